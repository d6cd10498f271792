//! Local providers for benchmarks and load tests, each speaking its wire protocol with a
//! realistic delay before it answers, and noting when it wrote what the bench times:
//! - Deepgram live transcription: a `Finalize` is answered [`Delays::stt`] later with a final
//!   naming the session (from its key, `bench-N`) and the question (the socket's count of
//!   finalizes);
//! - an OpenAI-compatible or Anthropic chat stream: the first token [`Delays::llm`] after the
//!   request;
//! - Cartesia's TTS socket: a context's first audio [`Delays::tts`] after its first text, a
//!   quarter second of tone a word.
//!
//! Every turn is named `session N question T` on all three, so the legs line up across them.
//! `cargo run --release --example stand_in_providers` serves them for a whole bot.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Protocol;

/// What the stand-ins saw and wrote, by turn name.
#[derive(Default)]
pub struct Log {
    /// Deepgram wrote the turn's final.
    pub final_sent: HashMap<String, Instant>,
    /// The LLM stand-in held the whole request.
    pub request_arrived: HashMap<String, Instant>,
    /// It wrote the first token.
    pub first_token_sent: HashMap<String, Instant>,
    /// Cartesia held the turn's first text.
    pub text_arrived: HashMap<String, Instant>,
    /// It wrote the turn's first audio.
    pub audio_sent: HashMap<String, Instant>,
}

/// How long each stand-in takes to answer.
#[derive(Debug, Clone, Copy)]
pub struct Delays {
    /// From a `Finalize` to its final.
    pub stt: Duration,
    /// From a request to its first token.
    pub llm: Duration,
    /// From a context's first text to its first audio.
    pub tts: Duration,
}

impl Delays {
    /// The same delay everywhere.
    pub fn all(delay: Duration) -> Self {
        Self {
            stt: delay,
            llm: delay,
            tts: delay,
        }
    }
}

/// The stand-ins' shared state.
#[derive(Clone)]
pub struct StandIns {
    /// What they saw and wrote.
    pub log: Arc<Mutex<Log>>,
    delays: Delays,
    protocol: Protocol,
}

impl StandIns {
    /// Serves all three on `addr` (port 0 for any).
    pub async fn serve(
        addr: std::net::SocketAddr,
        delays: Delays,
        protocol: Protocol,
    ) -> std::io::Result<(Self, std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
        let stand_ins = Self {
            log: Arc::default(),
            delays,
            protocol,
        };
        let app = axum::Router::new()
            .route("/v1/listen", axum::routing::get(listen))
            .route("/tts/websocket", axum::routing::get(speak))
            .fallback(chat)
            .with_state(stand_ins.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok((stand_ins, addr, server))
    }

    fn note(&self, at: Instant, key: String, which: fn(&mut Log) -> &mut HashMap<String, Instant>) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        which(&mut log).insert(key, at);
    }
}

/// The session a socket's key (`bench-N`) names.
fn session(headers: &HeaderMap, name: &str) -> String {
    let key = headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    key.rsplit('-').next().unwrap_or_default().to_owned()
}

fn turn(session: &str, question: usize) -> String {
    format!("session {session} question {question}")
}

async fn listen(
    State(stand_ins): State<StandIns>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let session = session(&headers, "authorization");
    upgrade.on_upgrade(move |socket| transcribe(socket, stand_ins, session))
}

/// Deepgram: audio is counted; each `Finalize` is answered `delay` later.
async fn transcribe(socket: WebSocket, stand_ins: StandIns, session: String) {
    use futures_util::{SinkExt, StreamExt};
    let (mut sink, mut stream) = socket.split();
    let (out, mut outgoing) = mpsc::channel::<(Instant, String, String)>(16);
    let writer = {
        let stand_ins = stand_ins.clone();
        tokio::spawn(async move {
            while let Some((at, key, text)) = outgoing.recv().await {
                tokio::time::sleep_until(at).await;
                stand_ins.note(Instant::now(), key, |log| &mut log.final_sent);
                if sink.send(Message::Text(text.into())).await.is_err() {
                    return;
                }
            }
        })
    };
    let (mut received, mut finalized, mut question) = (0usize, 0usize, 0usize);
    while let Some(Ok(message)) = stream.next().await {
        match message {
            Message::Binary(bytes) => received += bytes.len() / 2,
            Message::Text(text) if text.contains("\"Finalize\"") => {
                let key = turn(&session, question);
                question += 1;
                let results = json!({"type": "Results", "channel_index": [0, 1],
                    "start": finalized as f64 / 16_000.0,
                    "duration": (received - finalized) as f64 / 16_000.0,
                    "is_final": true, "speech_final": true, "from_finalize": true,
                    "channel": {"alternatives": [{"transcript": key, "confidence": 0.99, "words": []}]}});
                finalized = received;
                let due = Instant::now() + stand_ins.delays.stt;
                if out.send((due, key, results.to_string())).await.is_err() {
                    break;
                }
            }
            Message::Text(_) | Message::Ping(_) | Message::Pong(_) => {}
            Message::Close(_) => break,
        }
    }
    drop(out);
    let _ = writer.await;
}

