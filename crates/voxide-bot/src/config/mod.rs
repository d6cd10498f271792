//! The configuration file and bot files (TOML), and how their layers make one bot.
//!
//! A bot's settings come in layers, highest first: command-line flags, environment variables
//! (`VOXIDE_*`), the bot file (`--bot FILE`, or each file of `--bots DIR`), the config file's
//! `[bot]` table, built-in defaults. Each layer is a [`BotConfig`]; [`BotConfig::over`] stacks
//! one on another and [`BotConfig::resolve`] turns the result into the bot's options, checked.
//!
//! The config file:
//!
//! ```toml
//! [server]
//! host = "127.0.0.1"
//! port = 7860
//! max_sessions = 32
//! drain_timeout_secs = 60  # live sessions' time to end once the node drains
//! node_id = "n1"           # prefixes every id the node mints (default: the host name)
//! peers = "n2=http://10.0.0.12:7860,n3=http://10.0.0.13:7860"
//! peer_url = "http://{node}.voxide-nodes:7860"   # a node not in peers
//! agent_port = 7870        # HAProxy's agent check
//!
//! [bot]
//! voice = "piper"          # or "espeak"
//! turn = "smart"           # or "silence"
//! turn_timeout_secs = 2.0
//! turn_words = true        # weigh the turn's words with Smart Turn's verdict (English)
//! preemptive = true        # start the answer at a pause, before the turn has ended
//! max_tokens = 60
//! interrupt_min_words = 0  # words over the bot before it stops
//! resume_after_secs = 1.0  # pause on speech over the bot; resume if no words come
//! pause_at_onset = true    # hold the bot at the first sound of speech over it
//! backchannels = false     # "yeah", "mm hmm" over the bot are no words towards stopping it
//! denoise = "off"          # or "rnnoise": noise suppression before the VAD and the STT
//! instructions = "You are a helpful voice assistant."
//! llm = "openai,local"     # see --llm
//! llm_model = "gpt-4.1-mini"
//! llm_temperature = 0.6
//! stt = "whisper"          # see --stt: "deepgram,whisper" falls back to Whisper
//! stt_prompt = "Voxide, Piper, Smart Turn."   # words Whisper expects (default: tool requests)
//! tts = "piper"            # see --tts: "cartesia,piper" falls back to Piper
//!
//! # Your own rates (USD per million tokens) over the built-in list prices.
//! [bot.prices."gpt-4.1-mini"]
//! input = 0.40
//! output = 1.60
//! cache_read = 0.10        # default: the input rate
//! cache_write = 0.40       # default: the input rate
//! ```

pub mod flow;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use flow::{FlowConfig, NodeConfig};

/// Which embedded voice speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Voice {
    /// Piper (VITS): natural, RTF about 0.05 here.
    #[default]
    Piper,
    /// espeak-ng's formant voice: robotic, nearly free.
    Espeak,
}

/// Which noise suppression runs on the user's audio, before the VAD and the STT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Denoise {
    /// None: the audio as it came.
    #[default]
    Off,
    /// RNNoise (`nnnoiseless`): steady noise and much of a café's babble taken out.
    Rnnoise,
}

