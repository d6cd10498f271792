//! OpenAI chat-completions streaming chunks, as OpenAI and the servers that copy its API
//! (Ollama, vLLM, llama.cpp, Groq, OpenRouter) send them, and the sans-IO assembler that turns
//! them into [`LlmEvent`]s.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::llm::http::Decode;
use crate::llm::sse::SseEvent;
use crate::llm::{LlmError, LlmEvent};
use voxide_core::context::StopReason;
use voxide_core::frames::TokenUsage;

/// One `data:` payload of the stream.
#[derive(Debug, Deserialize)]
pub struct Chunk {
    #[serde(default)]
    pub choices: Vec<Choice>,
    /// Sent once, in a last chunk with no choices, when `stream_options.include_usage` is on.
    pub usage: Option<Usage>,
    /// Some servers report a failure mid-stream as a chunk.
    pub error: Option<ApiError>,
}

#[derive(Debug, Deserialize)]
pub struct Choice {
    #[serde(default)]
    pub delta: Delta,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Delta {
    pub content: Option<String>,
    /// DeepSeek, vLLM and llama.cpp's reasoning text.
    pub reasoning_content: Option<String>,
    /// Ollama's and OpenRouter's name for it.
    pub reasoning: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A fragment of a tool call: OpenAI streams a call by `index`, its id and name first and the
/// arguments in pieces; Ollama sends each call whole, without an index.
#[derive(Debug, Deserialize)]
pub struct ToolCallDelta {
    pub index: Option<usize>,
    pub id: Option<String>,
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionDelta {
    pub name: Option<String>,
    /// A string fragment (OpenAI); some servers send the whole object.
    pub arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Deserialize)]
pub struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: u64,
}

#[derive(Debug, Deserialize)]
pub struct ApiError {
    #[serde(default)]
    pub message: String,
}

/// A call being assembled.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Turns chunks into events: text and reasoning as they come, tool calls once whole (at the
/// finish), usage, the stop reason.
#[derive(Debug, Default)]
pub struct Assembler {
    calls: BTreeMap<usize, PartialCall>,
    /// Something the model said or called: a completion with neither is an error.
    produced: bool,
    finished: bool,
    /// `[DONE]` came.
    done: bool,
}

impl Assembler {
    /// An assembler for one completion.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads one `data:` payload.
    pub fn data(&mut self, data: &str) -> Result<Vec<LlmEvent>, LlmError> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(self.flush_calls());
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| LlmError::Protocol(format!("an unreadable chunk ({e}): {data:.200}")))?;
        if let Some(error) = chunk.error {
            return Err(LlmError::Provider(error.message));
        }
        let mut events = Vec::new();
        for choice in chunk.choices {
            let delta = choice.delta;
            if let Some(thinking) = delta.reasoning_content.or(delta.reasoning)
                && !thinking.is_empty()
            {
                events.push(LlmEvent::Thinking(thinking));
            }
            if let Some(text) = delta.content
                && !text.is_empty()
            {
                self.produced = true;
                events.push(LlmEvent::Text(text));
            }
            for call in delta.tool_calls {
                self.tool_call(call);
            }
            if let Some(reason) = choice.finish_reason {
                events.extend(self.flush_calls());
                self.finished = true;
                events.push(LlmEvent::Finished(stop_reason(&reason)));
            }
        }
        if let Some(usage) = chunk.usage {
            let cached = usage
                .prompt_tokens_details
                .map_or(0, |d| d.cached_tokens)
                .min(usage.prompt_tokens);
            events.push(LlmEvent::Usage(TokenUsage {
                input: usage.prompt_tokens - cached,
                output: usage.completion_tokens,
                cache_read: cached,
                cache_write: 0,
            }));
        }
        Ok(events)
    }

    fn tool_call(&mut self, delta: ToolCallDelta) {
        self.produced = true;
        // Without an index the call is whole (Ollama): it takes the next free place.
        let index = delta
            .index
            .unwrap_or_else(|| self.calls.keys().next_back().map_or(0, |k| k + 1));
        let call = self.calls.entry(index).or_default();
        if let Some(id) = delta.id.filter(|id| !id.is_empty()) {
            call.id = id;
        }
        if let Some(function) = delta.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                call.name = name;
            }
            match function.arguments {
                Some(Value::String(fragment)) => call.arguments.push_str(&fragment),
                Some(Value::Null) | None => {}
                Some(whole) => call.arguments = whole.to_string(),
            }
        }
    }

    fn flush_calls(&mut self) -> Vec<LlmEvent> {
        std::mem::take(&mut self.calls)
            .into_iter()
            .map(|(index, call)| LlmEvent::ToolCall {
                id: if call.id.is_empty() {
                    format!("call_{index}")
                } else {
                    call.id
                },
                name: call.name,
                arguments: if call.arguments.trim().is_empty() {
                    "{}".to_owned()
                } else {
                    call.arguments
                },
            })
            .collect()
    }

    /// The stream ended: calls never finished are flushed; nothing at all is an error.
    pub fn end(&mut self) -> Result<Vec<LlmEvent>, LlmError> {
        if !self.produced {
            return Err(LlmError::Provider(
                "the model returned an empty completion".into(),
            ));
        }
        let mut events = self.flush_calls();
        if !self.finished && !events.is_empty() {
            events.push(LlmEvent::Finished(StopReason::ToolUse));
        }
        Ok(events)
    }
}

