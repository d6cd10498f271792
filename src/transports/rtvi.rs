//! RTVI messages: the JSON dialect pipecat's client SDKs speak over the data channel.
//!
//! Every message is `{"label": "rtvi-ai", "type": ..., "id": ..., "data": ...}`. The server
//! answers `client-ready` with `bot-ready`, renders the session's events (speaking, transcripts,
//! what the bot says, tool calls, metrics, errors), takes `send-text` as typed user input and
//! `disconnect-bot` as the end, and answers anything else with `error-response`.
//!
//! The protocol version is negotiated as pipecat does it: a 1.x client gets its own version back
//! and 1.x `bot-output` messages; any other client gets [`VERSION`] and the 2.x shape.

use serde_json::{Value, json};

use crate::events::Event;
use crate::frames::MetricsData;

/// The label every RTVI message carries.
pub const LABEL: &str = "rtvi-ai";
/// The protocol version voxide speaks to current clients.
pub const VERSION: &str = "2.0.0";
/// The major version of [`VERSION`].
const MAJOR: u64 = 2;
/// The oldest major version still served, in its own message shapes.
const LEGACY_MAJOR: u64 = 1;
/// The largest client message read; a larger one is answered with `error-response` unread.
pub const MAX_CLIENT_MESSAGE: usize = 64 * 1024;

/// What a client message asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// The client is ready: send these replies (`bot-ready`, after an `error-response` when its
    /// version is unknown or incompatible).
    Ready(Vec<String>),
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

fn error_response(id: Option<&str>, error: impl Into<String>) -> String {
    message("error-response", id, json!({"error": error.into()}))
}

/// The answer to a client message of `len` bytes, over [`MAX_CLIENT_MESSAGE`].
pub fn too_large(len: usize) -> String {
    error_response(
        None,
        format!(
            "message_too_large: the message is {len} bytes; the most read is {MAX_CLIENT_MESSAGE}"
        ),
    )
}

/// A function call's data as the client may see it ([`Event::for_client`]): its id, its name
/// where one is told, and each of `fields` that is not null.
fn tool_call<const N: usize>(name: &str, tool_call_id: &str, fields: [(&str, Value); N]) -> Value {
    let mut data = serde_json::Map::new();
    if !name.is_empty() {
        data.insert("function_name".into(), json!(name));
    }
    data.insert("tool_call_id".into(), json!(tool_call_id));
    for (key, value) in fields {
        if !value.is_null() {
            data.insert(key.into(), value);
        }
    }
    Value::Object(data)
}

/// A non-fatal `error`: something the client sent was not used; the session goes on.
pub fn error(text: &str) -> String {
    message("error", None, json!({"error": text, "fatal": false}))
}

/// A fatal `error`: the server ends the session for this reason.
pub fn fatal_error(text: &str) -> String {
    message("error", None, json!({"error": text, "fatal": true}))
}

/// One client's side of the protocol: the version it negotiated decides the message shapes.
#[derive(Debug, Default)]
pub struct Rtvi {
    legacy: bool,
    segments: u64,
    /// Dollars the session's LLM calls cost so far (those with a known price).
    session_cost_usd: f64,
}

impl Rtvi {
    /// A conversation before `client-ready`: current shapes until the client says otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads one client message.
    pub fn parse(&mut self, text: &str) -> ClientMessage {
        if text.len() > MAX_CLIENT_MESSAGE {
            return ClientMessage::Invalid(too_large(text.len()));
        }
        let Ok(value) = serde_json::from_str::<Value>(text) else {
            return ClientMessage::Invalid(error_response(None, "the message is not JSON"));
        };
        let id = value.get("id").and_then(Value::as_str);
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if value.get("label").and_then(Value::as_str) != Some(LABEL) {
            return ClientMessage::Invalid(error_response(id, format!("expected label {LABEL:?}")));
        }
        match kind {
            "client-ready" => ClientMessage::Ready(self.ready(id, &value["data"]["version"])),
            "send-text" => match value["data"]["content"].as_str() {
                Some(content) if !content.trim().is_empty() => {
                    ClientMessage::Text(content.to_owned())
                }
                _ => ClientMessage::Invalid(error_response(id, "send-text needs data.content")),
            },
            "disconnect-bot" => ClientMessage::Disconnect,
            other => ClientMessage::Invalid(error_response(
                id,
                format!("unsupported message type {other:?}"),
            )),
        }
    }

