//! The LLM service processor: inference as an interruptible job, tool calls as owned tasks.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::engine::{LlmEngine, LlmEvent, LlmRequest};
use super::functions::{
    Delivered, FunctionCallParams, FunctionOptions, FunctionRegistry, ResultCallback,
    ResultProperties,
};
use super::pricing::PriceTable;
use crate::context::async_tool_messages::ASYNC_TOOL_INSTRUCTIONS;
use crate::context::{Content, ContextHandle, FunctionSchema, Message, StopReason, ToolsSchema};
use crate::events::Event;
use crate::frames::{
    CancelReason, ControlFrame, DataFrame, ErrorFrame, Frame, FrameBody, FunctionCallCancel,
    FunctionCallInProgress, FunctionCallRequest, FunctionCallResult, FunctionCallResultProperties,
    LlmResponseSummary, MetricsData, StartParams, SystemFrame, TokenUsage,
};
use crate::pipeline::{
    AppResources, Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError,
};

/// The placeholder content of a sync call's tool message until its result arrives.
pub const IN_PROGRESS: &str = "IN_PROGRESS";

/// What the model is told when it calls a tool nobody registered.
fn unavailable(name: &str) -> Value {
    Value::String(format!(
        "The function {name} is not available. Do not call it again."
    ))
}

/// What the model is told when a handler failed; the error itself goes to the logs only.
const FAILED: &str = "The function failed and returned no result.";

/// Service-wide options.
#[derive(Debug, Clone)]
pub struct LlmServiceOptions {
    /// Run a batch's calls in parallel (default) or one after another.
    pub run_in_parallel: bool,
    /// Run the LLM once, after the last call of a batch settled (default), or after each result.
    pub group_parallel_tools: bool,
    /// Timeout of a call whose function has none of its own.
    pub function_call_timeout: Duration,
    /// How long the engine may stay silent (before its first event, or between two) before the
    /// completion is abandoned with an error.
    pub completion_timeout: Duration,
    /// Prices for the usage and cost reports.
    pub prices: PriceTable,
}

impl Default for LlmServiceOptions {
    fn default() -> Self {
        Self {
            run_in_parallel: true,
            group_parallel_tools: true,
            function_call_timeout: Duration::from_secs(30),
            completion_timeout: Duration::from_secs(30),
            prices: PriceTable::default(),
        }
    }
}

/// A call that has started and not settled.
struct Running {
    function_name: String,
    arguments: Value,
    cancel_on_interruption: bool,
    group_id: u64,
    task: Option<JoinHandle<()>>,
}

type Calls = Arc<Mutex<HashMap<String, Running>>>;

fn lock(calls: &Calls) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
    calls.lock().unwrap_or_else(|p| p.into_inner())
}

/// The function registry and the calls it runs, shared by the text LLM service and the realtime
/// ones. Clones share the calls; the service that owns them aborts them when it goes, so none
/// outlives the session.
#[derive(Clone)]
pub(crate) struct ToolRunner {
    registry: Arc<FunctionRegistry>,
    options: LlmServiceOptions,
    calls: Calls,
    groups: Arc<AtomicU64>,
    resources: AppResources,
}

impl ToolRunner {
    pub(crate) fn new(options: LlmServiceOptions) -> Self {
        Self {
            registry: Arc::new(FunctionRegistry::default()),
            options,
            calls: Arc::default(),
            groups: Arc::default(),
            resources: AppResources::default(),
        }
    }

    pub(crate) fn functions(&mut self) -> &mut FunctionRegistry {
        Arc::make_mut(&mut self.registry)
    }

    pub(crate) fn set_resources(&mut self, resources: AppResources) {
        self.resources = resources;
    }

    /// True when an async function is registered (the model then needs the async instructions).
    pub(crate) fn has_async(&self) -> bool {
        self.registry.has_async()
    }

    /// The context's tools plus the registry's direct functions and `cancel_<name>` tools.
    pub(crate) fn tools(&self, mut tools: ToolsSchema) -> ToolsSchema {
        for schema in self.registry.direct_schemas() {
            if !tools.standard_tools.iter().any(|t| t.name == schema.name) {
                tools.standard_tools.push(schema.clone());
            }
        }
        for name in self.registry.cancellable() {
            tools.standard_tools.push(cancel_tool_schema(name));
        }
        tools
    }

