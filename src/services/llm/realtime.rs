//! Realtime (speech-to-speech) LLM services: one WebSocket per session, audio both ways, tool
//! calls through the same function registry as the text LLMs, and tool results delivered through
//! the provider's own channel, each exactly once.
//!
//! [`RealtimeService`] does what every provider shares: the connection and its reconnects, the
//! ledger of what was delivered, interruptions, frames and metrics. A [`RealtimeProtocol`] speaks
//! one provider's events ([`super::openai_realtime::OpenAiRealtime`],
//! [`super::gemini_live::GeminiLive`]).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::LlmServiceOptions;
use super::service::ToolRunner;
use crate::audio::resample::StreamResampler;
use crate::context::{ContextHandle, Message, StopReason, ToolChoice, ToolsSchema};
use crate::events::Event;
use crate::frames::{
    AudioFrame, ControlFrame, DataFrame, ErrorFrame, Frame, FrameBody, FunctionCallRequest,
    LlmResponseSummary, MetricsData, StartParams, SystemFrame, TokenUsage, Transcription, TtsText,
};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

pub use crate::services::ws::ConnectRequest;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Why a realtime service could not be configured or connected.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RealtimeError {
    /// A setting is missing or unusable (e.g. no API key, a malformed URL).
    #[error("realtime LLM configuration: {0}")]
    Config(String),
}

/// How a lost connection is retried: exponential backoff with jitter, a bounded number of times.
#[derive(Debug, Clone)]
pub struct ReconnectPolicy {
    /// Attempts after a loss before the service gives up with a fatal error.
    pub max_attempts: u32,
    /// Delay before the first retry; each further retry doubles it.
    pub initial_delay: Duration,
    /// Longest delay between two attempts.
    pub max_delay: Duration,
    /// How long opening the socket may take.
    pub connect_timeout: Duration,
    /// How long the provider may take to confirm the session set-up.
    pub setup_timeout: Duration,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            connect_timeout: Duration::from_secs(10),
            setup_timeout: Duration::from_secs(10),
        }
    }
}

impl ReconnectPolicy {
    /// The wait before attempt `attempt` (1-based): the doubled delay, jittered down by up to
    /// half so that many sessions cut off together do not come back in step.
    pub fn delay(&self, attempt: u32) -> Duration {
        crate::services::ws::backoff(self.initial_delay, self.max_delay, attempt)
    }
}

/// Options of a realtime service.
#[derive(Debug, Clone)]
pub struct RealtimeOptions {
    /// Reconnection after a lost connection.
    pub reconnect: ReconnectPolicy,
    /// How long the provider may stay silent after it was asked to respond, or in the middle of
    /// a response, before the response is given up with an error.
    pub response_timeout: Duration,
    /// Options of the function calls (timeouts, parallelism, prices).
    pub functions: LlmServiceOptions,
}

impl Default for RealtimeOptions {
    fn default() -> Self {
        Self {
            reconnect: ReconnectPolicy::default(),
            response_timeout: Duration::from_secs(30),
            functions: LlmServiceOptions::default(),
        }
    }
}

/// What a provider's server said, in the service's terms.
#[derive(Debug, Clone, PartialEq)]
pub enum RealtimeEvent {
    /// The session is set up; the conversation may start.
    Ready,
    /// The model started a response.
    ResponseStarted,
    /// Bot audio at the provider's output rate, mono.
    Audio {
        /// The samples.
        samples: Vec<i16>,
        /// The provider's id of the item it belongs to, where it has one (for truncation).
        item_id: Option<String>,
    },
    /// Words the bot says (a transcript of its audio).
    BotText(String),
    /// The user's words, transcribed by the provider.
    UserTranscript {
        /// The words.
        text: String,
        /// False for a partial transcript.
        is_final: bool,
    },
    /// The provider heard the user start speaking (its own turn detection).
    UserStarted,
    /// The provider heard the user stop speaking.
    UserStopped,
    /// The provider stopped its response because the user cut in (without separate speech
    /// events).
    Interrupted,
    /// The provider withdrew these tool calls.
    ToolCallsCancelled(Vec<String>),
    /// The model calls these functions.
    ToolCalls(Vec<FunctionCallRequest>),
    /// Tokens used.
    Usage(TokenUsage),
    /// The response ended.
    ResponseDone {
        /// True when it was cancelled or cut short.
        cancelled: bool,
    },
    /// The provider reported an error.
    Error(String),
}