/// How a turn ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum TurnEnd {
    /// The Smart Turn model decides at each pause.
    #[default]
    #[serde(rename = "smart")]
    #[cfg_attr(feature = "clap", value(name = "smart"))]
    SmartTurn,
    /// A fixed silence ends the turn.
    #[serde(rename = "silence")]
    Silence,
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[server]`.
    #[serde(default)]
    pub server: ServerConfig,
    /// `[bot]`.
    #[serde(default)]
    pub bot: BotConfig,
}

/// One model's rates, USD per million tokens.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// Fresh prompt tokens.
    pub input: f64,
    /// Generated tokens.
    pub output: f64,
    /// Prompt tokens read from the provider's cache (default: the input rate).
    pub cache_read: Option<f64>,
    /// Prompt tokens written to the provider's cache (default: the input rate).
    pub cache_write: Option<f64>,
}

impl PriceConfig {
    /// As the price table takes it.
    pub fn price(&self) -> crate::services::llm::Price {
        crate::services::llm::Price::cached(
            self.input,
            self.output,
            self.cache_read.unwrap_or(self.input),
            self.cache_write.unwrap_or(self.input),
        )
    }
}

/// `[server]`: how `voxide serve` listens.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to bind.
    pub host: Option<String>,
    /// Port.
    pub port: Option<u16>,
    /// Live sessions at most.
    pub max_sessions: Option<usize>,
    /// Seconds live sessions get to end once the node drains.
    #[serde(alias = "shutdown_grace_secs")]
    pub drain_timeout_secs: Option<f64>,
    /// This node's name.
    pub node_id: Option<String>,
    /// The other nodes: `NODE=URL,...`.
    pub peers: Option<String>,
    /// The URL of a node not in `peers`, with `{node}` in it.
    pub peer_url: Option<String>,
    /// Port of HAProxy's agent check.
    pub agent_port: Option<u16>,
}

/// One layer of a bot's settings: the config file's `[bot]` table, a bot file (the same keys at
/// its top level), or the flags. Every key is optional; a layer names what it changes.
///
/// `[idle]` in a bot file: what the bot does when the user goes quiet.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleConfig {
    /// Quiet, after the bot or the user last spoke, before the bot speaks up.
    pub after_secs: f64,
    /// What it says each time, in turn.
    #[serde(default)]
    pub check_ins: Vec<String>,
    /// What it says once the check-ins are spent, before it ends the session.
    pub goodbye: Option<String>,
}

/// `[voicemail]` in a bot file: for calls the bot places, who answered is told first, and an
/// answering machine gets `message` once it records (after its beep); without a message the
/// bot hangs up on one.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoicemailConfig {
    /// What the bot leaves on an answering machine.
    pub message: Option<String>,
    /// Where only the timing spoke (a long greeting, many words, nothing sure), the bot's LLM
    /// reads what the callee said and has the last word.
    #[serde(default)]
    pub ask_llm: bool,
}

/// A bot file:
///
/// ```toml
/// name = "concierge"
/// instructions_file = "concierge.md"   # or instructions = "..."
/// greeting = "Hello, this is the front desk. How can I help?"
/// llm = "openai,local"
/// builtin = ["clock"]                  # built-in tools: clock, calculator, timer, end-call, send-dtmf
/// function_call_report_level = "name" # what clients see of a tool call: disabled, none, name, full
/// record = false                       # never recorded (--record-dir); trace = false: never traced
/// max_context_tokens = 24000           # the oldest turns leave past this
/// summarize_context = true             # ... folded into a summary the LLM writes, in the background
///
/// [filler]                             # a tool slower than this: a line, or a thinking sound
/// after_secs = 1.5
/// lines = ["One moment.", "Let me check that."]
/// speak_progress = true                # an async tool's progress ("message") is said
///
/// [voicemail]                          # calls it places: a person, a menu or a machine?
/// message = "Hi, it's the bakery: your cake is ready." # left after a machine's beep
/// ask_llm = true                       # where only the timing spoke, the LLM reads the greeting
///
/// [idle]                               # when the user goes quiet after the bot has spoken
/// after_secs = 10
/// check_ins = ["Are you still there?"] # said in turn; the user speaking starts them over
/// goodbye = "I'll let you go. Goodbye!" # then the session ends
///
/// [[tool]]
/// name = "lookup_order"
/// description = "Looks up an order by its number."
/// parameters = { type = "object", properties = { order = { type = "string" } }, required = ["order"] }
/// url = "https://crm.example.com/orders/lookup"
/// headers = { Authorization = "Bearer ${CRM_TOKEN}" }
/// timeout_secs = 5
///
/// [[mcp]]
/// name = "everything"
/// command = "npx"
/// args = ["-y", "@modelcontextprotocol/server-everything"]
/// async_tools = ["trigger-long-running-operation"]
///
/// [[example]]                          # teaches the embedded model; larger ones need none
/// user = "Where is my order 1234?"
/// call = "lookup_order"
/// arguments = { order = "1234" }
/// ```
///
/// A bot with a script gives it as `[[node]]`s (see [`flow`]) or as `flow_file`, a Pipecat
/// Flows JSON file; `--bot flow.json` is such a bot on its own.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotConfig {
    /// The bot's name, which clients ask for (`{"bot": "concierge"}`); a bot file's default is
    /// its file name without `.toml`.
    pub name: Option<String>,
    /// The system instruction.
    pub instructions: Option<String>,
    /// A file holding the system instruction (relative to the file that names it).
    pub instructions_file: Option<PathBuf>,
    /// What the bot says first, as the session starts (spoken by the TTS; a text LLM only).
    pub greeting: Option<String>,
    /// What the bot does when the user goes quiet: `[idle]`.
    pub idle: Option<IdleConfig>,
    /// Who answered a call the bot placed, and its message for a machine: `[voicemail]`.
    pub voicemail: Option<VoicemailConfig>,
    /// What fills the silence while a tool works: `[filler]`.
    pub filler: Option<FillerConfig>,
    /// Where `transfer_call` may hand a phone call: `[transfer]`, a name for the model, then a
    /// number or a `sip:` URI.
    pub transfer: Option<BTreeMap<String, String>>,
    /// `piper` or `espeak`.
    pub voice: Option<Voice>,
    /// `smart` or `silence`.
    pub turn: Option<TurnEnd>,
    /// See `--turn-timeout-secs`.
    pub turn_timeout_secs: Option<f64>,
    /// See `--turn-words`.
    pub turn_words: Option<bool>,
    /// See `--preemptive`.
    pub preemptive: Option<bool>,
    /// Tokens one reply may have at most.
    pub max_tokens: Option<usize>,
    /// Tokens the conversation may hold (estimated, four characters a token) before its oldest
    /// turns are dropped; the instruction stays, and a tool call leaves with its results.
    pub max_context_tokens: Option<usize>,
    /// `true`: past `max_context_tokens`, the oldest turns are folded into a summary the LLM
    /// writes in the background (they are dropped only past twice the budget, or should the
    /// summary fail), rather than dropped.
    pub summarize_context: Option<bool>,
    /// What clients are told of a function call: `disabled`, `none` (its id), `name` (the
    /// default) or `full` (its arguments and result too).
    pub function_call_report_level: Option<crate::events::ReportLevel>,
    /// `false`: this bot's sessions are never recorded, whatever `--record-dir` says (a bot
    /// that takes card numbers, say).
    pub record: Option<bool>,
    /// `false`: this bot's sessions are never traced, whatever `--otlp-endpoint` says.
    pub trace: Option<bool>,
    /// See `--interrupt-min-words`.
    pub interrupt_min_words: Option<usize>,
    /// See `--resume-after-secs`.
    pub resume_after_secs: Option<f64>,
    /// See `--pause-at-onset`.
    pub pause_at_onset: Option<bool>,
    /// See `--backchannels`.
    pub backchannels: Option<bool>,
    /// See `--denoise`.
    pub denoise: Option<Denoise>,
    /// See `--llm`: `local`, `openai`, `anthropic`, `gemini`, a comma-separated fallback list of
    /// those, `openai-realtime` or `gemini-live`.
    pub llm: Option<String>,
    /// See `--llm-model`.
    pub llm_model: Option<String>,
    /// See `--llm-temperature`.
    pub llm_temperature: Option<f32>,
    /// See `--stt`.
    pub stt: Option<String>,
    /// See `--stt-model`.
    pub stt_model: Option<String>,
    /// See `--stt-prompt`.
    pub stt_prompt: Option<String>,
    /// See `--tts`.
    pub tts: Option<String>,
    /// See `--tts-model`.
    pub tts_model: Option<String>,
    /// See `--tts-voice`.
    pub tts_voice: Option<String>,
    /// Prices per model, over the built-in list prices: `[bot.prices."MODEL"]`.
    #[serde(default)]
    pub prices: BTreeMap<String, PriceConfig>,
    /// The realtime provider's WebSocket URL (the environment's `OPENAI_REALTIME_URL` /
    /// `GEMINI_LIVE_URL` wins).
    pub realtime_url: Option<String>,
    /// The realtime provider's model.
    pub realtime_model: Option<String>,
    /// The built-in tools the bot keeps (default: all of them).
    pub builtin: Option<Vec<Builtin>>,
    /// The bot's own HTTP tools: `[[tool]]`.
    #[serde(default, rename = "tool")]
    pub tools: Vec<HttpToolConfig>,
    /// MCP servers whose tools the bot gets: `[[mcp]]`.
    #[serde(default)]
    pub mcp: Vec<McpConfig>,
    /// Worked examples that teach the embedded LLM when to call the bot's own tools:
    /// `[[example]]` (larger models need none).
    #[serde(default, rename = "example")]
    pub examples: Vec<ExampleConfig>,
    /// A flow's first node (default: the first `[[node]]`).
    pub initial_node: Option<String>,
    /// How the conversation changes on entering a node, unless the node says: `append`
    /// (default) or `reset`.
    pub context_strategy: Option<flow::StrategyConfig>,
    /// Functions offered at every node of the flow.
    #[serde(default)]
    pub global_functions: Vec<flow::FunctionConfig>,
    /// The flow's nodes: `[[node]]`.
    #[serde(default, rename = "node")]
    pub nodes: Vec<NodeConfig>,
    /// A Pipecat Flows JSON file (relative to the bot file) whose nodes the bot follows.
    pub flow_file: Option<PathBuf>,
}