impl Decode for Assembler {
    fn event(&mut self, event: &SseEvent) -> Result<Vec<LlmEvent>, LlmError> {
        self.data(&event.data)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn end(&mut self) -> Result<Vec<LlmEvent>, LlmError> {
        Assembler::end(self)
    }
}

/// OpenAI's `finish_reason` as voxide's stop reason.
fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "length" => StopReason::Length,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "content_filter" => StopReason::Error,
        _ => StopReason::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&str]) -> Vec<LlmEvent> {
        let mut assembler = Assembler::new();
        let mut events = Vec::new();
        for chunk in chunks {
            events.extend(assembler.data(chunk).expect("valid chunk"));
        }
        events.extend(assembler.end().expect("a completion"));
        events
    }

    #[test]
    fn text_usage_and_the_stop_reason() {
        let events = run(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Hello"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":" there."},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}"#,
            "[DONE]",
        ]);
        assert_eq!(
            events,
            [
                LlmEvent::Text("Hello".into()),
                LlmEvent::Text(" there.".into()),
                LlmEvent::Finished(StopReason::Stop),
                LlmEvent::Usage(TokenUsage {
                    input: 12,
                    output: 3,
                    cache_read: 8,
                    cache_write: 0
                }),
            ]
        );
    }

    #[test]
    fn parallel_tool_calls_are_assembled_by_index() {
        let events = run(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_current_time","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"calculate","arguments":"{\"expr"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"ession\": \"17*23\"}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ]);
        assert_eq!(
            events,
            [
                LlmEvent::ToolCall {
                    id: "call_a".into(),
                    name: "get_current_time".into(),
                    arguments: "{}".into()
                },
                LlmEvent::ToolCall {
                    id: "call_b".into(),
                    name: "calculate".into(),
                    arguments: "{\"expression\": \"17*23\"}".into()
                },
                LlmEvent::Finished(StopReason::ToolUse),
            ]
        );
    }

    #[test]
    fn whole_calls_without_an_index_are_taken_as_ollama_sends_them() {
        let events = run(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"c1","function":{"name":"get_current_time","arguments":"{}"}},{"function":{"name":"calculate","arguments":{"expression":"2+2"}}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
        ]);
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[1],
            LlmEvent::ToolCall {
                id: "call_1".into(),
                name: "calculate".into(),
                arguments: r#"{"expression":"2+2"}"#.into()
            }
        );
    }

    #[test]
    fn reasoning_is_thinking_not_speech() {
        let events = run(&[
            r#"{"choices":[{"delta":{"reasoning_content":"The user greets."}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"Answer briefly."}}]}"#,
            r#"{"choices":[{"delta":{"content":"Hi."},"finish_reason":"stop"}]}"#,
        ]);
        assert_eq!(events[0], LlmEvent::Thinking("The user greets.".into()));
        assert_eq!(events[1], LlmEvent::Thinking("Answer briefly.".into()));
        assert_eq!(events[2], LlmEvent::Text("Hi.".into()));
    }

    #[test]
    fn malformed_errors_and_empty_completions_are_errors() {
        let mut assembler = Assembler::new();
        assert!(matches!(
            assembler.data("{\"choices\": [{\"delta\": "),
            Err(LlmError::Protocol(_))
        ));
        assert!(matches!(
            assembler.data(r#"{"error":{"message":"overloaded"}}"#),
            Err(LlmError::Provider(m)) if m == "overloaded"
        ));
        let mut empty = Assembler::new();
        empty
            .data(r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#)
            .expect("valid");
        assert!(empty.end().is_err());
    }
}
