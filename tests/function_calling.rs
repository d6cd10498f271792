//! Function calling through the LLM service and the assistant aggregator, driven by a scripted
//! engine that emits tool calls the way providers stream them (assembled calls, then the end).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{self, BoxStream};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use voxide::aggregators::AssistantAggregator;
use voxide::context::async_tool_messages::{AsyncToolMessageKind, parse_message};
use voxide::context::{ContextHandle, LlmContext, Message};
use voxide::events::EndReason;
use voxide::frames::{DataFrame, Frame, SystemFrame};
use voxide::pipeline::{
    Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session, SessionHandle,
};
use voxide::services::llm::{
    FunctionCallParams, FunctionOptions, LlmEngine, LlmError, LlmEvent, LlmRequest, LlmService,
    LlmServiceOptions, ResultProperties,
};

/// Plays back one scripted response per request; records every request.
#[derive(Clone, Default)]
struct ScriptedLlm {
    script: Arc<Mutex<VecDeque<Vec<LlmEvent>>>>,
    requests: Arc<Mutex<Vec<LlmRequest>>>,
}

impl ScriptedLlm {
    fn new(responses: Vec<Vec<LlmEvent>>) -> Self {
        Self {
            script: Arc::new(Mutex::new(responses.into())),
            requests: Arc::default(),
        }
    }

    fn runs(&self) -> usize {
        self.requests.lock().expect("lock").len()
    }
}

impl LlmEngine for ScriptedLlm {
    fn model(&self) -> &str {
        "scripted"
    }

    fn provider(&self) -> &str {
        "test"
    }

    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        self.requests.lock().expect("lock").push(request);
        let events = self
            .script
            .lock()
            .expect("lock")
            .pop_front()
            .unwrap_or_else(|| vec![LlmEvent::Text("ok".into())]);
        Box::pin(stream::iter(events.into_iter().map(Ok)))
    }
}

fn call(id: &str, name: &str, args: Value) -> LlmEvent {
    LlmEvent::ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.to_string(),
    }
}

fn say(text: &str) -> LlmEvent {
    LlmEvent::Text(text.into())
}

/// Reports every frame name that reaches the end of the pipeline.
struct Probe(mpsc::UnboundedSender<String>);

impl FrameProcessor for Probe {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let _ = self.0.send(frame.name().to_owned());
        cx.push(frame, direction);
        Ok(())
    }
}

struct Bot {
    handle: SessionHandle,
    session: Session,
    context: ContextHandle,
    frames: mpsc::UnboundedReceiver<String>,
    errors: mpsc::UnboundedReceiver<String>,
}

impl Bot {
    fn start(llm: LlmService) -> Self {
        let context = ContextHandle::new(LlmContext::new(vec![
            Message::system("You are a test bot."),
            Message::user("hello"),
        ]));
        let (tx, frames) = mpsc::unbounded_channel();
        let (etx, errors) = mpsc::unbounded_channel();
        let pipeline = Pipeline::new()
            .then(llm)
            .then(AssistantAggregator::new(context.clone()))
            .then(Probe(tx));
        let session = Session::builder(pipeline)
            .idle_timeout(None)
            .on_error(move |e| {
                let _ = etx.send(e.message.clone());
            })
            .spawn();
        Self {
            handle: session.handle(),
            session,
            context,
            frames,
            errors,
        }
    }

    async fn run_llm(&self) {
        self.handle
            .queue_frame(DataFrame::LlmContext(self.context.clone()))
            .await
            .expect("queued");
    }

    /// Waits until `n` responses have ended at the sink.
    async fn responses(&mut self, n: usize) {
        let mut seen = 0;
        while seen < n {
            match self.frames.recv().await {
                Some(name) if name == "llm_full_response_end" => seen += 1,
                Some(_) => {}
                None => panic!("session ended before {n} responses"),
            }
        }
    }

    async fn stop(self) -> (Vec<Message>, Vec<String>) {
        self.handle.stop_when_done().await.expect("queued");
        assert_eq!(self.session.join().await, EndReason::Completed);
        let mut errors = self.errors;
        let mut out = Vec::new();
        while let Ok(e) = errors.try_recv() {
            out.push(e);
        }
        (self.context.messages(), out)
    }
}

/// A handler that delivers `result` once released, and the sender that releases it.
fn held_until_released(
    result: Value,
) -> (
    mpsc::UnboundedSender<()>,
    impl Fn(FunctionCallParams) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync + 'static,
) {
    let (tx, rx) = mpsc::unbounded_channel::<()>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let handler = move |p: FunctionCallParams| {
        let rx = rx.clone();
        let result = result.clone();
        Box::pin(async move {
            rx.lock().await.recv().await;
            p.result_callback.done(result);
        }) as futures_util::future::BoxFuture<'static, ()>
    };
    (tx, handler)
}