/// `[filler]`: when a tool keeps the caller waiting, the bot says a line or plays a short
/// thinking sound, once per wait.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FillerConfig {
    /// Seconds a tool may take before the bot fills the silence (default 1.5).
    pub after_secs: Option<f64>,
    /// Said in turn, one per wait; none: a thinking sound.
    #[serde(default)]
    pub lines: Vec<String>,
    /// `true`: an async tool's progress is spoken as it comes (an intermediate result that is
    /// text, or carries text under `"message"`).
    pub speak_progress: Option<bool>,
}

/// `[[example]]`: what a user says, and the tool call it should make (none: answered in words).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExampleConfig {
    /// What the user says.
    pub user: String,
    /// The tool it calls.
    pub call: Option<String>,
    /// The call's arguments (default: none).
    pub arguments: Option<serde_json::Value>,
}

/// A built-in tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Builtin {
    /// `get_current_time`.
    Clock,
    /// `calculate`.
    Calculator,
    /// `set_timer` (an async tool).
    Timer,
    /// `end_call`: the bot hangs up after its goodbye. Never on by default.
    EndCall,
    /// `send_dtmf`: the bot presses keys, to steer a phone menu. Never on by default.
    SendDtmf,
}

impl Builtin {
    /// The default: every tool that only answers.
    pub const ALL: [Builtin; 3] = [Builtin::Clock, Builtin::Calculator, Builtin::Timer];
    /// Every built-in tool there is.
    pub const EVERY: [Builtin; 5] = [
        Builtin::Clock,
        Builtin::Calculator,
        Builtin::Timer,
        Builtin::EndCall,
        Builtin::SendDtmf,
    ];
}

