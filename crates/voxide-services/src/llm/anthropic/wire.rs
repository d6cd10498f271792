//! Anthropic Messages streaming events, as the API documents them, and the sans-IO decoder that
//! turns them into [`LlmEvent`]s.
//!
//! Each `tool_use` block is finished at its own `content_block_stop`, so every call of a reply
//! comes out, however many there are. Usage is `message_start`'s prompt figures with the latest
//! (cumulative) output count from `message_delta`, reported once.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::llm::http::Decode;
use crate::llm::sse::SseEvent;
use crate::llm::{LlmError, LlmEvent};
use voxide_core::context::StopReason;
use voxide_core::context::adapters::anthropic::thinking_message;
use voxide_core::frames::TokenUsage;

/// One event of the stream (its `data:`).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    MessageStart {
        message: MessageStart,
    },
    ContentBlockStart {
        index: usize,
        content_block: Block,
    },
    ContentBlockDelta {
        index: usize,
        delta: Delta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        #[serde(default)]
        delta: MessageDeltaBody,
        usage: Option<Usage>,
    },
    MessageStop,
    Ping,
    Error {
        error: ApiError,
    },
    /// Events added after this was written are skipped, as the API asks.
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Deserialize)]
pub struct MessageStart {
    pub usage: Option<Usage>,
}

/// Token counts; `message_delta`'s are cumulative.
#[derive(Debug, Default, Deserialize)]
pub struct Usage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cache_creation_input_tokens: Option<u64>,
    pub cache_read_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Delta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "input_json_delta")]
    InputJson {
        #[serde(default)]
        partial_json: String,
    },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "signature_delta")]
    Signature { signature: String },
    #[serde(other)]
    Other,
}

