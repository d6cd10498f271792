//! The bot's flags, and how they layer over a bot file and the config file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use voxide::bot::providers;
use voxide::bot::{BotOptions, Denoise, TurnEnd, Voice};
use voxide::config::{BotConfig, Config};

/// The bot's options, shared by the commands that run one. Each falls back to its
/// environment variable, then to the bot file, then to the config file's `[bot]` table, then
/// to the default.
#[derive(clap::Args, Debug)]
pub struct BotArgs {
    /// A bot file: its instruction, greeting, providers and tools (see `voxide::config` for
    /// its keys; `voxide check --bot FILE` checks one). The flags here override it.
    #[arg(long, env = "VOXIDE_BOT", value_name = "FILE")]
    pub bot: Option<PathBuf>,
    /// The voice: `piper` (natural) or `espeak` (robotic, nearly free). [default: piper]
    #[arg(long, value_enum, env = "VOXIDE_VOICE")]
    voice: Option<Voice>,
    /// How a user turn ends: `smart` (the Smart Turn model judges each pause) or `silence`
    /// (a fixed silence of --turn-timeout-secs). [default: smart]
    #[arg(long, value_enum, env = "VOXIDE_TURN")]
    turn: Option<TurnEnd>,
    /// With `--turn silence` the silence that ends a turn; with `--turn smart` the silence after
    /// which a turn that sounds unfinished ends anyway. [default: 2]
    #[arg(long, env = "VOXIDE_TURN_TIMEOUT_SECS")]
    turn_timeout_secs: Option<f64>,
    /// Tokens one reply may have at most. [default: 60]
    #[arg(long, env = "VOXIDE_MAX_TOKENS")]
    max_tokens: Option<usize>,
    /// Words the user must say over the bot before it stops; shorter remarks ("mm-hm") are
    /// dropped. 0: the start of speech interrupts. [default: 0]
    #[arg(long, env = "VOXIDE_INTERRUPT_MIN_WORDS")]
    interrupt_min_words: Option<usize>,
    /// Pause the bot when the user starts speaking over it, and resume it when no words come
    /// within this many seconds after they stop (a cough, a door). [default: off]
    #[arg(long, env = "VOXIDE_RESUME_AFTER_SECS")]
    resume_after_secs: Option<f64>,
    /// Hold the bot's audio from the first moment of speech over it, before the VAD confirms
    /// the start, and play on if it fades (`true` or `false`). [default: true]
    #[arg(long, env = "VOXIDE_PAUSE_AT_ONSET")]
    pause_at_onset: Option<bool>,
    /// Reactions over the bot ("yeah", "mm hmm", "I see") are no words towards stopping it: it
    /// stops once the transcript holds another word (`true` or `false`). Pair it with
    /// `--pause-at-onset false`, or every reaction pauses the bot until its start is
    /// confirmed. [default: false]
    #[arg(long, env = "VOXIDE_BACKCHANNELS")]
    backchannels: Option<bool>,
    /// Noise suppression on the user's audio before the VAD and the STT: `rnnoise` or `off`.
    /// [default: off]
    #[arg(long, value_enum, env = "VOXIDE_DENOISE")]
    denoise: Option<Denoise>,
    /// With `--turn smart`, weigh the turn's words with the model's verdict (`true` or
    /// `false`): a whole sentence the model calls unfinished ends 0.6 s after the pause, words
    /// that trail off ("and", "the") hold a finished-sounding turn 1 s. The word lists are
    /// English; turn it off for other languages. [default: true]
    #[arg(long, env = "VOXIDE_TURN_WORDS")]
    turn_words: Option<bool>,
    /// Start the answer at a pause whose words are in, before the turn has ended (`true` or
    /// `false`): the LLM starts, and the voice speaks the answer's first sentence with its audio
    /// held. If the turn ends with those words the answer is already under way; if the user
    /// goes on it is thrown away (wasted tokens are counted in the metrics; a paid LLM or voice
    /// bills them). [default: true]
    #[arg(long, env = "VOXIDE_PREEMPTIVE")]
    preemptive: Option<bool>,
    /// The system instruction (default: a short one of voxide's own).
    #[arg(long, env = "VOXIDE_INSTRUCTIONS")]
    instructions: Option<String>,
    // The providers' flags: their help comes from the tables in `bot::providers`.
    #[arg(long, env = "VOXIDE_LLM", help = providers::llm_help())]
    llm: Option<String>,
    #[arg(long, env = "VOXIDE_LLM_MODEL", help = providers::model_help(providers::LLM, "The text LLM's model"))]
    llm_model: Option<String>,
    #[arg(long, env = "VOXIDE_STT", help = providers::help(providers::STT, "Who listens (with a text LLM)", "whisper"))]
    stt: Option<String>,
    #[arg(long, env = "VOXIDE_STT_MODEL", help = providers::model_help(providers::STT, "The STT's model"))]
    stt_model: Option<String>,
    /// Words the embedded Whisper reads before each utterance, as if said just before it:
    /// names and terms it should expect and spell their way ("Voxide, Piper, Smart Turn."). A
    /// transcript made only of the prompt's words is decoded again without it. "" for none.
    /// [default: requests for the bot's tools: the built-in tools' and its examples that call
    /// one]
    #[arg(long, env = "VOXIDE_STT_PROMPT")]
    stt_prompt: Option<String>,
    #[arg(long, env = "VOXIDE_TTS", help = providers::help(providers::TTS, "Who speaks (with a text LLM)", "the --voice"))]
    tts: Option<String>,
    #[arg(long, env = "VOXIDE_TTS_MODEL", help = providers::model_help(providers::TTS, "The TTS provider's model"))]
    tts_model: Option<String>,
    /// The TTS provider's voice id (the first provider of the list).
    #[arg(long, env = "VOXIDE_TTS_VOICE")]
    tts_voice: Option<String>,
    /// The text LLMs' sampling temperature (0 to 2). [default: the provider's]
    #[arg(long, env = "VOXIDE_LLM_TEMPERATURE")]
    llm_temperature: Option<f32>,
    /// A TOML config file (see `voxide::config` for its keys).
    #[arg(long, env = "VOXIDE_CONFIG")]
    config: Option<PathBuf>,
}

