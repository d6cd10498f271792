//! Realtime LLM services against local servers that speak the providers' WebSocket protocols as
//! documented (OpenAI Realtime GA events; Gemini Live `BidiGenerateContent` messages): tool
//! round trips, async-tool delivery through the tool-result channel exactly once, interruption
//! truncation, reconnects, silence and malformed events.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

use voxide::aggregators::AssistantAggregator;
use voxide::context::{ContextHandle, FunctionSchema, LlmContext, Message, ToolsSchema};
use voxide::events::{EndReason, Event, SessionEvent};
use voxide::frames::{DataFrame, Frame, FrameBody, StartParams, SystemFrame};
use voxide::pipeline::{
    Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session, SessionHandle,
};
use voxide::services::llm::gemini_live::{GeminiLive, GeminiLiveSettings};
use voxide::services::llm::openai_realtime::{
    OpenAiRealtime, OpenAiRealtimeSettings, TurnDetection,
};
use voxide::services::llm::realtime::RealtimeProtocol;
use voxide::services::llm::{
    FunctionCallParams, FunctionOptions, RealtimeOptions, RealtimeService, ReconnectPolicy,
    ResultProperties,
};

const WAIT: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, PartialEq)]
enum Dialect {
    OpenAi,
    Gemini,
    /// Accepts the socket and never confirms the session.
    Silent,
}

enum Control {
    Send(Value),
    /// Drops the socket without a closing handshake, as a failing network does.
    Drop,
}

/// Each handshake's path and `Authorization` header.
type Handshakes = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A provider double: answers the set-up, records what the client sends (per connection), and
/// sends what the test tells it to.
struct FakeServer {
    url: String,
    log: Arc<Mutex<Vec<(usize, Value)>>>,
    requests: Handshakes,
    control: Arc<Mutex<Option<mpsc::UnboundedSender<Control>>>>,
    connections: Arc<AtomicUsize>,
}

impl FakeServer {
    async fn start(dialect: Dialect) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = Self {
            url: format!("ws://{addr}/v1/realtime"),
            log: Arc::default(),
            requests: Arc::default(),
            control: Arc::default(),
            connections: Arc::default(),
        };
        let (log, requests, control, connections) = (
            server.log.clone(),
            server.requests.clone(),
            server.control.clone(),
            server.connections.clone(),
        );
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let n = connections.fetch_add(1, Ordering::SeqCst);
                let requests = requests.clone();
                // The handshake callback's error type is tungstenite's, large as it is.
                #[allow(clippy::result_large_err)]
                let record = move |req: &Request, res: Response| {
                    let auth = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    requests
                        .lock()
                        .expect("lock")
                        .push((req.uri().to_string(), auth));
                    Ok(res)
                };
                let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, record).await else {
                    continue;
                };
                let (tx, rx) = mpsc::unbounded_channel();
                *control.lock().expect("lock") = Some(tx);
                tokio::spawn(connection(ws, n, rx, log.clone(), dialect));
            }
        });
        server
    }

    fn send(&self, event: Value) {
        if let Some(tx) = self.control.lock().expect("lock").as_ref() {
            let _ = tx.send(Control::Send(event));
        }
    }

    fn drop_connection(&self) {
        if let Some(tx) = self.control.lock().expect("lock").take() {
            let _ = tx.send(Control::Drop);
        }
    }

    fn received(&self) -> Vec<(usize, Value)> {
        self.log.lock().expect("lock").clone()
    }

    /// Waits for the `nth` (0-based) client message that matches.
    async fn wait_for(&self, what: &str, nth: usize, matches: impl Fn(&Value) -> bool) -> Value {
        let found = tokio::time::timeout(WAIT, async {
            loop {
                if let Some((_, v)) = self
                    .received()
                    .into_iter()
                    .filter(|(_, v)| matches(v))
                    .nth(nth)
                {
                    return v;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!(
                "the client never sent {what}; it sent {:#?}",
                self.received()
            )
        })
    }

    fn count(&self, matches: impl Fn(&Value) -> bool) -> usize {
        self.received().iter().filter(|(_, v)| matches(v)).count()
    }
}

async fn connection(
    mut ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    n: usize,
    mut control: mpsc::UnboundedReceiver<Control>,
    log: Arc<Mutex<Vec<(usize, Value)>>>,
    dialect: Dialect,
) {
    // Gemini sends its JSON in binary frames; OpenAI in text frames.
    let frame = |v: Value| match dialect {
        Dialect::Gemini => WsMessage::Binary(v.to_string().into_bytes().into()),
        _ => WsMessage::Text(v.to_string().into()),
    };
    if dialect == Dialect::OpenAi {
        let created = json!({"type": "session.created", "event_id": "event_0", "session": {"type": "realtime", "id": "sess_1", "object": "realtime.session", "model": "gpt-realtime"}});
        let _ = ws.send(frame(created)).await;
    }
    loop {
        tokio::select! {
            message = ws.next() => {
                let Some(Ok(message)) = message else { return };
                let text = match message {
                    WsMessage::Text(t) => t.to_string(),
                    WsMessage::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
                    _ => continue,
                };
                let Ok(value) = serde_json::from_str::<Value>(&text) else { continue };
                log.lock().expect("lock").push((n, value.clone()));
                let reply = match dialect {
                    Dialect::OpenAi if value["type"] == "session.update" => Some(json!({
                        "type": "session.updated", "event_id": "event_1", "session": value["session"],
                    })),
                    Dialect::Gemini if value.get("setup").is_some() => Some(json!({"setupComplete": {}})),
                    _ => None,
                };
                if let Some(reply) = reply {
                    let _ = ws.send(frame(reply)).await;
                }
            }
            command = control.recv() => match command {
                Some(Control::Send(v)) => { let _ = ws.send(frame(v)).await; }
                Some(Control::Drop) | None => return,
            },
        }
    }
}

/// Passes every frame on and reports its name.
struct Probe(mpsc::UnboundedSender<Frame>);

impl FrameProcessor for Probe {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if direction == Direction::Downstream {
            let _ = self.0.send(frame.clone());
        }
        cx.push(frame, direction);
        Ok(())
    }
}