/// `[[tool]]`: a tool served over HTTP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema; default: no arguments).
    pub parameters: Option<serde_json::Value>,
    /// Where the call goes.
    pub url: String,
    /// `POST` (default), `PUT`, `PATCH`, `GET` or `DELETE`.
    pub method: Option<String>,
    /// Headers every request carries; `${NAME}` in a value is the environment variable `NAME`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Seconds the whole call may take (default 10; an async tool's default is 300).
    pub timeout_secs: Option<f64>,
    /// True (default): an interruption cancels the call. False: an async tool; the conversation
    /// goes on and its results arrive later.
    pub cancel_on_interruption: Option<bool>,
}

/// `[[mcp]]`: a Model Context Protocol server, over stdio (`command`) or streamable HTTP (`url`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// The server's name, in logs and errors.
    pub name: String,
    /// Stdio: the program to run.
    pub command: Option<String>,
    /// Stdio: its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Stdio: environment variables it gets, over voxide's own; `${NAME}` as in headers.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Streamable HTTP: the server's URL.
    pub url: Option<String>,
    /// Streamable HTTP: headers every request carries; `${NAME}` as in HTTP tools.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The tools to keep (default: every tool the server lists).
    pub tools: Option<Vec<String>>,
    /// Tools that run as async tools: the conversation goes on, progress notifications become
    /// intermediate results.
    #[serde(default)]
    pub async_tools: Vec<String>,
    /// Seconds one call may take (default 30; an async tool's default is 600).
    pub timeout_secs: Option<f64>,
}