    /// Negotiates the version; returns the replies to `client-ready`.
    fn ready(&mut self, id: Option<&str>, version: &Value) -> Vec<String> {
        let mut replies = Vec::new();
        let major = version.as_str().map(|v| {
            v.split('.')
                .map(str::parse::<u64>)
                .collect::<Result<Vec<_>, _>>()
        });
        let mut answer = VERSION.to_owned();
        match (version.as_str(), major) {
            (Some(v), Some(Ok(parts))) if parts.len() == 3 => {
                if parts[0] == LEGACY_MAJOR {
                    self.legacy = true;
                    answer = v.to_owned();
                } else if parts[0] != MAJOR {
                    replies.push(error_response(
                        id,
                        format!("RTVI version {v} is not compatible with {VERSION}; compatibility issues may occur"),
                    ));
                }
            }
            (Some(v), _) => replies.push(error_response(
                id,
                format!("invalid client version format ({v}); compatibility issues may occur"),
            )),
            (None, _) => replies.push(error_response(
                id,
                "client version unknown; compatibility issues may occur",
            )),
        }
        replies.push(message(
            "bot-ready",
            id,
            json!({"version": answer, "about": {"library": "voxide", "library_version": env!("CARGO_PKG_VERSION")}}),
        ));
        replies
    }

    /// The RTVI messages for a session event, if the protocol has any.
    pub fn render(&mut self, event: &Event) -> Vec<String> {
        let (kind, data) = match event {
            Event::UserMuteStarted => ("user-mute-started", Value::Null),
            Event::UserMuteStopped => ("user-mute-stopped", Value::Null),
            Event::UserStartedSpeaking => ("user-started-speaking", Value::Null),
            Event::UserStoppedSpeaking => ("user-stopped-speaking", Value::Null),
            Event::BotStartedSpeaking => ("bot-started-speaking", Value::Null),
            Event::BotStoppedSpeaking => ("bot-stopped-speaking", Value::Null),
            Event::UserTranscription { text, is_final } => (
                "user-transcription",
                json!({"text": text, "final": is_final, "user_id": "user", "timestamp": ""}),
            ),
            Event::BotText { text } => return self.bot_output(text),
            Event::ToolCallStarted {
                name,
                tool_call_id,
                arguments,
            } => {
                let started = if name.is_empty() {
                    json!({})
                } else {
                    json!({"function_name": name})
                };
                return vec![
                    message("llm-function-call-started", None, started),
                    message(
                        "llm-function-call-in-progress",
                        None,
                        tool_call(name, tool_call_id, [("arguments", arguments.clone())]),
                    ),
                ];
            }
            Event::ToolCallResult {
                name,
                tool_call_id,
                result,
            } => (
                "llm-function-call-stopped",
                tool_call(
                    name,
                    tool_call_id,
                    [
                        ("cancelled", json!(false)),
                        ("result", result.clone().unwrap_or(Value::Null)),
                    ],
                ),
            ),
            Event::ToolCallCancelled {
                name, tool_call_id, ..
            } => (
                "llm-function-call-stopped",
                tool_call(name, tool_call_id, [("cancelled", json!(true))]),
            ),
            Event::Metrics { data } => match self.metrics(data) {
                Some(data) => ("metrics", data),
                None => return Vec::new(),
            },
            Event::Error {
                message: text,
                fatal,
                ..
            } => ("error", json!({"error": text, "fatal": fatal})),
            _ => return Vec::new(),
        };
        vec![message(kind, None, data)]
    }

    /// A sentence the bot speaks: `bot-output` in the negotiated shape, then `bot-tts-text`.
    fn bot_output(&mut self, text: &str) -> Vec<String> {
        self.segments += 1;
        let mut output = json!({
            "text": text,
            "output_type": "sentence",
            "text_type": "sentence",
            "aggregated_by": "sentence",
            "segment_id": self.segments,
        });
        if self.legacy {
            output["spoken"] = json!(true);
        } else {
            output["will_be_spoken"] = json!(true);
            output["spoken_status"] = json!("completed");
            output["spoken_progress"] = json!({"accumulated_text": text, "remaining_text": ""});
        }
        vec![
            message("bot-output", None, output),
            message("bot-tts-text", None, json!({"text": text})),
        ]
    }
}