/// How a conversation item reaches the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryKind {
    /// Conversation history: sent when a session is first set up, never afterwards (later
    /// messages came from the provider itself).
    History,
    /// A tool's result through the provider's tool-result channel; the model answers it.
    ToolResult,
    /// A partial result of a running tool, through whatever channel the provider has for it.
    PartialResult,
}

/// One conversation item to deliver once.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// Stable identity across context updates and reconnects.
    pub key: String,
    /// What it is.
    pub kind: DeliveryKind,
    /// The client messages that deliver it.
    pub messages: Vec<Value>,
}

/// What a new connection is configured from.
#[derive(Debug, Clone)]
pub struct SessionSetup {
    /// The conversation (its leading system messages are the instructions).
    pub messages: Vec<Message>,
    /// Every tool the model may call.
    pub tools: ToolsSchema,
    /// How it may use them.
    pub tool_choice: Option<ToolChoice>,
    /// Names of the async functions (`cancel_on_interruption = false`).
    pub async_functions: Vec<String>,
}

/// The bot audio of the item being played, for truncating it where the user cut in.
#[derive(Debug, Clone, PartialEq)]
pub struct PlayedAudio {
    /// The provider's id of the item.
    pub item_id: Option<String>,
    /// Milliseconds of it that were played.
    pub played_ms: u64,
}

/// One provider's side of a realtime session: the messages it sends and how to read the ones it
/// receives. Every method is pure; the service owns the socket.
pub trait RealtimeProtocol: Send + Sync + 'static {
    /// The provider's name (e.g. `openai`).
    fn provider(&self) -> &str;
    /// The model's name.
    fn model(&self) -> &str;
    /// The request that opens the socket: URL and headers.
    fn request(&self) -> Result<ConnectRequest, RealtimeError>;
    /// The sample rate the provider takes audio at.
    fn input_rate(&self) -> u32;
    /// The sample rate of the provider's audio.
    fn output_rate(&self) -> u32;
    /// The messages that configure a fresh connection.
    fn setup(&self, setup: &SessionSetup) -> Vec<Value>;
    /// One chunk of user audio at [`Self::input_rate`].
    fn audio(&self, samples: &[i16]) -> Value;
    /// Every deliverable item of the conversation, in order, keyed.
    fn deliveries(&self, messages: &[Message]) -> Vec<Delivery>;
    /// The message that asks for a response, if the provider needs one after tool results.
    fn respond(&self) -> Option<Value>;
    /// The messages that stop the current response where the user cut in.
    fn interrupt(&self, played: Option<&PlayedAudio>) -> Vec<Value>;
    /// Messages for the start of a user turn detected by voxide (empty with the provider's own
    /// turn detection).
    fn user_started(&self) -> Vec<Value>;
    /// Messages for the end of a user turn detected by voxide.
    fn user_stopped(&self) -> Vec<Value>;
    /// Reads one server message.
    fn parse(&mut self, text: &str) -> Result<Vec<RealtimeEvent>, String>;
}

/// What the processor tells its connection.
enum Command {
    Audio(Vec<i16>),
    Deliver,
    Interrupt,
    UserStarted,
    UserStopped,
    Close,
}

/// A realtime LLM in a pipeline: takes user audio, gives bot audio, runs tools, and delivers their
/// results through the provider's tool-result channel.
///
/// Place it where the STT, LLM and TTS would be: `input → [VAD, turns] → realtime → output →
/// assistant aggregator`. The provider's own turn detection drives turns unless the protocol was
/// configured without it, in which case voxide's user turns (upstream) do.
pub struct RealtimeService<P: RealtimeProtocol> {
    pending: Option<(P, RealtimeOptions)>,
    input_rate: u32,
    output_rate: u32,
    context: ContextHandle,
    tools: ToolRunner,
    commands: Option<mpsc::UnboundedSender<Command>>,
    resampler: Option<(u32, StreamResampler)>,
}

