//! The bot: the stages a session runs, from the options a config and a bot file resolve to. The
//! default one has a short instruction and three built-in tools that exercise the whole
//! function-calling path (a sync tool, a sync tool with checked input, an async tool); a bot
//! file adds its own instruction, greeting, HTTP tools ([`http_tool`]) and MCP servers ([`mcp`]).

//!
//! The crate also holds what a bot is made of: its [`config`] (the pure types a config file and
//! a bot file read into), its [`turns`] (when the user has finished, and what stops the bot) and
//! its [`flows`] (conversations with a shape). It depends only on the layers below it
//! (`voxide-core`, `voxide-engines`, `voxide-services`, `voxide-media`); the server and the
//! command line sit above it in `voxide`.

use voxide_core::{aggregators, context, events, frames, pipeline, secret, warnings};
use voxide_engines::models;
use voxide_media::{audio, transports};
use voxide_services as services;

pub use voxide_core::calculator;
pub mod config;
pub mod flows;
pub mod turns;

pub mod answered_by;
pub mod call_control;
pub mod filler;
pub mod http_tool;
pub mod mcp;
pub mod providers;
mod resolve;
pub mod run;
pub mod tools;

use std::sync::Arc;
use std::time::Duration;

use crate::aggregators::{AssistantAggregator, UserAggregator};
use crate::audio::aec::EchoCanceller;
use crate::audio::denoise::Denoiser;
use crate::audio::echo::{EchoGuard, EchoGuardParams, EchoReference, EchoTap};
use crate::audio::turn::SmartTurn;
use crate::audio::vad::{VadBatcher, VadParams, VadStage};
pub use crate::config::{Builtin, Denoise, TurnEnd, Voice};
use crate::context::{ContextHandle, DEFAULT_MAX_CONTEXT_TOKENS, LlmContext, Message};
use crate::events::ReportLevel;
use crate::flows::{Flow, FlowOptions, FlowSession};
use crate::frames::{Frame, FrameBody, StartParams, SystemFrame};
use crate::models::ModelError;
use crate::pipeline::{
    AppResources, Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError,
};
use crate::services::llm::FunctionRegistry;
use crate::services::llm::anthropic::{AnthropicLlm, AnthropicSettings};
use crate::services::llm::gemini::{GeminiLlm, GeminiSettings};
use crate::services::llm::gemini_live::{GeminiLive, GeminiLiveSettings};
use crate::services::llm::local::{LocalLlm, LocalLlmOptions, LocalModel, ToolExample};
use crate::services::llm::openai::{OpenAiLlm, OpenAiSettings};
use crate::services::llm::openai_realtime::{OpenAiRealtime, OpenAiRealtimeSettings};
use crate::services::llm::realtime::RealtimeProtocol;
use crate::services::llm::{
    ContextSummarizer, FallbackLlm, LlmEngine, LlmService, LlmServiceOptions, PriceTable,
    RealtimeOptions, RealtimeService,
};
use crate::services::stt::assemblyai::{AssemblyAiSettings, AssemblyAiStt};
use crate::services::stt::deepgram::{DeepgramSettings, DeepgramStt};
use crate::services::stt::openai::{OpenAiStt, OpenAiSttSettings};
use crate::services::stt::{
    PromptedWhisper, Segmented, SttEngine, SttFallback, SttService, Whisper,
};
use crate::services::tts::cartesia::{CartesiaSettings, CartesiaTts};
use crate::services::tts::deepgram::{AuraSettings, AuraTts};
use crate::services::tts::elevenlabs::{ElevenLabsSettings, ElevenLabsTts};
use crate::services::tts::espeak::EspeakError;
use crate::services::tts::openai::{OpenAiSpeech, OpenAiSpeechSettings};
use crate::services::tts::{
    EspeakVoice, PiperVoice, Sentences, TtsEngine, TtsFallback, TtsService,
};
use crate::transports::{AudioOutput, AudioSink, OutputOptions};
use crate::turns::{BargeIn, IdleParams, MuteStrategy, TurnStop, UserIdle, UserMute, UserTurns};
use filler::{FillerParams, ToolFiller};
pub use http_tool::HttpTool;
pub use mcp::McpServer;
use voxide_engines::speaker::SpeakerEncoder;

/// Tokens a summary of the oldest turns may have.
const SUMMARY_MAX_TOKENS: usize = 400;

