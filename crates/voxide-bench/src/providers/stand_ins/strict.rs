//! The request rules the real chat APIs enforce with a 400, for stand-ins as strict as they are.
//!
//! Each rule is read from the provider's documentation or its own error text (quoted), and is
//! checked on the request body as it arrives, independently of how voxide builds it:
//! - OpenAI chat completions: "messages with role 'tool' must be a response to a preceeding
//!   message with 'tool_calls'" (sic), and "an assistant message with 'tool_calls' must be
//!   followed by tool messages responding to each 'tool_call_id'".
//! - Anthropic messages: roles alternate; "each `tool_result` block must have a corresponding
//!   `tool_use` block in the previous message" and "each `tool_use` block must have a
//!   corresponding `tool_result` block in the next message"; Claude 4.6 and later: "This model
//!   does not support assistant message prefill. The conversation must end with a user message.";
//!   with thinking: "`thinking` or `redacted_thinking` blocks in the latest assistant message
//!   cannot be modified", and the blocks must be passed back with the `tool_use` they led to.
//! - Gemini `generateContent`: "Please ensure that multiturn requests alternate between user and
//!   model."; "Please ensure that the number of function response parts is equal to the number of
//!   function call parts of the function call turn."; and, as for Anthropic here, the request
//!   ends on a user turn.

use std::collections::HashMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Which API a request was made to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI chat completions (`/chat/completions`).
    OpenAi,
    /// Anthropic messages (`/v1/messages`).
    Anthropic,
    /// Gemini (`:streamGenerateContent`).
    Gemini,
}

impl Api {
    /// The API a request path belongs to.
    pub fn of_path(path: &str) -> Option<Api> {
        if path.ends_with("/chat/completions") {
            Some(Api::OpenAi)
        } else if path.ends_with("/v1/messages") {
            Some(Api::Anthropic)
        } else if path.contains(":streamGenerateContent") || path.contains(":generateContent") {
            Some(Api::Gemini)
        } else {
            None
        }
    }

    /// The 400 the provider answers, in its own error shape.
    pub fn refusal(self, message: &str) -> Response {
        let body = match self {
            Api::OpenAi => json!({"error": {"message": message, "type": "invalid_request_error",
                "param": "messages", "code": null}}),
            Api::Anthropic => json!({"type": "error",
                "error": {"type": "invalid_request_error", "message": message}}),
            Api::Gemini => {
                json!({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})
            }
        };
        (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
    }
}

/// The thinking blocks a stand-in sent, by the id of the `tool_use` they came before.
pub type Thinking = HashMap<String, Vec<Value>>;

/// Why the provider would refuse `body`, or `Ok`. `thinking`: what the stand-in sent so far
/// (Anthropic only).
pub fn check(api: Api, body: &Value, thinking: &Thinking) -> Result<(), String> {
    match api {
        Api::OpenAi => openai(body),
        Api::Anthropic => anthropic(body, thinking),
        Api::Gemini => gemini(body),
    }
}

fn openai(body: &Value) -> Result<(), String> {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    for (i, message) in messages.iter().enumerate() {
        if message["role"] == "tool" {
            let id = message["tool_call_id"].as_str().unwrap_or_default();
            let answered = messages[..i]
                .iter()
                .rev()
                .find(|m| m["role"] != "tool")
                .is_some_and(|m| call_ids(m).contains(&id));
            if !answered {
                return Err(format!(
                    "Invalid parameter: messages with role 'tool' must be a response to a \
                     preceeding message with 'tool_calls'. (messages.[{i}], {id})"
                ));
            }
        }
        let calls = call_ids(message);
        if !calls.is_empty() {
            let answers: Vec<&str> = messages[i + 1..]
                .iter()
                .take_while(|m| m["role"] == "tool")
                .filter_map(|m| m["tool_call_id"].as_str())
                .collect();
            let missing: Vec<&str> = calls
                .iter()
                .copied()
                .filter(|id| !answers.contains(id))
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "An assistant message with 'tool_calls' must be followed by tool messages \
                     responding to each 'tool_call_id'. The following tool_call_ids did not have \
                     response messages: {}",
                    missing.join(", ")
                ));
            }
        }
    }
    Ok(())
}

fn call_ids(message: &Value) -> Vec<&str> {
    message["tool_calls"]
        .as_array()
        .map(|calls| calls.iter().filter_map(|c| c["id"].as_str()).collect())
        .unwrap_or_default()
}

/// One turn's blocks or parts.
fn pieces<'a>(turn: &'a Value, key: &str) -> Vec<&'a Value> {
    match &turn[key] {
        Value::Array(pieces) => pieces.iter().collect(),
        Value::Null => Vec::new(),
        other => vec![other],
    }
}

