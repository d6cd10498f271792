//! The latency voxide itself adds around a network LLM, against a local stand-in that speaks the
//! provider's stream (OpenAI-compatible chat completions or Anthropic Messages) with a realistic
//! delay before the first token: K sessions, each asking T questions in turn.
//!
//! Two legs are timed on one clock, so the provider's own time is left out:
//! - **request**: from the LLM service taking the context to the stand-in holding the whole
//!   request (the request built, serialised and sent over a pooled connection);
//! - **first token**: from the stand-in writing the first token to that text leaving the LLM
//!   service for the voice (SSE decoding, assembly, the frame hop).
//!
//! Run it pinned (`taskset -c 0`) to read it per core; the stand-in shares that core.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::sessions::{LagReport, cpu_seconds};
use crate::context::{ContextHandle, LlmContext, Message};
use crate::frames::{ControlFrame, DataFrame, Frame, FrameBody};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session};
use crate::services::llm::anthropic::{AnthropicLlm, AnthropicSettings};
use crate::services::llm::openai::{OpenAiLlm, OpenAiSettings};
use crate::services::llm::{LlmEngine, LlmError, LlmService};

/// Which provider's stream the stand-in speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// OpenAI-compatible chat completions.
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

/// What the bench runs.
#[derive(Debug, Clone)]
pub struct ProvidersOptions {
    /// Concurrent sessions.
    pub sessions: usize,
    /// Questions each session asks, one after another.
    pub turns: usize,
    /// The stand-in's time to the first token.
    pub provider_delay: Duration,
    /// The stream the stand-in speaks.
    pub protocol: Protocol,
}

/// The figures, one JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct ProvidersReport {
    /// The stream spoken.
    pub protocol: Protocol,
    /// Concurrent sessions.
    pub sessions: usize,
    /// Answers timed.
    pub answers: usize,
    /// Answers that failed.
    pub failed: usize,
    /// Cores the process may use (its affinity).
    pub cores: usize,
    /// The stand-in's time to the first token, ms.
    pub provider_delay_ms: f64,
    /// From the context reaching the LLM service to the stand-in holding the request, ms.
    pub request_ms: LagReport,
    /// From the stand-in writing the first token to its text leaving the LLM service, ms.
    pub first_token_ms: LagReport,
    /// CPU seconds of the whole run (voxide and the stand-in).
    pub cpu_s: f64,
    /// Wall seconds of the whole run.
    pub wall_s: f64,
}

/// When the stand-in saw each request and sent its first token, by the question's marker.
#[derive(Default)]
struct Served {
    arrived: HashMap<String, Instant>,
    first_sent: HashMap<String, Instant>,
}

#[derive(Clone)]
struct StandIn {
    served: Arc<Mutex<Served>>,
    delay: Duration,
    protocol: Protocol,
}

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
        Protocol::Openai => (
            sse(
                None,
                json!({"choices": [{"index": 0, "delta": {"content": "Sure, "}}]}),
            ),
            [
                json!({"choices": [{"index": 0, "delta": {"content": "it is noon."}}]}),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 6}}),
            ]
            .into_iter()
            .map(|c| sse(None, c))
            .chain(["data: [DONE]\n\n".to_owned()])
            .collect(),
        ),
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

