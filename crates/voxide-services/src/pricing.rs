//! What tokens cost: a per-model price table, so usage can be reported in dollars.

use std::collections::HashMap;
use std::sync::Arc;

use voxide_core::frames::{
    ControlFrame, Frame, LlmResponseSummary, MetricsData, SystemFrame, TokenUsage,
};

/// Dollars per million tokens of each kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// Fresh prompt tokens.
    pub input: f64,
    /// Generated tokens.
    pub output: f64,
    /// Prompt tokens served from the provider's cache.
    pub cache_read: f64,
    /// Prompt tokens written to the provider's cache.
    pub cache_write: f64,
}

impl Price {
    /// A price without cache discounts: cached tokens cost as much as fresh ones.
    pub const fn flat(input: f64, output: f64) -> Self {
        Self {
            input,
            output,
            cache_read: input,
            cache_write: input,
        }
    }

    /// A price with cache read and write rates.
    pub const fn cached(input: f64, output: f64, cache_read: f64, cache_write: f64) -> Self {
        Self {
            input,
            output,
            cache_read,
            cache_write,
        }
    }

    /// Nothing to pay (local models).
    pub const FREE: Price = Price::flat(0.0, 0.0);

    /// Dollars for `usage`.
    pub fn cost(&self, usage: &TokenUsage) -> f64 {
        (usage.input as f64 * self.input
            + usage.output as f64 * self.output
            + usage.cache_read as f64 * self.cache_read
            + usage.cache_write as f64 * self.cache_write)
            / 1_000_000.0
    }
}

/// When the built-in list prices were taken from the providers' published lists. Negotiated or
/// newer rates go in the config file (`[bot.prices."MODEL"]`).
pub const PRICES_AS_OF: &str = "2026-03-15";

/// Public list prices (USD per million text tokens) as the providers publish them, as of
/// [`PRICES_AS_OF`]. Dated model names (`gpt-4o-2024-08-06`) resolve to their family.
const BUILTIN: &[(&str, Price)] = &[
    // OpenAI: cached input is discounted; there is no separate write charge.
    ("gpt-4o", Price::cached(2.50, 10.00, 1.25, 2.50)),
    ("gpt-4o-mini", Price::cached(0.15, 0.60, 0.075, 0.15)),
    ("gpt-4.1", Price::cached(2.00, 8.00, 0.50, 2.00)),
    ("gpt-4.1-mini", Price::cached(0.40, 1.60, 0.10, 0.40)),
    ("gpt-4.1-nano", Price::cached(0.10, 0.40, 0.025, 0.10)),
    ("gpt-5-mini", Price::cached(0.25, 2.00, 0.025, 0.25)),
    ("gpt-5-nano", Price::cached(0.05, 0.40, 0.005, 0.05)),
    // Realtime models, text tokens.
    ("gpt-realtime", Price::cached(4.00, 16.00, 0.40, 4.00)),
    (
        "gpt-4o-realtime-preview",
        Price::cached(5.00, 20.00, 2.50, 5.00),
    ),
    (
        "gpt-4o-mini-realtime-preview",
        Price::cached(0.60, 2.40, 0.30, 0.60),
    ),
    // Anthropic: cache writes cost 1.25x input, cache reads 0.1x.
    ("claude-opus-4", Price::cached(15.00, 75.00, 1.50, 18.75)),
    ("claude-sonnet-4", Price::cached(3.00, 15.00, 0.30, 3.75)),
    ("claude-sonnet-4-5", Price::cached(3.00, 15.00, 0.30, 3.75)),
    ("claude-sonnet-4-6", Price::cached(3.00, 15.00, 0.30, 3.75)),
    ("claude-haiku-4-5", Price::cached(1.00, 5.00, 0.10, 1.25)),
    ("claude-3-5-haiku", Price::cached(0.80, 4.00, 0.08, 1.00)),
    // Google.
    ("gemini-2.0-flash", Price::cached(0.10, 0.40, 0.025, 0.10)),
    ("gemini-2.5-flash", Price::cached(0.30, 2.50, 0.075, 0.30)),
    ("gemini-2.5-pro", Price::cached(1.25, 10.00, 0.31, 1.25)),
    (
        "gemini-2.5-flash-lite",
        Price::cached(0.10, 0.40, 0.025, 0.10),
    ),
    (
        "gemini-3-flash-preview",
        Price::cached(0.50, 3.00, 0.05, 0.50),
    ),
    // The embedded model runs here.
    ("SmolLM2-135M-Instruct", Price::FREE),
];

/// Prices by model name. Cheap to clone: the table is shared.
#[derive(Debug, Clone)]
pub struct PriceTable(Arc<HashMap<String, Price>>);

