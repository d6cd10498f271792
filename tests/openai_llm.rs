//! The OpenAI-compatible text LLM against a local stand-in that speaks the chat-completions
//! stream as OpenAI documents it: server-sent events split at arbitrary byte boundaries, CRLF
//! line ends, `: ping` comments, tool calls by index, a 429 before success, a malformed chunk,
//! a stream that stalls.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt;
use serde_json::{Value, json};

use voxide::context::{Message, StopReason, ToolsSchema};
use voxide::services::llm::openai::{OpenAiLlm, OpenAiSettings};
use voxide::services::llm::{LlmEngine, LlmError, LlmEvent, LlmRequest};

/// What the stand-in answers, one script per request in order (the last one repeats).
#[derive(Clone)]
enum Reply {
    /// An event stream, cut into pieces of this many bytes.
    Stream(String, usize),
    /// A status and body, with `retry-after: 0`.
    Status(u16, &'static str),
    /// This much of a stream, then nothing, forever.
    Stall(String),
}

#[derive(Clone, Default)]
struct StandIn {
    replies: Arc<Mutex<Vec<Reply>>>,
    requests: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

async fn completions(
    State(stand_in): State<StandIn>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> Response {
    let reply = {
        let mut requests = stand_in.requests.lock().expect("lock");
        requests.push((headers, body.0));
        let replies = stand_in.replies.lock().expect("lock");
        replies[(requests.len() - 1).min(replies.len() - 1)].clone()
    };
    let sse = [("content-type", "text/event-stream")];
    match reply {
        Reply::Stream(text, piece) => {
            let pieces: Vec<Result<Bytes, Infallible>> = text
                .into_bytes()
                .chunks(piece)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            (sse, Body::from_stream(futures_util::stream::iter(pieces))).into_response()
        }
        Reply::Status(status, body) => (
            StatusCode::from_u16(status).expect("status"),
            [("retry-after", "0")],
            body,
        )
            .into_response(),
        Reply::Stall(text) => {
            let first = futures_util::stream::iter([Ok::<_, Infallible>(Bytes::from(text))]);
            (
                sse,
                Body::from_stream(first.chain(futures_util::stream::pending())),
            )
                .into_response()
        }
    }
}

async fn stand_in(replies: Vec<Reply>) -> (SocketAddr, StandIn) {
    let stand_in = StandIn {
        replies: Arc::new(Mutex::new(replies)),
        ..StandIn::default()
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(stand_in.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, stand_in)
}

fn engine(addr: SocketAddr) -> OpenAiLlm {
    OpenAiLlm::new(OpenAiSettings {
        base_url: format!("http://{addr}/v1"),
        api_key: Some("sk-test".into()),
        model: "test-model".into(),
        max_tokens: Some(128),
        first_chunk_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(5),
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

async fn complete(engine: &OpenAiLlm) -> Vec<Result<LlmEvent, LlmError>> {
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
        let (headers, body) = stand_in.requests.lock().expect("lock")[0].clone();
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
    let events: Vec<LlmEvent> = complete(&engine(addr))
        .await
        .into_iter()
        .map(|e| e.expect("event"))
        .collect();
    let calls: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match e {
            LlmEvent::ToolCall {
                name, arguments, ..
            } => Some((name.clone(), arguments.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        calls,
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
    assert_eq!(stand_in.requests.lock().expect("lock").len(), 2);
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
    assert_eq!(stand_in.requests.lock().expect("lock").len(), 1);
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
        idle_timeout: Duration::from_millis(300),
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
        first_chunk_timeout: Duration::from_millis(300),
        retries: 1,
        ..OpenAiSettings::default()
    })
    .expect("engine");
    let events = complete(&engine).await;
    assert!(
        matches!(&events[..], [Err(LlmError::Connection(m))] if m.contains("no answer")),
        "{events:?}"
    );
    assert_eq!(stand_in.requests.lock().expect("lock").len(), 2);
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
