//! The chat stream stand-in (OpenAI-compatible or Anthropic) and the HTTP tool it calls.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::super::Protocol;
use super::StandIns;
use super::audit::Fault;
use super::strict::{self, Api};

/// The tool the OpenAI stream calls once a conversation when it is offered.
pub const TOOL: &str = "lookup_order";
/// How long the tool takes to answer.
pub const TOOL_DELAY: Duration = Duration::from_millis(300);

/// The marker of a question: the last user text of the request, without the full stop the
/// Deepgram stand-in's final puts after the turn's name.
fn marker(body: &Value) -> String {
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| &m["content"]);
    let text = match last {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    text.trim().trim_end_matches('.').to_owned()
}

/// The roles of a request's messages, in order (`system user assistant tool user`), an
/// async tool's messages marked by their status.
fn shape(messages: &[Value]) -> String {
    messages
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap_or("?");
            let status = m["content"]
                .as_str()
                .and_then(|c| serde_json::from_str::<Value>(c).ok())
                .filter(|v| v["type"] == "async_tool")
                .and_then(|v| v["status"].as_str().map(str::to_owned));
            match status {
                Some(status) => format!("{role}:{status}"),
                None => role.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a long answer tells, its words taken in turn as many times as it takes.
const STORY: &str = "once upon a time a dragon lived by the sea and every morning it baked \
    bread for the village below the hill where the people woke to the smell of warm loaves and \
    came to thank it";

/// A story of `words` words, in sentences of at most twelve.
fn story(words: usize) -> String {
    let mut text = String::new();
    for (i, word) in STORY.split_whitespace().cycle().take(words).enumerate() {
        let mut letters = word.chars();
        if i % 12 == 0
            && let Some(first) = letters.next()
        {
            text.extend(first.to_uppercase());
        }
        text.push_str(letters.as_str());
        let end = i + 1 == words || (i + 1) % 12 == 0;
        text.push_str(if end { ". " } else { " " });
    }
    text.trim_end().to_owned()
}

/// The stream of one answer: the first event holds the first token; the rest follow at once.
/// The answer begins with the last turn the question names, so that the TTS stand-in knows
/// which turn it speaks for; the rest is "it is noon.", or a story of `long` words.
fn answer(protocol: Protocol, question: &str, long: Option<usize>) -> (String, String) {
    let first_words = match super::audit::turns_named(question).pop() {
        Some(turn) => format!("{turn}: sure, "),
        None => "Sure, ".to_owned(),
    };
    let rest = long.map_or_else(|| "it is noon.".to_owned(), story);
    let sse = |name: Option<&str>, data: Value| match name {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    };
    match protocol {
        Protocol::Openai => {
            // Every chunk as the API writes it: its id, object, creation time and model.
            let chunk = |choices: Value, usage: Value| {
                sse(
                    None,
                    json!({"id": "chatcmpl-stand-in", "object": "chat.completion.chunk",
                        "created": 1_767_225_600, "model": "gpt-4o-mini",
                        "choices": choices, "usage": usage}),
                )
            };
            let delta = |content: &str| {
                json!([{"index": 0, "delta": {"content": content}, "finish_reason": null}])
            };
            (
                chunk(delta(&first_words), Value::Null),
                [
                    chunk(delta(&rest), Value::Null),
                    chunk(
                        json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
                        Value::Null,
                    ),
                    chunk(
                        json!([]),
                        json!({"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46}),
                    ),
                    "data: [DONE]\n\n".to_owned(),
                ]
                .concat(),
            )
        }
        Protocol::Anthropic => (
            [
                sse(
                    Some("message_start"),
                    json!({"type": "message_start", "message": {"usage": {"input_tokens": 40, "output_tokens": 1}}}),
                ),
                sse(
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                sse(
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": first_words}}),
                ),
            ]
            .concat(),
            [
                sse(
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": rest}}),
                ),
                sse(
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                sse(
                    Some("message_delta"),
                    json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}}),
                ),
                sse(Some("message_stop"), json!({"type": "message_stop"})),
            ]
            .concat(),
        ),
    }
}

/// The first chunk of a tool call to [`TOOL`] with id `call`, and the rest of the stream.
fn tool_call(call: &str) -> (String, String) {
    let chunk = |delta: Value, finish: Value| {
        let data = json!({"id": "chatcmpl-stand-in", "object": "chat.completion.chunk",
            "created": 1_767_225_600, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {data}\n\n")
    };
    let call_start = json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
        "id": call, "type": "function", "function": {"name": TOOL, "arguments": ""}}]});
    let arguments = json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]});
    (
        chunk(call_start, Value::Null),
        [
            chunk(arguments, Value::Null),
            chunk(json!({}), json!("tool_calls")),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat(),
    )
}