struct Bot {
    handle: SessionHandle,
    session: Session,
    context: ContextHandle,
    frames: mpsc::UnboundedReceiver<Frame>,
    errors: mpsc::UnboundedReceiver<(String, bool)>,
    events: broadcast::Receiver<SessionEvent>,
}

impl Bot {
    fn start<P: RealtimeProtocol>(protocol: P, options: RealtimeOptions) -> (Self, Controls) {
        let mut initial = LlmContext::new(vec![
            Message::system("You are a test bot."),
            Message::user("Earlier question."),
            Message::assistant("Earlier answer."),
        ]);
        initial.tools = ToolsSchema::new(vec![
            FunctionSchema::new("get_time", "Tells the time."),
            FunctionSchema::new("set_timer", "Sets a timer.").property(
                "seconds",
                json!({"type": "integer"}),
                true,
            ),
        ]);
        let context = ContextHandle::new(initial);
        let mut llm = RealtimeService::new(protocol, context.clone(), options);
        llm.functions().register_function(
            Some("get_time"),
            |p: FunctionCallParams| async move { p.result_callback.done(json!("12:00")) },
            FunctionOptions::default(),
        );
        let (release_tx, release_rx) = mpsc::unbounded_channel::<()>();
        let release_rx = Arc::new(tokio::sync::Mutex::new(release_rx));
        llm.functions().register_function(
            Some("set_timer"),
            move |p: FunctionCallParams| {
                let release = release_rx.clone();
                async move {
                    let mut release = release.lock().await;
                    release.recv().await;
                    p.result_callback
                        .deliver(json!("half way"), ResultProperties::intermediate());
                    release.recv().await;
                    p.result_callback.done(json!("rang"));
                }
            },
            FunctionOptions::asynchronous(),
        );
        let (tx, frames) = mpsc::unbounded_channel();
        let (etx, errors) = mpsc::unbounded_channel();
        let pipeline = Pipeline::new()
            .then(llm)
            .then(Probe(tx))
            .then(AssistantAggregator::new(context.clone()));
        let builder = Session::builder(pipeline)
            .idle_timeout(None)
            .params(StartParams {
                enable_metrics: true,
                enable_usage_metrics: true,
                ..StartParams::default()
            })
            .on_error(move |e| {
                let _ = etx.send((e.message.clone(), e.fatal));
            });
        let events = builder.subscribe();
        let session = builder.spawn();
        (
            Self {
                handle: session.handle(),
                session,
                context,
                frames,
                errors,
                events,
            },
            Controls {
                release: release_tx,
            },
        )
    }