impl<P: RealtimeProtocol> RealtimeService<P> {
    /// A service speaking `protocol`, recording into `context`.
    pub fn new(protocol: P, context: ContextHandle, options: RealtimeOptions) -> Self {
        Self {
            input_rate: protocol.input_rate(),
            output_rate: protocol.output_rate(),
            tools: ToolRunner::new(options.functions.clone()),
            pending: Some((protocol, options)),
            context,
            commands: None,
            resampler: None,
        }
    }

    /// The function registry, to register handlers before the session starts.
    pub fn functions(&mut self) -> &mut super::FunctionRegistry {
        self.tools.functions()
    }

    fn send(&self, command: Command) {
        if let Some(commands) = &self.commands {
            // The connection may have given up already; its fatal error said so.
            let _ = commands.send(command);
        }
    }

    fn start(&mut self, params: StartParams, cx: &mut FrameContext<'_>) {
        let Some((protocol, options)) = self.pending.take() else {
            return;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        self.commands = Some(tx);
        let link = Link {
            protocol,
            options,
            output_rate: self.output_rate,
            commands: rx,
            pusher: cx.pusher(),
            context: self.context.clone(),
            tools: self.tools.clone(),
            params,
            delivered: HashSet::new(),
            set_up: false,
            response: Response::default(),
            played: None,
        };
        cx.spawn(link.run());
    }

    /// User audio, mono at the provider's rate.
    fn audio(&mut self, audio: &AudioFrame) -> Option<Vec<i16>> {
        let channels = usize::from(audio.channels.max(1));
        let mono: Vec<i16> = audio.samples.iter().step_by(channels).copied().collect();
        if audio.sample_rate == self.input_rate {
            return Some(mono);
        }
        if self
            .resampler
            .as_ref()
            .is_none_or(|(rate, _)| *rate != audio.sample_rate)
        {
            match StreamResampler::new(audio.sample_rate, self.input_rate) {
                Ok(r) => self.resampler = Some((audio.sample_rate, r)),
                Err(e) => {
                    crate::warnings::warn(
                        "realtime_input_resample",
                        format_args!("cannot resample the input for the realtime LLM: {e}"),
                    );
                    return None;
                }
            }
        }
        self.resampler.as_mut().map(|(_, r)| r.process(&mono))
    }
}

impl<P: RealtimeProtocol> Drop for RealtimeService<P> {
    fn drop(&mut self) {
        self.tools.abort_all();
    }
}

impl<P: RealtimeProtocol> FrameProcessor for RealtimeService<P> {
    fn name(&self) -> &str {
        "RealtimeService"
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
                self.start(start.params.clone(), cx);
            }
            FrameBody::System(SystemFrame::InputAudio(audio)) => {
                if let Some(samples) = self.audio(audio)
                    && !samples.is_empty()
                {
                    self.send(Command::Audio(samples));
                }
            }
            FrameBody::System(SystemFrame::Interruption) => {
                for (frame, dir) in self.tools.cancel_for_interruption() {
                    cx.push(frame, dir);
                }
                self.send(Command::Interrupt);
            }
            FrameBody::System(SystemFrame::UserStartedSpeaking)
                if direction == Direction::Downstream =>
            {
                self.send(Command::UserStarted);
            }
            FrameBody::System(SystemFrame::UserStoppedSpeaking)
                if direction == Direction::Downstream =>
            {
                self.send(Command::UserStopped);
            }
            FrameBody::Data(DataFrame::LlmContext(_)) => {
                // The context is the one this service records into: look for new results in it.
                self.send(Command::Deliver);
                return Ok(());
            }
            FrameBody::Control(ControlFrame::End(_)) => self.send(Command::Close),
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// The response being received.
#[derive(Default)]
struct Response {
    /// A response start went downstream and its end has not.
    open: bool,
    /// When the provider was asked to respond and has not started yet.
    requested_at: Option<Instant>,
    /// When the provider last said something about the open response.
    last_event_at: Option<Instant>,
    /// Another response is wanted once this one ends.
    respond_after: bool,
    /// The rest of the current response was cut off by the user: drop it.
    discarding: bool,
    /// Where the response's first message will go in the context (for a late user transcript).
    context_index: usize,
    /// Transcript of the bot's words not yet reported as a spoken sentence.
    sentence: String,
    usage: TokenUsage,
}

/// Audio of the item being played.
struct Playing {
    item_id: Option<String>,
    first_at: Instant,
    received_ms: u64,
}

/// How a connection ended.
enum Ended {
    /// The session is over.
    Closed,
    /// The connection was lost: try again.
    Lost(String),
}

/// The connection task: owns the socket and everything that lives across reconnects.
struct Link<P: RealtimeProtocol> {
    protocol: P,
    options: RealtimeOptions,
    output_rate: u32,
    commands: mpsc::UnboundedReceiver<Command>,
    pusher: FramePusher,
    context: ContextHandle,
    tools: ToolRunner,
    params: StartParams,
    /// Keys of every item delivered so far, across reconnects.
    delivered: HashSet<String>,
    /// True once a connection has been set up (later ones are reconnects).
    set_up: bool,
    response: Response,
    played: Option<Playing>,
}

impl<P: RealtimeProtocol> Link<P> {
    async fn run(mut self) -> Result<(), ProcessorError> {
        let mut attempt = 0u32;
        loop {
            let reason = match self.open().await {
                Ok(mut socket) => {
                    let reconnect = self.set_up;
                    let restart = match self.after_open(&mut socket, reconnect).await {
                        Ok(restart) => restart,
                        Err(e) => {
                            attempt += 1;
                            self.retry_or_give_up(attempt, e).await?;
                            continue;
                        }
                    };
                    if reconnect {
                        self.pusher.emit(Event::LlmReconnected {
                            attempts: attempt,
                            restarted_response: restart,
                        });
                    }
                    attempt = 0;
                    match self.serve(&mut socket).await {
                        Ended::Closed => {
                            let _ = socket.close(None).await;
                            return Ok(());
                        }
                        Ended::Lost(reason) => reason,
                    }
                }
                Err(reason) => reason,
            };
            attempt += 1;
            self.retry_or_give_up(attempt, reason).await?;
        }
    }