/// The default bot's system instruction: short, because the embedded model is small.
pub const INSTRUCTIONS: &str = "You are voxide, a friendly voice assistant. Your replies are \
spoken aloud, so answer in one or two short sentences of plain words, without lists or symbols.";

/// A fresh conversation with the default instruction.
pub fn context() -> LlmContext {
    LlmContext::new(vec![Message::system(INSTRUCTIONS)])
}

/// The embedded LLM for one conversation, taught the default tools.
pub fn local_llm() -> Result<LocalLlm, ModelError> {
    local_llm_taught(&[])
}

/// The embedded LLM taught the default tools and `examples` of the bot's own.
fn local_llm_taught(examples: &[ToolExample]) -> Result<LocalLlm, ModelError> {
    let mut tool_examples = tools::local_examples();
    tool_examples.extend_from_slice(examples);
    Ok(LocalLlm::new(
        LocalModel::shared()?,
        LocalLlmOptions {
            tool_examples,
            tool_words: tools::local_words(),
            ..LocalLlmOptions::default()
        },
    ))
}

/// Which model listens, thinks and speaks.
#[derive(Debug, Clone)]
pub enum LlmChoice {
    /// Text LLMs with the embedded listening and voice around them: the first answers, each of
    /// the others is the fallback of the one before (`--llm openai,local`).
    Text(Vec<TextLlm>),
    /// OpenAI Realtime, speech to speech.
    OpenAiRealtime(OpenAiRealtimeSettings),
    /// Gemini Live, speech to speech.
    GeminiLive(GeminiLiveSettings),
}

impl Default for LlmChoice {
    /// The embedded stack: VAD, turns, Whisper, the local LLM and an embedded voice.
    fn default() -> Self {
        LlmChoice::Text(vec![TextLlm::Local])
    }
}

impl LlmChoice {
    /// Whether the embedded LLM is one of the text LLMs.
    fn uses_local(&self) -> bool {
        matches!(self, LlmChoice::Text(list) if list.contains(&TextLlm::Local))
    }
}

/// A speech-to-text engine.
#[derive(Debug, Clone, PartialEq)]
pub enum SttChoice {
    /// The embedded Whisper, offline.
    Whisper,
    /// Deepgram's live transcription.
    Deepgram(DeepgramSettings),
    /// AssemblyAI's Universal-Streaming.
    AssemblyAi(AssemblyAiSettings),
    /// OpenAI's realtime transcription, or a server that speaks it.
    OpenAi(OpenAiSttSettings),
}

impl SttChoice {
    /// The engine; the embedded Whisper reads `prompt` first, and listens again to what
    /// sounds like a request of the built-in tools `builtin` that it could not make out.
    fn engine(&self, prompt: &str, builtin: &[Builtin]) -> Result<Arc<dyn SttEngine>, BotError> {
        Ok(match self {
            SttChoice::Whisper => {
                let mut whisper = PromptedWhisper::new(Whisper::shared()?, prompt);
                if !builtin.is_empty() {
                    whisper = whisper.with_reader(tools::reader(builtin));
                }
                Segmented::shared(Arc::new(whisper))
            }
            SttChoice::Deepgram(settings) => Arc::new(DeepgramStt::new(settings.clone())),
            SttChoice::AssemblyAi(settings) => Arc::new(AssemblyAiStt::new(settings.clone())),
            SttChoice::OpenAi(settings) => Arc::new(OpenAiStt::new(settings.clone())),
        })
    }
}

/// A voice.
#[derive(Debug, Clone, PartialEq)]
pub enum TtsChoice {
    /// The embedded voice the options' `voice` names (Piper or espeak-ng), offline.
    Embedded,
    /// Cartesia's streaming voice.
    Cartesia(CartesiaSettings),
    /// OpenAI's speech API, or a server that speaks it.
    OpenAi(OpenAiSpeechSettings),
    /// Deepgram Aura's streaming voice.
    Deepgram(AuraSettings),
    /// ElevenLabs' multi-context streaming voice.
    ElevenLabs(ElevenLabsSettings),
}

/// A text LLM.
#[derive(Debug, Clone, PartialEq)]
pub enum TextLlm {
    /// The embedded SmolLM2, offline.
    Local,
    /// An OpenAI-compatible chat-completions server (OpenAI, Ollama, vLLM, llama.cpp, Groq…).
    OpenAi(OpenAiSettings),
    /// Anthropic's Messages API.
    Anthropic(AnthropicSettings),
    /// Google's Gemini API.
    Gemini(GeminiSettings),
}

