//! The configuration file (TOML). Precedence, highest first: command-line flags, environment
//! variables (`VOXIDE_*`), this file, built-in defaults.
//!
//! ```toml
//! [server]
//! host = "127.0.0.1"
//! port = 7860
//! max_sessions = 32
//! shutdown_grace_secs = 10
//!
//! [bot]
//! voice = "piper"          # or "espeak"
//! turn = "smart"           # or "silence"
//! turn_timeout_secs = 2.0
//! max_tokens = 60
//! interrupt_min_words = 0  # words over the bot before it stops
//! resume_after_secs = 1.0  # pause on speech over the bot; resume if no words come
//! pause_at_onset = true    # hold the bot at the first sound of speech over it
//! instructions = "You are a helpful voice assistant."
//! llm = "openai,local"     # see --llm
//! llm_model = "gpt-4.1-mini"
//! llm_temperature = 0.6
//! stt = "whisper"          # see --stt: "deepgram,whisper" falls back to Whisper
//! tts = "piper"            # see --tts: "cartesia,piper" falls back to Piper
//!
//! # Your own rates (USD per million tokens) over the built-in list prices.
//! [bot.prices."gpt-4.1-mini"]
//! input = 0.40
//! output = 1.60
//! cache_read = 0.10        # default: the input rate
//! cache_write = 0.40       # default: the input rate
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

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
    /// Seconds live sessions get to finish on shutdown.
    pub shutdown_grace_secs: Option<f64>,
}

/// `[bot]`: the default bot's options.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotConfig {
    /// `piper` or `espeak`.
    pub voice: Option<String>,
    /// `smart` or `silence`.
    pub turn: Option<String>,
    /// See `--turn-timeout-secs`.
    pub turn_timeout_secs: Option<f64>,
    /// Tokens one reply may have at most.
    pub max_tokens: Option<usize>,
    /// See `--interrupt-min-words`.
    pub interrupt_min_words: Option<usize>,
    /// See `--resume-after-secs`.
    pub resume_after_secs: Option<f64>,
    /// See `--pause-at-onset`.
    pub pause_at_onset: Option<bool>,
    /// The system instruction.
    pub instructions: Option<String>,
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
}

/// Why the file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// It could not be read.
    #[error("cannot read the config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not valid TOML or has unknown keys.
    #[error("the config file {path} is invalid: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line.
        message: String,
    },
}

impl Config {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_and_typos_are_errors() {
        let example: String = include_str!("config.rs")
            .lines()
            .skip_while(|l| !l.starts_with("//! ```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| l.trim_start_matches("//!").trim_start())
            .collect::<Vec<_>>()
            .join("\n");
        let config: Config = toml::from_str(&example).expect("the example parses");
        assert_eq!(config.server.port, Some(7860));
        assert_eq!(config.bot.voice.as_deref(), Some("piper"));
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
}