async fn serve(State(stand_in): State<StandIn>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let key = marker(&request);
    stand_in
        .served
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .arrived
        .insert(key.clone(), arrived);
    let (first, rest) = answer(stand_in.protocol);
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, Infallible>>(4);
    tokio::spawn(async move {
        tokio::time::sleep_until(arrived + stand_in.delay).await;
        stand_in
            .served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first_sent
            .insert(key, Instant::now());
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

/// One session's clock readings, turn by turn.
#[derive(Default)]
struct Marks {
    /// The context reached the LLM service.
    asked: Vec<Instant>,
    /// The first text left it (none: the answer had no text).
    first_text: Vec<Option<Instant>>,
    /// Answers that ended in an error.
    failed: usize,
}

/// Stands before the LLM service: notes when each context passes.
struct Asked(Arc<Mutex<Marks>>);

impl FrameProcessor for Asked {
    fn name(&self) -> &str {
        "Asked"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if let FrameBody::Data(DataFrame::LlmContext(_)) = &frame.body {
            let now = Instant::now();
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .asked
                .push(now);
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Stands where the voice would: notes the first text of each answer, and its end.
struct Heard {
    marks: Arc<Mutex<Marks>>,
    in_answer: bool,
    ended: mpsc::Sender<()>,
}

impl FrameProcessor for Heard {
    fn name(&self) -> &str {
        "Heard"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::Control(ControlFrame::LlmFullResponseStart) => {
                self.in_answer = true;
                let mut marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
                marks.first_text.push(None);
            }
            FrameBody::Data(DataFrame::LlmText(_)) if self.in_answer => {
                self.in_answer = false;
                let now = Instant::now();
                let mut marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(last) = marks.first_text.last_mut() {
                    *last = Some(now);
                }
            }
            FrameBody::Control(ControlFrame::LlmFullResponseEnd) => {
                if std::mem::take(&mut self.in_answer) {
                    self.marks.lock().unwrap_or_else(|p| p.into_inner()).failed += 1;
                }
                let _ = self.ended.try_send(());
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

fn engine(protocol: Protocol, addr: std::net::SocketAddr) -> Result<Box<dyn LlmEngine>, LlmError> {
    Ok(match protocol {
        Protocol::Openai => Box::new(OpenAiLlm::new(OpenAiSettings {
            base_url: format!("http://{addr}/v1"),
            model: "bench".into(),
            ..OpenAiSettings::default()
        })?),
        Protocol::Anthropic => Box::new(AnthropicLlm::new(AnthropicSettings {
            base_url: format!("http://{addr}"),
            model: "bench".into(),
            ..AnthropicSettings::new("bench")
        })?),
    })
}

/// Why the bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProvidersError {
    /// The stand-in could not listen.
    #[error("the stand-in could not listen: {0}")]
    Listen(#[from] std::io::Error),
    /// An engine could not be set up.
    #[error(transparent)]
    Llm(#[from] LlmError),
}

/// Runs the bench.
pub async fn run_providers(options: ProvidersOptions) -> Result<ProvidersReport, ProvidersError> {
    let stand_in = StandIn {
        served: Arc::default(),
        delay: options.provider_delay,
        protocol: options.protocol,
    };
    let app = axum::Router::new()
        .fallback(serve)
        .with_state(stand_in.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let cpu_start = cpu_seconds();
    let wall_start = std::time::Instant::now();
    let k = options.sessions.max(1);
    let mut runs = Vec::with_capacity(k);
    for i in 0..k {
        let engine = engine(options.protocol, addr)?;
        // Connections are warm before the first question, as a session start leaves them.
        engine.warm().await;
        let marks = Arc::new(Mutex::new(Marks::default()));
        let (ended, mut answers) = mpsc::channel(1);
        let pipeline = Pipeline::new()
            .then(Asked(marks.clone()))
            .then(LlmService::new(engine))
            .then(Heard {
                marks: marks.clone(),
                in_answer: false,
                ended,
            });
        let session = Session::builder(pipeline).idle_timeout(None).spawn();
        let handle = session.handle();
        let context = ContextHandle::new(LlmContext::new(vec![Message::system("Be brief.")]));
        let turns = options.turns;
        // Sessions start spread over 100 ms, so they do not ask in lock step.
        let start = Instant::now() + Duration::from_micros(100_000 * i as u64 / k as u64);
        let asker = tokio::spawn(async move {
            tokio::time::sleep_until(start).await;
            for turn in 0..turns {
                context
                    .lock()
                    .messages
                    .push(Message::user(format!("session {i} question {turn}")));
                let frame = DataFrame::LlmContext(context.clone());
                if handle.queue_frame(frame).await.is_err() || answers.recv().await.is_none() {
                    break;
                }
                // What an assistant aggregator would keep.
                context
                    .lock()
                    .messages
                    .push(Message::assistant("Sure, it is noon."));
            }
            let _ = handle.stop_when_done().await;
        });
        runs.push((i, session, asker, marks));
    }
    let (mut request, mut first_token, mut failed) = (Vec::new(), Vec::new(), 0);
    for (i, session, asker, marks) in runs {
        let _ = asker.await;
        session.join().await;
        let marks = marks.lock().unwrap_or_else(|p| p.into_inner());
        failed += marks.failed;
        let served = stand_in.served.lock().unwrap_or_else(|p| p.into_inner());
        for (turn, asked) in marks.asked.iter().enumerate() {
            let key = format!("session {i} question {turn}");
            if let Some(arrived) = served.arrived.get(&key) {
                request.push(ms(arrived.saturating_duration_since(*asked)));
            }
            if let (Some(sent), Some(Some(heard))) =
                (served.first_sent.get(&key), marks.first_text.get(turn))
            {
                first_token.push(ms(heard.saturating_duration_since(*sent)));
            }
        }
    }
    server.abort();
    request.sort_by(f64::total_cmp);
    first_token.sort_by(f64::total_cmp);
    Ok(ProvidersReport {
        protocol: options.protocol,
        sessions: k,
        answers: first_token.len(),
        failed,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        provider_delay_ms: ms(options.provider_delay),
        request_ms: LagReport::of(&request),
        first_token_ms: LagReport::of(&first_token),
        cpu_s: cpu_seconds() - cpu_start,
        wall_s: wall_start.elapsed().as_secs_f64(),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