fn json_of(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| serde_json::to_value(m).expect("json"))
        .collect()
}

#[tokio::test]
async fn a_sync_call_runs_one_inference_after_its_result() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "get_time", json!({}))],
        vec![say("It is noon.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("get_time"),
        |p| async move { p.result_callback.done(json!("12:00")) },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, errors) = bot.stop().await;
    assert_eq!(engine.runs(), 2);
    assert!(errors.is_empty(), "{errors:?}");
    let v = json_of(&messages);
    assert_eq!(v[2]["tool_calls"][0]["function"]["name"], "get_time");
    assert_eq!(
        v[3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "\"12:00\""})
    );
    assert_eq!(v[4], json!({"role": "assistant", "content": "It is noon."}));
    // The second request saw the result.
    let second = &engine.requests.lock().expect("lock")[1];
    assert_eq!(second.messages[3].text(), Some("\"12:00\""));
}

#[tokio::test]
async fn two_parallel_calls_run_exactly_one_inference_after_the_second() {
    let engine = ScriptedLlm::new(vec![
        vec![
            call("a", "slow", json!({"ms": 30})),
            call("b", "slow", json!({"ms": 1})),
        ],
        vec![say("Both done.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("slow"),
        |p| async move {
            let ms = p.arguments["ms"].as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            p.result_callback.done(json!(ms));
        },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    assert_eq!(engine.runs(), 2);
    let second = &engine.requests.lock().expect("lock")[1];
    let tool_results: Vec<_> = second
        .messages
        .iter()
        .filter(|m| m.role() == "tool")
        .filter_map(|m| m.text())
        .collect();
    assert_eq!(tool_results, vec!["30", "1"]);
    assert_eq!(messages.last().and_then(Message::text), Some("Both done."));
}

#[tokio::test]
async fn an_unknown_tool_gets_a_not_available_result() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "launch_rocket", json!({}))],
        vec![say("I can't.")],
    ]);
    let mut bot = Bot::start(LlmService::new(engine.clone()));
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let tool = messages
        .iter()
        .find(|m| m.role() == "tool")
        .and_then(Message::text)
        .expect("tool message");
    assert!(tool.contains("launch_rocket is not available"), "{tool}");
    assert_eq!(engine.runs(), 2);
}