#[derive(Debug, Default, Deserialize)]
pub struct MessageDeltaBody {
    pub stop_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ApiError {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub message: String,
}

/// A `tool_use` block being read.
#[derive(Debug)]
struct OpenCall {
    id: String,
    name: String,
    /// The input the block started with (the whole input when no deltas follow).
    input: Value,
    json: String,
}

/// Reads one reply.
#[derive(Debug, Default)]
pub struct Decoder {
    calls: HashMap<usize, OpenCall>,
    /// Thinking blocks being read, by index: the API wants them back verbatim with the calls.
    open_thinking: HashMap<usize, Value>,
    /// Finished thinking blocks not yet tied to a call.
    thinking: Vec<Value>,
    usage: TokenUsage,
    has_usage: bool,
    produced: bool,
    stop: Option<StopReason>,
    done: bool,
}

impl Decoder {
    /// A decoder for one reply.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads one event's data.
    pub fn data(&mut self, data: &str) -> Result<Vec<LlmEvent>, LlmError> {
        let event: Event = serde_json::from_str(data)
            .map_err(|e| LlmError::Protocol(format!("an unreadable event ({e}): {data:.200}")))?;
        let mut out = Vec::new();
        match event {
            Event::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.add_usage(&usage);
                }
            }
            Event::ContentBlockStart {
                index,
                content_block,
            } => match content_block {
                Block::Text { text } => self.text(text, &mut out),
                Block::Thinking {
                    thinking,
                    signature,
                } => {
                    let block =
                        json!({"type": "thinking", "thinking": thinking, "signature": signature});
                    self.open_thinking.insert(index, block);
                    if !thinking.is_empty() {
                        out.push(LlmEvent::Thinking(thinking))
                    }
                }
                Block::RedactedThinking { data } => self
                    .thinking
                    .push(json!({"type": "redacted_thinking", "data": data})),
                Block::ToolUse { id, name, input } => {
                    self.produced = true;
                    if !self.thinking.is_empty() {
                        let blocks = std::mem::take(&mut self.thinking);
                        out.push(LlmEvent::ProviderMessage(thinking_message(&id, blocks)));
                    }
                    self.calls.insert(
                        index,
                        OpenCall {
                            id,
                            name,
                            input,
                            json: String::new(),
                        },
                    );
                }
                Block::Other => {}
            },
            Event::ContentBlockDelta { index, delta } => match delta {
                Delta::Text { text } => self.text(text, &mut out),
                Delta::Thinking { thinking } => {
                    if let Some(block) = self.open_thinking.get_mut(&index) {
                        append(&mut block["thinking"], &thinking);
                    }
                    if !thinking.is_empty() {
                        out.push(LlmEvent::Thinking(thinking))
                    }
                }
                Delta::Signature { signature } => {
                    if let Some(block) = self.open_thinking.get_mut(&index) {
                        append(&mut block["signature"], &signature);
                    }
                }
                Delta::InputJson { partial_json } => match self.calls.get_mut(&index) {
                    Some(call) => call.json.push_str(&partial_json),
                    None => {
                        return Err(LlmError::Protocol(format!(
                            "input for block {index}, which is not a tool call"
                        )));
                    }
                },
                Delta::Other => {}
            },
            Event::ContentBlockStop { index } => {
                if let Some(call) = self.calls.remove(&index) {
                    out.push(finished(call));
                }
                if let Some(block) = self.open_thinking.remove(&index) {
                    self.thinking.push(block);
                }
            }
            Event::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.stop_reason {
                    self.stop = Some(stop_reason(&reason));
                }
                if let Some(usage) = usage {
                    self.add_usage(&usage);
                }
            }
            Event::MessageStop => {
                self.done = true;
                out.extend(self.close());
            }
            Event::Ping | Event::Unknown => {}
            Event::Error { error } => {
                let message = format!("{}: {}", error.kind, error.message);
                return Err(match error.kind.as_str() {
                    "overloaded_error" | "rate_limit_error" => LlmError::Busy(message),
                    _ => LlmError::Provider(message),
                });
            }
        }
        Ok(out)
    }

    fn text(&mut self, text: String, out: &mut Vec<LlmEvent>) {
        if !text.is_empty() {
            self.produced = true;
            out.push(LlmEvent::Text(text));
        }
    }

    /// Counts are replaced, not added: `message_delta` repeats the totals so far.
    fn add_usage(&mut self, usage: &Usage) {
        self.has_usage = true;
        if let Some(n) = usage.input_tokens {
            self.usage.input = n;
        }
        if let Some(n) = usage.output_tokens {
            self.usage.output = n;
        }
        if let Some(n) = usage.cache_read_input_tokens {
            self.usage.cache_read = n;
        }
        if let Some(n) = usage.cache_creation_input_tokens {
            self.usage.cache_write = n;
        }
    }

    /// The reply is over: calls never stopped, the usage, the stop reason. Once only.
    fn close(&mut self) -> Vec<LlmEvent> {
        let mut open: Vec<_> = self.calls.drain().collect();
        open.sort_by_key(|(index, _)| *index);
        let mut out: Vec<LlmEvent> = open.into_iter().map(|(_, call)| finished(call)).collect();
        if std::mem::take(&mut self.has_usage) {
            out.push(LlmEvent::Usage(self.usage));
        }
        if let Some(reason) = self.stop.take() {
            out.push(LlmEvent::Finished(reason));
        }
        out
    }
}

fn finished(call: OpenCall) -> LlmEvent {
    let arguments = if !call.json.trim().is_empty() {
        call.json
    } else if call.input.as_object().is_some_and(|o| !o.is_empty()) {
        call.input.to_string()
    } else {
        // A tool without input yields no deltas.
        "{}".to_owned()
    };
    LlmEvent::ToolCall {
        id: call.id,
        name: call.name,
        arguments,
    }
}

impl Decode for Decoder {
    fn event(&mut self, event: &SseEvent) -> Result<Vec<LlmEvent>, LlmError> {
        self.data(&event.data)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn end(&mut self) -> Result<Vec<LlmEvent>, LlmError> {
        if !self.produced {
            return Err(LlmError::Provider(
                "the model returned an empty reply".into(),
            ));
        }
        Ok(self.close())
    }
}

/// Anthropic's `stop_reason` as voxide's.
fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => StopReason::Length,
        "tool_use" => StopReason::ToolUse,
        "refusal" => StopReason::Error,
        _ => StopReason::Stop,
    }
}