fn ids<'a>(pieces: &[&'a Value], pointer: &str) -> Vec<&'a str> {
    pieces
        .iter()
        .filter_map(|p| p.pointer(pointer).and_then(Value::as_str))
        .collect()
}

fn anthropic(body: &Value, thinking: &Thinking) -> Result<(), String> {
    let turns = body["messages"].as_array().cloned().unwrap_or_default();
    if turns.is_empty() {
        return Err("messages: at least one message is required".into());
    }
    let last_assistant = turns.iter().rposition(|t| t["role"] == "assistant");
    for (i, turn) in turns.iter().enumerate() {
        let role = turn["role"].as_str().unwrap_or_default();
        if i > 0 && turns[i - 1]["role"] == role {
            return Err(format!(
                "messages: roles must alternate between \"user\" and \"assistant\", but found \
                 multiple \"{role}\" roles in a row"
            ));
        }
        let blocks = pieces(turn, "content");
        let uses: Vec<&Value> = blocks
            .iter()
            .copied()
            .filter(|b| b["type"] == "tool_use")
            .collect();
        let results: Vec<&Value> = blocks
            .iter()
            .copied()
            .filter(|b| b["type"] == "tool_result")
            .collect();
        let asked = match i.checked_sub(1).map(|p| &turns[p]) {
            Some(before) if before["role"] == "assistant" => {
                let before = pieces(before, "content");
                let uses: Vec<&Value> = before
                    .into_iter()
                    .filter(|b| b["type"] == "tool_use")
                    .collect();
                ids(&uses, "/id")
            }
            _ => Vec::new(),
        };
        for id in ids(&results, "/tool_use_id") {
            if !asked.contains(&id) {
                return Err(format!(
                    "messages.{i}.content: unexpected `tool_use_id` found in `tool_result` \
                     blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` \
                     block in the previous message."
                ));
            }
        }
        let uses = ids(&uses, "/id");
        if !uses.is_empty() {
            let next = turns.get(i + 1).map(|t| pieces(t, "content"));
            let answered: Vec<&str> = next
                .map(|blocks| {
                    let results: Vec<&Value> = blocks
                        .into_iter()
                        .filter(|b| b["type"] == "tool_result")
                        .collect();
                    ids(&results, "/tool_use_id")
                })
                .unwrap_or_default();
            if let Some(id) = uses.iter().find(|id| !answered.contains(id)) {
                return Err(format!(
                    "messages.{i}: `tool_use` ids were found without `tool_result` blocks \
                     immediately after: {id}. Each `tool_use` block must have a corresponding \
                     `tool_result` block in the next message."
                ));
            }
        }
        if Some(i) == last_assistant {
            // The thinking that led to these calls, as it was sent, before them.
            let sent: Vec<&Value> = uses
                .iter()
                .filter_map(|id| thinking.get(*id))
                .flatten()
                .collect();
            let kept: Vec<&Value> = blocks
                .iter()
                .copied()
                .filter(|b| b["type"] == "thinking" || b["type"] == "redacted_thinking")
                .collect();
            if kept != sent
                || blocks
                    .iter()
                    .take(kept.len())
                    .copied()
                    .ne(kept.iter().copied())
            {
                return Err(format!(
                    "messages.{i}.content: `thinking` or `redacted_thinking` blocks in the latest \
                     assistant message cannot be modified. These blocks must remain as they were \
                     in the original response."
                ));
            }
        }
    }
    if turns.last().is_some_and(|t| t["role"] == "assistant") {
        return Err(
            "This model does not support assistant message prefill. The conversation \
                    must end with a user message."
                .into(),
        );
    }
    Ok(())
}

fn gemini(body: &Value) -> Result<(), String> {
    let turns = body["contents"].as_array().cloned().unwrap_or_default();
    if turns.is_empty() {
        return Err("* GenerateContentRequest.contents: contents is not specified".into());
    }
    for (i, turn) in turns.iter().enumerate() {
        if i > 0 && turns[i - 1]["role"] == turn["role"] {
            return Err(
                "Please ensure that multiturn requests alternate between user and model.".into(),
            );
        }
        let calls = ids(&pieces(turn, "parts"), "/functionCall/name");
        if !calls.is_empty() {
            let responses = turns
                .get(i + 1)
                .map(|t| ids(&pieces(t, "parts"), "/functionResponse/name").len())
                .unwrap_or_default();
            if responses != calls.len() {
                return Err(
                    "Please ensure that the number of function response parts is equal \
                            to the number of function call parts of the function call turn."
                        .into(),
                );
            }
        }
    }
    if turns.last().is_some_and(|t| t["role"] == "model") {
        return Err("Please ensure that the request ends with a user turn.".into());
    }
    Ok(())
}

