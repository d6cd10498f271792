//! The LLM service processor: inference as an interruptible job, tool calls as owned tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::sync::mpsc;

use super::engine::{LlmEngine, LlmError, LlmEvent, LlmRequest};
use super::functions::{FunctionCallParams, FunctionOptions, FunctionRegistry};
use super::tools::{ToolBatch, ToolRunner, parse_arguments};
use crate::pricing::{PriceTable, account_response};
use voxide_core::context::async_tool_messages::ASYNC_TOOL_INSTRUCTIONS;
use voxide_core::context::{Content, ContextHandle, LlmContext, Message, StopReason};
use voxide_core::events::Event;
use voxide_core::frames::{
    ControlFrame, DataFrame, Frame, FrameBody, FunctionCallRequest, LlmResponseSummary,
    MetricsData, StartParams, SystemFrame, TokenUsage, WastedGuess,
};
use voxide_core::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};
use voxide_core::text::first_words_end;

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
///
/// A guess at the next context ([`DataFrame::LlmGuess`]) starts the engine ahead of the turn's
/// end with its output held; the next [`DataFrame::LlmContext`] takes it over when its request
/// is the same, and throws it away otherwise, as does the user speaking again or an
/// interruption. Each guess is reported as [`MetricsData::Preemption`]. The guessed answer's
/// first words go on at once as [`DataFrame::TtsGuess`], so that the voice can speak them ahead
/// too.
pub struct LlmService {
    engine: Arc<dyn LlmEngine>,
    tools: ToolRunner,
    params: StartParams,
    last_revision: Option<u64>,
    guess: Option<Guess>,
}

/// Events a guessed request's answer can hold before the engine waits for the turn's end.
const GUESS_BUFFER: usize = 1024;