async fn speak(
    State(stand_ins): State<StandIns>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let session = session(&headers, "x-api-key");
    upgrade.on_upgrade(move |socket| voice(socket, stand_ins, session))
}

/// Cartesia: each context's text is answered with its timestamps and audio, the first `delay`
/// after its first text; its end with `done` after its audio.
async fn voice(socket: WebSocket, stand_ins: StandIns, session: String) {
    use futures_util::{SinkExt, StreamExt};
    let (mut sink, mut stream) = socket.split();
    // (when, the turn whose first audio it is, the message).
    let (out, mut outgoing) = mpsc::channel::<(Instant, Option<String>, String)>(64);
    let writer = {
        let stand_ins = stand_ins.clone();
        tokio::spawn(async move {
            while let Some((at, first_of, text)) = outgoing.recv().await {
                tokio::time::sleep_until(at).await;
                if let Some(key) = first_of {
                    stand_ins.note(Instant::now(), key, |log| &mut log.audio_sent);
                }
                if sink.send(Message::Text(text.into())).await.is_err() {
                    return;
                }
            }
        })
    };
    // Each context's turn name and when its first audio is due.
    let mut contexts: HashMap<String, (String, Instant)> = HashMap::new();
    let mut questions = 0usize;
    while let Some(Ok(Message::Text(text))) = stream.next().await {
        let arrived = Instant::now();
        let Ok(message) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let Some(context) = message["context_id"].as_str().map(str::to_owned) else {
            continue;
        };
        if message["cancel"] == true {
            contexts.remove(&context);
            continue;
        }
        let known = contexts.contains_key(&context);
        if !known {
            let key = turn(&session, questions);
            questions += 1;
            stand_ins.note(arrived, key.clone(), |log| &mut log.text_arrived);
            contexts.insert(context.clone(), (key, arrived + stand_ins.delays.tts));
        }
        let Some((key, due)) = contexts.get(&context).cloned() else {
            continue;
        };
        let transcript = message["transcript"].as_str().unwrap_or_default();
        let at = due.max(Instant::now());
        if message["continue"] == false {
            contexts.remove(&context);
            let done =
                json!({"type": "done", "done": true, "status_code": 206, "context_id": context});
            if out.send((at, None, done.to_string())).await.is_err() {
                break;
            }
            continue;
        }
        let words: Vec<&str> = transcript.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        let timestamps = json!({"type": "timestamps", "done": false, "status_code": 206,
            "context_id": context, "word_timestamps": {"words": words,
            "start": (0..words.len()).map(|i| i as f64 * 0.3).collect::<Vec<_>>(),
            "end": (0..words.len()).map(|i| i as f64 * 0.3 + 0.25).collect::<Vec<_>>()}});
        let chunk = json!({"type": "chunk", "data": WORD_B64.as_str(), "done": false,
            "status_code": 206, "step_time": 10, "context_id": context});
        let first = (!known).then_some(key);
        if out.send((at, None, timestamps.to_string())).await.is_err()
            || out.send((at, first, chunk.to_string())).await.is_err()
        {
            break;
        }
    }
    drop(out);
    let _ = writer.await;
}

/// A spoken word: a quarter second of a 220 Hz tone at 24 kHz, base64.
static WORD_B64: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use base64::Engine as _;
    let bytes: Vec<u8> = (0..6_000)
        .map(|i| (3_000.0 * (i as f64 * 220.0 * std::f64::consts::TAU / 24_000.0).sin()) as i16)
        .flat_map(i16::to_le_bytes)
        .collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
});

/// The marker of a question: the last user text of the request.
fn marker(body: &Value) -> String {
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| &m["content"]);
    match last {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// The stream of one answer: the first event holds the first token; the rest follow at once.
fn answer(protocol: Protocol) -> (String, String) {
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
                chunk(delta("Sure, "), Value::Null),
                [
                    chunk(delta("it is noon."), Value::Null),
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
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Sure, "}}),
                ),
            ]
            .concat(),
            [
                sse(
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "it is noon."}}),
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

/// The chat stream: the first token `delay` after the request.
async fn chat(State(stand_ins): State<StandIns>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let key = marker(&request);
    stand_ins.note(arrived, key.clone(), |log| &mut log.request_arrived);
    let (first, rest) = answer(stand_ins.protocol);
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, Infallible>>(4);
    tokio::spawn(async move {
        tokio::time::sleep_until(arrived + stand_ins.delays.llm).await;
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
