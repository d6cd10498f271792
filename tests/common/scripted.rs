//! A scripted LLM engine and a small bot around it (the LLM service, the assistant aggregator,
//! a probe), for the tests that drive function calling without a model.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures_util::stream::{self, BoxStream};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};

use voxide::aggregators::AssistantAggregator;
use voxide::context::{ContextHandle, LlmContext, Message};
use voxide::events::{EndReason, Event, SessionEvent};
use voxide::frames::{DataFrame, Frame, StartParams};
use voxide::pipeline::{
    AppResources, Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session,
    SessionHandle,
};
use voxide::services::llm::{
    FunctionCallParams, LlmEngine, LlmError, LlmEvent, LlmRequest, LlmService,
};

/// Plays back one scripted response per request; records every request.
#[derive(Clone, Default)]
pub struct ScriptedLlm {
    script: Arc<Mutex<VecDeque<Vec<LlmEvent>>>>,
    pub requests: Arc<Mutex<Vec<LlmRequest>>>,
}

impl ScriptedLlm {
    pub fn new(responses: Vec<Vec<LlmEvent>>) -> Self {
        Self {
            script: Arc::new(Mutex::new(responses.into())),
            requests: Arc::default(),
        }
    }

    pub fn runs(&self) -> usize {
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

pub fn call(id: &str, name: &str, args: Value) -> LlmEvent {
    LlmEvent::ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.to_string(),
    }
}

pub fn say(text: &str) -> LlmEvent {
    LlmEvent::Text(text.into())
}

/// Reports every frame name that reaches the end of the pipeline.
pub struct Probe(pub mpsc::UnboundedSender<String>);

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

/// The LLM service and the assistant aggregator in a session, with a probe at the end.
pub struct Bot {
    pub handle: SessionHandle,
    pub session: Session,
    pub context: ContextHandle,
    pub frames: mpsc::UnboundedReceiver<String>,
    pub errors: mpsc::UnboundedReceiver<String>,
    pub events: broadcast::Receiver<SessionEvent>,
}

impl Bot {
    pub fn start(llm: LlmService) -> Self {
        Self::start_with(llm, AppResources::default())
    }

    /// Starts with `resources` for the tools.
    pub fn start_with(llm: LlmService, resources: AppResources) -> Self {
        let context = ContextHandle::new(LlmContext::new(vec![
            Message::system("You are a test bot."),
            Message::user("hello"),
        ]));
        Self::start_in(Pipeline::new().then(llm), context, resources)
    }

    /// Starts `front` (the LLM service and any stage after it) on `context`.
    pub fn start_in(front: Pipeline, context: ContextHandle, resources: AppResources) -> Self {
        let (tx, frames) = mpsc::unbounded_channel();
        let (etx, errors) = mpsc::unbounded_channel();
        let pipeline = front
            .then(AssistantAggregator::new(context.clone()))
            .then(Probe(tx));
        let builder = Session::builder(pipeline)
            .idle_timeout(None)
            .params(StartParams {
                enable_usage_metrics: true,
                ..StartParams::default()
            })
            .resources(resources)
            .on_error(move |e| {
                let _ = etx.send(e.message.clone());
            });
        let events = builder.subscribe();
        let session = builder.spawn();
        Self {
            handle: session.handle(),
            session,
            context,
            frames,
            errors,
            events,
        }
    }

    pub async fn run_llm(&self) {
        self.handle
            .queue_frame(DataFrame::LlmContext(self.context.clone()))
            .await
            .expect("queued");
    }

    /// The user says `text` (straight into the context) and the LLM runs; waits for `n`
    /// responses.
    pub async fn user_says(&mut self, text: &str, n: usize) {
        self.context.lock().messages.push(Message::user(text));
        self.run_llm().await;
        self.responses(n).await;
    }

    /// Waits until `n` responses have ended at the sink.
    pub async fn responses(&mut self, n: usize) {
        let mut seen = 0;
        while seen < n {
            match self.frames.recv().await {
                Some(name) if name == "llm_full_response_end" => seen += 1,
                Some(_) => {}
                None => panic!("session ended before {n} responses"),
            }
        }
    }

    pub async fn stop(self) -> (Vec<Message>, Vec<String>) {
        let (messages, errors, _) = self.stop_with_events().await;
        (messages, errors)
    }

    /// Stops the bot; returns the context's messages, the errors and every session event.
    pub async fn stop_with_events(self) -> (Vec<Message>, Vec<String>, Vec<Event>) {
        self.handle.stop_when_done().await.expect("queued");
        assert_eq!(self.session.join().await, EndReason::Completed);
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

/// A handler that delivers `result` once released, and the sender that releases it.
pub fn held_until_released(
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