    /// Waits for a frame that matches; returns the frames seen up to it.
    async fn until(&mut self, what: &str, matches: impl Fn(&Frame) -> bool) -> Vec<Frame> {
        let mut seen = Vec::new();
        let found = tokio::time::timeout(WAIT, async {
            while let Some(frame) = self.frames.recv().await {
                let hit = matches(&frame);
                seen.push(frame);
                if hit {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(
            matches!(found, Ok(true)),
            "never saw {what}; saw {:?}",
            seen.iter().map(Frame::name).collect::<Vec<_>>()
        );
        seen
    }

    async fn stop(self) -> (Vec<Message>, Vec<(String, bool)>, Vec<Event>) {
        self.handle.stop_when_done().await.expect("queued");
        let reason = tokio::time::timeout(WAIT, self.session.join())
            .await
            .expect("the session ends");
        assert_eq!(reason, EndReason::Completed);
        let mut errors = self.errors;
        let mut out = Vec::new();
        while let Ok(e) = errors.try_recv() {
            out.push(e);
        }
        let mut events = self.events;
        let mut seen = Vec::new();
        while let Ok(e) = events.try_recv() {
            seen.push(e.event);
        }
        (self.context.messages(), out, seen)
    }
}

struct Controls {
    release: mpsc::UnboundedSender<()>,
}

fn options() -> RealtimeOptions {
    RealtimeOptions {
        reconnect: ReconnectPolicy {
            max_attempts: 3,
            initial_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(5),
            setup_timeout: Duration::from_secs(5),
        },
        response_timeout: Duration::from_secs(10),
        ..RealtimeOptions::default()
    }
}

fn openai(server: &FakeServer, turns: TurnDetection) -> OpenAiRealtime {
    let mut settings = OpenAiRealtimeSettings::new("sk-test");
    settings.url = server.url.clone();
    settings.turn_detection = turns;
    OpenAiRealtime::new(settings)
}

fn is_type(v: &Value, kind: &str) -> bool {
    v["type"] == kind
}

fn is_output(v: &Value, call_id: &str) -> bool {
    v["type"] == "conversation.item.create"
        && v["item"]["type"] == "function_call_output"
        && v["item"]["call_id"] == call_id
}

fn is_partial(v: &Value) -> bool {
    v["type"] == "conversation.item.create"
        && v["item"]["role"] == "system"
        && v["item"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("partial result"))
}

fn call_events(response: &str, call_id: &str, name: &str, arguments: &str) -> Vec<Value> {
    vec![
        json!({"type": "response.created", "event_id": "e1", "response": {"id": response, "object": "realtime.response", "status": "in_progress", "output": []}}),
        json!({"type": "response.output_item.added", "event_id": "e2", "response_id": response, "output_index": 0, "item": {"id": "item_call", "type": "function_call", "status": "in_progress", "name": name, "call_id": call_id, "arguments": ""}}),
        json!({"type": "response.function_call_arguments.done", "event_id": "e3", "response_id": response, "item_id": "item_call", "output_index": 0, "call_id": call_id, "name": name, "arguments": arguments}),
        json!({"type": "response.done", "event_id": "e4", "response": {"id": response, "object": "realtime.response", "status": "completed", "output": [], "usage": {"total_tokens": 30, "input_tokens": 20, "output_tokens": 10, "input_token_details": {"cached_tokens": 0}}}}),
    ]
}

fn audio_delta(response: &str, item: &str, samples: usize) -> Value {
    use base64::Engine;
    let bytes = vec![0x10u8; samples * 2];
    json!({"type": "response.output_audio.delta", "event_id": "ea", "response_id": response, "item_id": item, "output_index": 0, "content_index": 0, "delta": base64::engine::general_purpose::STANDARD.encode(bytes)})
}

fn spoken_response(response: &str, item: &str, words: &str) -> Vec<Value> {
    vec![
        json!({"type": "response.created", "event_id": "e5", "response": {"id": response, "status": "in_progress", "output": []}}),
        audio_delta(response, item, 2400),
        json!({"type": "response.output_audio_transcript.delta", "event_id": "e6", "response_id": response, "item_id": item, "output_index": 0, "content_index": 0, "delta": words}),
        json!({"type": "response.done", "event_id": "e7", "response": {"id": response, "status": "completed", "output": []}}),
    ]
}

fn is_response_end(f: &Frame) -> bool {
    f.name() == "llm_full_response_end"
}

#[tokio::test]
async fn session_is_configured_and_history_sent_once() {
    let server = FakeServer::start(Dialect::OpenAi).await;
    let (bot, _controls) = Bot::start(openai(&server, TurnDetection::ServerVad), options());
    let update = server
        .wait_for("session.update", 0, |v| is_type(v, "session.update"))
        .await;
    let session = &update["session"];
    assert_eq!(session["type"], "realtime");
    assert_eq!(session["instructions"], "You are a test bot.");
    assert_eq!(session["audio"]["input"]["format"]["rate"], 24000);
    assert_eq!(
        session["audio"]["input"]["turn_detection"]["type"],
        "server_vad"
    );
    let tools: Vec<&str> = session["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(tools, ["get_time", "set_timer"]);
    // The earlier conversation goes over as items, once.
    server
        .wait_for("the history", 1, |v| is_type(v, "conversation.item.create"))
        .await;
    let (path, auth) = server.requests.lock().expect("lock")[0].clone();
    assert_eq!(path, "/v1/realtime?model=gpt-realtime");
    assert_eq!(auth.as_deref(), Some("Bearer sk-test"));
    let (_, errors, _) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(server.count(|v| is_type(v, "conversation.item.create")), 2);
}

#[tokio::test]
async fn a_sync_tool_result_goes_back_as_function_call_output() {
    let server = FakeServer::start(Dialect::OpenAi).await;
    let (mut bot, _controls) = Bot::start(openai(&server, TurnDetection::ServerVad), options());
    server
        .wait_for("session.update", 0, |v| is_type(v, "session.update"))
        .await;
    for event in call_events("resp_1", "call_1", "get_time", "{}") {
        server.send(event);
    }
    let output = server
        .wait_for("the tool's output", 0, |v| is_output(v, "call_1"))
        .await;
    assert_eq!(output["item"]["output"], "\"12:00\"");
    let outputs_before_answer = server.received().len();
    server
        .wait_for("response.create", 0, |v| is_type(v, "response.create"))
        .await;
    assert!(server.received().len() >= outputs_before_answer);
    for event in spoken_response("resp_2", "item_2", "It is noon.") {
        server.send(event);
    }
    let seen = bot
        .until(
            "the spoken answer",
            |f| matches!(&f.body, FrameBody::Data(DataFrame::LlmText(t)) if t == "It is noon."),
        )
        .await;
    assert!(seen.iter().any(|f| f.name() == "function_call_in_progress"));
    bot.until("the answer's end", is_response_end).await;
    let (messages, errors, events) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(server.count(|v| is_output(v, "call_1")), 1);
    assert_eq!(server.count(|v| is_type(v, "response.create")), 1);
    let json: Vec<Value> = messages
        .iter()
        .map(|m| serde_json::to_value(m).expect("json"))
        .collect();
    assert!(
        json.iter()
            .any(|m| m["role"] == "tool" && m["tool_call_id"] == "call_1")
    );
    assert_eq!(json.last().expect("messages")["content"], "It is noon.");
    assert!(events.iter().any(
        |e| matches!(e, Event::ToolCallResult { tool_call_id, .. } if tool_call_id == "call_1")
    ));
    assert!(events.iter().any(|e| matches!(e, Event::Metrics { data } if data.iter().any(|d| matches!(d, voxide::frames::MetricsData::LlmUsage { .. })))));
}

#[tokio::test]
async fn an_async_tool_delivers_one_partial_message_and_one_output() {
    let server = FakeServer::start(Dialect::OpenAi).await;
    let (mut bot, controls) = Bot::start(openai(&server, TurnDetection::ServerVad), options());
    server
        .wait_for("session.update", 0, |v| is_type(v, "session.update"))
        .await;
    for event in call_events("resp_1", "call_t", "set_timer", r#"{"seconds":5}"#) {
        server.send(event);
    }
    bot.until("the call's response end", is_response_end).await;
    // The started message is not sent; the partial result goes as a system message.
    controls.release.send(()).expect("release");
    let partial = server.wait_for("the partial result", 0, is_partial).await;
    assert!(
        partial["item"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("half way"))
    );
    assert_eq!(server.count(|v| is_type(v, "response.create")), 0);
    controls.release.send(()).expect("release");
    let output = server
        .wait_for("the final result", 0, |v| is_output(v, "call_t"))
        .await;
    assert_eq!(output["item"]["output"], "\"rang\"");
    server
        .wait_for("response.create", 0, |v| is_type(v, "response.create"))
        .await;
    for event in spoken_response("resp_2", "item_2", "Your timer rang.") {
        server.send(event);
    }
    bot.until("the answer", is_response_end).await;
    let (_, errors, _) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(server.count(|v| is_output(v, "call_t")), 1);
    assert_eq!(server.count(is_partial), 1);
    assert_eq!(server.count(|v| is_type(v, "response.create")), 1);
    // History (2 items) + partial + output: nothing else was created.
    assert_eq!(server.count(|v| is_type(v, "conversation.item.create")), 4);
}

#[tokio::test]
async fn the_server_hearing_the_user_interrupts_and_truncates() {
    let server = FakeServer::start(Dialect::OpenAi).await;
    let (mut bot, _controls) = Bot::start(openai(&server, TurnDetection::ServerVad), options());
    server
        .wait_for("session.update", 0, |v| is_type(v, "session.update"))
        .await;
    server.send(json!({"type": "response.created", "event_id": "e1", "response": {"id": "resp_1", "status": "in_progress", "output": []}}));
    server.send(audio_delta("resp_1", "item_a", 24_000));
    bot.until("bot audio", |f| {
        matches!(f.body, FrameBody::Data(DataFrame::OutputAudio(_)))
    })
    .await;
    server.send(json!({"type": "input_audio_buffer.speech_started", "event_id": "e2", "audio_start_ms": 1000, "item_id": "item_user"}));
    let seen = bot
        .until("the interruption", |f| {
            matches!(f.body, FrameBody::System(SystemFrame::Interruption))
        })
        .await;
    assert!(
        seen.iter()
            .any(|f| matches!(f.body, FrameBody::System(SystemFrame::UserStartedSpeaking)))
    );
    let truncate = server
        .wait_for("conversation.item.truncate", 0, |v| {
            is_type(v, "conversation.item.truncate")
        })
        .await;
    assert_eq!(truncate["item_id"], "item_a");
    assert_eq!(truncate["content_index"], 0);
    let played = truncate["audio_end_ms"].as_u64().expect("audio_end_ms");
    assert!(played <= 1000, "played {played} ms of 1000");
    // With server VAD the server cancels the response itself; what it still sends is dropped.
    assert_eq!(server.count(|v| is_type(v, "response.cancel")), 0);
    server.send(audio_delta("resp_1", "item_a", 2400));
    server.send(json!({"type": "response.done", "event_id": "e3", "response": {"id": "resp_1", "status": "cancelled", "output": []}}));
    server.send(json!({"type": "input_audio_buffer.speech_stopped", "event_id": "e4", "audio_end_ms": 2000, "item_id": "item_user"}));
    let after = bot
        .until("the user's stop", |f| {
            matches!(f.body, FrameBody::System(SystemFrame::UserStoppedSpeaking))
        })
        .await;
    assert!(
        !after
            .iter()
            .any(|f| matches!(f.body, FrameBody::Data(DataFrame::OutputAudio(_)))),
        "audio of the cut-off response still went out"
    );
    let (_, errors, _) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test]
async fn a_local_interruption_cancels_and_truncates() {
    let server = FakeServer::start(Dialect::OpenAi).await;
    let (mut bot, _controls) = Bot::start(openai(&server, TurnDetection::Local), options());
    server
        .wait_for("session.update", 0, |v| is_type(v, "session.update"))
        .await;
    // voxide's turns end the user's turn: the audio is committed and a response asked for.
    bot.handle
        .queue_frame(SystemFrame::UserStoppedSpeaking)
        .await
        .expect("queued");
    server
        .wait_for("the commit", 0, |v| is_type(v, "input_audio_buffer.commit"))
        .await;
    server
        .wait_for("response.create", 0, |v| is_type(v, "response.create"))
        .await;
    server.send(json!({"type": "response.created", "event_id": "e1", "response": {"id": "resp_1", "status": "in_progress", "output": []}}));
    server.send(audio_delta("resp_1", "item_b", 4800));
    bot.until("bot audio", |f| {
        matches!(f.body, FrameBody::Data(DataFrame::OutputAudio(_)))
    })
    .await;
    bot.handle
        .queue_frame(SystemFrame::Interruption)
        .await
        .expect("queued");
    server
        .wait_for("response.cancel", 0, |v| is_type(v, "response.cancel"))
        .await;
    let truncate = server
        .wait_for("the truncation", 0, |v| {
            is_type(v, "conversation.item.truncate")
        })
        .await;
    assert_eq!(truncate["item_id"], "item_b");
    assert!(
        truncate["audio_end_ms"]
            .as_u64()
            .is_some_and(|ms| ms <= 200)
    );
    let (_, errors, _) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test]
async fn a_dropped_connection_reconnects_without_delivering_twice() {
    let server = FakeServer::start(Dialect::OpenAi).await;
    let (mut bot, controls) = Bot::start(openai(&server, TurnDetection::ServerVad), options());
    server
        .wait_for("session.update", 0, |v| is_type(v, "session.update"))
        .await;
    for event in call_events("resp_1", "call_t", "set_timer", r#"{"seconds":5}"#) {
        server.send(event);
    }
    bot.until("the call's response end", is_response_end).await;
    controls.release.send(()).expect("release");
    server.wait_for("the partial result", 0, is_partial).await;
    // A response is under way when the network fails.
    server.send(json!({"type": "response.created", "event_id": "e1", "response": {"id": "resp_2", "status": "in_progress", "output": []}}));
    server.send(audio_delta("resp_2", "item_2", 2400));
    bot.until("bot audio", |f| {
        matches!(f.body, FrameBody::Data(DataFrame::OutputAudio(_)))
    })
    .await;
    server.drop_connection();
    // The new connection is configured again and the cut-off response asked for again.
    server
        .wait_for("a second session.update", 1, |v| {
            is_type(v, "session.update")
        })
        .await;
    server
        .wait_for("the restarted response", 0, |v| {
            is_type(v, "response.create")
        })
        .await;
    controls.release.send(()).expect("release");
    server
        .wait_for("the final result", 0, |v| is_output(v, "call_t"))
        .await;
    let (_, errors, events) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);
    assert_eq!(server.count(is_partial), 1);
    assert_eq!(server.count(|v| is_output(v, "call_t")), 1);
    // History went over once, on the first connection only.
    let second: Vec<Value> = server
        .received()
        .into_iter()
        .filter(|(n, _)| *n == 1)
        .map(|(_, v)| v)
        .collect();
    assert!(
        !second
            .iter()
            .any(|v| is_type(v, "conversation.item.create") && !is_output(v, "call_t"))
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::LlmReconnecting { attempt: 1, .. }))
    );
    assert!(events.iter().any(|e| matches!(
        e,
        Event::LlmReconnected {
            restarted_response: true,
            ..
        }
    )));
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_with_an_error() {
    let server = FakeServer::start(Dialect::OpenAi).await;
    let mut opts = options();
    opts.response_timeout = Duration::from_millis(300);
    let (bot, _controls) = Bot::start(openai(&server, TurnDetection::Local), opts);
    server
        .wait_for("session.update", 0, |v| is_type(v, "session.update"))
        .await;
    bot.handle
        .queue_frame(SystemFrame::UserStoppedSpeaking)
        .await
        .expect("queued");
    server
        .wait_for("response.create", 0, |v| is_type(v, "response.create"))
        .await;
    let mut bot = bot;
    let error = tokio::time::timeout(WAIT, bot.errors.recv())
        .await
        .expect("an error in time")
        .expect("an error");
    assert!(error.0.contains("no answer"), "{error:?}");
    assert!(!error.1, "a timeout is not fatal");
    let (_, _, events) = bot.stop().await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::LlmCompletionTimeout { .. }))
    );
}