impl Rtvi {
    /// RTVI `metrics` data, as pipecat's server sends it: `ttfb` and `processing` per processor,
    /// `tokens` per LLM call, `characters` per TTS call. Each `tokens` entry also carries its
    /// dollars (`cost_usd`, when the model's price is known) and the session's so far
    /// (`session_cost_usd`).
    fn metrics(&mut self, data: &[MetricsData]) -> Option<Value> {
        let mut out = serde_json::Map::new();
        let mut add = |key: &str, item: Value| {
            if let Value::Array(list) = out.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
                list.push(item);
            }
        };
        for item in data {
            match item {
                MetricsData::Ttfb {
                    processor, seconds, ..
                } => add("ttfb", json!({"processor": processor, "value": seconds})),
                MetricsData::ProcessingTime { processor, seconds } => add(
                    "processing",
                    json!({"processor": processor, "value": seconds}),
                ),
                MetricsData::LlmUsage {
                    processor,
                    model,
                    usage,
                    cost_usd,
                } => {
                    self.session_cost_usd += cost_usd.unwrap_or(0.0);
                    add(
                        "tokens",
                        json!({
                            "processor": processor,
                            "model": model,
                            "value": {
                                "prompt_tokens": usage.input + usage.cache_read + usage.cache_write,
                                "completion_tokens": usage.output,
                                "total_tokens": usage.total(),
                                "cache_read_input_tokens": usage.cache_read,
                                "cache_creation_input_tokens": usage.cache_write,
                            },
                            "cost_usd": cost_usd,
                            "session_cost_usd": self.session_cost_usd,
                        }),
                    );
                }
                MetricsData::TtsUsage {
                    processor,
                    model,
                    characters,
                    cost_usd,
                } => {
                    self.session_cost_usd += cost_usd.unwrap_or(0.0);
                    add(
                        "characters",
                        json!({"processor": processor, "model": model, "value": characters,
                            "cost_usd": cost_usd, "session_cost_usd": self.session_cost_usd}),
                    );
                }
                MetricsData::SttUsage {
                    processor,
                    model,
                    seconds,
                    cost_usd,
                } => {
                    self.session_cost_usd += cost_usd.unwrap_or(0.0);
                    add(
                        "stt_seconds",
                        json!({"processor": processor, "model": model, "value": seconds,
                            "cost_usd": cost_usd, "session_cost_usd": self.session_cost_usd}),
                    );
                }
                MetricsData::Network {
                    transport,
                    received,
                    lost,
                    recovered,
                    concealed,
                    late,
                    reordered,
                    duplicated,
                    jitter_ms,
                    depth_ms,
                    sent_loss,
                } => add(
                    "network",
                    json!({"processor": transport, "value": {
                        "received": received, "lost": lost, "recovered": recovered,
                        "concealed": concealed, "late": late, "reordered": reordered,
                        "duplicated": duplicated, "jitter_ms": jitter_ms, "depth_ms": depth_ms,
                        "sent_loss": sent_loss,
                    }}),
                ),
                _ => {}
            }
        }
        (!out.is_empty()).then_some(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(rtvi: &mut Rtvi, data: &str) -> Vec<Value> {
        let text =
            format!(r#"{{"label":"rtvi-ai","type":"client-ready","id":"abc","data":{data}}}"#);
        let ClientMessage::Ready(replies) = rtvi.parse(&text) else {
            panic!("ready");
        };
        replies
            .iter()
            .map(|r| serde_json::from_str(r).expect("json"))
            .collect()
    }

    fn bot_output(rtvi: &mut Rtvi) -> Value {
        let rendered = rtvi.render(&Event::BotText {
            text: "It is sunny.".into(),
        });
        assert_eq!(rendered.len(), 2);
        let tts: Value = serde_json::from_str(&rendered[1]).expect("json");
        assert_eq!(tts["type"], "bot-tts-text");
        assert_eq!(tts["data"]["text"], "It is sunny.");
        serde_json::from_str(&rendered[0]).expect("json")
    }

    #[test]
    fn a_current_client_gets_the_current_version_and_v2_bot_output() {
        let mut rtvi = Rtvi::new();
        let replies = ready(&mut rtvi, r#"{"version":"2.1.0"}"#);
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0]["type"], "bot-ready");
        assert_eq!(replies[0]["id"], "abc");
        assert_eq!(replies[0]["label"], LABEL);
        assert_eq!(replies[0]["data"]["version"], VERSION);
        let output = bot_output(&mut rtvi);
        assert_eq!(output["type"], "bot-output");
        assert_eq!(output["data"]["text"], "It is sunny.");
        assert_eq!(output["data"]["will_be_spoken"], true);
        assert_eq!(output["data"]["spoken_status"], "completed");
        assert_eq!(
            output["data"]["spoken_progress"]["accumulated_text"],
            "It is sunny."
        );
        assert!(output["data"].get("spoken").is_none());
        assert_eq!(bot_output(&mut rtvi)["data"]["segment_id"], 2);
    }

    #[test]
    fn a_1x_client_gets_its_version_back_and_v1_bot_output() {
        let mut rtvi = Rtvi::new();
        let replies = ready(&mut rtvi, r#"{"version":"1.4.1"}"#);
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0]["data"]["version"], "1.4.1");
        let output = bot_output(&mut rtvi);
        assert_eq!(output["data"]["spoken"], true);
        assert!(output["data"].get("spoken_status").is_none());
    }