impl TextLlm {
    /// The engine, replies capped at `max_tokens` where the settings name no cap; the embedded
    /// model learns the bot's own tools from `examples`.
    fn engine(
        &self,
        max_tokens: usize,
        examples: &[ToolExample],
    ) -> Result<Box<dyn LlmEngine>, BotError> {
        let cap = u32::try_from(max_tokens).unwrap_or(u32::MAX);
        Ok(match self {
            TextLlm::Local => {
                let mut engine = local_llm_taught(examples)?;
                engine.set_max_tokens(max_tokens);
                Box::new(engine)
            }
            TextLlm::OpenAi(settings) => {
                let mut settings = settings.clone();
                settings.max_tokens = settings.max_tokens.or(Some(cap));
                Box::new(OpenAiLlm::new(settings)?)
            }
            TextLlm::Anthropic(settings) => Box::new(AnthropicLlm::new(settings.clone())?),
            TextLlm::Gemini(settings) => {
                let mut settings = settings.clone();
                settings.max_tokens = settings.max_tokens.or(Some(cap));
                Box::new(GeminiLlm::new(settings)?)
            }
        })
    }
}

/// Registers a program's own functions on each session's registry.
type Register = Arc<dyn Fn(&mut FunctionRegistry) + Send + Sync>;

/// Tools a Rust program gives the bot, beside the built-in, HTTP and MCP ones: each entry
/// registers its functions on every session's registry.
#[derive(Clone, Default)]
pub struct RustTools(Vec<Register>);

impl RustTools {
    /// Adds `register`, run for every session.
    pub fn add(&mut self, register: impl Fn(&mut FunctionRegistry) + Send + Sync + 'static) {
        self.0.push(Arc::new(register));
    }
}

impl std::fmt::Debug for RustTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RustTools({} registrations)", self.0.len())
    }
}

/// What a bot is made of.
#[derive(Debug, Clone)]
pub struct BotOptions {
    /// The name clients ask for it by (none: the server's only bot).
    pub name: Option<String>,
    /// The model: embedded, or a realtime provider.
    pub llm: LlmChoice,
    /// The VAD's parameters.
    pub vad: VadParams,
    /// How a turn ends.
    pub turn_end: TurnEnd,
    /// With [`TurnEnd::Silence`], the silence; with [`TurnEnd::SmartTurn`], the silence after
    /// which an unfinished-sounding turn ends anyway.
    pub turn_timeout: Duration,
    /// With [`TurnEnd::SmartTurn`], weigh the turn's words with the model's verdict.
    pub turn_words: bool,
    /// Start the text LLM at a pause whose words are in, before the turn ends.
    pub preemptive: bool,
    /// The voice.
    pub voice: Voice,
    /// Tokens one reply may have at most.
    pub max_tokens: usize,
    /// Tokens the conversation may hold (estimated) before its oldest turns are dropped.
    pub max_context_tokens: usize,
    /// Past `max_context_tokens`, fold the oldest turns into a summary the LLM writes in the
    /// background; they are dropped only past twice the budget.
    pub summarize_context: bool,
    /// What clients are told of a function call.
    pub function_call_report_level: ReportLevel,
    /// Its sessions may be recorded (`voxide serve --record-dir`).
    pub record: bool,
    /// Its sessions may be traced (`voxide serve --otlp-endpoint`).
    pub trace: bool,
    /// The system instruction.
    pub instructions: String,
    /// What the bot says as the session starts.
    pub greeting: Option<String>,
    /// What the bot does when the user goes quiet.
    pub idle: Option<IdleParams>,
    /// On a call it placed, who answered is told first, and a machine gets this (`[voicemail]`).
    pub voicemail: Option<answered_by::Voicemail>,
    /// This session is a call the bot placed (`POST /calls`): `voicemail` applies.
    pub placed_call: bool,
    /// What fills the silence while a tool works.
    pub filler: Option<FillerParams>,
    /// Where `transfer_call` may hand a phone call: name, then number or SIP URI (none: no
    /// such tool).
    pub transfer: Vec<(String, String)>,
    /// The built-in tools it keeps.
    pub builtin: Vec<Builtin>,
    /// Its own HTTP tools.
    pub http_tools: Vec<HttpTool>,
    /// MCP servers whose tools it gets (started once, shared by its sessions).
    pub mcp: Vec<McpServer>,
    /// Tools a Rust program gives it ([`RustTools::add`]).
    pub rust_tools: RustTools,
    /// Worked examples that teach the embedded LLM when to call the bot's own tools (larger
    /// models need none).
    pub tool_examples: Vec<ToolExample>,
    /// Whether the user may interrupt the bot.
    pub allow_interruptions: bool,
    /// The pipeline's output sample rate.
    pub audio_out_sample_rate: u32,
    /// Cancel the bot's own echo in the input (AEC3, with what was played as the reference): for
    /// a microphone next to a speaker with no echo canceller before voxide (browsers cancel
    /// their own).
    pub echo_canceller: bool,
    /// Silence input no louder than the bot's echo: the cheap alternative to the canceller.
    pub echo_guard: Option<EchoGuardParams>,
    /// Noise suppression on the user's audio, before the VAD and the STT.
    pub denoise: Denoise,
    /// When the user is not heard (none: always heard).
    pub mute: Vec<MuteStrategy>,
    /// When speech over the bot interrupts it (default: at once, at the VAD's start).
    pub barge_in: BargeIn,
    /// What the LLM's tokens cost, for the usage reports.
    pub prices: PriceTable,
    /// Who listens (with a text LLM): the first engine, each of the others the fallback of the
    /// one before (`--stt deepgram,whisper`).
    pub stt: Vec<SttChoice>,
    /// Words the embedded Whisper reads before each utterance, as said just before it: names
    /// and terms it should expect and spell their way (OpenAI's `prompt`). None: the bot's tool
    /// requests ([`BotOptions::expected_words`]); empty: nothing.
    pub stt_prompt: Option<String>,
    /// Who speaks (with a text LLM), likewise (`--tts cartesia,piper`).
    pub tts: Vec<TtsChoice>,
    /// The nodes the conversation follows, each with its own instructions and tools.
    pub flow: Option<Arc<Flow>>,
}