impl Default for PriceTable {
    /// The built-in list prices.
    fn default() -> Self {
        Self(Arc::new(
            BUILTIN
                .iter()
                .map(|(model, price)| ((*model).to_owned(), *price))
                .collect(),
        ))
    }
}

impl PriceTable {
    /// An empty table: every cost is unknown.
    pub fn empty() -> Self {
        Self(Arc::default())
    }

    /// Adds or replaces the price of `model` (negotiated rates, new models).
    pub fn with(mut self, model: impl Into<String>, price: Price) -> Self {
        Arc::make_mut(&mut self.0).insert(model.into(), price);
        self
    }

    /// The price of `model`: an exact entry, else the longest entry it extends with a version
    /// suffix (`-2024-08-06`, `-latest`, `-20250514`).
    pub fn price(&self, model: &str) -> Option<Price> {
        if let Some(price) = self.0.get(model) {
            return Some(*price);
        }
        self.0
            .iter()
            .filter(|(name, _)| {
                model
                    .strip_prefix(name.as_str())
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(is_version_suffix)
            })
            .max_by_key(|(name, _)| name.len())
            .map(|(_, price)| *price)
    }

    /// Dollars for `usage` on `model`, when its price is known.
    pub fn cost(&self, model: &str, usage: &TokenUsage) -> Option<f64> {
        self.price(model).map(|p| p.cost(usage))
    }
}

/// Only dates and `latest` count as versions: another variant (`-audio-preview`) is another model
/// with another price.
fn is_version_suffix(rest: &str) -> bool {
    rest == "latest" || rest.starts_with(|c: char| c.is_ascii_digit())
}

/// What listening and speaking cost: USD per minute of audio sent to an STT, per million
/// characters sent to a TTS, as of [`PRICES_AS_OF`] (`PROVIDERS.md` §12 names each source). Dated
/// model names resolve to their family, as for the LLMs.
const SPEECH: &[(&str, SpeechPrice)] = &[
    // Deepgram Nova-3 streaming, pay as you go (third-party 2026 figures: $0.0052-0.0059).
    ("nova-3", SpeechPrice::PerMinute(0.0058)),
    // AssemblyAI Universal-Streaming bills the socket's open time, $0.15 an hour; voxide streams
    // all of a session's audio from its start, so its audio is that time. U3-Pro: $0.45 an hour.
    (
        "universal-streaming-english",
        SpeechPrice::PerMinute(0.0025),
    ),
    (
        "universal-streaming-multilingual",
        SpeechPrice::PerMinute(0.0025),
    ),
    ("u3-rt-pro", SpeechPrice::PerMinute(0.0075)),
    // OpenAI transcription.
    ("gpt-4o-transcribe", SpeechPrice::PerMinute(0.006)),
    ("gpt-4o-mini-transcribe", SpeechPrice::PerMinute(0.003)),
    // Cartesia Sonic: about a credit a character, $37-39 per million on the Startup and Scale
    // plans.
    ("sonic-3.5", SpeechPrice::PerMillionChars(38.0)),
    ("sonic-2", SpeechPrice::PerMillionChars(38.0)),
    // ElevenLabs: Flash and Turbo v2.5 $0.05 per thousand characters, Multilingual v2 $0.10.
    ("eleven_flash_v2_5", SpeechPrice::PerMillionChars(50.0)),
    ("eleven_turbo_v2_5", SpeechPrice::PerMillionChars(50.0)),
    (
        "eleven_multilingual_v2",
        SpeechPrice::PerMillionChars(100.0),
    ),
    // OpenAI speech: tts-1 by the character; gpt-4o-mini-tts about $0.015 a minute, which is
    // $16.7 per million characters at 15 characters a second.
    ("tts-1", SpeechPrice::PerMillionChars(15.0)),
    ("gpt-4o-mini-tts", SpeechPrice::PerMillionChars(16.7)),
    // Deepgram Aura, priced per family whatever the voice: Aura-1 $0.015 per thousand
    // characters, Aura-2 about $0.030 (unverified).
    ("aura", SpeechPrice::PerMillionChars(15.0)),
    ("aura-2", SpeechPrice::PerMillionChars(30.0)),
    // The embedded engines run here.
    ("whisper", SpeechPrice::PerMinute(0.0)),
    ("piper", SpeechPrice::PerMillionChars(0.0)),
    ("espeak-ng", SpeechPrice::PerMillionChars(0.0)),
];

/// A speech model's price.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SpeechPrice {
    /// USD per minute of audio (STT).
    PerMinute(f64),
    /// USD per million characters (TTS).
    PerMillionChars(f64),
}