/// The thinking blocks of an Anthropic event stream a stand-in sends, by the id of the
/// `tool_use` that follows them.
pub fn thinking_in(stream: &str) -> Thinking {
    let mut out = Thinking::new();
    let mut open: HashMap<u64, Value> = HashMap::new();
    let mut done: Vec<Value> = Vec::new();
    let events = stream
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok());
    for event in events {
        let index = event["index"].as_u64().unwrap_or_default();
        match event["type"].as_str().unwrap_or_default() {
            "content_block_start" => {
                let block = &event["content_block"];
                match block["type"].as_str().unwrap_or_default() {
                    "thinking" | "redacted_thinking" => {
                        open.insert(index, block.clone());
                    }
                    "tool_use" if !done.is_empty() => {
                        let id = block["id"].as_str().unwrap_or_default().to_owned();
                        out.insert(id, std::mem::take(&mut done));
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let Some(block) = open.get_mut(&index) else {
                    continue;
                };
                let delta = &event["delta"];
                for (kind, field) in [
                    ("thinking_delta", "thinking"),
                    ("signature_delta", "signature"),
                ] {
                    if delta["type"] == kind {
                        let piece = delta[field].as_str().unwrap_or_default();
                        let text = block[field].as_str().unwrap_or_default().to_owned() + piece;
                        block[field] = Value::String(text);
                    }
                }
            }
            "content_block_stop" => done.extend(open.remove(&index)),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_thinking() -> Thinking {
        Thinking::new()
    }

    #[test]
    fn an_anthropic_request_ending_on_the_assistant_is_refused_as_claude_4_6_refuses_it() {
        let body = json!({"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}]}
        ]});
        let refused = check(Api::Anthropic, &body, &no_thinking()).expect_err("a prefill");
        assert!(
            refused.contains("must end with a user message"),
            "{refused}"
        );
    }

    #[test]
    fn an_anthropic_result_must_answer_the_turn_right_before_it() {
        let body = json!({"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}]}
        ]});
        let refused = check(Api::Anthropic, &body, &no_thinking()).expect_err("a stray result");
        assert!(refused.contains("unexpected `tool_use_id`"), "{refused}");
        let valid = json!({"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}]}
        ]});
        assert_eq!(check(Api::Anthropic, &valid, &no_thinking()), Ok(()));
    }

    #[test]
    fn anthropic_thinking_dropped_or_changed_before_its_call_is_refused() {
        let stream = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Hm.\"}}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig\"}}\n\n\
            event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
            event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":{}}}\n\n";
        let thinking = thinking_in(stream);
        let block = json!({"type": "thinking", "thinking": "Hm.", "signature": "sig"});
        assert_eq!(thinking["a"], std::slice::from_ref(&block));
        let with = |blocks: Vec<Value>| {
            let mut content = blocks;
            content.push(json!({"type": "tool_use", "id": "a", "name": "f", "input": {}}));
            json!({"messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}]}
            ]})
        };
        assert_eq!(check(Api::Anthropic, &with(vec![block]), &thinking), Ok(()));
        let changed = json!({"type": "thinking", "thinking": "Hm!", "signature": "sig"});
        assert!(check(Api::Anthropic, &with(vec![changed]), &thinking).is_err());
        assert!(check(Api::Anthropic, &with(vec![]), &thinking).is_err());
    }

    #[test]
    fn an_openai_tool_message_needs_its_call_and_every_call_its_result() {
        let call = json!({"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        let result = json!({"role": "tool", "tool_call_id": "a", "content": "1"});
        let user = json!({"role": "user", "content": "Hi"});
        let valid = json!({"messages": [user, call, result]});
        assert_eq!(check(Api::OpenAi, &valid, &no_thinking()), Ok(()));
        let orphan = json!({"messages": [user, result]});
        assert!(check(Api::OpenAi, &orphan, &no_thinking()).is_err());
        let unanswered = json!({"messages": [user, call, user]});
        assert!(check(Api::OpenAi, &unanswered, &no_thinking()).is_err());
    }

    #[test]
    fn gemini_turns_alternate_and_end_on_the_user() {
        let user = json!({"role": "user", "parts": [{"text": "Hi"}]});
        let model = json!({"role": "model", "parts": [{"text": "Hello"}]});
        assert!(
            check(
                Api::Gemini,
                &json!({"contents": [user, model]}),
                &no_thinking()
            )
            .is_err()
        );
        assert!(
            check(
                Api::Gemini,
                &json!({"contents": [user, user]}),
                &no_thinking()
            )
            .is_err()
        );
        assert_eq!(
            check(
                Api::Gemini,
                &json!({"contents": [user, model, user]}),
                &no_thinking()
            ),
            Ok(())
        );
    }
}