impl Default for BotOptions {
    fn default() -> Self {
        Self {
            name: None,
            llm: LlmChoice::default(),
            vad: VadParams::default(),
            turn_end: TurnEnd::SmartTurn,
            turn_timeout: Duration::from_secs(2),
            turn_words: true,
            preemptive: true,
            voice: Voice::Piper,
            max_tokens: 60,
            max_context_tokens: DEFAULT_MAX_CONTEXT_TOKENS,
            summarize_context: false,
            function_call_report_level: ReportLevel::default(),
            record: true,
            trace: true,
            instructions: INSTRUCTIONS.to_owned(),
            greeting: None,
            idle: None,
            voicemail: None,
            placed_call: false,
            filler: None,
            transfer: Vec::new(),
            builtin: Builtin::ALL.to_vec(),
            http_tools: Vec::new(),
            mcp: Vec::new(),
            rust_tools: RustTools::default(),
            tool_examples: Vec::new(),
            allow_interruptions: true,
            audio_out_sample_rate: 24_000,
            echo_canceller: false,
            echo_guard: None,
            denoise: Denoise::Off,
            mute: Vec::new(),
            barge_in: BargeIn::default(),
            prices: PriceTable::default(),
            stt: vec![SttChoice::Whisper],
            stt_prompt: None,
            tts: vec![TtsChoice::Embedded],
            flow: None,
        }
    }
}

impl BotOptions {
    /// The bot's speech recogniser: its STT choices in order of preference, each handing the
    /// listening to the next should it fail for good.
    pub fn recogniser(&self) -> Result<Arc<dyn SttEngine>, BotError> {
        let expected = self.expected_words();
        let stt = self
            .stt
            .iter()
            .map(|choice| choice.engine(&expected, &self.builtin))
            .collect::<Result<Vec<_>, _>>()?;
        SttFallback::shared(stt).map_err(BotError::Config)
    }

    /// What the embedded Whisper is told to expect: the `stt_prompt`, or by default the
    /// requests the bot's tools are made for (the built-in tools' own, then the bot's worked
    /// examples that call a tool), so that "cancel the timer" is not heard as "console my
    /// timer". Whole sentences also keep Whisper punctuating, which the turn's words are
    /// judged by.
    pub fn expected_words(&self) -> String {
        if let Some(prompt) = &self.stt_prompt {
            return prompt.clone();
        }
        let mut words = tools::requests(&self.builtin);
        words.extend(
            self.tool_examples
                .iter()
                .filter(|example| example.call.is_some())
                .map(|example| example.user.as_str()),
        );
        words.join(" ")
    }