    /// Waits before attempt `attempt`, or ends the task with a fatal error after the last one.
    async fn retry_or_give_up(
        &mut self,
        attempt: u32,
        reason: String,
    ) -> Result<(), ProcessorError> {
        let policy = &self.options.reconnect;
        if attempt > policy.max_attempts {
            let message = format!(
                "the realtime LLM ({}) could not be reached after {} attempts: {reason}",
                self.protocol.provider(),
                policy.max_attempts
            );
            tracing::error!("{message}");
            return Err(ProcessorError::fatal(message));
        }
        let delay = policy.delay(attempt);
        tracing::warn!(attempt, delay_ms = delay.as_millis() as u64, %reason, "realtime LLM connection lost; reconnecting");
        self.pusher.emit(Event::LlmReconnecting {
            attempt,
            delay_ms: delay.as_millis() as u64,
            reason,
        });
        // A response cut off by the loss ends here; it is asked for again once reconnected.
        if self.response.open {
            self.end_response(StopReason::Error).await;
            self.response.respond_after = true;
        }
        if self.response.requested_at.take().is_some() {
            self.response.respond_after = true;
        }
        self.played = None;
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        // Audio that arrives while disconnected is stale by the time a connection is back.
        loop {
            tokio::select! {
                () = &mut sleep => return Ok(()),
                command = self.commands.recv() => match command {
                    None | Some(Command::Close) => return Err(ProcessorError::new("the session ended while the realtime LLM was reconnecting")),
                    Some(_) => {}
                },
            }
        }
    }