    /// A new batch of calls from one response.
    pub(crate) fn batch(&self, handle: ContextHandle, pusher: FramePusher) -> ToolBatch {
        ToolBatch {
            registry: self.registry.clone(),
            options: self.options.clone(),
            calls: self.calls.clone(),
            group_id: self.groups.fetch_add(1, Ordering::Relaxed) + 1,
            resources: self.resources.clone(),
            handle,
            pusher,
        }
    }

    /// Aborts every running call.
    pub(crate) fn abort_all(&self) {
        for call in lock(&self.calls).values() {
            if let Some(task) = &call.task {
                task.abort();
            }
        }
    }

    /// Names of the async functions.
    pub(crate) fn async_functions(&self) -> Vec<String> {
        self.registry.async_names()
    }

    /// Cancels the calls with these ids (the provider withdrew them); returns the frames that
    /// report it.
    pub(crate) fn cancel_ids(&self, ids: &[String]) -> Vec<(Frame, Direction)> {
        let cancelled: Vec<(String, Running)> = {
            let mut calls = lock(&self.calls);
            ids.iter()
                .filter_map(|id| calls.remove(id).map(|c| (id.clone(), c)))
                .collect()
        };
        let mut frames = Vec::new();
        for (id, call) in cancelled {
            if let Some(task) = &call.task {
                task.abort();
            }
            frames.extend(cancel_frames(&id, &call, CancelReason::Llm, Some(false)));
        }
        frames
    }

    /// Cancels the calls an interruption cancels (async calls keep running); returns the frames
    /// that report it.
    pub(crate) fn cancel_for_interruption(&self) -> Vec<(Frame, Direction)> {
        let cancelled: Vec<(String, Running)> = {
            let mut calls = lock(&self.calls);
            let ids: Vec<String> = calls
                .iter()
                .filter(|(_, c)| c.cancel_on_interruption)
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| calls.remove(&id).map(|c| (id, c)))
                .collect()
        };
        let mut frames = Vec::new();
        for (id, call) in cancelled {
            if let Some(task) = &call.task {
                task.abort();
            }
            tracing::debug!(tool_call_id = %id, function = %call.function_name, "call cancelled by interruption");
            frames.extend(cancel_frames(
                &id,
                &call,
                CancelReason::Interruption,
                Some(false),
            ));
        }
        frames
    }
}

impl Drop for LlmService {
    fn drop(&mut self) {
        self.tools.abort_all();
    }
}

/// Runs an [`LlmEngine`] on the context it is given and runs the tool calls the model makes.
pub struct LlmService {
    engine: Arc<dyn LlmEngine>,
    tools: ToolRunner,
    params: StartParams,
    last_revision: Option<u64>,
}

impl LlmService {
    /// A service around `engine` with default options.
    pub fn new(engine: impl LlmEngine) -> Self {
        Self::with_options(engine, LlmServiceOptions::default())
    }

    /// A service around `engine`.
    pub fn with_options(engine: impl LlmEngine, options: LlmServiceOptions) -> Self {
        Self {
            engine: Arc::new(engine),
            tools: ToolRunner::new(options),
            params: StartParams::default(),
            last_revision: None,
        }
    }

    /// The function registry, to register handlers before the session starts.
    pub fn functions(&mut self) -> &mut FunctionRegistry {
        self.tools.functions()
    }

    /// Registers `handler` under `name` (`None`: catch-all).
    pub fn register_function<F, Fut>(
        &mut self,
        name: Option<&str>,
        handler: F,
        options: FunctionOptions,
    ) where
        F: Fn(FunctionCallParams) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.functions().register_function(name, handler, options);
    }

    fn start_inference(&mut self, handle: ContextHandle, cx: &mut FrameContext<'_>) {
        let revision = handle.revision();
        if self.last_revision == Some(revision) {
            tracing::debug!("context unchanged since the last run; not running the LLM again");
            return;
        }
        self.last_revision = Some(revision);
        let request = self.request(&handle);
        let run = Inference {
            engine: self.engine.clone(),
            metrics: self.params.enable_metrics,
            usage_metrics: self.params.enable_usage_metrics,
            batch: self.tools.batch(handle, cx.pusher()),
        };
        cx.run(run.run(request));
    }

    /// The request for the engine: the context plus the service's instructions and tools.
    fn request(&self, handle: &ContextHandle) -> LlmRequest {
        let context = handle.snapshot();
        let mut messages = context.messages;
        if self.tools.has_async() {
            add_instructions(&mut messages, ASYNC_TOOL_INSTRUCTIONS);
        }
        LlmRequest {
            messages,
            tools: self.tools.tools(context.tools),
            tool_choice: context.tool_choice,
        }
    }
}