    /// Registers the bot's tools on `registry`: the built-in ones it keeps, its HTTP tools, and
    /// the tools its MCP servers list.
    pub fn register_tools(&self, registry: &mut FunctionRegistry) {
        tools::register(registry, &self.builtin);
        tools::register_transfer(registry, &self.transfer);
        for tool in &self.http_tools {
            tool.register(registry);
        }
        for server in &self.mcp {
            server.register(registry);
        }
        for register in &self.rust_tools.0 {
            register(registry);
        }
    }

    /// Two tools of one name would shadow each other: an error naming it.
    pub fn check_tool_names(&self) -> Result<(), String> {
        let mut registry = FunctionRegistry::default();
        tools::register(&mut registry, &self.builtin);
        tools::register_transfer(&mut registry, &self.transfer);
        let mut seen: Vec<String> = registry
            .direct_schemas()
            .iter()
            .map(|s| s.name.clone())
            .collect();
        let http = self.http_tools.iter().map(|t| t.name().to_owned());
        let mcp = self.mcp.iter().flat_map(McpServer::tool_names);
        let mut rust = FunctionRegistry::default();
        for register in &self.rust_tools.0 {
            register(&mut rust);
        }
        let rust = rust.direct_schemas().iter().map(|s| s.name.clone());
        for name in http.chain(mcp).chain(rust) {
            if seen.contains(&name) {
                return Err(format!("two tools are named {name:?}"));
            }
            seen.push(name);
        }
        Ok(())
    }

    /// Starts the bot's MCP servers (each once) and lists their tools; an error names a server
    /// that would not start, a tool name two places give, or a tool a flow's node offers that
    /// the bot does not have.
    pub async fn start_tools(&self) -> Result<(), BotError> {
        for server in &self.mcp {
            server.start().await.map_err(BotError::Config)?;
        }
        self.check_tool_names().map_err(BotError::Config)?;
        if let Some(flow) = &self.flow {
            flow.check_tools(&self.tool_names())
                .map_err(BotError::Config)?;
        }
        Ok(())
    }

    /// The names of the bot's tools, as the model would see them (an MCP server's once it has
    /// started).
    pub fn tool_names(&self) -> Vec<String> {
        let mut registry = FunctionRegistry::default();
        self.register_tools(&mut registry);
        registry
            .direct_schemas()
            .iter()
            .map(|s| s.name.clone())
            .collect()
    }

    /// The session parameters the bot runs with.
    fn start_params(&self) -> StartParams {
        StartParams {
            audio_out_sample_rate: self.audio_out_sample_rate,
            allow_interruptions: self.allow_interruptions,
            enable_metrics: true,
            enable_usage_metrics: true,
            ..StartParams::default()
        }
    }
}

/// Why the bot could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BotError {
    /// A model is missing or broken.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// espeak-ng could not start.
    #[error(transparent)]
    Espeak(#[from] EspeakError),
    /// The LLM provider's client could not be set up.
    #[error(transparent)]
    Llm(#[from] crate::services::llm::LlmError),
    /// The options do not go together.
    #[error("{0}")]
    Config(String),
    /// A client asked for a bot this server does not have.
    #[error("no bot named {name:?} here (this server has: {known})")]
    UnknownBot {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: String,
    },
}

/// Who a session is for: its id and what its client sent when it started (pipecat's
/// `requestData`, or `/start`'s `body`). Every tool call can read it from the session's
/// resources (`params.app_resources.get::<SessionInfo>()`); HTTP tools send it in the request
/// body and MCP tools in the call's `_meta`, so a backend can look the caller up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionInfo {
    /// The session's id.
    pub id: String,
    /// What the client sent (null when nothing).
    pub request_data: serde_json::Value,
    /// A call the bot placed (`POST /calls`), not one it took.
    pub placed: bool,
}

impl SessionInfo {
    /// The bot the client asked for: `{"bot": "name"}`.
    pub fn bot(&self) -> Option<&str> {
        self.request_data.get("bot").and_then(|b| b.as_str())
    }

    /// Whether the caller lets the session be recorded: `{"record": false}` refuses.
    pub fn consents_to_recording(&self) -> bool {
        self.request_data.get("record") != Some(&serde_json::Value::Bool(false))
    }
}