    /// Opens the socket and configures the session.
    async fn open(&mut self) -> Result<Socket, String> {
        let request = self.protocol.request().map_err(|e| e.to_string())?;
        // rustls needs its crypto provider chosen once per process; a second call is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let policy = &self.options.reconnect;
        let (mut socket, _) = tokio::time::timeout(
            policy.connect_timeout,
            tokio_tungstenite::connect_async(request),
        )
        .await
        .map_err(|_| "connecting timed out".to_owned())?
        .map_err(|e| e.to_string())?;
        let setup = self.setup();
        for message in self.protocol.setup(&setup) {
            send(&mut socket, &message).await?;
        }
        let deadline = tokio::time::Instant::now() + policy.setup_timeout;
        loop {
            let message = tokio::time::timeout_at(deadline, socket.next())
                .await
                .map_err(|_| "the provider did not confirm the session set-up".to_owned())?;
            let Some(text) = text_of(message)? else {
                continue;
            };
            match self.protocol.parse(&text) {
                Ok(events) => {
                    for event in events {
                        match event {
                            RealtimeEvent::Ready => return Ok(socket),
                            RealtimeEvent::Error(e) => return Err(e),
                            _ => {}
                        }
                    }
                }
                Err(e) => crate::warnings::warn(
                    "realtime_unreadable_event",
                    format_args!("unreadable realtime event ignored: {e}"),
                ),
            }
        }
    }

    fn setup(&self) -> SessionSetup {
        let context = self.context.snapshot();
        SessionSetup {
            messages: context.messages,
            tools: self.tools.tools(context.tools),
            tool_choice: context.tool_choice,
            async_functions: self.tools.async_functions(),
        }
    }

    /// Sends the history (first connection) or what is still owed (reconnect); restarts a
    /// response that the loss cut off. Returns whether it did.
    async fn after_open(&mut self, socket: &mut Socket, reconnect: bool) -> Result<bool, String> {
        self.deliver(socket, !reconnect).await?;
        self.set_up = true;
        let restart = std::mem::take(&mut self.response.respond_after);
        if restart {
            self.respond(socket).await?;
        }
        Ok(restart)
    }

    /// Runs one connection until the session ends or the connection is lost.
    async fn serve(&mut self, socket: &mut Socket) -> Ended {
        loop {
            let deadline = self.deadline();
            let result = tokio::select! {
                command = self.commands.recv() => match command {
                    None | Some(Command::Close) => return Ended::Closed,
                    Some(command) => self.command(socket, command).await,
                },
                message = socket.next() => match text_of(message) {
                    Ok(Some(text)) => self.server(socket, &text).await,
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                },
                () = sleep_until(deadline), if deadline.is_some() => {
                    self.timed_out().await;
                    Ok(())
                }
            };
            if let Err(reason) = result {
                return Ended::Lost(reason);
            }
        }
    }

    fn deadline(&self) -> Option<Instant> {
        let since = self.response.requested_at.or(if self.response.open {
            self.response.last_event_at
        } else {
            None
        })?;
        Some(since + self.options.response_timeout)
    }

    async fn command(&mut self, socket: &mut Socket, command: Command) -> Result<(), String> {
        match command {
            Command::Audio(samples) => send(socket, &self.protocol.audio(&samples)).await,
            Command::Deliver => self.deliver(socket, false).await,
            Command::Interrupt => self.interrupt(socket).await,
            Command::UserStarted => {
                for message in self.protocol.user_started() {
                    send(socket, &message).await?;
                }
                Ok(())
            }
            Command::UserStopped => {
                let messages = self.protocol.user_stopped();
                if !messages.is_empty() && !self.response.open {
                    self.response.requested_at = Some(Instant::now());
                }
                for message in messages {
                    send(socket, &message).await?;
                }
                Ok(())
            }
            Command::Close => Ok(()),
        }
    }

    /// Sends every item not delivered yet: all of them on a fresh session, tool results and
    /// partial results afterwards. Asks for a response when a tool result went out.
    async fn deliver(&mut self, socket: &mut Socket, history: bool) -> Result<(), String> {
        let messages = self.context.snapshot().messages;
        let mut answer = false;
        for delivery in self.protocol.deliveries(&messages) {
            if self.delivered.contains(&delivery.key) {
                continue;
            }
            if history || delivery.kind != DeliveryKind::History {
                for message in &delivery.messages {
                    send(socket, message).await?;
                }
                tracing::debug!(key = %delivery.key, "delivered to the realtime LLM");
                answer |= !history && delivery.kind == DeliveryKind::ToolResult;
            }
            self.delivered.insert(delivery.key);
        }
        if answer {
            self.respond(socket).await?;
        }
        Ok(())
    }