#[tokio::test]
async fn a_server_that_never_sets_up_gives_a_fatal_error_not_a_hang() {
    let server = FakeServer::start(Dialect::Silent).await;
    let mut opts = options();
    opts.reconnect.setup_timeout = Duration::from_millis(200);
    opts.reconnect.max_attempts = 1;
    let (mut bot, _controls) = Bot::start(openai(&server, TurnDetection::ServerVad), opts);
    let error = tokio::time::timeout(WAIT, bot.errors.recv())
        .await
        .expect("an error in time")
        .expect("an error");
    assert!(error.1, "giving up is fatal: {error:?}");
    assert!(error.0.contains("could not be reached"), "{error:?}");
    let reason = tokio::time::timeout(WAIT, bot.session.join())
        .await
        .expect("the session ends");
    assert!(matches!(reason, EndReason::FatalError(_)), "{reason:?}");
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn malformed_server_events_are_ignored() {
    let server = FakeServer::start(Dialect::OpenAi).await;
    let (mut bot, _controls) = Bot::start(openai(&server, TurnDetection::ServerVad), options());
    server
        .wait_for("session.update", 0, |v| is_type(v, "session.update"))
        .await;
    server.send(json!("not an event"));
    server.send(json!({"no": "type"}));
    server.send(json!({"type": "response.output_audio.delta", "delta": "%%% not base64"}));
    server.send(json!({"type": "response.function_call_arguments.done", "call_id": 7}));
    server.send(json!({"type": "some.future.event", "x": 1}));
    for event in spoken_response("resp_1", "item_1", "Still here.") {
        server.send(event);
    }
    bot.until(
        "the answer after the junk",
        |f| matches!(&f.body, FrameBody::Data(DataFrame::LlmText(t)) if t == "Still here."),
    )
    .await;
    let (_, errors, _) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
}

fn gemini(server: &FakeServer) -> GeminiLive {
    let mut settings = GeminiLiveSettings::new("g-test");
    settings.url = server.url.clone();
    GeminiLive::new(settings)
}

fn function_response(v: &Value) -> Option<&Value> {
    v.pointer("/toolResponse/functionResponses/0")
}

#[tokio::test]
async fn gemini_live_gets_async_results_through_tool_response() {
    let server = FakeServer::start(Dialect::Gemini).await;
    let (mut bot, controls) = Bot::start(gemini(&server), options());
    let setup = server
        .wait_for("setup", 0, |v| v.get("setup").is_some())
        .await;
    let declarations = setup
        .pointer("/setup/tools/0/functionDeclarations")
        .and_then(Value::as_array)
        .expect("declarations");
    let timer = declarations
        .iter()
        .find(|d| d["name"] == "set_timer")
        .expect("set_timer declared");
    assert_eq!(timer["behavior"], "NON_BLOCKING");
    let clock = declarations
        .iter()
        .find(|d| d["name"] == "get_time")
        .expect("get_time declared");
    assert!(clock.get("behavior").is_none());
    assert_eq!(
        setup.pointer("/setup/systemInstruction/parts/0/text"),
        Some(&json!("You are a test bot."))
    );
    let (path, auth) = server.requests.lock().expect("lock")[0].clone();
    assert!(path.ends_with("?key=g-test"), "{path}");
    assert!(auth.is_none());

    // A sync call: its result goes back plainly.
    server.send(
        json!({"toolCall": {"functionCalls": [{"id": "fc_1", "name": "get_time", "args": {}}]}}),
    );
    let sync = server
        .wait_for("the sync result", 0, |v| {
            function_response(v).is_some_and(|r| r["id"] == "fc_1")
        })
        .await;
    let sync = function_response(&sync).expect("response");
    assert_eq!(sync["name"], "get_time");
    assert_eq!(sync["response"], json!({"result": "12:00"}));
    assert!(sync.get("scheduling").is_none());

    // An async call: a partial result that says more will come, then the final one when idle.
    server.send(json!({"toolCall": {"functionCalls": [{"id": "fc_2", "name": "set_timer", "args": {"seconds": 5}}]}}));
    bot.until("the call in progress", |f| {
        f.name() == "function_call_in_progress"
    })
    .await;
    controls.release.send(()).expect("release");
    let partial = server
        .wait_for("the partial result", 0, |v| {
            function_response(v).is_some_and(|r| r["id"] == "fc_2" && r["willContinue"] == true)
        })
        .await;
    assert_eq!(
        function_response(&partial).expect("response")["scheduling"],
        "SILENT"
    );
    controls.release.send(()).expect("release");
    let last = server
        .wait_for("the final result", 0, |v| {
            function_response(v)
                .is_some_and(|r| r["id"] == "fc_2" && r.get("willContinue").is_none())
        })
        .await;
    let last = function_response(&last).expect("response");
    assert_eq!(last["scheduling"], "WHEN_IDLE");
    assert_eq!(last["response"], json!({"result": "rang"}));

    // Then it speaks, in binary frames as Gemini does.
    use base64::Engine;
    let audio = base64::engine::general_purpose::STANDARD.encode([1u8, 0, 2, 0]);
    server.send(json!({"serverContent": {"modelTurn": {"parts": [{"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": audio}}]}}}));
    server.send(json!({"serverContent": {"outputTranscription": {"text": "Your timer rang."}}}));
    server.send(json!({"serverContent": {"turnComplete": true}, "usageMetadata": {"promptTokenCount": 12, "responseTokenCount": 5, "totalTokenCount": 17}}));
    bot.until(
        "the spoken answer",
        |f| matches!(&f.body, FrameBody::Data(DataFrame::LlmText(t)) if t == "Your timer rang."),
    )
    .await;
    bot.until("its end", is_response_end).await;
    let (messages, errors, _) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
    let count = |id: &str| server.count(|v| function_response(v).is_some_and(|r| r["id"] == id));
    assert_eq!(count("fc_1"), 1);
    assert_eq!(count("fc_2"), 2);
    let json: Vec<Value> = messages
        .iter()
        .map(|m| serde_json::to_value(m).expect("json"))
        .collect();
    assert_eq!(
        json.last().expect("messages")["content"],
        "Your timer rang.",
        "{json:#?}"
    );
}