/// A bot ready to run in a session.
pub struct Bot {
    /// Its stages, from the VAD to the assistant aggregator.
    pub pipeline: Pipeline,
    /// Its conversation.
    pub context: ContextHandle,
    /// The session parameters it expects.
    pub params: StartParams,
    /// What its tools get: the [`SessionInfo`].
    pub resources: AppResources,
    /// What its clients are told of a function call.
    pub report_level: ReportLevel,
}

impl Bot {
    /// The bot for the session `session`: its tools see who it is for.
    pub fn for_session(mut self, session: SessionInfo) -> Self {
        self.resources = self.resources.with(session);
        self
    }
}

/// Loads every embedded engine the bot uses (once per process), so the first session does not
/// pay for it. The engines load side by side, each on a thread of its own: they share nothing
/// but the disk, and most of a start is their CPU (the LLM's weights re-quantized and its tool
/// prompt prefilled, Whisper's weights widened to f32).
pub fn preload(options: &BotOptions) -> Result<(), BotError> {
    if !matches!(options.llm, LlmChoice::Text(_)) {
        // A realtime provider does the listening, thinking and speaking.
        return Ok(());
    }
    type Load = Box<dyn FnOnce() -> Result<(), BotError> + Send>;
    let mut loads: Vec<(&str, Load)> = vec![(
        "vad",
        Box::new(|| VadBatcher::shared().map(drop).map_err(Into::into)),
    )];
    if options.stt.contains(&SttChoice::Whisper) {
        loads.push((
            "whisper",
            Box::new(|| Whisper::shared().map(drop).map_err(Into::into)),
        ));
    }
    if options.llm.uses_local() {
        loads.push((
            "local llm",
            Box::new(|| {
                let model = LocalModel::shared()?;
                // Prefill the tool-decision prompt, shared by every session from then on.
                let _ = model.prepare_tools(&tools::tool_set());
                Ok(())
            }),
        ));
    }
    if options.turn_end == TurnEnd::SmartTurn {
        loads.push((
            "smart turn",
            Box::new(|| SmartTurn::shared().map(drop).map_err(Into::into)),
        ));
    }
    if options.tts.contains(&TtsChoice::Embedded) {
        let voice = options.voice;
        loads.push((
            "voice",
            Box::new(move || {
                match voice {
                    Voice::Piper => drop(PiperVoice::shared()?),
                    Voice::Espeak => drop(EspeakVoice::new("en-us")?),
                }
                Ok(())
            }),
        ));
    }
    std::thread::scope(|scope| {
        let started = std::time::Instant::now();
        let loading: Vec<_> = loads
            .into_iter()
            .map(|(engine, load)| {
                scope.spawn(move || {
                    let result = load();
                    tracing::debug!(engine, ms = started.elapsed().as_millis(), "loaded");
                    result
                })
            })
            .collect();
        // Every load runs to its end; the first failure is the answer.
        loading
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
            .fold(Ok(()), Result::and)
    })
}