    /// Asks for a response now, or once the current one has ended.
    async fn respond(&mut self, socket: &mut Socket) -> Result<(), String> {
        if self.response.open {
            self.response.respond_after = true;
            return Ok(());
        }
        if let Some(message) = self.protocol.respond() {
            send(socket, &message).await?;
            self.response.requested_at = Some(Instant::now());
        }
        Ok(())
    }

    /// The user cut in: stop the response where it was heard and drop the rest of it.
    async fn interrupt(&mut self, socket: &mut Socket) -> Result<(), String> {
        if !self.response.open && self.played.is_none() {
            return Ok(());
        }
        let played = self.played.take().map(|p| PlayedAudio {
            item_id: p.item_id,
            played_ms: (p.first_at.elapsed().as_millis() as u64).min(p.received_ms),
        });
        for message in self.protocol.interrupt(played.as_ref()) {
            send(socket, &message).await?;
        }
        if self.response.open {
            self.flush_sentence().await;
            self.response.open = false;
            self.response.discarding = true;
            self.response.usage = TokenUsage::default();
        }
        Ok(())
    }

    async fn server(&mut self, socket: &mut Socket, text: &str) -> Result<(), String> {
        let events = match self.protocol.parse(text) {
            Ok(events) => events,
            Err(e) => {
                crate::warnings::warn(
                    "realtime_unreadable_event",
                    format_args!("unreadable realtime event ignored: {e}"),
                );
                return Ok(());
            }
        };
        if self.response.open {
            self.response.last_event_at = Some(Instant::now());
        }
        for event in events {
            self.event(socket, event).await?;
        }
        Ok(())
    }

    async fn event(&mut self, socket: &mut Socket, event: RealtimeEvent) -> Result<(), String> {
        let down = Direction::Downstream;
        match event {
            RealtimeEvent::Ready => {}
            RealtimeEvent::ResponseStarted => self.open_response().await,
            RealtimeEvent::Audio { samples, item_id } => {
                if self.response.discarding {
                    return Ok(());
                }
                self.open_response().await;
                let rate = self.output_rate.max(1);
                let ms = samples.len() as u64 * 1000 / u64::from(rate);
                match &mut self.played {
                    Some(p) if p.item_id == item_id => p.received_ms += ms,
                    _ => {
                        self.played = Some(Playing {
                            item_id,
                            first_at: Instant::now(),
                            received_ms: ms,
                        })
                    }
                }
                let frame = AudioFrame::new(samples, rate, 1);
                self.push(DataFrame::OutputAudio(frame).into(), down).await;
            }
            RealtimeEvent::BotText(text) => {
                if !self.response.discarding {
                    self.open_response().await;
                    self.response.sentence.push_str(&text);
                    self.push(DataFrame::LlmText(text).into(), down).await;
                    let sentence = self.response.sentence.trim_end();
                    if sentence.ends_with(['.', '!', '?']) {
                        self.flush_sentence().await;
                    }
                }
            }
            RealtimeEvent::UserTranscript { text, is_final } => {
                let transcription = Box::new(Transcription::new(text.trim(), "user"));
                if is_final {
                    if !text.trim().is_empty() {
                        self.record_user(text.trim());
                    }
                    self.push(DataFrame::Transcription(transcription).into(), down)
                        .await;
                } else {
                    self.push(DataFrame::InterimTranscription(transcription).into(), down)
                        .await;
                }
            }
            RealtimeEvent::UserStarted => {
                self.push(SystemFrame::UserStartedSpeaking.into(), down)
                    .await;
                if self.response.open || self.played.is_some() {
                    self.barge_in(socket).await?;
                }
            }
            RealtimeEvent::Interrupted => self.barge_in(socket).await?,
            RealtimeEvent::ToolCallsCancelled(ids) => {
                for (frame, dir) in self.tools.cancel_ids(&ids) {
                    self.push(frame, dir).await;
                }
            }
            RealtimeEvent::UserStopped => {
                self.push(SystemFrame::UserStoppedSpeaking.into(), down)
                    .await;
                self.response.requested_at.get_or_insert_with(Instant::now);
            }
            RealtimeEvent::ToolCalls(calls) => {
                if !self.response.discarding && !calls.is_empty() {
                    self.open_response().await;
                    self.tools
                        .batch(self.context.clone(), self.pusher.clone())
                        .start(calls)
                        .await;
                }
            }
            RealtimeEvent::Usage(usage) => self.response.usage += usage,
            RealtimeEvent::ResponseDone { cancelled } => {
                self.played = None;
                if self.response.discarding {
                    self.response.discarding = false;
                } else if self.response.open {
                    let reason = if cancelled {
                        StopReason::Aborted
                    } else {
                        StopReason::Stop
                    };
                    self.end_response(reason).await;
                }
                self.response.requested_at = None;
                if std::mem::take(&mut self.response.respond_after) {
                    self.respond(socket).await?;
                }
            }
            RealtimeEvent::Error(message) => {
                tracing::warn!(%message, "the realtime LLM reported an error");
                let mut error = ErrorFrame::new(format!("realtime LLM error: {message}"));
                error.processor = Some(self.pusher.name().to_owned());
                self.push(
                    SystemFrame::Error(Box::new(error)).into(),
                    Direction::Upstream,
                )
                .await;
            }
        }
        Ok(())
    }