#[tokio::test]
async fn a_panicking_handler_is_reported_and_the_model_gets_a_failed_result_without_the_panic_text()
{
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "explode", json!({}))],
        vec![say("That failed.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("explode"),
        |_p| async move { panic!("secret internal detail") },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, errors) = bot.stop().await;
    assert!(
        errors.iter().any(|e| e.contains("secret internal detail")),
        "{errors:?}"
    );
    let all = serde_json::to_string(&json_of(&messages)).expect("json");
    assert!(!all.contains("secret internal detail"));
    assert!(all.contains("failed and returned no result"));
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_call_is_cancelled_and_the_llm_runs() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "hang", json!({}))],
        vec![say("It took too long.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("hang"),
        |_p| async move { std::future::pending::<()>().await },
        FunctionOptions {
            timeout: Some(Duration::from_secs(5)),
            ..FunctionOptions::default()
        },
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let tool = messages
        .iter()
        .find(|m| m.role() == "tool")
        .and_then(Message::text);
    assert_eq!(tool, Some("CANCELLED"));
    assert_eq!(engine.runs(), 2);
}

#[tokio::test]
async fn an_async_call_delivers_started_intermediate_and_final_messages() {
    let engine = ScriptedLlm::new(vec![
        vec![call("t1", "set_timer", json!({"seconds": 1}))],
        vec![say("Timer set.")],
        vec![say("Halfway.")],
        vec![say("Ding!")],
    ]);
    let (go_tx, go_rx) = mpsc::unbounded_channel::<()>();
    let go_rx = Arc::new(tokio::sync::Mutex::new(go_rx));
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("set_timer"),
        move |p| {
            let go = go_rx.clone();
            async move {
                let mut go = go.lock().await;
                go.recv().await;
                p.result_callback
                    .deliver(json!({"remaining": 0.5}), ResultProperties::intermediate());
                go.recv().await;
                p.result_callback.done(json!({"rang": true}));
            }
        },
        FunctionOptions::asynchronous(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await; // the tool call, then "Timer set." while the timer runs
    go_tx.send(()).expect("go");
    bot.responses(1).await; // "Halfway."
    go_tx.send(()).expect("go");
    bot.responses(1).await; // "Ding!"
    let (messages, _) = bot.stop().await;
    let kinds: Vec<AsyncToolMessageKind> = messages
        .iter()
        .filter_map(parse_message)
        .map(|p| p.kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            AsyncToolMessageKind::Started,
            AsyncToolMessageKind::Intermediate,
            AsyncToolMessageKind::Final
        ]
    );
    assert_eq!(engine.runs(), 4);
    let first = &engine.requests.lock().expect("lock")[0];
    assert!(
        first.messages[0]
            .text()
            .is_some_and(|s| s.contains("async_tool")),
        "async instructions added"
    );
}

#[tokio::test]
async fn interruption_cancels_sync_calls_but_not_async_ones() {
    let engine = ScriptedLlm::new(vec![
        vec![
            call("s1", "lookup", json!({})),
            call("a1", "background", json!({})),
        ],
        vec![say("Working on it.")],
    ]);
    let (done_tx, background) = held_until_released(json!("finished"));
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("lookup"),
        |_p| async move { std::future::pending::<()>().await },
        FunctionOptions::default(),
    );
    llm.register_function(
        Some("background"),
        background,
        FunctionOptions::asynchronous(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(1).await;
    bot.handle
        .queue_frame(SystemFrame::Interruption)
        .await
        .expect("queued");
    // The async call survives the interruption and still delivers.
    done_tx.send(()).expect("done");
    loop {
        let finished = bot
            .context
            .messages()
            .iter()
            .filter_map(parse_message)
            .any(|p| p.kind == AsyncToolMessageKind::Final);
        if finished {
            break;
        }
        bot.frames.recv().await.expect("frames");
    }
    let (messages, _) = bot.stop().await;
    let sync_result = messages.iter().find_map(|m| match m {
        Message::Tool(t) if t.tool_call_id == "s1" => m.text(),
        _ => None,
    });
    assert_eq!(sync_result, Some("CANCELLED"));
}

#[tokio::test]
async fn a_result_during_the_users_turn_runs_the_llm_when_the_turn_ends() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "get_time", json!({}))],
        vec![say("It is noon.")],
    ]);
    let (release_tx, get_time) = held_until_released(json!("12:00"));
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(Some("get_time"), get_time, FunctionOptions::default());
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(1).await;
    bot.handle
        .queue_frame(SystemFrame::UserStartedSpeaking)
        .await
        .expect("queued");
    release_tx.send(()).expect("release");
    // Wait until the result is in the context: the LLM must not have run yet.
    while !bot
        .context
        .messages()
        .iter()
        .any(|m| m.text() == Some("\"12:00\""))
    {
        bot.frames.recv().await.expect("frames");
    }
    assert_eq!(engine.runs(), 1, "the LLM ran while the user was speaking");
    bot.handle
        .queue_frame(SystemFrame::UserStoppedSpeaking)
        .await
        .expect("queued");
    bot.responses(1).await;
    assert_eq!(engine.runs(), 2);
    bot.stop().await;
}

#[tokio::test]
async fn the_model_can_cancel_a_running_async_call() {
    let engine = ScriptedLlm::new(vec![
        vec![call("t1", "set_timer", json!({"seconds": 600}))],
        vec![say("Timer set.")],
        vec![call("x1", "cancel_set_timer", json!({}))],
        vec![say("Cancelled it.")],
    ]);
    let mut llm = LlmService::with_options(engine.clone(), LlmServiceOptions::default());
    llm.register_function(
        Some("set_timer"),
        |_p| async move { std::future::pending::<()>().await },
        FunctionOptions {
            cancellable_by_llm: true,
            ..FunctionOptions::asynchronous()
        },
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    assert!(
        engine.requests.lock().expect("lock")[0]
            .tools
            .standard_tools
            .iter()
            .any(|t| t.name == "cancel_set_timer")
    );
    bot.context
        .lock()
        .messages
        .push(Message::user("cancel the timer"));
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let cancel_result = messages.iter().find_map(|m| match m {
        Message::Tool(t) if t.tool_call_id == "x1" => m.text(),
        _ => None,
    });
    assert!(
        cancel_result.is_some_and(|r| r.contains("Cancelled the set_timer call t1")),
        "{cancel_result:?}"
    );
    assert!(
        messages
            .iter()
            .filter_map(parse_message)
            .any(|p| p.is_cancelled())
    );
}