/// The default bot on the embedded engines, playing into `sink`: VAD, turns, STT, the user
/// aggregator, the LLM with the built-in tools, TTS, the output, the assistant aggregator.
pub fn build<S: AudioSink>(
    options: &BotOptions,
    sink: S,
    output: OutputOptions,
) -> Result<Bot, BotError> {
    let mut initial = LlmContext::new(vec![Message::system(options.instructions.clone())]);
    initial.tools = crate::context::ToolsSchema::default();
    let context = ContextHandle::new(initial);
    let text_llms = match &options.llm {
        LlmChoice::Text(list) => list,
        LlmChoice::OpenAiRealtime(settings) => {
            let protocol = OpenAiRealtime::new(settings.clone());
            return Ok(realtime(options, protocol, context, sink, output));
        }
        LlmChoice::GeminiLive(settings) => {
            let protocol = GeminiLive::new(settings.clone());
            return Ok(realtime(options, protocol, context, sink, output));
        }
    };
    let stop = match options.turn_end {
        TurnEnd::SmartTurn => TurnStop::SmartTurn {
            model: SmartTurn::shared()?,
            incomplete_timeout: options.turn_timeout,
            words: options.turn_words,
        },
        TurnEnd::Silence => TurnStop::SpeechTimeout(options.turn_timeout),
    };
    let mut llm = text_llm(options, text_llms)?;
    let flow = match &options.flow {
        None => None,
        Some(flow) => {
            let summaries = match flow.summarizes() {
                true => Some(Arc::from(text_llms[0].engine(SUMMARY_MAX_TOKENS, &[])?)),
                false => None,
            };
            let session = FlowSession::new(
                flow.clone(),
                &options.instructions,
                FlowOptions {
                    summaries,
                    realtime: false,
                },
            );
            session.register(llm.functions());
            *context.lock() = session.initial_context();
            Some(session)
        }
    };
    let voice = voice(options)?;
    let output = OutputOptions {
        speech_end_offset: Duration::from_secs_f32(options.vad.stop_secs),
        ..output
    };
    let stt = options.recogniser()?;
    let (front, sink) = input_front(options, sink);
    // A summarizer keeps the conversation near its budget; turns are dropped only far past it.
    let hard_cap = match options.summarize_context {
        true => options.max_context_tokens.saturating_mul(2),
        false => options.max_context_tokens,
    };
    let mut pipeline = front
        .then(
            VadStage::new(VadBatcher::shared()?, options.vad).voiceprint(SpeakerEncoder::shared()?),
        )
        .then(
            SttService::new(stt, "user")
                .with_speech_end_offset(Duration::from_secs_f32(options.vad.stop_secs)),
        );
    let answerer = match (&options.voicemail, options.placed_call) {
        (Some(voicemail), true) => {
            let stage =
                answered_by::AnswererDetection::new(options.greeting.clone(), voicemail.clone());
            Some(match voicemail.ask_llm {
                true => stage.with_judge(Arc::from(
                    text_llms[0].engine(answered_by::JUDGE_MAX_TOKENS, &[])?,
                )),
                false => stage,
            })
        }
        _ => None,
    };
    let greets_at_start = answerer.is_none();
    if let Some(stage) = answerer {
        pipeline = pipeline.then(stage);
    }
    let mut pipeline = pipeline
        .then(UserTurns::with_barge_in(stop, options.barge_in).preemptive(options.preemptive))
        .then(UserAggregator::new(context.clone()).with_max_tokens(hard_cap));
    if options.summarize_context {
        // Summaries are longer than answers.
        let engine = text_llms[0].engine(SUMMARY_MAX_TOKENS, &[])?;
        pipeline = pipeline.then(ContextSummarizer::new(
            Arc::from(engine),
            context.clone(),
            options.max_context_tokens,
        ));
    }
    pipeline = pipeline.then(llm);
    // Only a bot that greets has the stage: every frame crosses each one. On a call it placed
    // with `[voicemail]`, the greeting waits for a person to answer.
    if let Some(greeting) = &options.greeting
        && greets_at_start
    {
        pipeline = pipeline.then(Greeting(Some(greeting.clone())));
    }
    if let Some(flow) = &flow {
        pipeline = pipeline.then(flow.stage(context.clone()));
    }
    if let Some(filler) = &options.filler {
        pipeline = pipeline.then(ToolFiller::new(filler.clone()));
    }
    if let Some(idle) = &options.idle {
        pipeline = pipeline.then(UserIdle::new(idle.clone()));
    }
    if let Some(stage) = phone_tools(options) {
        pipeline = pipeline.then(stage);
    }
    let pipeline = pipeline
        .then(TtsService::new(voice))
        .then(AudioOutput::new(sink, output))
        .then(AssistantAggregator::new(context.clone()));
    Ok(Bot {
        pipeline,
        context,
        params: options.start_params(),
        resources: AppResources::default(),
        report_level: options.function_call_report_level,
    })
}

/// The text LLM service: the first engine, each of the others the fallback of the one before,
/// with the bot's tools.
fn text_llm(options: &BotOptions, llms: &[TextLlm]) -> Result<LlmService, BotError> {
    let mut engines = llms
        .iter()
        .map(|llm| llm.engine(options.max_tokens, &options.tool_examples))
        .collect::<Result<Vec<_>, _>>()?;
    let service_options = LlmServiceOptions {
        prices: options.prices.clone(),
        ..LlmServiceOptions::default()
    };
    let mut llm = match engines.len() {
        1 => LlmService::with_options(engines.remove(0), service_options),
        _ => LlmService::with_options(FallbackLlm::new(engines)?, service_options),
    };
    options.register_tools(llm.functions());
    Ok(llm)
}