#[tokio::test]
async fn voxide_run_talks_to_a_realtime_provider() {
    use voxide::bot::run::{RunOptions, run};
    use voxide::bot::{BotOptions, LlmChoice};

    let dir = std::env::temp_dir().join(format!("voxide-realtime-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let input = dir.join("in.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(&input, spec).expect("wav");
    for i in 0..32_000u32 {
        writer
            .write_sample(((i % 40) as i16 - 20) * 50)
            .expect("sample");
    }
    writer.finalize().expect("wav");

    let server = FakeServer::start(Dialect::OpenAi).await;
    let mut settings = OpenAiRealtimeSettings::new("sk-test");
    settings.url = server.url.clone();
    let options = RunOptions {
        input,
        output: dir.join("out.wav"),
        events: Some(dir.join("events.jsonl")),
        fast: false,
        max_tail: Duration::from_secs(10),
        settle: Duration::from_millis(800),
        bot: BotOptions {
            llm: LlmChoice::OpenAiRealtime(settings),
            ..BotOptions::default()
        },
    };
    let run = tokio::spawn(run(options));
    // The provider hears the user (the audio arrives at 24 kHz), transcribes and answers.
    let append = server
        .wait_for("user audio", 10, |v| {
            is_type(v, "input_audio_buffer.append")
        })
        .await;
    assert!(append["audio"].as_str().is_some_and(|a| !a.is_empty()));
    server.send(json!({"type": "input_audio_buffer.speech_started", "event_id": "e1", "audio_start_ms": 0, "item_id": "item_u"}));
    server.send(json!({"type": "input_audio_buffer.speech_stopped", "event_id": "e2", "audio_end_ms": 500, "item_id": "item_u"}));
    server.send(json!({"type": "conversation.item.input_audio_transcription.completed", "event_id": "e3", "item_id": "item_u", "content_index": 0, "transcript": "What time is it?"}));
    server.send(json!({"type": "response.created", "event_id": "e4", "response": {"id": "resp_1", "status": "in_progress", "output": []}}));
    for _ in 0..5 {
        server.send(audio_delta("resp_1", "item_b", 2400));
    }
    server.send(json!({"type": "response.output_audio_transcript.delta", "event_id": "e5", "response_id": "resp_1", "item_id": "item_b", "output_index": 0, "content_index": 0, "delta": "It is noon."}));
    server.send(json!({"type": "response.done", "event_id": "e6", "response": {"id": "resp_1", "status": "completed", "output": []}}));
    let summary = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the run ends")
        .expect("joined")
        .expect("the run succeeds");
    assert_eq!(summary.transcripts, ["What time is it?"]);
    assert_eq!(summary.bot_text, ["It is noon."]);
    let mut reader = hound::WavReader::open(dir.join("out.wav")).expect("reply wav");
    let loud = reader
        .samples::<i16>()
        .filter_map(Result::ok)
        .filter(|s| s.unsigned_abs() > 1000)
        .count();
    assert!(
        loud > 10_000,
        "the bot's audio is in the recording ({loud} loud samples)"
    );
    let events = std::fs::read_to_string(dir.join("events.jsonl")).expect("events");
    assert!(events.contains("\"bot_started_speaking\""));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reception desk that hands billing calls on to the billing desk, on a realtime model.
fn reception_flow<P: RealtimeProtocol>(protocol: P) -> Bot {
    use voxide::config::flow::{FunctionConfig, NodeConfig, TransitionConfig};
    use voxide::flows::{Flow, FlowOptions, FlowSession};
    let nodes = [
        NodeConfig {
            name: "reception".into(),
            task: Some("Ask what the call is about.".into()),
            functions: vec![FunctionConfig {
                name: "to_billing".into(),
                description: Some("The call is about a bill.".into()),
                transition_to: Some(TransitionConfig::Node("billing".into())),
                ..FunctionConfig::default()
            }],
            ..NodeConfig::default()
        },
        NodeConfig {
            name: "billing".into(),
            role: Some("You are the billing desk.".into()),
            task: Some("Ask for the invoice number.".into()),
            functions: vec![FunctionConfig {
                name: "take_invoice".into(),
                description: Some("Records the invoice number.".into()),
                ..FunctionConfig::default()
            }],
            ..NodeConfig::default()
        },
    ];
    let flow = Arc::new(Flow::new(&nodes, None, None, &[]).expect("flow"));
    assert_eq!(flow.realtime_gap(), None);
    let realtime = FlowOptions {
        realtime: true,
        ..FlowOptions::default()
    };
    let session = FlowSession::new(flow, "You answer the phone.", realtime);
    let context = ContextHandle::new(LlmContext::default());
    let mut llm = RealtimeService::new(protocol, context.clone(), options());
    session.register(llm.functions());
    *context.lock() = session.initial_context();
    let (tx, frames) = mpsc::unbounded_channel();
    let (etx, errors) = mpsc::unbounded_channel();
    let pipeline = Pipeline::new()
        .then(llm)
        .then(session.stage(context.clone()))
        .then(Probe(tx))
        .then(AssistantAggregator::new(context.clone()));
    let builder = Session::builder(pipeline)
        .idle_timeout(None)
        .on_error(move |e| {
            let _ = etx.send((e.message.clone(), e.fatal));
        });
    let events = builder.subscribe();
    let running = builder.spawn();
    Bot {
        handle: running.handle(),
        session: running,
        context,
        frames,
        errors,
        events,
    }
}

/// The billing node was entered and nothing went wrong.
async fn ends_at_billing(bot: Bot) {
    let (_, errors, events) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::FlowNode { node } if node == "billing"))
    );
}