    /// The provider heard the user cut in: everything downstream stops, and so does the response.
    async fn barge_in(&mut self, socket: &mut Socket) -> Result<(), String> {
        self.push(SystemFrame::Interruption.into(), Direction::Upstream)
            .await;
        self.push(SystemFrame::Interruption.into(), Direction::Downstream)
            .await;
        for (frame, dir) in self.tools.cancel_for_interruption() {
            self.push(frame, dir).await;
        }
        self.interrupt(socket).await
    }

    /// Writes a final user transcript into the context, before the response it led to.
    fn record_user(&self, text: &str) {
        let mut context = self.context.lock();
        let at = if self.response.open {
            self.response.context_index.min(context.messages.len())
        } else {
            context.messages.len()
        };
        context.messages.insert(at, Message::user(text));
    }

    async fn open_response(&mut self) {
        if self.response.open {
            return;
        }
        let now = Instant::now();
        if let Some(asked) = self.response.requested_at.take()
            && self.params.enable_metrics
        {
            let ttfb = MetricsData::Ttfb {
                processor: self.pusher.name().to_owned(),
                model: Some(self.protocol.model().to_owned()),
                seconds: now.duration_since(asked).as_secs_f64(),
            };
            self.push(
                SystemFrame::Metrics(vec![ttfb]).into(),
                Direction::Downstream,
            )
            .await;
        }
        self.response.open = true;
        self.response.discarding = false;
        self.response.last_event_at = Some(now);
        self.response.usage = TokenUsage::default();
        self.response.context_index = self.context.lock().messages.len();
        self.push(
            ControlFrame::LlmFullResponseStart.into(),
            Direction::Downstream,
        )
        .await;
    }

    /// Reports the bot's words so far as a spoken sentence (the provider speaks them itself).
    async fn flush_sentence(&mut self) {
        let sentence = std::mem::take(&mut self.response.sentence);
        let text = sentence.trim();
        if !text.is_empty() {
            let spoken = TtsText::spoken(text);
            self.push(DataFrame::TtsText(spoken).into(), Direction::Downstream)
                .await;
        }
    }

    async fn end_response(&mut self, stop_reason: StopReason) {
        let down = Direction::Downstream;
        self.flush_sentence().await;
        self.response.open = false;
        let usage = std::mem::take(&mut self.response.usage);
        let model = self.protocol.model().to_owned();
        let cost_usd = self.options.functions.prices.cost(&model, &usage);
        if self.params.enable_usage_metrics && usage != TokenUsage::default() {
            let data = MetricsData::LlmUsage {
                processor: self.pusher.name().to_owned(),
                model: Some(model.clone()),
                usage,
                cost_usd,
            };
            self.push(SystemFrame::Metrics(vec![data]).into(), down)
                .await;
        }
        let summary = LlmResponseSummary {
            provider: self.protocol.provider().to_owned(),
            model,
            usage,
            cost_usd,
            stop_reason,
            thinking: String::new(),
            provider_messages: Vec::new(),
        };
        self.push(
            ControlFrame::LlmResponseSummary(Box::new(summary)).into(),
            down,
        )
        .await;
        self.push(ControlFrame::LlmFullResponseEnd.into(), down)
            .await;
    }