/// Whether an OpenAI request offers [`TOOL`] to a conversation that has not called a tool yet.
fn calls_tool(protocol: Protocol, request: &Value, messages: &[Value]) -> bool {
    let offered = request["tools"]
        .as_array()
        .is_some_and(|tools| tools.iter().any(|t| t["function"]["name"] == TOOL));
    protocol == Protocol::Openai
        && offered
        && !messages.iter().any(|m| m.get("tool_calls").is_some())
}

/// The chat stream: the first token `delay` after the request. As faults, a request is refused
/// (429 with `retry-after`, 500, 503) or its first token comes past the client's deadline.
pub(super) async fn chat(State(stand_ins): State<StandIns>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let key = marker(&request);
    if let Some(refusal) = stand_ins.refused(Fault::RequestRefused) {
        stand_ins.ledger().struck(&key);
        return refusal;
    }
    let api = match stand_ins.protocol {
        Protocol::Openai => Api::OpenAi,
        Protocol::Anthropic => Api::Anthropic,
    };
    // The stand-in's replies have no thinking blocks to be sent back.
    if let Err(refusal) = strict::check(api, &request, &strict::Thinking::new()) {
        tracing::warn!(%refusal, "the chat stand-in refused a request as the real API would");
        return api.refusal(&refusal);
    }
    stand_ins.note(arrived, key.clone(), |log| &mut log.request_arrived);
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let late = stand_ins.faults.strike(Fault::FirstTokenLate);
    let (first, rest) = {
        let mut ledger = stand_ins.ledger();
        if late {
            ledger.struck(&key);
        }
        ledger.delivered(&messages);
        let last = messages.last();
        if !late && last.is_some_and(|m| m["role"] == "user") {
            ledger.answered_as(&key, &shape(&messages), arrived.into_std());
        } else if !late && last.is_some_and(|m| m["role"] == "tool" || m["role"] == "developer") {
            ledger.followed_up();
        }
        if calls_tool(stand_ins.protocol, &request, &messages) {
            ledger.tool_called();
            let call = stand_ins.sockets.fetch_add(1, Ordering::Relaxed);
            tool_call(&format!("call_stand_in_{call}"))
        } else {
            answer(stand_ins.protocol, &key, stand_ins.options.long_answers)
        }
    };
    let delay = if late {
        stand_ins.faults.late()
    } else {
        stand_ins.delays.llm
    };
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, Infallible>>(4);
    tokio::spawn(async move {
        super::until(arrived + delay).await;
        stand_ins.note(Instant::now(), key, |log| &mut log.first_token_sent);
        let _ = tx.send(Ok(Bytes::from(first))).await;
        let _ = tx.send(Ok(Bytes::from(rest))).await;
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// The HTTP tool: answers [`TOOL_DELAY`] after it is called, and notes the call finished.
pub(super) async fn tool(State(stand_ins): State<StandIns>, Json(call): Json<Value>) -> Response {
    tokio::time::sleep(TOOL_DELAY).await;
    let id = call["tool_call_id"].as_str().unwrap_or_default().to_owned();
    stand_ins.ledger().tool_finished(&id);
    Json(json!({"order": "A-1042", "status": "shipped", "arrives": "tomorrow"})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_answer_tells_as_many_words_as_asked_in_short_sentences() {
        let text = story(30);
        assert_eq!(text.split_whitespace().count(), 30);
        let sentences: Vec<&str> = text.split_terminator('.').collect();
        assert_eq!(sentences.len(), 3, "{text}");
        assert!(sentences.iter().all(|s| s.split_whitespace().count() <= 12));
        assert!(text.ends_with('.'));
        assert!(text.starts_with("Once upon a time"), "{text}");
        assert!(text.contains(". Morning"), "{text}");
    }

    #[test]
    fn an_openai_answer_streams_the_story_after_its_first_words() {
        let (first, rest) = answer(Protocol::Openai, "What time is it?", Some(20));
        assert!(first.contains("Sure, "));
        assert!(rest.contains(&story(20)), "{rest}");
        let (_, plain) = answer(Protocol::Openai, "What time is it?", None);
        assert!(plain.contains("it is noon."));
    }
}