impl BotConfig {
    /// This layer over `lower`: each key this layer names wins. An instruction (text or file)
    /// replaces the lower one whole; tool and server lists replace the lower ones when this
    /// layer has any; prices merge, model by model.
    pub fn over(self, lower: BotConfig) -> BotConfig {
        // A flow is one piece: the layer that has one gives all of it.
        let flow_here = !self.nodes.is_empty() || self.flow_file.is_some();
        let (initial_node, context_strategy, global_functions, nodes, flow_file) = if flow_here {
            let flow = (
                self.initial_node,
                self.context_strategy,
                self.global_functions,
            );
            (flow.0, flow.1, flow.2, self.nodes, self.flow_file)
        } else {
            let flow = (
                lower.initial_node,
                lower.context_strategy,
                lower.global_functions,
            );
            (flow.0, flow.1, flow.2, lower.nodes, lower.flow_file)
        };
        let instructions_here = self.instructions.is_some() || self.instructions_file.is_some();
        let (instructions, instructions_file) = if instructions_here {
            (self.instructions, self.instructions_file)
        } else {
            (lower.instructions, lower.instructions_file)
        };
        let mut prices = lower.prices;
        prices.extend(self.prices);
        BotConfig {
            name: self.name.or(lower.name),
            instructions,
            instructions_file,
            greeting: self.greeting.or(lower.greeting),
            idle: self.idle.or(lower.idle),
            voicemail: self.voicemail.or(lower.voicemail),
            filler: self.filler.or(lower.filler),
            transfer: self.transfer.or(lower.transfer),
            voice: self.voice.or(lower.voice),
            turn: self.turn.or(lower.turn),
            turn_timeout_secs: self.turn_timeout_secs.or(lower.turn_timeout_secs),
            turn_words: self.turn_words.or(lower.turn_words),
            preemptive: self.preemptive.or(lower.preemptive),
            max_tokens: self.max_tokens.or(lower.max_tokens),
            max_context_tokens: self.max_context_tokens.or(lower.max_context_tokens),
            summarize_context: self.summarize_context.or(lower.summarize_context),
            function_call_report_level: self
                .function_call_report_level
                .or(lower.function_call_report_level),
            record: self.record.or(lower.record),
            trace: self.trace.or(lower.trace),
            interrupt_min_words: self.interrupt_min_words.or(lower.interrupt_min_words),
            resume_after_secs: self.resume_after_secs.or(lower.resume_after_secs),
            pause_at_onset: self.pause_at_onset.or(lower.pause_at_onset),
            backchannels: self.backchannels.or(lower.backchannels),
            denoise: self.denoise.or(lower.denoise),
            llm: self.llm.or(lower.llm),
            llm_model: self.llm_model.or(lower.llm_model),
            llm_temperature: self.llm_temperature.or(lower.llm_temperature),
            stt: self.stt.or(lower.stt),
            stt_model: self.stt_model.or(lower.stt_model),
            stt_prompt: self.stt_prompt.or(lower.stt_prompt),
            tts: self.tts.or(lower.tts),
            tts_model: self.tts_model.or(lower.tts_model),
            tts_voice: self.tts_voice.or(lower.tts_voice),
            prices,
            realtime_url: self.realtime_url.or(lower.realtime_url),
            realtime_model: self.realtime_model.or(lower.realtime_model),
            builtin: self.builtin.or(lower.builtin),
            tools: if self.tools.is_empty() {
                lower.tools
            } else {
                self.tools
            },
            mcp: if self.mcp.is_empty() {
                lower.mcp
            } else {
                self.mcp
            },
            examples: if self.examples.is_empty() {
                lower.examples
            } else {
                self.examples
            },
            initial_node,
            context_strategy,
            global_functions,
            nodes,
            flow_file,
        }
    }

    /// Reads a bot file: its keys at the top level, its name its file name unless it says one,
    /// its instruction file relative to it.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut bot: BotConfig = if path.extension().is_some_and(|e| e == "json") {
            BotConfig {
                flow_file: Some(path.to_owned()),
                ..BotConfig::default()
            }
        } else {
            read_toml(path)?
        };
        if bot.name.is_none() {
            bot.name = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
        }
        if let (Some(file), Some(dir)) = (&bot.instructions_file, path.parent()) {
            bot.instructions_file = Some(dir.join(file));
        }
        if let Some(file) = bot.flow_file.take() {
            let file = path.parent().map_or(file.clone(), |dir| dir.join(&file));
            bot.read_flow_file(&file)?;
        }
        Ok(bot)
    }

    /// Reads the Pipecat Flows JSON at `path` into this bot's flow.
    fn read_flow_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        if !self.nodes.is_empty() {
            return Err(invalid(
                "a bot has [[node]]s or a flow_file, not both".into(),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let flow = flow::from_pipecat_json(&json).map_err(invalid)?;
        self.initial_node = self.initial_node.take().or(flow.initial_node);
        self.global_functions.extend(flow.global_functions);
        self.nodes = flow.nodes;
        self.flow_file = Some(path.to_owned());
        Ok(())
    }

    /// Every `*.toml` bot file in `dir`, in name order; two bots of one name are an error.
    pub fn load_dir(dir: &Path) -> Result<Vec<Self>, ConfigError> {
        let entries = std::fs::read_dir(dir).map_err(|source| ConfigError::Read {
            path: dir.to_owned(),
            source,
        })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(ConfigError::Value(format!(
                "{} holds no bot files (*.toml)",
                dir.display()
            )));
        }
        let mut bots: Vec<BotConfig> = Vec::new();
        for path in paths {
            let bot = Self::load(&path)?;
            if let Some(twin) = bots.iter().find(|b| b.name == bot.name) {
                return Err(ConfigError::Value(format!(
                    "two bots in {} are named {:?}",
                    dir.display(),
                    twin.name.as_deref().unwrap_or_default()
                )));
            }
            bots.push(bot);
        }
        Ok(bots)
    }
}