impl FrameProcessor for LlmService {
    fn name(&self) -> &str {
        "LlmService"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::System(SystemFrame::Start(start)) => {
                self.tools.set_resources(start.resources.clone());
                self.params = start.params.clone();
                // The connection is open before the first turn needs it.
                tokio::spawn(self.engine.warm());
            }
            FrameBody::System(SystemFrame::Interruption) => {
                for (frame, dir) in self.tools.cancel_for_interruption() {
                    cx.push(frame, dir);
                }
            }
            FrameBody::Data(DataFrame::LlmContext(handle)) => {
                self.start_inference(handle.clone(), cx);
                return Ok(());
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Appends `text` to the first system message, or adds one.
pub(crate) fn add_instructions(messages: &mut Vec<Message>, text: &str) {
    for message in messages.iter_mut() {
        if let Message::System(m) = message {
            let joined = format!("{}\n\n{text}", m.content.joined_text());
            m.content = Content::Text(joined);
            return;
        }
    }
    messages.insert(0, Message::system(text));
}

/// The schema of the `cancel_<name>` tool offered for a cancellable async function.
pub fn cancel_tool_schema(name: &str) -> FunctionSchema {
    FunctionSchema::new(
        format!("cancel_{name}"),
        format!("Cancels a running {name} call. Give tool_call_id when more than one is running."),
    )
    .property(
        "tool_call_id",
        serde_json::json!({"type": "string", "description": "The id of the call to cancel."}),
        false,
    )
}

/// One run of the engine and the calls it makes.
struct Inference {
    engine: Arc<dyn LlmEngine>,
    metrics: bool,
    usage_metrics: bool,
    batch: ToolBatch,
}

impl Inference {
    async fn run(self, request: LlmRequest) -> Result<(), ProcessorError> {
        let down = Direction::Downstream;
        let pusher = &self.batch.pusher;
        let options = &self.batch.options;
        let _ = pusher
            .push(ControlFrame::LlmFullResponseStart.into(), down)
            .await;
        let started = Instant::now();
        let mut first = true;
        let mut stream = self.engine.generate(request);
        let mut requested = Vec::new();
        let mut usage = TokenUsage::default();
        let mut thinking = String::new();
        let mut provider_messages = Vec::new();
        let mut stop_reason = None;
        let mut failure = None;
        loop {
            let event = match tokio::time::timeout(options.completion_timeout, stream.next()).await
            {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(_) => {
                    let seconds = options.completion_timeout.as_secs_f64();
                    pusher.emit(Event::LlmCompletionTimeout { seconds });
                    failure = Some(format!("the LLM gave no answer for {seconds} s"));
                    break;
                }
            };
            // Time to the first of the answer: bookkeeping (usage, a fallback) does not count.
            if first && self.metrics && matches!(&event, Ok(e) if e.is_content()) {
                first = false;
                let ttfb = MetricsData::Ttfb {
                    processor: pusher.name().to_owned(),
                    model: Some(self.engine.model().to_owned()),
                    seconds: started.elapsed().as_secs_f64(),
                };
                let _ = pusher
                    .push(SystemFrame::Metrics(vec![ttfb]).into(), down)
                    .await;
            }
            match event {
                Ok(LlmEvent::Text(text)) => {
                    let _ = pusher.push(DataFrame::LlmText(text).into(), down).await;
                }
                Ok(LlmEvent::ToolCall {
                    id,
                    name,
                    arguments,
                }) => requested.push(FunctionCallRequest {
                    function_name: name,
                    tool_call_id: id,
                    arguments: parse_arguments(&arguments),
                }),
                Ok(LlmEvent::Thinking(text)) => thinking.push_str(&text),
                Ok(LlmEvent::Usage(more)) => usage += more,
                Ok(LlmEvent::Finished(reason)) => stop_reason = Some(reason),
                Ok(LlmEvent::ProviderMessage(message)) => provider_messages.push(message),
                Ok(LlmEvent::Fallback { from, to, reason }) => {
                    pusher.emit(Event::LlmFallback { from, to, reason });
                }
                Err(e) => {
                    failure = Some(e.to_string());
                    break;
                }
            }
        }
        drop(stream);
        let has_calls = !requested.is_empty();
        if has_calls {
            self.batch.start(requested).await;
        }
        let mut summary = self.summary(usage, thinking, stop_reason, has_calls, failure.is_some());
        summary.provider_messages = provider_messages;
        if self.usage_metrics && usage != TokenUsage::default() {
            let data = MetricsData::LlmUsage {
                processor: pusher.name().to_owned(),
                model: Some(summary.model.clone()),
                usage,
                cost_usd: summary.cost_usd,
            };
            let _ = pusher
                .push(SystemFrame::Metrics(vec![data]).into(), down)
                .await;
        }
        let _ = pusher
            .push(
                ControlFrame::LlmResponseSummary(Box::new(summary)).into(),
                down,
            )
            .await;
        let _ = pusher
            .push(ControlFrame::LlmFullResponseEnd.into(), down)
            .await;
        match failure {
            Some(message) => Err(ProcessorError::new(message)),
            None => Ok(()),
        }
    }

    fn summary(
        &self,
        usage: TokenUsage,
        thinking: String,
        reported: Option<StopReason>,
        has_calls: bool,
        failed: bool,
    ) -> LlmResponseSummary {
        let model = self.engine.model().to_owned();
        let stop_reason = match reported {
            _ if failed => StopReason::Error,
            _ if has_calls => StopReason::ToolUse,
            Some(reason) => reason,
            None => StopReason::Stop,
        };
        LlmResponseSummary {
            provider: self.engine.provider().to_owned(),
            cost_usd: self.batch.options.prices.cost(&model, &usage),
            model,
            usage,
            stop_reason,
            thinking,
            provider_messages: Vec::new(),
        }
    }
}

/// The calls of one response: announced together, run in parallel or in order, sharing a group id.
pub(crate) struct ToolBatch {
    registry: Arc<FunctionRegistry>,
    options: LlmServiceOptions,
    calls: Calls,
    group_id: u64,
    resources: AppResources,
    handle: ContextHandle,
    pusher: FramePusher,
}

impl ToolBatch {
    /// Announces the batch, then starts every call.
    pub(crate) async fn start(&self, requested: Vec<FunctionCallRequest>) {
        let batch: Arc<[FunctionCallRequest]> = requested.clone().into();
        for dir in [Direction::Downstream, Direction::Upstream] {
            let _ = self
                .pusher
                .push(SystemFrame::FunctionCallsStarted(batch.clone()).into(), dir)
                .await;
        }
        // In sequential mode each call waits for the one before it to settle (or be cancelled).
        let mut previous: Option<oneshot::Receiver<()>> = None;
        for call in requested {
            let options = self
                .registry
                .get(&call.function_name)
                .map(|r| r.options.clone());
            let builtin = self.builtin_cancel(&call.function_name);
            let cancel_on_interruption = options.as_ref().is_none_or(|o| o.cancel_on_interruption);
            let in_progress = FunctionCallInProgress {
                function_name: call.function_name.clone(),
                tool_call_id: call.tool_call_id.clone(),
                arguments: call.arguments.clone(),
                cancel_on_interruption,
                group_id: self.group_id,
            };
            for dir in [Direction::Downstream, Direction::Upstream] {
                let frame = ControlFrame::FunctionCallInProgress(Box::new(in_progress.clone()));
                let _ = self.pusher.push(frame.into(), dir).await;
            }
            let running = Running {
                function_name: call.function_name.clone(),
                arguments: call.arguments.clone(),
                cancel_on_interruption,
                group_id: self.group_id,
                task: None,
            };
            let id = call.tool_call_id.clone();
            lock(&self.calls).insert(id.clone(), running);
            let work = self.call_work(call, options, builtin);
            let wait = if self.options.run_in_parallel {
                None
            } else {
                previous.take()
            };
            let (settled_tx, settled_rx) = oneshot::channel::<()>();
            previous = Some(settled_rx);
            let task = tokio::spawn(async move {
                if let Some(wait) = wait {
                    let _ = wait.await;
                }
                work.await;
                drop(settled_tx);
            });
            // The call may already have settled and left the table; then its handle goes.
            if let Some(running) = lock(&self.calls).get_mut(&id) {
                running.task = Some(task);
            }
        }
    }

    /// For `cancel_<name>` of a cancellable async function: the name it cancels.
    fn builtin_cancel(&self, name: &str) -> Option<String> {
        let target = name.strip_prefix("cancel_")?;
        self.registry
            .cancellable()
            .any(|n| n == target)
            .then(|| target.to_owned())
    }

    /// The future that runs one call to its settled result.
    fn call_work(
        &self,
        call: FunctionCallRequest,
        options: Option<FunctionOptions>,
        builtin: Option<String>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let pusher = self.pusher.clone();
        let calls = self.calls.clone();
        let registry = self.registry.clone();
        let context = self.handle.clone();
        let resources = self.resources.clone();
        let group_all = self.options.group_parallel_tools;
        let timeout = options
            .as_ref()
            .and_then(|o| o.timeout)
            .unwrap_or(self.options.function_call_timeout);
        async move {
            let id = call.tool_call_id.clone();
            let outcome = if let Some(target) = builtin {
                let (result, cancelled) = cancel_running(&calls, &target, &call.arguments);
                for (cid, running) in cancelled {
                    for (frame, dir) in
                        cancel_frames(&cid, &running, CancelReason::Llm, Some(false))
                    {
                        let _ = pusher.push(frame, dir).await;
                    }
                }
                Outcome::Result(Delivered {
                    result: Some(Value::String(result)),
                    properties: ResultProperties::final_result(),
                })
            } else if let Some(registered) = registry.get(&call.function_name) {
                let is_async = !registered.options.cancel_on_interruption;
                let (tx, rx) = mpsc::unbounded_channel();
                let params = FunctionCallParams {
                    function_name: call.function_name.clone(),
                    tool_call_id: id.clone(),
                    arguments: call.arguments.clone(),
                    context,
                    app_resources: resources,
                    result_callback: ResultCallback(tx),
                };
                let work = drive_handler(
                    (registered.handler)(params),
                    rx,
                    is_async,
                    &pusher,
                    &calls,
                    &id,
                );
                match tokio::time::timeout(timeout, work).await {
                    Ok(outcome) => outcome,
                    Err(_) => Outcome::TimedOut,
                }
            } else {
                tracing::warn!(function = %call.function_name, "the model called an unknown function");
                Outcome::Result(Delivered {
                    result: Some(unavailable(&call.function_name)),
                    properties: ResultProperties::final_result(),
                })
            };
            let Some(running) = lock(&calls).remove(&id) else {
                // Cancelled meanwhile: the cancel already reported it.
                return;
            };
            let frames = match outcome {
                Outcome::Result(delivered) => {
                    let mut properties = frame_properties(delivered.properties);
                    if properties.run_llm.is_none() && !group_all {
                        properties.run_llm = Some(true);
                    }
                    result_frames(&id, &running, delivered.result, true, properties)
                }
                Outcome::Failed(message) => {
                    let error = ErrorFrame {
                        message: format!("function {} failed: {message}", running.function_name),
                        fatal: false,
                        processor: Some(pusher.name().to_owned()),
                    };
                    let _ = pusher
                        .push(
                            SystemFrame::Error(Box::new(error)).into(),
                            Direction::Upstream,
                        )
                        .await;
                    result_frames(
                        &id,
                        &running,
                        Some(Value::String(FAILED.to_owned())),
                        true,
                        FunctionCallResultProperties::default(),
                    )
                }
                Outcome::TimedOut => {
                    tracing::warn!(function = %running.function_name, "function call timed out");
                    cancel_frames(&id, &running, CancelReason::Timeout, Some(true))
                }
            };
            for (frame, dir) in frames {
                let _ = pusher.push(frame, dir).await;
            }
        }
    }
}

enum Outcome {
    Result(Delivered),
    Failed(String),
    TimedOut,
}

/// Runs a handler until its final result, forwarding intermediate results of async calls.
async fn drive_handler(
    handler: futures_util::future::BoxFuture<'static, ()>,
    mut results: mpsc::UnboundedReceiver<Delivered>,
    is_async: bool,
    pusher: &FramePusher,
    calls: &Calls,
    id: &str,
) -> Outcome {
    let handler = AssertUnwindSafe(handler).catch_unwind();
    tokio::pin!(handler);
    let mut handler_done = false;
    let mut callbacks_gone = false;
    loop {
        if handler_done && callbacks_gone {
            // The handler finished and nobody can deliver any more: it returned nothing.
            return Outcome::Result(Delivered {
                result: None,
                properties: ResultProperties::final_result(),
            });
        }
        tokio::select! {
            finished = &mut handler, if !handler_done => {
                handler_done = true;
                if let Err(panic) = finished {
                    let text = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "panicked".to_owned());
                    return Outcome::Failed(text);
                }
            }
            delivered = results.recv(), if !callbacks_gone => match delivered {
                Some(d) if d.properties.is_final => return Outcome::Result(d),
                Some(d) if is_async => {
                    let frames = {
                        let calls = lock(calls);
                        calls.get(id).map(|running| result_frames(id, running, d.result, false, frame_properties(d.properties)))
                    };
                    for (frame, dir) in frames.unwrap_or_default() {
                        let _ = pusher.push(frame, dir).await;
                    }
                }
                Some(_) => tracing::warn!(tool_call_id = %id, "intermediate results are for async calls only; ignored"),
                // Every callback is gone; the call settles once the handler has finished too.
                None => callbacks_gone = true,
            },
        }
    }
}

/// Cancels running calls of `target` as `cancel_<target>` asked; returns what to tell the model.
fn cancel_running(
    calls: &Calls,
    target: &str,
    arguments: &Value,
) -> (String, Vec<(String, Running)>) {
    let mut calls = lock(calls);
    let running: Vec<String> = calls
        .iter()
        .filter(|(_, c)| c.function_name == target)
        .map(|(id, _)| id.clone())
        .collect();
    let wanted = arguments.get("tool_call_id").and_then(Value::as_str);
    let id = match (wanted, running.as_slice()) {
        (Some(id), _) if running.iter().any(|r| r == id) => id.to_owned(),
        (Some(id), _) => {
            return (
                format!("There is no running {target} call with id {id}; nothing was cancelled."),
                Vec::new(),
            );
        }
        (None, []) => {
            return (
                format!("No {target} call is running; nothing was cancelled."),
                Vec::new(),
            );
        }
        (None, [only]) => only.clone(),
        (None, many) => {
            return (
                format!(
                    "Several {target} calls are running ({}); call cancel_{target} again with the tool_call_id of the one to cancel.",
                    many.join(", ")
                ),
                Vec::new(),
            );
        }
    };
    let Some(call) = calls.remove(&id) else {
        return (
            format!("No {target} call is running; nothing was cancelled."),
            Vec::new(),
        );
    };
    if let Some(task) = &call.task {
        task.abort();
    }
    (
        format!("Cancelled the {target} call {id}; it is no longer running."),
        vec![(id, call)],
    )
}

/// Result frames for both aggregators (downstream and upstream).
fn result_frames(
    id: &str,
    call: &Running,
    result: Option<Value>,
    is_final: bool,
    properties: FunctionCallResultProperties,
) -> Vec<(Frame, Direction)> {
    let result = FunctionCallResult {
        function_name: call.function_name.clone(),
        tool_call_id: id.to_owned(),
        arguments: call.arguments.clone(),
        result,
        is_final,
        cancelled: false,
        cancel_on_interruption: call.cancel_on_interruption,
        group_id: call.group_id,
        properties,
    };
    [Direction::Downstream, Direction::Upstream]
        .into_iter()
        .map(|dir| {
            (
                Frame::new(DataFrame::FunctionCallResult(Box::new(result.clone()))),
                dir,
            )
        })
        .collect()
}

/// The properties a result frame carries.
fn frame_properties(properties: super::ResultProperties) -> FunctionCallResultProperties {
    FunctionCallResultProperties {
        run_llm: properties.run_llm,
        on_context_updated: properties.on_context_updated,
    }
}

/// The cancel frame and a cancelled result, both ways.
fn cancel_frames(
    id: &str,
    call: &Running,
    reason: CancelReason,
    run_llm: Option<bool>,
) -> Vec<(Frame, Direction)> {
    let cancel = FunctionCallCancel {
        function_name: call.function_name.clone(),
        tool_call_id: id.to_owned(),
        reason,
    };
    let mut frames: Vec<(Frame, Direction)> = [Direction::Downstream, Direction::Upstream]
        .into_iter()
        .map(|dir| {
            (
                Frame::new(SystemFrame::FunctionCallCancel(Box::new(cancel.clone()))),
                dir,
            )
        })
        .collect();
    let properties = FunctionCallResultProperties {
        run_llm,
        on_context_updated: None,
    };
    for (mut frame, dir) in result_frames(id, call, None, true, properties) {
        if let FrameBody::Data(DataFrame::FunctionCallResult(r)) = &mut frame.body {
            r.cancelled = true;
        }
        frames.push((frame, dir));
    }
    frames
}

/// Arguments as the model wrote them, as an object; anything unparsable becomes `{}`.
pub(crate) fn parse_arguments(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ if arguments.trim().is_empty() => Value::Object(Map::new()),
        _ => {
            tracing::warn!(
                arguments,
                "the model wrote arguments that are not a JSON object"
            );
            Value::Object(Map::new())
        }
    }
}