/// An answer being worked out on a guess at the turn's words.
struct Guess {
    request: LlmRequest,
    events: mpsc::Receiver<Result<LlmEvent, LlmError>>,
    /// Text pieces generated so far.
    tokens: Arc<AtomicU64>,
    /// Cleared when the answer is taken over: its first words no longer go ahead to the voice.
    held: Arc<AtomicBool>,
    /// Aborted with the guess, unless its answer was taken over.
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Guess {
    /// Starts `engine` on `request`; the answer's first words go to `pusher`'s next processor
    /// as [`DataFrame::TtsGuess`] while the guess is held.
    fn start(
        engine: &Arc<dyn LlmEngine>,
        id: u64,
        request: LlmRequest,
        pusher: FramePusher,
    ) -> Self {
        let (tx, events) = mpsc::channel(GUESS_BUFFER);
        let tokens = Arc::new(AtomicU64::new(0));
        let held = Arc::new(AtomicBool::new(true));
        let mut stream = engine.generate(request.clone());
        let (counted, ahead) = (tokens.clone(), held.clone());
        let task = tokio::spawn(async move {
            // The answer's text until its first words are complete.
            let mut first = Some(String::new());
            while let Some(event) = stream.next().await {
                if let Ok(LlmEvent::Text(text)) = &event {
                    counted.fetch_add(1, Ordering::Relaxed);
                    if let Some(words) = &mut first {
                        words.push_str(text);
                        if let Some(end) = first_words_end(words) {
                            let said = words[..end].to_owned();
                            first = None;
                            speak_ahead(id, said, &ahead, &pusher).await;
                        }
                    }
                }
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            // A one-sentence answer: its first words are all of it.
            if let Some(words) = first.filter(|w| !w.trim().is_empty()) {
                speak_ahead(id, words, &ahead, &pusher).await;
            }
        });
        Self {
            request,
            events,
            tokens,
            held,
            task: Some(task),
        }
    }

    fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// The answer's events, those held first.
    fn into_stream(mut self) -> EventStream {
        // The task now ends with the engine's answer, or when the reader drops the stream.
        self.task = None;
        self.held.store(false, Ordering::Relaxed);
        let (_, closed) = mpsc::channel(1);
        let mut events = std::mem::replace(&mut self.events, closed);
        Box::pin(futures_util::stream::poll_fn(move |cx| {
            events.poll_recv(cx)
        }))
    }
}

/// Sends a guessed answer's first words on to the voice, unless the guess was taken over (the
/// answer itself then brings them).
async fn speak_ahead(id: u64, text: String, held: &AtomicBool, pusher: &FramePusher) {
    if held.load(Ordering::Relaxed) {
        let _ = pusher
            .push(
                DataFrame::TtsGuess { id, text }.into(),
                Direction::Downstream,
            )
            .await;
    }
}

impl Drop for Guess {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// A request's prompt in tokens, estimated from its JSON at four characters a token.
fn estimated_tokens(request: &LlmRequest) -> u64 {
    let messages: usize = request
        .messages
        .iter()
        .map(|m| serde_json::to_string(m).map_or(0, |json| json.len()))
        .sum();
    (messages / 4) as u64
}

/// An engine's answer as the service reads it.
type EventStream = BoxStream<'static, Result<LlmEvent, LlmError>>;

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
            guess: None,
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
        let request = self.request(handle.snapshot());
        let guessed = match self.guess.take() {
            Some(guess) if guess.request == request => {
                self.report_guess(true, guess.tokens(), None, cx);
                Some(guess.into_stream())
            }
            Some(guess) => {
                self.throw_away(guess, cx);
                None
            }
            None => None,
        };
        let run = Inference {
            engine: self.engine.clone(),
            metrics: self.params.enable_metrics,
            usage_metrics: self.params.enable_usage_metrics,
            batch: self.tools.batch(handle, cx.pusher()),
        };
        cx.run(run.run(request, guessed));
    }

    /// Starts the engine on guess `id` at the next context, replacing any earlier guess.
    fn start_guess(&mut self, id: u64, context: LlmContext, cx: &mut FrameContext<'_>) {
        self.drop_guess(cx);
        let request = self.request(context);
        self.guess = Some(Guess::start(&self.engine, id, request, cx.pusher()));
    }

    /// Throws the guess away, if there is one.
    fn drop_guess(&mut self, cx: &mut FrameContext<'_>) {
        if let Some(guess) = self.guess.take() {
            self.throw_away(guess, cx);
        }
    }

    /// Reports a guess that is thrown away, with what it cost all the same.
    fn throw_away(&self, mut guess: Guess, cx: &mut FrameContext<'_>) {
        let tokens = guess.tokens();
        let mut usage = None;
        while let Ok(event) = guess.events.try_recv() {
            if let Ok(LlmEvent::Usage(counted)) = event {
                usage = Some(counted);
            }
        }
        let usage = usage.unwrap_or_else(|| TokenUsage {
            input: estimated_tokens(&guess.request),
            output: tokens,
            ..TokenUsage::default()
        });
        let cost_usd = self.tools.prices().cost(self.engine.model(), &usage);
        self.report_guess(false, tokens, Some(WastedGuess { usage, cost_usd }), cx);
    }

    fn report_guess(
        &self,
        used: bool,
        tokens: u64,
        wasted: Option<WastedGuess>,
        cx: &mut FrameContext<'_>,
    ) {
        tracing::debug!(used, tokens, ?wasted, "preemptive generation");
        // A guess thrown away cost tokens: the usage metrics report it too.
        let usage = wasted.is_some() && self.params.enable_usage_metrics;
        if self.params.enable_metrics || usage {
            cx.push_downstream(SystemFrame::Metrics(vec![MetricsData::Preemption {
                processor: cx.pusher().name().to_owned(),
                used,
                tokens,
                wasted,
            }]));
        }
    }

    /// The request for the engine: the context plus the service's instructions and tools.
    fn request(&self, context: LlmContext) -> LlmRequest {
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
                self.drop_guess(cx);
                for (frame, dir) in self.tools.cancel_for_interruption() {
                    cx.push(frame, dir);
                }
            }
            // The user goes on: the guess was not the turn.
            FrameBody::System(
                SystemFrame::VadUserStartedSpeaking | SystemFrame::VadSpeechResumed,
            ) => self.drop_guess(cx),
            FrameBody::Data(DataFrame::LlmContext(handle)) => {
                self.start_inference(handle.clone(), cx);
                return Ok(());
            }
            FrameBody::Data(DataFrame::LlmGuess { id, context }) => {
                self.start_guess(*id, (**context).clone(), cx);
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
    provider_messages: Vec<voxide_core::context::ProviderMessage>,
    stop_reason: Option<StopReason>,
}

impl Inference {
    /// Runs the engine on `request`, or reads the answer a guess already started on it.
    async fn run(
        self,
        request: LlmRequest,
        guessed: Option<EventStream>,
    ) -> Result<(), ProcessorError> {
        let _ = self
            .batch
            .pusher
            .push(
                ControlFrame::LlmFullResponseStart.into(),
                Direction::Downstream,
            )
            .await;
        let events = guessed.unwrap_or_else(|| self.engine.generate(request));
        let (collected, failure) = self.stream(events).await;
        self.finish(collected, failure).await
    }

    /// Streams the response: its text goes on as it comes, the rest is collected; why it
    /// failed, if it did.
    async fn stream(&self, mut stream: EventStream) -> (Collected, Option<String>) {
        let down = Direction::Downstream;
        let pusher = &self.batch.pusher;
        let timeout = self.batch.options.completion_timeout;
        let started = Instant::now();
        let mut first = true;
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
