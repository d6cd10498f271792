//! The text LLMs over HTTP (OpenAI-compatible, Anthropic, Gemini) against local stand-ins that
//! speak each stream as the provider documents it: server-sent events split at arbitrary byte
//! boundaries, CRLF line ends, `: ping` comments, text, one and two parallel tool calls, a 429 or
//! 529 before success, a malformed chunk, a stream that stalls; then the fallback from one
//! engine to the next and the connection warmed before the first turn.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};

use common::llm_stand_in::{Reply, Seen, start as stand_in};
use voxide::context::{Message, StopReason, ToolsSchema};
use voxide::services::llm::openai::{OpenAiLlm, OpenAiSettings};
use voxide::services::llm::{LlmEngine, LlmError, LlmEvent, LlmRequest, Timing};

fn engine(addr: SocketAddr) -> OpenAiLlm {
    OpenAiLlm::new(OpenAiSettings {
        base_url: format!("http://{addr}/v1"),
        api_key: Some("sk-test".into()),
        model: "test-model".into(),
        max_tokens: Some(128),
        timing: Timing {
            first_chunk_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            retries: 2,
            hedge_after: None,
        },
        ..OpenAiSettings::default()
    })
    .expect("engine")
}

fn request() -> LlmRequest {
    LlmRequest {
        messages: vec![
            Message::system("Be brief."),
            Message::user("What time is it, and what is seventeen times twenty-three?"),
        ],
        tools: ToolsSchema::default(),
        tool_choice: None,
    }
}

async fn complete(engine: &dyn LlmEngine) -> Vec<Result<LlmEvent, LlmError>> {
    engine.generate(request()).collect().await
}

/// `data:` lines as OpenAI sends them, with CRLF line ends and a keepalive comment between.
fn sse(chunks: &[Value]) -> String {
    let mut out = String::from(": ping\r\n\r\n");
    for chunk in chunks {
        out.push_str(&format!("data: {chunk}\r\n\r\n"));
    }
    out.push_str("data: [DONE]\r\n\r\n");
    out
}

fn text_answer() -> String {
    sse(&[
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "It is noon."}}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 4}}),
    ])
}

#[tokio::test]
async fn a_streamed_answer_arrives_whole_however_the_bytes_are_cut() {
    for piece in [1, 7, 4096] {
        let (addr, stand_in) = stand_in(vec![Reply::Stream(text_answer(), piece)]).await;
        let events = complete(&engine(addr)).await;
        let events: Vec<LlmEvent> = events.into_iter().map(|e| e.expect("event")).collect();
        assert_eq!(events[0], LlmEvent::Text("It is noon.".into()), "{piece}");
        assert_eq!(events[1], LlmEvent::Finished(StopReason::Stop));
        assert!(matches!(&events[2], LlmEvent::Usage(u) if u.input == 30 && u.output == 4));
        // The request: the model, streamed with usage, the token limit, the bearer key.
        let seen = stand_in.posts()[0].clone();
        let (headers, body) = (seen.headers, seen.body);
        assert_eq!(seen.uri.path(), "/v1/chat/completions");
        assert_eq!(headers["authorization"], "Bearer sk-test");
        assert_eq!(body["model"], "test-model");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["max_tokens"], 128);
        assert_eq!(body["messages"][0]["role"], "system");
        assert_eq!(body["messages"][1]["role"], "user");
    }
}

#[tokio::test]
async fn two_parallel_tool_calls_come_out_as_two_calls() {
    let stream = sse(&[
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_t", "type": "function",
            "function": {"name": "get_current_time", "arguments": ""}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "call_c", "type": "function",
            "function": {"name": "calculate", "arguments": "{\"expression\":"}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": " \"17*23\"}"}}]}}]}),
        json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
    ]);
    let (addr, _) = stand_in(vec![Reply::Stream(stream, 5)]).await;
    assert_time_and_product(&answer(&engine(addr)).await);
}