/// Appends a delta to a block's string field.
fn append(field: &mut Value, delta: &str) {
    if let Value::String(text) = field {
        text.push_str(delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[&str]) -> Vec<LlmEvent> {
        let mut decoder = Decoder::new();
        let mut out = Vec::new();
        for event in events {
            out.extend(decoder.data(event).expect("valid event"));
        }
        out.extend(Decode::end(&mut decoder).expect("a reply"));
        out
    }

    const START: &str = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-haiku-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1,"cache_creation_input_tokens":4,"cache_read_input_tokens":10}}}"#;

    #[test]
    fn text_then_usage_from_start_and_delta_counted_once() {
        let events = run(&[
            START,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"ping"}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there."}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}"#,
            r#"{"type":"message_stop"}"#,
        ]);
        assert_eq!(
            events,
            [
                LlmEvent::Text("Hi".into()),
                LlmEvent::Text(" there.".into()),
                LlmEvent::Usage(TokenUsage {
                    input: 25,
                    output: 7,
                    cache_read: 10,
                    cache_write: 4
                }),
                LlmEvent::Finished(StopReason::Stop),
            ]
        );
    }

    #[test]
    fn every_parallel_tool_use_comes_out_at_its_own_block_stop() {
        let events = run(&[
            START,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_a","name":"get_current_time","input":{}}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_b","name":"calculate","input":{}}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"expression\": \"17"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"*23\"}"}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":60}}"#,
            r#"{"type":"message_stop"}"#,
        ]);
        assert_eq!(
            &events[..2],
            [
                LlmEvent::ToolCall {
                    id: "toolu_a".into(),
                    name: "get_current_time".into(),
                    arguments: "{}".into()
                },
                LlmEvent::ToolCall {
                    id: "toolu_b".into(),
                    name: "calculate".into(),
                    arguments: "{\"expression\": \"17*23\"}".into()
                },
            ]
        );
        assert_eq!(
            events.last(),
            Some(&LlmEvent::Finished(StopReason::ToolUse))
        );
    }

    #[test]
    fn thinking_is_kept_apart_from_speech() {
        let events = run(&[
            START,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Greet back."}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":"Hello."}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_stop"}"#,
        ]);
        assert_eq!(events[0], LlmEvent::Thinking("Greet back.".into()));
        assert_eq!(events[1], LlmEvent::Text("Hello.".into()));
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, LlmEvent::ProviderMessage(_))),
            "no call, nothing to replay: {events:?}"
        );
    }

    #[test]
    fn thinking_before_a_call_is_kept_verbatim_for_the_follow_up() {
        let events = run(&[
            START,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Need "}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"the clock."}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"redacted_thinking","data":"c2VjcmV0"}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_a","name":"get_current_time","input":{}}}"#,
            r#"{"type":"content_block_stop","index":2}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":60}}"#,
            r#"{"type":"message_stop"}"#,
        ]);
        let kept: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                LlmEvent::ProviderMessage(m) => Some(m),
                _ => None,
            })
            .collect();
        assert_eq!(kept.len(), 1, "{events:?}");
        assert_eq!(kept[0].llm, "anthropic");
        assert_eq!(
            kept[0].message,
            json!({"type": "thinking", "blocks": [
                {"type": "thinking", "thinking": "Need the clock.", "signature": "EqQB"},
                {"type": "redacted_thinking", "data": "c2VjcmV0"}
            ], "bookmark": {"function_call": "toolu_a"}})
        );
    }

    #[test]
    fn overload_is_busy_other_errors_are_the_providers_and_garbage_is_a_protocol_error() {
        let mut decoder = Decoder::new();
        assert!(matches!(
            decoder.data(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#),
            Err(LlmError::Busy(m)) if m.contains("Overloaded")
        ));
        assert!(matches!(
            decoder.data(
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#
            ),
            Err(LlmError::Provider(_))
        ));
        assert!(matches!(
            decoder.data(r#"{"type":"content_block_delta","index":0,"#),
            Err(LlmError::Protocol(_))
        ));
        assert!(matches!(
            decoder.data(r#"{"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{"}}"#),
            Err(LlmError::Protocol(_))
        ));
        // New event kinds are skipped.
        assert_eq!(
            decoder.data(r#"{"type":"future_event"}"#).ok(),
            Some(vec![])
        );
    }

    #[test]
    fn a_reply_with_nothing_in_it_is_an_error() {
        let mut decoder = Decoder::new();
        decoder.data(START).expect("valid");
        decoder.data(r#"{"type":"message_stop"}"#).expect("valid");
        assert!(Decode::end(&mut decoder).is_err());
    }
}