impl BotArgs {
    /// The config file, or an empty one.
    pub fn config(&self) -> Result<Config> {
        Ok(match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        })
    }

    /// The flags (and their environment variables) as the top layer of the bot's settings.
    pub fn layer(&self) -> BotConfig {
        BotConfig {
            voice: self.voice,
            turn: self.turn,
            turn_timeout_secs: self.turn_timeout_secs,
            max_tokens: self.max_tokens,
            interrupt_min_words: self.interrupt_min_words,
            resume_after_secs: self.resume_after_secs,
            pause_at_onset: self.pause_at_onset,
            backchannels: self.backchannels,
            denoise: self.denoise,
            turn_words: self.turn_words,
            preemptive: self.preemptive,
            instructions: self.instructions.clone(),
            llm: self.llm.clone(),
            llm_model: self.llm_model.clone(),
            llm_temperature: self.llm_temperature,
            stt: self.stt.clone(),
            stt_model: self.stt_model.clone(),
            stt_prompt: self.stt_prompt.clone(),
            tts: self.tts.clone(),
            tts_model: self.tts_model.clone(),
            tts_voice: self.tts_voice.clone(),
            ..BotConfig::default()
        }
    }

    /// The bot: the flags over `--bot`'s file over the config's `[bot]` over `defaults`,
    /// resolved, its MCP servers started.
    pub async fn bot(&self, defaults: BotConfig) -> Result<BotOptions> {
        let file = match &self.bot {
            Some(path) => BotConfig::load(path)?,
            None => BotConfig::default(),
        };
        let bot = self
            .layer()
            .over(file.over(self.config()?.bot.over(defaults)))
            .resolve()?;
        bot.start_tools().await?;
        Ok(bot)
    }

    /// Each bot of `dir`, layered as [`BotArgs::bot`] does with its file, started.
    pub async fn bots(&self, dir: &Path) -> Result<Vec<BotOptions>> {
        let base = self.config()?.bot;
        let mut bots = Vec::new();
        for file in BotConfig::load_dir(dir)? {
            let bot = self.layer().over(file.over(base.clone())).resolve()?;
            bot.start_tools().await?;
            bots.push(bot);
        }
        Ok(bots)
    }
}

/// `voxide check`.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// A folder of bot files to check.
    #[arg(long, value_name = "DIR", conflicts_with = "bot")]
    bots: Option<PathBuf>,
    /// Draws each flow bot's nodes and transitions: NAME.svg and its Mermaid text NAME.mmd in
    /// this folder (default: the one the command runs in), or at this path when it ends in
    /// `.svg`.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = ".")]
    graph: Option<PathBuf>,
    #[command(flatten)]
    bot: BotArgs,
}

impl CheckArgs {
    /// Every bot resolved as a run would resolve it, nothing started.
    pub fn run(&self) -> Result<()> {
        let args = &self.bot;
        let base = args.config()?.bot;
        let files = match (&self.bots, &args.bot) {
            (Some(dir), _) => BotConfig::load_dir(dir)?,
            (None, Some(path)) => vec![BotConfig::load(path)?],
            (None, None) => vec![BotConfig::default()],
        };
        for file in files {
            let bot = args.layer().over(file.over(base.clone())).resolve()?;
            let tools = bot.http_tools.len();
            let servers: Vec<&str> = bot.mcp.iter().map(|s| s.name()).collect();
            let name = bot.name.as_deref().unwrap_or("default");
            println!(
                "ok: bot {name:?}: {} built-in tools, {tools} HTTP tools, MCP servers [{}] (not started)",
                bot.builtin.len(),
                servers.join(", ")
            );
            let Some(flow) = &bot.flow else {
                continue;
            };
            if bot.mcp.is_empty() {
                flow.check_tools(&bot.tool_names())
                    .map_err(|e| anyhow::anyhow!("bot {name:?}: {e}"))?;
            }
            println!(
                "    a flow of {} nodes from {:?}{}",
                flow.node_names().count(),
                flow.initial(),
                if bot.mcp.is_empty() {
                    ""
                } else {
                    " (its MCP tools are checked as the servers start)"
                }
            );
            if let Some(graph) = &self.graph {
                let svg = if graph.extension().is_some_and(|e| e == "svg") {
                    graph.clone()
                } else {
                    graph.join(format!("{name}.svg"))
                };
                let mmd = svg.with_extension("mmd");
                std::fs::write(&svg, voxide::flows::svg(flow))
                    .with_context(|| format!("writing {}", svg.display()))?;
                std::fs::write(&mmd, voxide::flows::mermaid(flow))
                    .with_context(|| format!("writing {}", mmd.display()))?;
                println!("    drawn: {} and {}", svg.display(), mmd.display());
            }
        }
        Ok(())
    }
}

/// The bot's options over `defaults`, with every engine they use loaded.
pub async fn preloaded(args: &BotArgs, defaults: BotConfig) -> Result<BotOptions> {
    let bot = args.bot(defaults).await?;
    let preload = bot.clone();
    tokio::task::spawn_blocking(move || voxide::bot::preload(&preload)).await??;
    Ok(bot)
}
