//! Realtime (speech-to-speech) LLM services: one WebSocket per session, audio both ways, tool
//! calls through the same function registry as the text LLMs, and tool results delivered through
//! the provider's own channel, each exactly once.
//!
//! Three layers. A [`RealtimeProtocol`] speaks one provider's messages
//! ([`super::openai_realtime::OpenAiRealtime`], [`super::gemini_live::GeminiLive`]), purely. The
//! sans-IO `core::RealtimeCore` does what every provider shares: the set-up of each connection,
//! the ledger of what was delivered, the response and its timeout, interruptions, frames and
//! metrics, as actions. The shared WebSocket driver ([`crate::ws`]) runs it: connects,
//! reconnects with backoff and jitter, and refuses to retry a rejected key; [`RealtimeService`]
//! feeds it commands and a pump carries out its actions.

mod core;

use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use self::core::{Action, Command, RealtimeCore};
use super::LlmServiceOptions;
use super::tools::ToolRunner;
use voxide_core::context::{ContextHandle, Message, ToolChoice, ToolsSchema};
use voxide_core::frames::{
    AudioFrame, ControlFrame, DataFrame, Frame, FrameBody, FunctionCallRequest, StartParams,
    SystemFrame, TokenUsage,
};
use voxide_core::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};
use voxide_engines::audio::resample::StreamResampler;

pub use crate::ws::ConnectRequest;
pub use crate::{pcm_from_base64, pcm_to_base64};

/// The service's name, on its frames and metrics.
const PROCESSOR: &str = "RealtimeService";

/// Why a realtime service could not be configured or connected, or a server message not read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RealtimeError {
    /// A setting is missing or unusable (e.g. no API key, a malformed URL).
    #[error("realtime LLM configuration: {0}")]
    Config(String),
    /// A server message that does not read as the provider's wire format says.
    #[error("unreadable {provider} message: {reason}")]
    Unreadable {
        /// The provider (`openai`, `google`).
        provider: &'static str,
        /// What did not read.
        reason: String,
    },
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
        crate::ws::backoff(self.initial_delay, self.max_delay, attempt)
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
    /// The messages that give a live session new instructions and tools (a flow moved to
    /// another node); `None` where the provider fixes them at the set-up.
    fn update(&self, setup: &SessionSetup) -> Option<Vec<Value>> {
        let _ = setup;
        None
    }
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
    fn parse(&mut self, text: &str) -> Result<Vec<RealtimeEvent>, RealtimeError>;
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
    context: ContextHandle,
    tools: ToolRunner,
    commands: Option<mpsc::Sender<Command>>,
    resampler: Option<(u32, StreamResampler)>,
}

/// Commands the connection may fall behind by (about 10 s of 20 ms audio).
const COMMAND_QUEUE: usize = 512;
/// Actions the pump may fall behind by.
const ACTION_QUEUE: usize = 256;