/// Why the file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// It could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not valid TOML or has unknown keys.
    #[error("{path} is invalid: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line.
        message: String,
    },
    /// A setting has a value that cannot be used, or settings do not go together.
    #[error("{0}")]
    Value(String),
}

impl Config {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        read_toml(path)
    }
}

fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Invalid {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// `value` with each `${NAME}` replaced by the environment variable `NAME`; `what` names the
/// setting in the error when one is not set.
pub fn expand_env(value: &str, what: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("{what}: an unclosed ${{ in {value:?}"));
        };
        let name = &after[..end];
        match std::env::var(name) {
            Ok(v) => out.push_str(&v),
            Err(_) => {
                return Err(format!(
                    "{what} names the environment variable {name}, which is not set"
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_and_typos_are_errors() {
        let example: String = include_str!("mod.rs")
            .lines()
            .skip_while(|l| !l.starts_with("//! ```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| l.trim_start_matches("//!").trim_start())
            .collect::<Vec<_>>()
            .join("\n");
        let config: Config = toml::from_str(&example).expect("the example parses");
        assert_eq!(config.server.port, Some(7860));
        assert_eq!(config.bot.voice, Some(Voice::Piper));
        assert_eq!(config.bot.turn, Some(TurnEnd::SmartTurn));
        assert_eq!(config.bot.llm.as_deref(), Some("openai,local"));
        let price = config.bot.prices["gpt-4.1-mini"].price();
        assert_eq!(
            (price.input, price.output, price.cache_read),
            (0.40, 1.60, 0.10)
        );
        assert!(
            toml::from_str::<Config>(
                "[bot.prices.m]
input = 1.0
"
            )
            .is_err()
        );
        assert!(toml::from_str::<Config>("[server]\nprot = 1\n").is_err());
        assert!(toml::from_str::<Config>("[server]\nport = \"x\"\n").is_err());
    }

    #[test]
    fn the_documented_bot_file_parses() {
        let example: String = include_str!("mod.rs")
            .lines()
            .skip_while(|l| !l.starts_with("/// ```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("/// ```"))
            .map(|l| l.trim_start_matches("///").trim_start())
            .collect::<Vec<_>>()
            .join("\n");
        let bot: BotConfig = toml::from_str(&example).expect("the bot file example parses");
        assert_eq!(bot.name.as_deref(), Some("concierge"));
        assert_eq!(bot.tools[0].name, "lookup_order");
        assert_eq!(bot.mcp[0].async_tools, ["trigger-long-running-operation"]);
        assert_eq!(bot.examples[0].call.as_deref(), Some("lookup_order"));
    }

    fn layer(text: &str) -> BotConfig {
        toml::from_str(text).expect("a bot layer")
    }

    #[test]
    fn a_higher_layer_wins_key_by_key_and_an_instruction_whole() {
        let config = layer(
            "llm = \"local\"\nmax_tokens = 80\ninstructions = \"Be brief.\"\n\
             [prices.m]\ninput = 1.0\noutput = 2.0",
        );
        let file = layer(
            "name = \"desk\"\ninstructions_file = \"desk.md\"\nturn = \"silence\"\n\
             [prices.n]\ninput = 3.0\noutput = 4.0",
        );
        let flags = layer("max_tokens = 120");
        let bot = flags.over(file.over(config));
        assert_eq!(bot.name.as_deref(), Some("desk"));
        assert_eq!(bot.max_tokens, Some(120), "the flag wins");
        assert_eq!(bot.llm.as_deref(), Some("local"), "the config's key stays");
        assert_eq!(bot.turn, Some(TurnEnd::Silence));
        assert_eq!(
            bot.instructions, None,
            "the file's instruction replaces the text whole"
        );
        assert_eq!(bot.instructions_file, Some(PathBuf::from("desk.md")));
        assert_eq!(bot.prices.len(), 2, "prices merge");
    }

    #[test]
    fn resolving_checks_values_and_names_what_is_wrong() {
        let error = |text: &str| layer(text).resolve().expect_err(text).to_string();
        assert!(error("max_tokens = 0").contains("max tokens"));
        assert!(error("max_context_tokens = 10").contains("max context tokens"));
        assert!(error("[idle]\nafter_secs = 0.5").contains("idle.after_secs"));
        assert!(error("[idle]\nafter_secs = 5\ncheck_ins = [\"\"]").contains("idle.check_ins"));
        assert!(error("llm = \"local,local\"").contains("twice"));
        assert!(error("tts = \"piper,espeak\"").contains("one embedded voice"));
        assert!(error("stt = \"nobody\"").contains("whisper"));
        let e = error("stt = \"deepgram\"\nstt_prompt = \"Voxide.\"");
        assert!(e.contains("Whisper"), "{e}");
        assert!(error("instructions = \"a\"\ninstructions_file = \"b\"").contains("not both"));
        assert!(
            error("[[tool]]\nname = \"calculate\"\ndescription = \"d\"\nurl = \"http://x/\"")
                .contains("two tools are named \"calculate\"")
        );
        let bot = layer(
            "voice = \"espeak\"\nbuiltin = [\"clock\"]\ngreeting = \"Hi.\"\n\
             stt_prompt = \"Voxide.\"",
        )
        .resolve()
        .expect("a bot");
        assert_eq!(bot.stt_prompt.as_deref(), Some("Voxide."));
        assert_eq!(bot.voice, Voice::Espeak);
        assert_eq!(bot.builtin, [Builtin::Clock]);
        assert_eq!(bot.greeting.as_deref(), Some("Hi."));
        assert!(toml::from_str::<BotConfig>("builtin = [\"weather\"]").is_err());
        assert!(
            error("[transfer]\nsales = \"sip:a@b;transport=tcp\"").contains("[transfer] sales")
        );
        assert!(error("[transfer]\n\"sales desk\" = \"2001\"").contains("a name of letters"));
        let phone = layer(
            "builtin = [\"end-call\"]\n[transfer]\nsales = \"sip:2001@pbx.example.com\"\n\
             billing = \"+15551234567\"",
        )
        .resolve()
        .expect("a phone bot");
        assert_eq!(phone.builtin, [Builtin::EndCall]);
        assert!(error("[voicemail]\nmessage = \" \"").contains("voicemail.message"));
        let caller = layer("[voicemail]\nmessage = \"Call us back.\"")
            .resolve()
            .expect("a bot that calls");
        let message = caller.voicemail.and_then(|v| v.message);
        assert_eq!(message.as_deref(), Some("Call us back."));
        assert_eq!(
            phone.transfer,
            [
                ("billing".to_owned(), "+15551234567".to_owned()),
                ("sales".to_owned(), "sip:2001@pbx.example.com".to_owned())
            ]
        );
    }

    #[test]
    fn a_bot_file_is_named_after_itself_and_finds_its_instructions_beside_it() {
        let dir = std::env::temp_dir().join(format!("voxide-bot-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("desk.md"), "You answer the front desk.\n").expect("md");
        std::fs::write(dir.join("desk.toml"), "instructions_file = \"desk.md\"\n").expect("toml");
        std::fs::write(dir.join("typo.toml.bak"), "").expect("ignored");
        let bots = BotConfig::load_dir(&dir).expect("the folder");
        assert_eq!(bots.len(), 1);
        assert_eq!(bots[0].name.as_deref(), Some("desk"));
        let bot = bots[0].clone().resolve().expect("the bot");
        assert_eq!(bot.instructions, "You answer the front desk.");
        std::fs::write(dir.join("other.toml"), "nmae = \"x\"\n").expect("typo");
        let e = BotConfig::load_dir(&dir)
            .expect_err("an unknown key")
            .to_string();
        assert!(e.contains("other.toml") && e.contains("nmae"), "{e}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
