//! The LLM service processor: inference as an interruptible job, tool calls as owned tasks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::engine::{LlmEngine, LlmEvent, LlmRequest};
use super::functions::{FunctionCallParams, FunctionOptions, FunctionRegistry};
use super::pricing::{PriceTable, account_response};
use super::tools::{ToolBatch, ToolRunner, parse_arguments};
use crate::context::async_tool_messages::ASYNC_TOOL_INSTRUCTIONS;
use crate::context::{Content, ContextHandle, Message, StopReason};
use crate::events::Event;
use crate::frames::{
    ControlFrame, DataFrame, Frame, FrameBody, FunctionCallRequest, LlmResponseSummary,
    MetricsData, StartParams, SystemFrame, TokenUsage,
};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

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

/// One run of the engine and the calls it makes.
struct Inference {
    engine: Arc<dyn LlmEngine>,
    metrics: bool,
    usage_metrics: bool,
    batch: ToolBatch,
}

/// What a response brought besides its text.
#[derive(Default)]
struct Collected {
    requested: Vec<FunctionCallRequest>,
    usage: TokenUsage,
    thinking: String,
    provider_messages: Vec<crate::context::ProviderMessage>,
    stop_reason: Option<StopReason>,
}

impl Inference {
    async fn run(self, request: LlmRequest) -> Result<(), ProcessorError> {
        let _ = self
            .batch
            .pusher
            .push(
                ControlFrame::LlmFullResponseStart.into(),
                Direction::Downstream,
            )
            .await;
        let (collected, failure) = self.stream(request).await;
        self.finish(collected, failure).await
    }

    /// Streams the response: its text goes on as it comes, the rest is collected; why it
    /// failed, if it did.
    async fn stream(&self, request: LlmRequest) -> (Collected, Option<String>) {
        let down = Direction::Downstream;
        let pusher = &self.batch.pusher;
        let timeout = self.batch.options.completion_timeout;
        let started = Instant::now();
        let mut first = true;
        let mut stream = self.engine.generate(request);
        let mut got = Collected::default();
        loop {
            let event = match tokio::time::timeout(timeout, stream.next()).await {
                Ok(Some(event)) => event,
                Ok(None) => return (got, None),
                Err(_) => {
                    let seconds = timeout.as_secs_f64();
                    pusher.emit(Event::LlmCompletionTimeout { seconds });
                    return (got, Some(format!("the LLM gave no answer for {seconds} s")));
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
                }) => got.requested.push(FunctionCallRequest {
                    function_name: name,
                    tool_call_id: id,
                    arguments: parse_arguments(&arguments),
                }),
                Ok(LlmEvent::Thinking(text)) => got.thinking.push_str(&text),
                Ok(LlmEvent::Usage(more)) => got.usage += more,
                Ok(LlmEvent::Finished(reason)) => got.stop_reason = Some(reason),
                Ok(LlmEvent::ProviderMessage(message)) => got.provider_messages.push(message),
                Ok(LlmEvent::Fallback { from, to, reason }) => {
                    pusher.emit(Event::LlmFallback { from, to, reason });
                }
                Err(e) => return (got, Some(e.to_string())),
            }
        }
    }

    /// Starts the calls the response asked for and accounts for it.
    async fn finish(self, got: Collected, failure: Option<String>) -> Result<(), ProcessorError> {
        let has_calls = !got.requested.is_empty();
        if has_calls {
            self.batch.start(got.requested).await;
        }
        let summary = LlmResponseSummary {
            provider: self.engine.provider().to_owned(),
            model: self.engine.model().to_owned(),
            usage: got.usage,
            cost_usd: None,
            stop_reason: match got.stop_reason {
                _ if failure.is_some() => StopReason::Error,
                _ if has_calls => StopReason::ToolUse,
                Some(reason) => reason,
                None => StopReason::Stop,
            },
            thinking: got.thinking,
            provider_messages: got.provider_messages,
        };
        let pusher = &self.batch.pusher;
        let prices = &self.batch.options.prices;
        for frame in account_response(summary, prices, self.usage_metrics, pusher.name()) {
            let _ = pusher.push(frame, Direction::Downstream).await;
        }
        match failure {
            Some(message) => Err(ProcessorError::new(message)),
            None => Ok(()),
        }
    }
}
