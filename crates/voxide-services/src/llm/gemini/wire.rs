//! Gemini's `streamGenerateContent?alt=sse` responses, as the API documents them, and the
//! sans-IO decoder that turns them into [`LlmEvent`]s.
//!
//! Calls arrive whole (`functionCall` parts, several for parallel calls). A call's
//! `thoughtSignature` must go back verbatim with it: it comes out as a Gemini-only context
//! message in pipecat's shape (`{"type": "thought_signature", "signature", "bookmark":
//! {"function_call": ID}}`), which the Gemini adapter attaches to the call again. There is no
//! `[DONE]`: the body's end is the reply's end. `usageMetadata` may come on several chunks; the
//! last one counts.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::llm::http::Decode;
use crate::llm::sse::SseEvent;
use crate::llm::{LlmError, LlmEvent};
use voxide_core::context::{AdapterKind, ProviderMessage, StopReason};
use voxide_core::frames::TokenUsage;

/// One `data:` payload: a `GenerateContentResponse`, or an error.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    #[serde(default)]
    pub candidates: Vec<Candidate>,
    pub usage_metadata: Option<UsageMetadata>,
    pub error: Option<ApiError>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    pub content: Option<CandidateContent>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct CandidateContent {
    #[serde(default)]
    pub parts: Vec<Part>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    pub text: Option<String>,
    /// The text is the model's reasoning, not its answer.
    #[serde(default)]
    pub thought: bool,
    pub function_call: Option<FunctionCall>,
    pub thought_signature: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionCall {
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    pub args: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageMetadata {
    #[serde(default)]
    pub prompt_token_count: u64,
    #[serde(default)]
    pub candidates_token_count: u64,
    #[serde(default)]
    pub thoughts_token_count: u64,
    #[serde(default)]
    pub cached_content_token_count: u64,
}

#[derive(Debug, Deserialize)]
pub struct ApiError {
    #[serde(default)]
    pub code: u16,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub status: String,
}

/// Reads one reply.
#[derive(Debug, Default)]
pub struct Decoder {
    usage: Option<TokenUsage>,
    produced: bool,
    stop: Option<StopReason>,
    /// Calls of this reply, to name those the API sent without an id.
    calls: usize,
}

impl Decoder {
    /// A decoder for one reply.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads one `data:` payload.
    pub fn data(&mut self, data: &str) -> Result<Vec<LlmEvent>, LlmError> {
        let response: Response = serde_json::from_str(data)
            .map_err(|e| LlmError::Protocol(format!("an unreadable chunk ({e}): {data:.200}")))?;
        if let Some(error) = response.error {
            let message = format!("{} {}: {}", error.code, error.status, error.message);
            let busy = matches!(error.code, 429 | 500 | 503)
                || matches!(error.status.as_str(), "RESOURCE_EXHAUSTED" | "UNAVAILABLE");
            return Err(if busy {
                LlmError::Busy(message)
            } else {
                LlmError::Provider(message)
            });
        }
        let mut out = Vec::new();
        // Only the first candidate is asked for.
        if let Some(candidate) = response.candidates.into_iter().next() {
            for part in candidate.content.map(|c| c.parts).unwrap_or_default() {
                self.part(part, &mut out);
            }
            if let Some(reason) = candidate.finish_reason {
                self.stop = Some(stop_reason(&reason));
            }
        }
        if let Some(usage) = response.usage_metadata {
            let cached = usage
                .cached_content_token_count
                .min(usage.prompt_token_count);
            self.usage = Some(TokenUsage {
                input: usage.prompt_token_count - cached,
                // Thinking is billed as output.
                output: usage.candidates_token_count + usage.thoughts_token_count,
                cache_read: cached,
                cache_write: 0,
            });
        }
        Ok(out)
    }

    fn part(&mut self, part: Part, out: &mut Vec<LlmEvent>) {
        if let Some(call) = part.function_call {
            self.produced = true;
            self.calls += 1;
            let id = call.id.filter(|id| !id.is_empty()).unwrap_or_else(|| {
                format!(
                    "call_{:08x}{:08x}",
                    voxide_core::ids::random_u32(),
                    self.calls
                )
            });
            let arguments = match call.args {
                Some(args @ Value::Object(_)) => args.to_string(),
                _ => "{}".to_owned(),
            };
            if let Some(signature) = part.thought_signature {
                out.push(LlmEvent::ProviderMessage(thought_signature(&id, signature)));
            }
            out.push(LlmEvent::ToolCall {
                id,
                name: call.name,
                arguments,
            });
            return;
        }
        match part.text {
            Some(text) if text.is_empty() => {}
            Some(text) if part.thought => out.push(LlmEvent::Thinking(text)),
            Some(text) => {
                self.produced = true;
                out.push(LlmEvent::Text(text));
            }
            None => {}
        }
    }
}

/// The context message that carries a call's signature back to Gemini (pipecat's shape).
pub fn thought_signature(tool_call_id: &str, signature: String) -> ProviderMessage {
    ProviderMessage {
        llm: AdapterKind::Gemini.as_str().to_owned(),
        message: json!({
            "type": "thought_signature",
            "signature": signature,
            "bookmark": {"function_call": tool_call_id},
        }),
    }
}

impl Decode for Decoder {
    fn event(&mut self, event: &SseEvent) -> Result<Vec<LlmEvent>, LlmError> {
        self.data(&event.data)
    }

    fn done(&self) -> bool {
        // The connection's close ends the stream.
        false
    }

    fn end(&mut self) -> Result<Vec<LlmEvent>, LlmError> {
        if !self.produced {
            return Err(LlmError::Provider(
                "the model returned an empty reply".into(),
            ));
        }
        let mut out = Vec::new();
        if let Some(usage) = self.usage.take() {
            out.push(LlmEvent::Usage(usage));
        }
        if let Some(reason) = self.stop.take() {
            out.push(LlmEvent::Finished(reason));
        }
        Ok(out)
    }
}

/// Gemini's `finishReason` as voxide's.
fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "STOP" => StopReason::Stop,
        "MAX_TOKENS" => StopReason::Length,
        // SAFETY, RECITATION, MALFORMED_FUNCTION_CALL, OTHER…: the answer is not whole.
        _ => StopReason::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&str]) -> Vec<LlmEvent> {
        let mut decoder = Decoder::new();
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(decoder.data(chunk).expect("valid chunk"));
        }
        out.extend(Decode::end(&mut decoder).expect("a reply"));
        out
    }

    #[test]
    fn text_with_the_last_usage_not_the_sum() {
        let events = run(&[
            r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"It is "}]},"index":0}],"usageMetadata":{"promptTokenCount":15,"candidatesTokenCount":2,"totalTokenCount":17}}"#,
            r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"noon."}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":15,"candidatesTokenCount":6,"thoughtsTokenCount":1,"cachedContentTokenCount":5,"totalTokenCount":22}}"#,
        ]);
        assert_eq!(
            events,
            [
                LlmEvent::Text("It is ".into()),
                LlmEvent::Text("noon.".into()),
                LlmEvent::Usage(TokenUsage {
                    input: 10,
                    output: 7,
                    cache_read: 5,
                    cache_write: 0
                }),
                LlmEvent::Finished(StopReason::Stop),
            ]
        );
    }

    #[test]
    fn parallel_calls_come_whole_with_their_signature_for_the_context() {
        let events = run(&[
            r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"get_current_time","args":{}},"thoughtSignature":"c2lnLWE="},{"functionCall":{"id":"fc_2","name":"calculate","args":{"expression":"17*23"}}}]},"finishReason":"STOP"}]}"#,
        ]);
        let LlmEvent::ProviderMessage(signature) = &events[0] else {
            panic!("a signature first: {events:?}");
        };
        let LlmEvent::ToolCall { id, name, .. } = &events[1] else {
            panic!("a call: {events:?}");
        };
        assert_eq!(name, "get_current_time");
        assert!(id.starts_with("call_"));
        assert_eq!(signature.llm, "gemini");
        assert_eq!(
            signature.message,
            json!({"type": "thought_signature", "signature": "c2lnLWE=", "bookmark": {"function_call": id}})
        );
        assert_eq!(
            events[2],
            LlmEvent::ToolCall {
                id: "fc_2".into(),
                name: "calculate".into(),
                arguments: r#"{"expression":"17*23"}"#.into()
            }
        );
    }

    #[test]
    fn thoughts_are_thinking_and_errors_say_whether_to_retry() {
        let events = run(&[
            r#"{"candidates":[{"content":{"parts":[{"text":"The user asks the time.","thought":true},{"text":"Noon."}]}}]}"#,
        ]);
        assert_eq!(
            &events[..2],
            [
                LlmEvent::Thinking("The user asks the time.".into()),
                LlmEvent::Text("Noon.".into())
            ]
        );
        let mut decoder = Decoder::new();
        assert!(matches!(
            decoder
                .data(r#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}"#),
            Err(LlmError::Busy(_))
        ));
        assert!(matches!(
            decoder.data(r#"{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}"#),
            Err(LlmError::Provider(_))
        ));
        assert!(matches!(
            decoder.data("{\"candidates\": ["),
            Err(LlmError::Protocol(_))
        ));
        let mut empty = Decoder::new();
        empty
            .data(r#"{"usageMetadata":{"promptTokenCount":3}}"#)
            .expect("usage alone is valid");
        assert!(Decode::end(&mut empty).is_err());
    }
}