/// The speech price of `model`, from the built-in list.
pub fn speech_price(model: &str) -> Option<SpeechPrice> {
    // Aura's model names its voice (`aura-2-thalia-en`); the price is the family's.
    let model = match model {
        m if m.starts_with("aura-2-") => "aura-2",
        m if m.starts_with("aura-") => "aura",
        m => m,
    };
    SPEECH
        .iter()
        .filter(|(name, _)| {
            model == *name
                || model
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(is_version_suffix)
        })
        .max_by_key(|(name, _)| name.len())
        .map(|(_, price)| *price)
}

/// Dollars for `seconds` of audio sent to the STT `model`.
pub fn stt_cost(model: &str, seconds: f64) -> Option<f64> {
    match speech_price(model)? {
        SpeechPrice::PerMinute(usd) => Some(usd * seconds / 60.0),
        SpeechPrice::PerMillionChars(_) => None,
    }
}

/// Dollars for `characters` sent to the TTS `model`.
pub fn tts_cost(model: &str, characters: u64) -> Option<f64> {
    match speech_price(model)? {
        SpeechPrice::PerMillionChars(usd) => Some(usd * characters as f64 / 1e6),
        SpeechPrice::PerMinute(_) => None,
    }
}

/// Accounts for one finished LLM response, for the text service and the realtime ones alike:
/// prices it, and returns what ends it downstream, in order: the usage metrics (when asked for
/// and there was usage), the summary, the response's end.
pub(crate) fn account_response(
    mut summary: LlmResponseSummary,
    prices: &PriceTable,
    usage_metrics: bool,
    processor: &str,
) -> Vec<Frame> {
    summary.cost_usd = prices.cost(&summary.model, &summary.usage);
    let mut frames = Vec::with_capacity(3);
    if usage_metrics && summary.usage != TokenUsage::default() {
        let data = MetricsData::LlmUsage {
            processor: processor.to_owned(),
            model: Some(summary.model.clone()),
            usage: summary.usage,
            cost_usd: summary.cost_usd,
        };
        frames.push(SystemFrame::Metrics(vec![data]).into());
    }
    frames.push(ControlFrame::LlmResponseSummary(Box::new(summary)).into());
    frames.push(ControlFrame::LlmFullResponseEnd.into());
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_names_resolve_to_their_family_and_variants_do_not() {
        let table = PriceTable::default();
        assert_eq!(table.price("gpt-4o-2024-08-06"), table.price("gpt-4o"));
        assert_eq!(
            table.price("gpt-4o-mini-2024-07-18"),
            table.price("gpt-4o-mini")
        );
        assert_eq!(
            table.price("claude-sonnet-4-20250514"),
            table.price("claude-sonnet-4")
        );
        assert_eq!(table.price("gpt-4o-audio-preview"), None);
        assert_eq!(table.price("unknown-model"), None);
    }

    #[test]
    fn cost_adds_every_kind_of_token() {
        let usage = TokenUsage {
            input: 1_000_000,
            output: 500_000,
            cache_read: 2_000_000,
            cache_write: 0,
        };
        let cost = PriceTable::default()
            .cost("gpt-4o", &usage)
            .expect("priced");
        assert!((cost - (2.50 + 5.00 + 2.50)).abs() < 1e-9);
    }

    #[test]
    fn custom_prices_override_the_list() {
        let table = PriceTable::default().with("gpt-4o", Price::flat(1.0, 1.0));
        let usage = TokenUsage {
            input: 1_000_000,
            ..TokenUsage::default()
        };
        assert_eq!(table.cost("gpt-4o", &usage), Some(1.0));
        assert_eq!(PriceTable::empty().cost("gpt-4o", &usage), None);
    }

    #[test]
    fn speech_is_priced_by_the_minute_or_the_character() {
        assert_eq!(stt_cost("nova-3", 60.0), Some(0.0058));
        assert_eq!(
            stt_cost("nova-3-general", 60.0),
            None,
            "a variant is another model"
        );
        assert_eq!(tts_cost("sonic-3.5", 1_000_000), Some(38.0));
        assert_eq!(
            tts_cost("gpt-4o-mini-tts-2025-03-20", 1_000_000),
            Some(16.7)
        );
        assert_eq!(stt_cost("sonic-3.5", 60.0), None, "a voice is not an STT");
        assert_eq!(tts_cost("piper", 500), Some(0.0));
        assert_eq!(tts_cost("unknown", 500), None);
        assert_eq!(tts_cost("aura-2-thalia-en", 1_000_000), Some(30.0));
        assert_eq!(tts_cost("aura-asteria-en", 1_000_000), Some(15.0));
    }
}