    #[test]
    fn an_unknown_or_odd_version_is_warned_about_and_still_served() {
        for data in [r#"{}"#, r#"{"version":"banana"}"#, r#"{"version":"3.0.0"}"#] {
            let replies = ready(&mut Rtvi::new(), data);
            assert_eq!(replies.len(), 2, "{data}");
            assert_eq!(replies[0]["type"], "error-response", "{data}");
            assert_eq!(replies[0]["id"], "abc");
            assert_eq!(replies[1]["type"], "bot-ready", "{data}");
        }
    }

    #[test]
    fn a_message_over_the_limit_is_answered_unread() {
        let mut rtvi = Rtvi::new();
        let huge = format!(
            r#"{{"label":"rtvi-ai","type":"send-text","data":{{"content":"{}"}}}}"#,
            "a".repeat(1 << 20)
        );
        let ClientMessage::Invalid(reply) = rtvi.parse(&huge) else {
            panic!("a megabyte is not read");
        };
        let reply: Value = serde_json::from_str(&reply).expect("JSON");
        assert_eq!(reply["type"], "error-response");
        let error = reply["data"]["error"].as_str().expect("a reason");
        assert!(error.starts_with("message_too_large"), "{error}");
    }

    #[test]
    fn text_unknown_and_malformed_messages() {
        let mut rtvi = Rtvi::new();
        assert_eq!(
            rtvi.parse(
                r#"{"label":"rtvi-ai","type":"send-text","id":"1","data":{"content":"hi"}}"#
            ),
            ClientMessage::Text("hi".into())
        );
        assert_eq!(
            rtvi.parse(r#"{"label":"rtvi-ai","type":"disconnect-bot","id":"2"}"#),
            ClientMessage::Disconnect
        );
        for bad in [
            r#"{"label":"rtvi-ai","type":"dance","id":"3"}"#,
            r#"{"label":"other","type":"client-ready"}"#,
            "not json",
            r#"{"label":"rtvi-ai","type":"send-text","data":{}}"#,
        ] {
            let ClientMessage::Invalid(reply) = rtvi.parse(bad) else {
                panic!("{bad} is invalid");
            };
            assert!(reply.contains("error-response"), "{reply}");
        }
    }

    #[test]
    fn events_render_as_rtvi_messages() {
        let mut rtvi = Rtvi::new();
        let rendered = rtvi.render(&Event::UserTranscription {
            text: "hello".into(),
            is_final: true,
        });
        let value: Value = serde_json::from_str(&rendered[0]).expect("json");
        assert_eq!(value["type"], "user-transcription");
        assert_eq!(value["data"]["text"], "hello");
        assert_eq!(value["data"]["final"], true);
        let call = rtvi.render(&Event::ToolCallStarted {
            name: "get_weather".into(),
            tool_call_id: "c1".into(),
            arguments: json!({"city": "Paris"}),
        });
        let kinds: Vec<Value> = call
            .iter()
            .map(|m| serde_json::from_str::<Value>(m).expect("json")["type"].clone())
            .collect();
        assert_eq!(
            kinds,
            [
                json!("llm-function-call-started"),
                json!("llm-function-call-in-progress")
            ]
        );
        assert!(rtvi.render(&Event::SessionStarted).is_empty());
    }

    #[test]
    fn token_metrics_carry_each_calls_dollars_and_the_sessions() {
        let mut rtvi = Rtvi::new();
        let usage = |cost| Event::Metrics {
            data: vec![MetricsData::LlmUsage {
                processor: "LlmService".into(),
                model: Some("gpt-4.1-mini".into()),
                usage: crate::frames::TokenUsage {
                    input: 900,
                    output: 20,
                    cache_read: 100,
                    cache_write: 0,
                },
                cost_usd: cost,
            }],
        };
        let first: Value = serde_json::from_str(&rtvi.render(&usage(Some(0.25)))[0]).expect("json");
        assert_eq!(first["type"], "metrics");
        let tokens = &first["data"]["tokens"][0];
        assert_eq!(tokens["value"]["prompt_tokens"], 1000);
        assert_eq!(tokens["value"]["completion_tokens"], 20);
        assert_eq!(tokens["value"]["cache_read_input_tokens"], 100);
        assert_eq!(tokens["cost_usd"], 0.25);
        let unpriced: Value = serde_json::from_str(&rtvi.render(&usage(None))[0]).expect("json");
        assert_eq!(unpriced["data"]["tokens"][0]["cost_usd"], Value::Null);
        let second: Value = serde_json::from_str(&rtvi.render(&usage(Some(0.5)))[0]).expect("json");
        assert_eq!(second["data"]["tokens"][0]["session_cost_usd"], 0.75);
    }
}