#[tokio::test]
async fn a_flow_on_openai_realtime_gives_the_session_each_nodes_instructions_and_tools_before_its_answer()
 {
    let server = FakeServer::start(Dialect::OpenAi).await;
    let mut bot = reception_flow(openai(&server, TurnDetection::ServerVad));
    let first = server
        .wait_for("session.update", 0, |v| is_type(v, "session.update"))
        .await;
    assert_eq!(
        first["session"]["instructions"],
        "You answer the phone.\n\nAsk what the call is about."
    );
    let names = |update: &Value| -> Vec<String> {
        update["session"]["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|t| t["name"].as_str().expect("name").to_owned())
            .collect()
    };
    assert_eq!(names(&first), ["to_billing"]);
    for event in call_events("resp_1", "call_1", "to_billing", "{}") {
        server.send(event);
    }
    let update = server
        .wait_for("the billing node's update", 1, |v| {
            is_type(v, "session.update")
        })
        .await;
    assert_eq!(
        update["session"]["instructions"],
        "You are the billing desk.\n\nAsk for the invoice number."
    );
    assert_eq!(names(&update), ["take_invoice"]);
    server
        .wait_for("response.create", 0, |v| is_type(v, "response.create"))
        .await;
    // In order: the new instructions, the function's output, then the ask for an answer.
    let order: Vec<&str> = server
        .received()
        .iter()
        .filter_map(|(_, v)| {
            if is_type(v, "session.update") {
                Some("update")
            } else if is_output(v, "call_1") {
                Some("output")
            } else if is_type(v, "response.create") {
                Some("respond")
            } else {
                None
            }
        })
        .collect();
    assert_eq!(order, ["update", "update", "output", "respond"]);
    for event in spoken_response("resp_2", "item_2", "What is the invoice number?") {
        server.send(event);
    }
    bot.until("the billing node's answer", is_response_end)
        .await;
    ends_at_billing(bot).await;
}

#[tokio::test]
async fn a_flow_on_gemini_live_updates_the_sessions_instructions_and_tools_before_the_functions_response()
 {
    let server = FakeServer::start(Dialect::Gemini).await;
    let mut bot = reception_flow(gemini(&server));
    let setup = server
        .wait_for("setup", 0, |v| v.get("setup").is_some())
        .await;
    assert_eq!(
        setup.pointer("/setup/systemInstruction/parts/0/text"),
        Some(&json!(
            "You answer the phone.\n\nAsk what the call is about."
        ))
    );
    let names = |tools: Option<&Value>| -> Vec<String> {
        tools
            .and_then(Value::as_array)
            .expect("declarations")
            .iter()
            .map(|d| d["name"].as_str().expect("name").to_owned())
            .collect()
    };
    assert_eq!(
        names(setup.pointer("/setup/tools/0/functionDeclarations")),
        ["to_billing"]
    );
    server.send(
        json!({"toolCall": {"functionCalls": [{"id": "fc_1", "name": "to_billing", "args": {}}]}}),
    );
    let response = server
        .wait_for("the function's response", 0, |v| {
            function_response(v).is_some_and(|r| r["id"] == "fc_1")
        })
        .await;
    assert_eq!(
        function_response(&response).expect("response")["name"],
        "to_billing"
    );
    let update = server
        .wait_for("the billing node's update", 0, |v| {
            v.get("contextUpdate").is_some()
        })
        .await;
    assert_eq!(
        update.pointer("/contextUpdate/systemInstruction/parts/0/text"),
        Some(&json!(
            "You are the billing desk.\n\nAsk for the invoice number."
        ))
    );
    assert_eq!(
        names(update.pointer("/contextUpdate/tools/tools/0/functionDeclarations")),
        ["take_invoice"]
    );
    // In order: the set-up, the new node's context, then the response Gemini answers; once.
    let order: Vec<&str> = server
        .received()
        .iter()
        .filter_map(|(_, v)| {
            if v.get("setup").is_some() {
                Some("setup")
            } else if v.get("contextUpdate").is_some() {
                Some("update")
            } else if function_response(v).is_some() {
                Some("response")
            } else {
                None
            }
        })
        .collect();
    assert_eq!(order, ["setup", "update", "response"]);
    server.send(
        json!({"serverContent": {"outputTranscription": {"text": "What is the invoice number?"}}}),
    );
    server.send(json!({"serverContent": {"turnComplete": true}}));
    bot.until("the billing node's answer", is_response_end)
        .await;
    assert_eq!(server.count(|v| v.get("contextUpdate").is_some()), 1);
    ends_at_billing(bot).await;
}