#[tokio::test]
async fn a_429_before_the_first_token_is_retried() {
    let (addr, stand_in) = stand_in(vec![
        Reply::Status(429, r#"{"error":{"message":"rate limited"}}"#),
        Reply::Stream(text_answer(), 64),
    ])
    .await;
    let events = complete(&engine(addr)).await;
    assert_eq!(
        events[0].as_ref().expect("an answer after the retry"),
        &LlmEvent::Text("It is noon.".into())
    );
    assert_eq!(stand_in.posts().len(), 2);
}

#[tokio::test]
async fn a_request_dropped_while_it_waits_to_be_retried_is_not_sent_again() {
    // The first attempt is refused for a second; the reader goes (a guess thrown away) while
    // the request waits it out.
    let (addr, stand_in) = stand_in(vec![Reply::Busy(1), Reply::Stream(text_answer(), 64)]).await;
    let engine = engine(addr);
    let stream = engine.generate(request());
    let refused = tokio::time::Instant::now() + Duration::from_secs(10);
    while stand_in.posts().is_empty() {
        assert!(
            tokio::time::Instant::now() < refused,
            "the first attempt never came"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(stream);
    // Twice the wait: a retry would have come.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(
        stand_in.posts().len(),
        1,
        "asked again after the reader had gone"
    );
}

#[tokio::test]
async fn a_client_error_is_not_retried_and_says_what_the_server_said() {
    let (addr, stand_in) = stand_in(vec![Reply::Status(
        401,
        r#"{"error":{"message":"Incorrect API key provided"}}"#,
    )])
    .await;
    let events = complete(&engine(addr)).await;
    match &events[..] {
        [Err(LlmError::Provider(message))] => {
            assert!(message.contains("401"), "{message}");
            assert!(message.contains("Incorrect API key"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(stand_in.posts().len(), 1);
}

#[tokio::test]
async fn a_malformed_chunk_is_a_clear_error() {
    let stream = "data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n\ndata: {\"choices\": [{\"del\n\n";
    let (addr, _) = stand_in(vec![Reply::Stream(stream.into(), 9)]).await;
    let events = complete(&engine(addr)).await;
    assert_eq!(
        events[0].as_ref().expect("the first chunk"),
        &LlmEvent::Text("Hi".into())
    );
    assert!(
        matches!(events.last(), Some(Err(LlmError::Protocol(_)))),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_stream_that_stalls_ends_in_an_error_not_a_hang() {
    let first = "data: {\"choices\": [{\"delta\": {\"content\": \"It is\"}}]}\n\n";
    let (addr, _) = stand_in(vec![Reply::Stall(first.into())]).await;
    let engine = OpenAiLlm::new(OpenAiSettings {
        base_url: format!("http://{addr}/v1"),
        timing: Timing {
            idle_timeout: Duration::from_millis(300),
            ..Timing::default()
        },
        ..OpenAiSettings::default()
    })
    .expect("engine");
    let events = complete(&engine).await;
    assert_eq!(
        events[0].as_ref().expect("the first chunk"),
        &LlmEvent::Text("It is".into())
    );
    assert!(
        matches!(events.last(), Some(Err(LlmError::Connection(m))) if m.contains("stalled")),
        "{events:?}"
    );
}

#[tokio::test]
async fn no_first_chunk_in_time_is_retried_then_an_error() {
    let (addr, stand_in) = stand_in(vec![Reply::Stall(": nothing yet\n\n".into())]).await;
    let engine = OpenAiLlm::new(OpenAiSettings {
        base_url: format!("http://{addr}/v1"),
        timing: Timing {
            first_chunk_timeout: Duration::from_millis(300),
            retries: 1,
            ..Timing::default()
        },
        ..OpenAiSettings::default()
    })
    .expect("engine");
    let events = complete(&engine).await;
    assert!(
        matches!(&events[..], [Err(LlmError::Connection(m))] if m.contains("no answer")),
        "{events:?}"
    );
    assert_eq!(stand_in.posts().len(), 2);
}

#[tokio::test]
async fn a_late_first_token_is_hedged_by_a_second_request_whose_answer_is_read() {
    let answer = sse(&[json!({"choices": [{"delta": {"content": "It is noon."}}]})]);
    let (addr, stand_in) = stand_in(vec![
        Reply::Stall(": thinking\n\n".into()),
        Reply::Stream(answer, 64),
    ])
    .await;
    let engine = OpenAiLlm::new(OpenAiSettings {
        base_url: format!("http://{addr}/v1"),
        timing: Timing {
            // Past the test's own patience: only the hedge can answer in time.
            first_chunk_timeout: Duration::from_secs(60),
            hedge_after: Some(Duration::from_millis(100)),
            ..Timing::default()
        },
        ..OpenAiSettings::default()
    })
    .expect("engine");
    let events = tokio::time::timeout(Duration::from_secs(30), complete(&engine))
        .await
        .expect("the hedge answered before the first request's deadline");
    assert_eq!(
        events[0].as_ref().expect("the hedge's answer"),
        &LlmEvent::Text("It is noon.".into())
    );
    let posts = stand_in.posts();
    assert_eq!(posts.len(), 2, "the request and its hedge");
    assert_eq!(posts[0].body, posts[1].body, "the same request, sent twice");
}

#[tokio::test]
async fn a_request_that_is_refused_is_retried_not_hedged() {
    let answer = sse(&[json!({"choices": [{"delta": {"content": "Here."}}]})]);
    let (addr, stand_in) = stand_in(vec![
        Reply::Status(503, r#"{"error":{"message":"busy"}}"#),
        Reply::Stream(answer, 64),
    ])
    .await;
    let engine = OpenAiLlm::new(OpenAiSettings {
        base_url: format!("http://{addr}/v1"),
        timing: Timing {
            hedge_after: Some(Duration::from_secs(60)),
            ..Timing::default()
        },
        ..OpenAiSettings::default()
    })
    .expect("engine");
    let events = complete(&engine).await;
    assert_eq!(
        events[0].as_ref().expect("the retry's answer"),
        &LlmEvent::Text("Here.".into())
    );
    assert_eq!(stand_in.posts().len(), 2);
}

#[tokio::test]
async fn an_empty_completion_is_an_error() {
    let stream = sse(&[json!({"choices": [{"delta": {}, "finish_reason": "stop"}]})]);
    let (addr, _) = stand_in(vec![Reply::Stream(stream, 64)]).await;
    let events = complete(&engine(addr)).await;
    assert!(
        matches!(events.last(), Some(Err(LlmError::Provider(m))) if m.contains("empty")),
        "{events:?}"
    );
}

/// The events of a completion that must succeed.
async fn answer(engine: &dyn LlmEngine) -> Vec<LlmEvent> {
    complete(engine)
        .await
        .into_iter()
        .map(|e| e.expect("event"))
        .collect()
}

/// The two calls of "what time is it, and what is seventeen times twenty-three?", in one reply.
fn assert_time_and_product(events: &[LlmEvent]) {
    assert_eq!(
        calls(events),
        [
            ("get_current_time".to_owned(), "{}".to_owned()),
            (
                "calculate".to_owned(),
                "{\"expression\": \"17*23\"}".to_owned()
            )
        ]
    );
    assert_eq!(
        events.last(),
        Some(&LlmEvent::Finished(StopReason::ToolUse))
    );
}

fn calls(events: &[LlmEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            LlmEvent::ToolCall {
                name, arguments, ..
            } => Some((name.clone(), arguments.clone())),
            _ => None,
        })
        .collect()
}

/// A conversation with an async tool's *started* and *final* messages after a call.
fn with_async_tool_messages() -> LlmRequest {
    use voxide::context::async_tool_messages::{build_final_result_message, build_started_message};
    use voxide::context::{AssistantMessage, ToolCall};
    let call = ToolCall::function("call_timer", "set_timer", &json!({"seconds": 5}));
    LlmRequest {
        messages: vec![
            Message::system("Be brief."),
            Message::user("Set a timer for five seconds."),
            Message::Assistant(AssistantMessage {
                tool_calls: Some(vec![call]),
                ..AssistantMessage::default()
            }),
            build_started_message("call_timer"),
            Message::assistant("Timer set."),
            build_final_result_message("call_timer", Some(&json!("ring"))),
        ],
        tools: ToolsSchema::default(),
        tool_choice: None,
    }
}

mod anthropic {
    use super::*;
    use voxide::services::llm::anthropic::{AnthropicLlm, AnthropicSettings};

    fn engine(addr: SocketAddr) -> AnthropicLlm {
        engine_with(addr, Timing::default())
    }

    fn engine_with(addr: SocketAddr, timing: Timing) -> AnthropicLlm {
        AnthropicLlm::new(AnthropicSettings {
            base_url: format!("http://{addr}"),
            model: "claude-test".into(),
            max_tokens: 256,
            timing,
            ..AnthropicSettings::new("sk-ant-test")
        })
        .expect("engine")
    }

    fn start() -> (Option<&'static str>, Value) {
        (
            Some("message_start"),
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "content": [], "model": "claude-test", "stop_reason": null,
                "stop_sequence": null, "usage": {"input_tokens": 25, "output_tokens": 1,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5}}}),
        )
    }

    fn stop(reason: &str, output: u64) -> [(Option<&'static str>, Value); 2] {
        [
            (
                Some("message_delta"),
                json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null},
                    "usage": {"output_tokens": output}}),
            ),
            (Some("message_stop"), json!({"type": "message_stop"})),
        ]
    }

    pub fn text_answer(text: &str) -> String {
        let mut events = vec![
            start(),
            (
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            (Some("ping"), json!({"type": "ping"})),
            (
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
            ),
            (
                Some("content_block_stop"),
                json!({"type": "content_block_stop", "index": 0}),
            ),
        ];
        events.extend(stop("end_turn", 9));
        events_text(&events)
    }

    pub fn events_text(events: &[(Option<&str>, Value)]) -> String {
        common::llm_stand_in::events(events)
    }

    /// Two `tool_use` blocks in one reply, their input streamed in pieces.
    pub fn two_calls() -> String {
        calls_after(None)
    }

    /// A text block, then the two `tool_use` blocks, as Claude often answers.
    pub fn text_then_two_calls(text: &str) -> String {
        calls_after(Some(text))
    }

    fn calls_after(text: Option<&str>) -> String {
        let mut events = vec![start()];
        let first = usize::from(text.is_some());
        if let Some(text) = text {
            events.extend([
                (
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                (
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
                ),
                (
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": 0}),
                ),
            ]);
        }
        for (index, id, name, pieces) in [
            (first, "toolu_time", "get_current_time", vec![""]),
            (
                first + 1,
                "toolu_calc",
                "calculate",
                vec!["{\"expression\": ", "\"17*23\"}"],
            ),
        ] {
            events.push((
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
            ));
            for piece in pieces {
                events.push((
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece}}),
                ));
            }
            events.push((
                Some("content_block_stop"),
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
        events.extend(stop("tool_use", 40));
        events_text(&events)
    }

    #[tokio::test]
    async fn a_streamed_answer_arrives_whole_however_the_bytes_are_cut() {
        for piece in [1, 9, 4096] {
            let (addr, stand_in) =
                stand_in(vec![Reply::Stream(text_answer("It is noon."), piece)]).await;
            let events = answer(&engine(addr)).await;
            assert_eq!(events[0], LlmEvent::Text("It is noon.".into()), "{piece}");
            assert!(matches!(&events[1], LlmEvent::Usage(u)
                if u.input == 25 && u.output == 9 && u.cache_read == 5));
            assert_eq!(events[2], LlmEvent::Finished(StopReason::Stop));
            let seen = stand_in.posts()[0].clone();
            assert_eq!(seen.uri.path(), "/v1/messages");
            assert_eq!(seen.headers["x-api-key"], "sk-ant-test");
            assert_eq!(seen.headers["anthropic-version"], "2023-06-01");
            assert_eq!(seen.body["model"], "claude-test");
            assert_eq!(seen.body["max_tokens"], 256);
            assert_eq!(seen.body["stream"], true);
            // Instructions at the top level, never a message.
            assert_eq!(seen.body["system"], "Be brief.");
            assert_eq!(seen.body["messages"][0]["role"], "user");
        }
    }

    #[tokio::test]
    async fn two_tool_uses_in_one_reply_both_come_out() {
        let (addr, _) = stand_in(vec![Reply::Stream(two_calls(), 7)]).await;
        assert_time_and_product(&answer(&engine(addr)).await);
    }

    #[tokio::test]
    async fn overloaded_before_the_first_token_is_retried_as_529_or_as_an_event() {
        let overloaded = events_text(&[
            start(),
            (
                Some("error"),
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
        ]);
        let (addr, stand_in) = stand_in(vec![
            Reply::Status(
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
            Reply::Stream(overloaded, 64),
            Reply::Stream(text_answer("Here."), 64),
        ])
        .await;
        let events = answer(&engine(addr)).await;
        assert_eq!(events[0], LlmEvent::Text("Here.".into()));
        // One usage report: the failed attempt's is not counted.
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, LlmEvent::Usage(_)))
                .count(),
            1
        );
        assert_eq!(stand_in.posts().len(), 3);
    }

    #[tokio::test]
    async fn a_bad_key_is_said_at_once_and_a_malformed_event_is_a_clear_error() {
        let (addr, log) = stand_in(vec![Reply::Status(
            401,
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
        )])
        .await;
        let events = complete(&engine(addr)).await;
        assert!(
            matches!(&events[..], [Err(LlmError::Provider(m))] if m.contains("invalid x-api-key")),
            "{events:?}"
        );
        assert_eq!(log.posts().len(), 1);

        let broken = "event: content_block_delta\r\ndata: {\"type\": \"content_block_delta\", \"index\r\n\r\n";
        let (addr, _) = stand_in(vec![Reply::Stream(broken.into(), 16)]).await;
        let events = complete(&engine(addr)).await;
        assert!(
            matches!(events.last(), Some(Err(LlmError::Protocol(_)))),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn a_stream_that_stalls_ends_in_an_error_not_a_hang() {
        let first = events_text(&[
            start(),
            (
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "It is"}}),
            ),
        ]);
        let (addr, _) = stand_in(vec![Reply::Stall(first)]).await;
        let timing = Timing {
            idle_timeout: Duration::from_millis(300),
            ..Timing::default()
        };
        let events = complete(&engine_with(addr, timing)).await;
        assert_eq!(
            events[0].as_ref().expect("the first text"),
            &LlmEvent::Text("It is".into())
        );
        assert!(
            matches!(events.last(), Some(Err(LlmError::Connection(m))) if m.contains("stalled")),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn async_tool_messages_go_as_a_tool_result_then_user_text() {
        let (addr, stand_in) = stand_in(vec![Reply::Stream(text_answer("It rang."), 64)]).await;
        let events: Vec<_> = engine(addr)
            .generate(with_async_tool_messages())
            .collect()
            .await;
        assert!(events.iter().all(Result::is_ok), "{events:?}");
        let body = stand_in.posts()[0].body.clone();
        let messages = body["messages"].as_array().expect("messages");
        let roles: Vec<&str> = messages
            .iter()
            .map(|m| m["role"].as_str().expect("role"))
            .collect();
        // Alternating, and the call answered by the very next user turn.
        assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
        assert_eq!(messages[1]["content"][0]["type"], "tool_use");
        let result = &messages[2]["content"][0];
        assert_eq!(result["type"], "tool_result");
        assert_eq!(result["tool_use_id"], "call_timer");
        assert!(
            result["content"]
                .as_str()
                .expect("text")
                .contains("\"status\": \"running\"")
        );
        let last = messages[4]["content"][0]["text"].as_str().expect("text");
        assert!(last.contains("\"status\": \"finished\""), "{last}");
        assert!(last.contains("call_timer"), "{last}");
    }
}

mod gemini {
    use super::*;
    use voxide::context::{AssistantMessage, Message, ToolCall};
    use voxide::services::llm::gemini::{GeminiLlm, GeminiSettings, thought_signature};

    fn engine(addr: SocketAddr) -> GeminiLlm {
        GeminiLlm::new(GeminiSettings {
            base_url: format!("http://{addr}"),
            model: "gemini-2.5-flash".into(),
            max_tokens: Some(200),
            ..GeminiSettings::new("g-test")
        })
        .expect("engine")
    }

    /// `data:` chunks only; the stream ends when the connection closes (no `[DONE]`).
    fn chunks(chunks: &[Value]) -> String {
        common::llm_stand_in::events(&chunks.iter().map(|c| (None, c.clone())).collect::<Vec<_>>())
    }

    #[tokio::test]
    async fn a_streamed_answer_arrives_whole_with_the_last_usage() {
        let stream = chunks(&[
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "It is "}]}, "index": 0}],
                "usageMetadata": {"promptTokenCount": 15, "candidatesTokenCount": 2, "totalTokenCount": 17}}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "noon."}]}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 15, "candidatesTokenCount": 4, "totalTokenCount": 19}}),
        ]);
        for piece in [1, 11, 4096] {
            let (addr, stand_in) = stand_in(vec![Reply::Stream(stream.clone(), piece)]).await;
            let events = answer(&engine(addr)).await;
            assert_eq!(
                &events[..2],
                [
                    LlmEvent::Text("It is ".into()),
                    LlmEvent::Text("noon.".into())
                ]
            );
            assert!(matches!(&events[2], LlmEvent::Usage(u) if u.input == 15 && u.output == 4));
            let seen = stand_in.posts()[0].clone();
            assert_eq!(
                seen.uri.to_string(),
                "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
            );
            assert_eq!(seen.headers["x-goog-api-key"], "g-test");
            assert_eq!(
                seen.body["systemInstruction"]["parts"][0]["text"],
                "Be brief."
            );
            assert_eq!(seen.body["generationConfig"]["maxOutputTokens"], 200);
            assert_eq!(
                seen.body["generationConfig"]["thinkingConfig"]["thinkingBudget"],
                0
            );
        }
    }

    #[tokio::test]
    async fn parallel_calls_come_out_and_their_signature_goes_back_verbatim() {
        let stream = chunks(&[
            json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"id": "fc_time", "name": "get_current_time", "args": {}}, "thoughtSignature": "U0lHLXRpbWU="},
            {"functionCall": {"id": "fc_calc", "name": "calculate", "args": {"expression": "17*23"}}}
        ]}, "finishReason": "STOP"}]}),
        ]);
        let (addr, stand_in) = stand_in(vec![Reply::Stream(stream, 13)]).await;
        let engine = engine(addr);
        let events = answer(&engine).await;
        assert_eq!(
            calls(&events),
            [
                ("get_current_time".to_owned(), "{}".to_owned()),
                (
                    "calculate".to_owned(),
                    "{\"expression\":\"17*23\"}".to_owned()
                )
            ]
        );
        let signature = events
            .iter()
            .find_map(|e| match e {
                LlmEvent::ProviderMessage(m) => Some(m.clone()),
                _ => None,
            })
            .expect("the signature, for the context");
        assert_eq!(
            signature,
            thought_signature("fc_time", "U0lHLXRpbWU=".into())
        );

        // The next request, with the calls, their signature and their results in the context.
        let mut follow_up = request();
        for (id, name, args) in [
            ("fc_time", "get_current_time", json!({})),
            ("fc_calc", "calculate", json!({"expression": "17*23"})),
        ] {
            follow_up
                .messages
                .push(Message::Assistant(AssistantMessage {
                    tool_calls: Some(vec![ToolCall::function(id, name, &args)]),
                    ..AssistantMessage::default()
                }));
        }
        follow_up
            .messages
            .push(Message::ProviderSpecific(signature));
        follow_up.messages.push(Message::tool("fc_time", "12:00"));
        follow_up.messages.push(Message::tool("fc_calc", "391"));
        let _: Vec<_> = engine.generate(follow_up).collect().await;
        let body = stand_in.posts()[1].body.clone();
        let contents = body["contents"].as_array().expect("contents");
        assert_eq!(contents.len(), 3, "{contents:?}");
        let model = &contents[1]["parts"];
        assert_eq!(model[0]["functionCall"]["id"], "fc_time");
        assert_eq!(model[0]["thoughtSignature"], "U0lHLXRpbWU=");
        assert!(model[1].get("thoughtSignature").is_none());
        let results = &contents[2]["parts"];
        assert_eq!(results[0]["functionResponse"]["name"], "get_current_time");
        assert_eq!(results[1]["functionResponse"]["response"]["result"], 391);
    }

    #[tokio::test]
    async fn a_quota_error_is_retried_and_a_malformed_chunk_is_a_clear_error() {
        let ok = chunks(&[
            json!({"candidates": [{"content": {"parts": [{"text": "Yes."}]}, "finishReason": "STOP"}]}),
        ]);
        let (addr, log) = stand_in(vec![
            Reply::Status(
                429,
                r#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}"#,
            ),
            Reply::Stream(ok, 64),
        ])
        .await;
        let events = answer(&engine(addr)).await;
        assert_eq!(events[0], LlmEvent::Text("Yes.".into()));
        assert_eq!(log.posts().len(), 2);

        let (addr, _) = stand_in(vec![Reply::Stream(
            "data: {\"candidates\": [\r\n\r\n".into(),
            8,
        )])
        .await;
        let events = complete(&engine(addr)).await;
        assert!(
            matches!(events.last(), Some(Err(LlmError::Protocol(_)))),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn async_tool_messages_go_as_a_function_response_then_user_text() {
        let ok = chunks(&[
            json!({"candidates": [{"content": {"parts": [{"text": "It rang."}]}, "finishReason": "STOP"}]}),
        ]);
        let (addr, stand_in) = stand_in(vec![Reply::Stream(ok, 64)]).await;
        let _: Vec<_> = engine(addr)
            .generate(with_async_tool_messages())
            .collect()
            .await;
        let body = stand_in.posts()[0].body.clone();
        let contents = body["contents"].as_array().expect("contents");
        let roles: Vec<&str> = contents
            .iter()
            .map(|c| c["role"].as_str().expect("role"))
            .collect();
        assert_eq!(roles, ["user", "model", "user", "model", "user"]);
        let started = &contents[2]["parts"][0]["functionResponse"];
        assert_eq!(started["name"], "set_timer");
        assert_eq!(started["response"]["status"], "running");
        let last = contents[4]["parts"][0]["text"].as_str().expect("text");
        assert!(last.contains("\"status\": \"finished\""), "{last}");
    }
}

mod fallback_and_warm {
    use super::*;
    use voxide::services::llm::FallbackLlm;
    use voxide::services::llm::anthropic::{AnthropicLlm, AnthropicSettings};

    /// OpenAI at `primary` with `timing`, then Anthropic at `secondary`.
    fn openai_then_anthropic(
        primary: std::net::SocketAddr,
        timing: Timing,
        secondary: std::net::SocketAddr,
    ) -> FallbackLlm {
        let primary = OpenAiLlm::new(OpenAiSettings {
            base_url: format!("http://{primary}/v1"),
            timing,
            ..OpenAiSettings::default()
        })
        .expect("engine");
        let secondary = AnthropicLlm::new(AnthropicSettings {
            base_url: format!("http://{secondary}"),
            ..AnthropicSettings::new("k")
        })
        .expect("engine");
        FallbackLlm::new(vec![Box::new(primary), Box::new(secondary)]).expect("engines")
    }

    #[tokio::test]
    async fn a_failed_engine_hands_the_request_to_the_next_and_later_ones_stay_there() {
        let (down, down_log) =
            stand_in(vec![Reply::Status(503, r#"{"error":{"message":"down"}}"#)]).await;
        let (up, up_log) = stand_in(vec![Reply::Stream(
            anthropic::text_answer("Still here."),
            64,
        )])
        .await;
        let timing = Timing {
            retries: 1,
            ..Timing::default()
        };
        let engine = openai_then_anthropic(down, timing, up);
        assert_eq!(engine.provider(), "openai");
        let events = answer(&engine).await;
        match &events[0] {
            LlmEvent::Fallback { from, to, reason } => {
                assert_eq!((from.as_str(), to.as_str()), ("openai", "anthropic"));
                assert!(reason.contains("503"), "{reason}");
            }
            other => panic!("a fallback first: {other:?}"),
        }
        assert_eq!(events[1], LlmEvent::Text("Still here.".into()));
        assert_eq!(down_log.posts().len(), 2, "the primary's own retry first");
        assert_eq!(engine.provider(), "anthropic");
        assert_eq!(engine.model(), "claude-haiku-4-5");

        // The next request goes straight to the engine that answered.
        let events = answer(&engine).await;
        assert_eq!(events[0], LlmEvent::Text("Still here.".into()));
        assert_eq!(down_log.posts().len(), 2);
        assert_eq!(up_log.posts().len(), 2);
    }

    #[tokio::test]
    async fn a_stalled_engine_times_out_and_the_next_one_answers() {
        let (stalled, _) = stand_in(vec![Reply::Stall(": thinking\n\n".into())]).await;
        let (up, _) = stand_in(vec![Reply::Stream(
            anthropic::text_answer("Here I am."),
            64,
        )])
        .await;
        let timing = Timing {
            first_chunk_timeout: Duration::from_millis(200),
            retries: 0,
            ..Timing::default()
        };
        let engine = openai_then_anthropic(stalled, timing, up);
        let events = answer(&engine).await;
        assert!(
            matches!(&events[0], LlmEvent::Fallback { reason, .. } if reason.contains("no answer")),
            "{events:?}"
        );
        assert_eq!(events[1], LlmEvent::Text("Here I am.".into()));
    }

    #[tokio::test]
    async fn the_last_engine_failing_is_an_error() {
        let (down, _) = stand_in(vec![Reply::Status(400, r#"{"error":{"message":"bad"}}"#)]).await;
        let only = OpenAiLlm::new(OpenAiSettings {
            base_url: format!("http://{down}/v1"),
            ..OpenAiSettings::default()
        })
        .expect("engine");
        let twice = OpenAiLlm::new(OpenAiSettings {
            base_url: format!("http://{down}/v1"),
            ..OpenAiSettings::default()
        })
        .expect("engine");
        let engine = FallbackLlm::new(vec![Box::new(only), Box::new(twice)]).expect("engines");
        let events = complete(&engine).await;
        assert!(
            matches!(&events[0], Ok(LlmEvent::Fallback { .. })),
            "{events:?}"
        );
        assert!(
            matches!(events.last(), Some(Err(LlmError::Provider(m))) if m.contains("bad")),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn warming_opens_the_connection_the_first_request_then_uses() {
        let (addr, stand_in) = stand_in(vec![Reply::Stream(text_answer(), 64)]).await;
        let engine = engine(addr);
        engine.warm().await;
        let warm = stand_in.all();
        assert_eq!(warm.len(), 1, "one request to open the connection");
        assert_eq!(warm[0].method, "HEAD");
        let _ = answer(&engine).await;
        let posts = stand_in.posts();
        assert_eq!(posts.len(), 1);
        assert_eq!(
            posts[0].peer, warm[0].peer,
            "the completion reuses the warm connection"
        );
    }
}

/// The whole bot on a text LLM over HTTP: a spoken question that asks two things makes two
/// tool calls in one reply; both run, both results go back in one follow-up request, and the
/// bot speaks the answer.
mod whole_bot {
    use std::sync::Arc;

    use super::*;
    use voxide::audio::wav::{self, Wav};
    use voxide::bot::run::RunSummary;
    use voxide::bot::{BotOptions, LlmChoice, TextLlm, Voice};
    use voxide::services::llm::anthropic::AnthropicSettings;
    use voxide::services::tts::{PiperVoice, Synthesizer};

    use common::bot_run::{Ran, event, run_bot};

    const QUESTION: &str = "What time is it and what is seventeen times twenty-three?";

    /// The question in the Piper voice, between a second of silence before and two after.
    fn spoken_question(name: &str) -> std::path::PathBuf {
        let voice = PiperVoice::shared().expect("the Piper voice loads; run scripts/setup.sh");
        let speech = voice.synthesize(QUESTION).expect("speech");
        let rate = speech.sample_rate as usize;
        let mut samples = vec![0i16; rate];
        samples.extend(&speech.samples);
        samples.extend(vec![0i16; 2 * rate]);
        let path = common::bot_run::scratch().join(name);
        wav::write(
            &path,
            &Wav {
                samples,
                sample_rate: speech.sample_rate,
                channels: 1,
            },
        )
        .expect("write the question");
        path
    }

    async fn ask(llm: TextLlm, name: &str) -> RunSummary {
        ask_with(vec![llm], name).await.summary
    }

    async fn ask_with(llms: Vec<TextLlm>, name: &str) -> Ran {
        let input = spoken_question(&format!("{name}_question.wav"));
        let bot = BotOptions {
            llm: LlmChoice::Text(llms),
            voice: Voice::Piper,
            ..BotOptions::default()
        };
        run_bot(bot, &input, name).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_provider_that_is_down_hands_the_turn_to_the_local_model_and_says_so() {
        let (down, log) =
            stand_in(vec![Reply::Status(503, r#"{"error":{"message":"down"}}"#)]).await;
        let provider = TextLlm::OpenAi(OpenAiSettings {
            base_url: format!("http://{down}/v1"),
            ..OpenAiSettings::default()
        });
        let Ran {
            summary, events, ..
        } = ask_with(vec![provider, TextLlm::Local], "fallback").await;
        let fallback = event(&events, "llm_fallback").expect("an llm_fallback event");
        assert_eq!(fallback["from"], "openai");
        assert_eq!(fallback["to"], "local");
        assert!(log.posts().len() >= 3, "the provider's own retries first");
        assert!(
            events.iter().all(|e| e["type"] != "error"),
            "no error reaches the session: {events:?}"
        );
        assert_eq!(summary.voice_to_voice_ms.len(), 1, "the turn is answered");
    }

    /// Whether the request's last user words ask for the time (as Whisper heard them).
    fn asks_the_time(user_texts: Vec<String>) -> bool {
        user_texts
            .last()
            .is_some_and(|t| t.to_lowercase().contains("time"))
    }

    /// The messages of the one request that carries tool results, which must be the last.
    /// Requests before it ask for the calls: the answer may start at a pause in the question
    /// (preemptive), so a guess can ask once more than the finished turn does.
    fn the_follow_up(posts: &[Seen], is_result: impl Fn(&Value) -> bool) -> Vec<Value> {
        let messages = |post: &Seen| -> Vec<Value> {
            post.body["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        };
        let with_results: Vec<usize> = (0..posts.len())
            .filter(|&i| messages(&posts[i]).iter().any(&is_result))
            .collect();
        assert_eq!(
            with_results,
            [posts.len() - 1],
            "one follow-up with the results, after the requests for the calls"
        );
        assert!(posts.len() <= 3, "at most a guess and the turn before it");
        messages(&posts[posts.len() - 1])
    }

    fn check(summary: &RunSummary) {
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        let mut calls = summary.tool_calls.clone();
        calls.sort();
        assert_eq!(
            calls,
            ["calculate", "get_current_time"],
            "heard: {:?}",
            summary.transcripts
        );
        let said = summary.bot_text.join(" ");
        assert!(said.contains("391"), "the bot said {said:?}");
        assert_eq!(summary.voice_to_voice_ms.len(), 1, "one spoken answer");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn openai_two_tools_in_one_reply_both_results_in_one_follow_up() {
        let first = sse(&[
            json!({"choices": [{"delta": {"role": "assistant", "content": "Let me check."}}]}),
            json!({"choices": [{"delta": {"tool_calls": [
                {"index": 0, "id": "call_time", "type": "function", "function": {"name": "get_current_time", "arguments": "{}"}},
                {"index": 1, "id": "call_calc", "type": "function", "function": {"name": "calculate", "arguments": "{\"expression\": \"17*23\"}"}}
            ]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let last = sse(&[
            json!({"choices": [{"delta": {"content": "It is noon, and seventeen times twenty-three is 391."}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
        ]);
        let lost =
            sse(&[json!({"choices": [{"delta": {"content": "Sorry?"}, "finish_reason": "stop"}]})]);
        let reply = Reply::With(Arc::new(move |body: &Value| {
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            let results = messages.iter().filter(|m| m["role"] == "tool").count();
            let users = messages
                .iter()
                .filter(|m| m["role"] == "user")
                .filter_map(|m| m["content"].as_str().map(str::to_owned))
                .collect();
            match results {
                0 if asks_the_time(users) => Reply::Stream(first.clone(), 32),
                0 => Reply::Stream(lost.clone(), 32),
                _ => Reply::Stream(last.clone(), 32),
            }
        }));
        let (addr, stand_in) = stand_in(vec![reply]).await;
        let summary = ask(
            TextLlm::OpenAi(OpenAiSettings {
                base_url: format!("http://{addr}/v1"),
                model: "gpt-4.1-mini".into(),
                ..OpenAiSettings::default()
            }),
            "openai",
        )
        .await;
        check(&summary);
        assert_eq!(stand_in.refusals(), Vec::<String>::new());
        let follow_up = the_follow_up(&stand_in.posts(), |m| m["role"] == "tool");
        // The words and the first call in one message, each call's result right after it.
        let n = follow_up.len();
        let roles: Vec<&str> = follow_up[n - 4..]
            .iter()
            .map(|m| m["role"].as_str().expect("role"))
            .collect();
        assert_eq!(
            roles,
            ["assistant", "tool", "assistant", "tool"],
            "{follow_up:#?}"
        );
        assert_eq!(follow_up[n - 4]["content"], "Let me check.");
        assert_eq!(follow_up[n - 4]["tool_calls"][0]["id"], "call_time");
        let results: Vec<&Value> = follow_up.iter().filter(|m| m["role"] == "tool").collect();
        assert_eq!(results.len(), 2, "{follow_up:?}");
        assert_eq!(results[0]["tool_call_id"], "call_time");
        assert_eq!(results[1]["tool_call_id"], "call_calc");
        assert!(
            results[1]["content"]
                .as_str()
                .expect("text")
                .contains("391")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn anthropic_two_tool_uses_in_one_reply_both_results_in_one_user_turn() {
        let last = anthropic::text_answer("It is noon, and seventeen times twenty-three is 391.");
        let lost = anthropic::text_answer("Sorry?");
        // Words, then the calls, as Claude often answers: the words stay before the calls and
        // the follow-up ends on the results (Claude 4.6 refuses one that ends on the assistant,
        // and so does the stand-in).
        let first = anthropic::text_then_two_calls("Let me check.");
        let reply = Reply::With(Arc::new(move |body: &Value| {
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            let blocks = |kind: &str| -> Vec<Value> {
                messages
                    .iter()
                    .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
                    .filter(|b| b["type"] == kind)
                    .collect()
            };
            let users = blocks("text")
                .iter()
                .filter_map(|b| b["text"].as_str().map(str::to_owned))
                .collect();
            match blocks("tool_result").len() {
                0 if asks_the_time(users) => Reply::Stream(first.clone(), 32),
                0 => Reply::Stream(lost.clone(), 32),
                _ => Reply::Stream(last.clone(), 32),
            }
        }));
        let (addr, stand_in) = stand_in(vec![reply]).await;
        let summary = ask(
            TextLlm::Anthropic(AnthropicSettings {
                base_url: format!("http://{addr}"),
                ..AnthropicSettings::new("sk-ant-test")
            }),
            "anthropic",
        )
        .await;
        check(&summary);
        let follow_up = the_follow_up(&stand_in.posts(), |m| {
            m["content"]
                .as_array()
                .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
        });
        assert_eq!(stand_in.refusals(), Vec::<String>::new());
        // The words and calls in one assistant turn, both results in the one user turn after
        // it, and nothing after them.
        let n = follow_up.len();
        assert_eq!(follow_up[n - 2]["role"], "assistant");
        let blocks: Vec<String> = follow_up[n - 2]["content"]
            .as_array()
            .expect("blocks")
            .iter()
            .map(|b| match b["type"].as_str() {
                Some("tool_use") => format!("tool_use {}", b["id"].as_str().expect("id")),
                Some("text") => format!("text {}", b["text"].as_str().expect("text")),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            blocks,
            [
                "text Let me check.",
                "tool_use toolu_time",
                "tool_use toolu_calc"
            ],
            "{follow_up:#?}"
        );
        assert_eq!(follow_up[n - 1]["role"], "user");
        let results: Vec<&Value> = follow_up[n - 1]["content"]
            .as_array()
            .expect("blocks")
            .iter()
            .filter(|b| b["type"] == "tool_result")
            .collect();
        assert_eq!(results.len(), 2, "{follow_up:?}");
        assert_eq!(results[1]["tool_use_id"], "toolu_calc");
        assert!(
            results[1]["content"]
                .as_str()
                .expect("text")
                .contains("391")
        );
    }
}