impl<P: RealtimeProtocol> RealtimeService<P> {
    /// A service speaking `protocol`, recording into `context`.
    pub fn new(protocol: P, context: ContextHandle, options: RealtimeOptions) -> Self {
        Self {
            input_rate: protocol.input_rate(),
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
        if let Some(commands) = &self.commands
            && let Err(mpsc::error::TrySendError::Full(_)) = commands.try_send(command)
        {
            // The connection has given up, or is far behind: audio that cannot wait is dropped.
            voxide_core::warnings::warn(
                "realtime_commands_full",
                "the realtime LLM's connection is behind; a command was dropped",
            );
        }
    }

    fn start(&mut self, params: StartParams, cx: &mut FrameContext<'_>) {
        let Some((protocol, options)) = self.pending.take() else {
            return;
        };
        let (commands, inputs) = mpsc::channel(COMMAND_QUEUE);
        let (actions, pending) = mpsc::channel(ACTION_QUEUE);
        self.commands = Some(commands);
        let policy = crate::ws::ReconnectPolicy {
            max_attempts: options.reconnect.max_attempts,
            initial_delay: options.reconnect.initial_delay,
            max_delay: options.reconnect.max_delay,
            connect_timeout: options.reconnect.connect_timeout,
        };
        let (context, tools) = (self.context.clone(), self.tools.clone());
        let setup = Box::new(move || {
            let snapshot = context.snapshot();
            SessionSetup {
                messages: snapshot.messages,
                tools: tools.tools(snapshot.tools),
                tool_choice: snapshot.tool_choice,
                async_functions: tools.async_functions(),
            }
        });
        let core = RealtimeCore::new(protocol, options, self.context.clone(), params, setup);
        tokio::spawn(crate::ws::drive(core, inputs, actions, policy));
        let pump = Pump {
            pusher: cx.pusher(),
            context: self.context.clone(),
            tools: self.tools.clone(),
        };
        cx.spawn(pump.run(pending));
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
                    voxide_core::warnings::warn(
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
        PROCESSOR
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
            // Dropping the commands closes the connection.
            FrameBody::Control(ControlFrame::End(_)) => self.commands = None,
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Carries out what the core asks, in order: frames into the pipeline, events, tool calls. A
/// connection given up for good ends the session with a fatal error.
struct Pump {
    pusher: FramePusher,
    context: ContextHandle,
    tools: ToolRunner,
}

impl Pump {
    async fn run(self, mut actions: mpsc::Receiver<Action>) -> Result<(), ProcessorError> {
        while let Some(action) = actions.recv().await {
            match action {
                Action::Push(frame, direction) => {
                    let _ = self.pusher.push(frame, direction).await;
                }
                Action::Emit(event) => self.pusher.emit(event),
                Action::RunTools(calls) => {
                    self.tools
                        .batch(self.context.clone(), self.pusher.clone())
                        .start(calls)
                        .await;
                }
                Action::CancelTools(ids) => {
                    for (frame, direction) in self.tools.cancel_ids(&ids) {
                        let _ = self.pusher.push(frame, direction).await;
                    }
                }
                Action::CancelToolsForInterruption => {
                    for (frame, direction) in self.tools.cancel_for_interruption() {
                        let _ = self.pusher.push(frame, direction).await;
                    }
                }
                Action::Fatal(message) => return Err(ProcessorError::fatal(message)),
            }
        }
        Ok(())
    }
}

/// For voxide's fuzz targets: the core's state machine over `protocol`, driven by `bytes`: each
/// message's first byte picks a command from the service (audio, a delivery, an interruption,
/// the user's turn) or a provider message (text, or binary), the clock moving on as it goes.
#[doc(hidden)]
pub fn fuzz_core(protocol: impl RealtimeProtocol, bytes: &[u8]) {
    use crate::ws::{Message as WsMessage, WsCore};
    let context = ContextHandle::new(voxide_core::context::LlmContext::new(vec![
        voxide_core::context::Message::system("Be brief."),
    ]));
    let setup = Box::new(|| SessionSetup {
        messages: vec![voxide_core::context::Message::system("Be brief.")],
        tools: voxide_core::context::ToolsSchema::default(),
        tool_choice: None,
        async_functions: vec!["lookup".into()],
    });
    let mut core = core::RealtimeCore::new(
        protocol,
        RealtimeOptions::default(),
        context,
        StartParams::default(),
        setup,
    );
    let mut now = std::time::Instant::now();
    let _ = core.opened(now);
    for message in bytes.split(|b| *b == 0xff) {
        let Some((kind, rest)) = message.split_first() else {
            continue;
        };
        now += std::time::Duration::from_millis(u64::from(*kind) * 7);
        let command = match kind % 8 {
            0 => Some(core::Command::Audio(
                rest.chunks_exact(2)
                    .map(|b| i16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            )),
            1 => Some(core::Command::Deliver),
            2 => Some(core::Command::Interrupt),
            3 => Some(core::Command::UserStarted),
            4 => Some(core::Command::UserStopped),
            _ => None,
        };
        if let Some(command) = command {
            let _ = core.input(command, now);
            continue;
        }
        let message = if kind % 8 == 5 {
            WsMessage::Binary(rest.to_vec().into())
        } else {
            WsMessage::Text(String::from_utf8_lossy(rest).into_owned().into())
        };
        if core.message(message, now).is_err() {
            let _ = core.opened(now);
        }
        let _ = core.tick(now);
    }
}

/// A connect request for `url` with extra headers.
pub fn connect_request(
    url: &str,
    headers: &[(&str, &str)],
) -> Result<ConnectRequest, RealtimeError> {
    crate::ws::connect_request(url, headers).map_err(|e| RealtimeError::Config(e.to_string()))
}

/// `url` with `name=value` added to its query, the value percent-encoded (a key with `&`, `#`
/// or `=` in it stays one parameter).
pub fn with_query(url: &str, name: &str, value: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    format!("{url}{separator}{name}={encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_in_a_url_is_one_parameter_whatever_it_holds() {
        assert_eq!(
            with_query("ws://h/x", "key", "a&b=c#d é"),
            "ws://h/x?key=a%26b%3Dc%23d%20%C3%A9"
        );
    }

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