    async fn timed_out(&mut self) {
        let seconds = self.options.response_timeout.as_secs_f64();
        tracing::warn!(seconds, "the realtime LLM gave no answer");
        self.pusher.emit(Event::LlmCompletionTimeout { seconds });
        let mut error = ErrorFrame::new(format!("the realtime LLM gave no answer for {seconds} s"));
        error.processor = Some(self.pusher.name().to_owned());
        self.push(
            SystemFrame::Error(Box::new(error)).into(),
            Direction::Upstream,
        )
        .await;
        self.response.requested_at = None;
        if self.response.open {
            self.end_response(StopReason::Error).await;
            // Whatever still comes for it is late: drop it.
            self.response.discarding = true;
        }
    }

    async fn push(&self, frame: Frame, direction: Direction) {
        let _ = self.pusher.push(frame, direction).await;
    }
}

async fn send(socket: &mut Socket, message: &Value) -> Result<(), String> {
    socket
        .send(tungstenite::Message::Text(message.to_string().into()))
        .await
        .map_err(|e| format!("sending failed: {e}"))
}

/// The text of a server message: `Ok(None)` for control frames, an error for a lost connection.
fn text_of(
    message: Option<Result<tungstenite::Message, tungstenite::Error>>,
) -> Result<Option<String>, String> {
    match message {
        Some(Ok(tungstenite::Message::Text(text))) => Ok(Some(text.to_string())),
        // Some providers (Gemini Live) send their JSON in binary frames.
        Some(Ok(tungstenite::Message::Binary(bytes))) => match String::from_utf8(bytes.to_vec()) {
            Ok(text) => Ok(Some(text)),
            Err(_) => {
                crate::warnings::warn(
                    "realtime_binary_not_utf8",
                    "a binary realtime message that is not UTF-8 was ignored",
                );
                Ok(None)
            }
        },
        Some(Ok(tungstenite::Message::Close(frame))) => Err(match frame {
            Some(f) => format!(
                "the provider closed the connection ({}: {})",
                f.code, f.reason
            ),
            None => "the provider closed the connection".to_owned(),
        }),
        Some(Ok(_)) => Ok(None),
        Some(Err(e)) => Err(format!("the connection failed: {e}")),
        None => Err("the connection ended".to_owned()),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// A connect request for `url` with extra headers.
pub fn connect_request(
    url: &str,
    headers: &[(&str, &str)],
) -> Result<ConnectRequest, RealtimeError> {
    crate::services::ws::connect_request(url, headers)
        .map_err(|e| RealtimeError::Config(e.to_string()))
}

/// `url` with `name=value` added to its query.
pub fn with_query(url: &str, name: &str, value: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{name}={value}")
}

/// 16-bit little-endian PCM as base64, as both providers carry audio in JSON.
pub fn pcm_to_base64(samples: &[i16]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Base64 16-bit little-endian PCM back to samples (a trailing odd byte is dropped).
pub fn pcm_from_base64(data: &str) -> Result<Vec<i16>, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("audio is not base64: {e}"))?;
    Ok(bytes
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcm_survives_base64_and_bad_data_is_an_error() {
        let samples = [0i16, 1, -1, i16::MAX, i16::MIN];
        assert_eq!(
            pcm_from_base64(&pcm_to_base64(&samples)),
            Ok(samples.to_vec())
        );
        assert!(pcm_from_base64("%%").is_err());
        assert_eq!(with_query("ws://h/x?a=1", "key", "k"), "ws://h/x?a=1&key=k");
        assert_eq!(with_query("ws://h/x", "model", "m"), "ws://h/x?model=m");
    }
}
