//! RTVI messages: the JSON dialect pipecat's client SDKs speak over the data channel.
//!
//! Every message is `{"label": "rtvi-ai", "type": ..., "id": ..., "data": ...}`. The server
//! answers `client-ready` with `bot-ready`, renders the session's events (speaking, transcripts,
//! what the bot says, tool calls, metrics, errors), takes `send-text` as typed user input and
//! `disconnect-bot` as the end, and answers anything else with `error-response`.

use serde_json::{Value, json};

use crate::events::Event;
use crate::frames::MetricsData;

/// The label every RTVI message carries.
pub const LABEL: &str = "rtvi-ai";
/// The protocol version voxide speaks.
pub const VERSION: &str = "1.0.0";

/// What a client message asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// The client is ready: answer with this reply (`bot-ready`).
    Ready(String),
    /// The user typed this.
    Text(String),
    /// The client is leaving.
    Disconnect,
    /// Not understood: send this reply (`error-response`).
    Invalid(String),
}

fn message(kind: &str, id: Option<&str>, data: Value) -> String {
    let mut out = json!({"label": LABEL, "type": kind, "data": data});
    if let Some(id) = id {
        out["id"] = json!(id);
    }
    out.to_string()
}

/// Reads one client message.
pub fn parse(text: &str) -> ClientMessage {
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return ClientMessage::Invalid(message(
            "error-response",
            None,
            json!({"error": "the message is not JSON"}),
        ));
    };
    let id = value.get("id").and_then(Value::as_str);
    let kind = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if value.get("label").and_then(Value::as_str) != Some(LABEL) {
        return ClientMessage::Invalid(message(
            "error-response",
            id,
            json!({"error": format!("expected label {LABEL:?}")}),
        ));
    }
    match kind {
        "client-ready" => ClientMessage::Ready(message(
            "bot-ready",
            id,
            json!({"version": VERSION, "about": {"library": "voxide", "library_version": env!("CARGO_PKG_VERSION")}}),
        )),
        "send-text" => match value["data"]["content"].as_str() {
            Some(content) if !content.trim().is_empty() => ClientMessage::Text(content.to_owned()),
            _ => ClientMessage::Invalid(message(
                "error-response",
                id,
                json!({"error": "send-text needs data.content"}),
            )),
        },
        "disconnect-bot" => ClientMessage::Disconnect,
        other => ClientMessage::Invalid(message(
            "error-response",
            id,
            json!({"error": format!("unsupported message type {other:?}")}),
        )),
    }
}

/// The RTVI message for a session event, if the protocol has one.
pub fn render(event: &Event) -> Option<String> {
    let (kind, data) = match event {
        Event::UserStartedSpeaking => ("user-started-speaking", Value::Null),
        Event::UserStoppedSpeaking => ("user-stopped-speaking", Value::Null),
        Event::BotStartedSpeaking => ("bot-started-speaking", Value::Null),
        Event::BotStoppedSpeaking => ("bot-stopped-speaking", Value::Null),
        Event::UserTranscription { text, is_final } => (
            "user-transcription",
            json!({"text": text, "final": is_final, "user_id": "user", "timestamp": ""}),
        ),
        Event::BotText { text } => ("bot-tts-text", json!({"text": text})),
        Event::ToolCallStarted {
            name,
            tool_call_id,
            arguments,
        } => (
            "llm-function-call-in-progress",
            json!({"function_name": name, "tool_call_id": tool_call_id, "arguments": arguments}),
        ),
        Event::ToolCallResult {
            name,
            tool_call_id,
            result,
        } => (
            "llm-function-call-stopped",
            json!({"function_name": name, "tool_call_id": tool_call_id, "cancelled": false, "result": result}),
        ),
        Event::ToolCallCancelled {
            name, tool_call_id, ..
        } => (
            "llm-function-call-stopped",
            json!({"function_name": name, "tool_call_id": tool_call_id, "cancelled": true}),
        ),
        Event::Metrics { data } => {
            let mut ttfb = Vec::new();
            let mut processing = Vec::new();
            for item in data {
                match item {
                    MetricsData::Ttfb {
                        processor, seconds, ..
                    } => ttfb.push(json!({"processor": processor, "value": seconds})),
                    MetricsData::ProcessingTime { processor, seconds } => {
                        processing.push(json!({"processor": processor, "value": seconds}))
                    }
                    _ => {}
                }
            }
            if ttfb.is_empty() && processing.is_empty() {
                return None;
            }
            ("metrics", json!({"ttfb": ttfb, "processing": processing}))
        }
        Event::Error {
            message: text,
            fatal,
            ..
        } => ("error", json!({"error": text, "fatal": fatal})),
        _ => return None,
    };
    Some(message(kind, None, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ready_is_answered_with_bot_ready_and_the_same_id() {
        let reply = parse(
            r#"{"label":"rtvi-ai","type":"client-ready","id":"abc","data":{"version":"1.0.0"}}"#,
        );
        let ClientMessage::Ready(reply) = reply else {
            panic!("ready");
        };
        let reply: Value = serde_json::from_str(&reply).expect("json");
        assert_eq!(reply["type"], "bot-ready");
        assert_eq!(reply["id"], "abc");
        assert_eq!(reply["label"], LABEL);
    }

    #[test]
    fn text_unknown_and_malformed_messages() {
        assert_eq!(
            parse(r#"{"label":"rtvi-ai","type":"send-text","id":"1","data":{"content":"hi"}}"#),
            ClientMessage::Text("hi".into())
        );
        assert_eq!(
            parse(r#"{"label":"rtvi-ai","type":"disconnect-bot","id":"2"}"#),
            ClientMessage::Disconnect
        );
        for bad in [
            r#"{"label":"rtvi-ai","type":"dance","id":"3"}"#,
            r#"{"label":"other","type":"client-ready"}"#,
            "not json",
            r#"{"label":"rtvi-ai","type":"send-text","data":{}}"#,
        ] {
            let ClientMessage::Invalid(reply) = parse(bad) else {
                panic!("{bad} is invalid");
            };
            assert!(reply.contains("error-response"), "{reply}");
        }
    }

    #[test]
    fn events_render_as_rtvi_messages() {
        let rendered = render(&Event::UserTranscription {
            text: "hello".into(),
            is_final: true,
        })
        .expect("rendered");
        let value: Value = serde_json::from_str(&rendered).expect("json");
        assert_eq!(value["type"], "user-transcription");
        assert_eq!(value["data"]["text"], "hello");
        assert_eq!(value["data"]["final"], true);
        assert!(render(&Event::SessionStarted).is_none());
    }
}