/// The voices, each the fallback of the one before.
fn voice(options: &BotOptions) -> Result<Arc<dyn TtsEngine>, BotError> {
    let voices = options
        .tts
        .iter()
        .map(|tts| -> Result<Arc<dyn TtsEngine>, BotError> {
            Ok(match tts {
                TtsChoice::Embedded => match options.voice {
                    Voice::Piper => Sentences::shared(PiperVoice::shared()?),
                    Voice::Espeak => Sentences::shared(Arc::new(EspeakVoice::new("en-us")?)),
                },
                TtsChoice::Cartesia(settings) => Arc::new(CartesiaTts::new(settings.clone())),
                TtsChoice::Deepgram(settings) => Arc::new(AuraTts::new(settings.clone())),
                TtsChoice::ElevenLabs(settings) => Arc::new(ElevenLabsTts::new(settings.clone())),
                TtsChoice::OpenAi(settings) => {
                    Arc::new(OpenAiSpeech::new(settings.clone()).map_err(BotError::Config)?)
                }
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    TtsFallback::shared(voices).map_err(BotError::Config)
}

/// The bot on a realtime provider: the service, the output, the assistant aggregator. The
/// provider's own turn detection drives turns and barge-in.
fn realtime<P: RealtimeProtocol, S: AudioSink>(
    options: &BotOptions,
    protocol: P,
    context: ContextHandle,
    sink: S,
    output: OutputOptions,
) -> Bot {
    let realtime_options = RealtimeOptions {
        functions: LlmServiceOptions {
            prices: options.prices.clone(),
            ..LlmServiceOptions::default()
        },
        ..RealtimeOptions::default()
    };
    let mut service = RealtimeService::new(protocol, context.clone(), realtime_options);
    options.register_tools(service.functions());
    let flow = options.flow.as_ref().map(|flow| {
        let realtime = FlowOptions {
            realtime: true,
            ..FlowOptions::default()
        };
        let session = FlowSession::new(flow.clone(), &options.instructions, realtime);
        session.register(service.functions());
        *context.lock() = session.initial_context();
        session
    });
    let (front, sink) = input_front(options, sink);
    let mut pipeline = front.then(service);
    if let Some(flow) = &flow {
        pipeline = pipeline.then(flow.stage(context.clone()));
    }
    if let Some(stage) = phone_tools(options) {
        pipeline = pipeline.then(stage);
    }
    let pipeline = pipeline
        .then(AudioOutput::new(sink, output))
        .then(AssistantAggregator::new(context.clone()));
    Bot {
        pipeline,
        context,
        params: options.start_params(),
        resources: AppResources::default(),
        report_level: options.function_call_report_level,
    }
}

/// The stage that carries out the phone tools, when the bot has any.
fn phone_tools(options: &BotOptions) -> Option<call_control::CallControl> {
    let any = options
        .builtin
        .iter()
        .any(|b| matches!(b, Builtin::EndCall | Builtin::SendDtmf))
        || !options.transfer.is_empty();
    any.then(|| call_control::CallControl::new(options.transfer.clone()))
}

/// Says the bot's greeting as the session starts, as a response of its own: the TTS speaks it
/// and the assistant aggregator writes it into the conversation.
struct Greeting(Option<String>);

impl FrameProcessor for Greeting {
    fn name(&self) -> &str {
        "Greeting"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let starting = matches!(frame.body, FrameBody::System(SystemFrame::Start(_)));
        cx.push(frame, direction);
        if starting && let Some(greeting) = self.0.take() {
            for frame in Frame::response(greeting) {
                cx.push(frame, Direction::Downstream);
            }
        }
        Ok(())
    }
}

/// The pipeline's start: the echo canceller, the mute filter, the echo guard and the denoiser
/// where the options ask for them, and the sink tapped for their reference.
fn input_front<S: AudioSink>(options: &BotOptions, sink: S) -> (Pipeline, EchoTap<S>) {
    let reference = EchoReference::new();
    let mut front = Pipeline::new();
    // First, so it sees every input frame in step with what was played.
    if options.echo_canceller {
        front = front.then(EchoCanceller::new(reference.clone()));
    }
    if !options.mute.is_empty() {
        front = front.then(UserMute::new(options.mute.iter().copied()));
    }
    if let Some(params) = options.echo_guard {
        front = front.then(EchoGuard::new(reference.clone(), params));
    }
    // After the echo's handling (both compare the input with what played), before the VAD.
    if options.denoise == Denoise::Rnnoise {
        front = front.then(Denoiser::new());
    }
    let tapped = if options.echo_canceller || options.echo_guard.is_some() {
        reference.tap(sink)
    } else {
        EchoTap::untapped(sink)
    };
    (front, tapped)
}
