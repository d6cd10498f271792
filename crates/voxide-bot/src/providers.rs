//! The providers a bot may name, one table per kind: each entry's name, what it reads from the
//! environment, its default model, and how its choice is made. The names a bot file or a flag
//! takes, the help that lists them and the errors that name them all come from here: a new
//! provider is its folder under `services` and one entry here.

use super::{SttChoice, TextLlm, TtsChoice};
use crate::config::{ConfigError, Voice};
use crate::services::llm::{anthropic, gemini, openai};
use crate::services::stt::{assemblyai, deepgram as deepgram_stt, openai as openai_stt};
use crate::services::tts::{cartesia, deepgram as aura, elevenlabs, openai as openai_tts};

/// What a list's settings may be told: the first entry that uses each takes it.
#[derive(Debug, Default)]
pub(super) struct Overrides {
    /// The model (`stt_model`, `tts_model`, `llm_model`).
    pub model: Option<String>,
    /// The voice's id (`tts_voice`).
    pub voice_id: Option<String>,
    /// The text LLM's temperature (every text LLM of the list).
    pub temperature: Option<f32>,
    /// The embedded voice a TTS list named.
    pub embedded: Option<Voice>,
}

impl Overrides {
    /// `setting` takes the model, if it is still untaken.
    fn model(&mut self, setting: &mut String) {
        if let Some(model) = self.model.take() {
            *setting = model;
        }
    }

    /// `setting` takes the voice id, if it is still untaken.
    fn voice_id(&mut self, setting: &mut String) {
        if let Some(id) = self.voice_id.take() {
            *setting = id;
        }
    }

    /// The list's embedded voice is `voice`: one at most.
    fn embed(&mut self, voice: Voice) -> Result<(), ConfigError> {
        if self.embedded.is_some() {
            return Err(ConfigError::Value("one embedded voice at most".into()));
        }
        self.embedded = Some(voice);
        Ok(())
    }
}

/// One provider of a kind.
pub struct ProviderSpec<C> {
    /// Its name in `--stt`, `--tts`, `--llm` and bot files.
    pub name: &'static str,
    /// What it is and the variables it reads, for the help.
    pub about: &'static str,
    /// The model it uses when none is named.
    pub default_model: Option<&'static str>,
    /// Its choice, with what it takes of the overrides.
    build: fn(&mut Overrides) -> Result<C, ConfigError>,
}

impl<C> ProviderSpec<C> {
    /// The choice `name` names in `table`, built with `overrides`; an error lists the table.
    pub(super) fn build(
        table: &[Self],
        kind: &str,
        name: &str,
        overrides: &mut Overrides,
    ) -> Result<C, ConfigError> {
        let spec = table.iter().find(|spec| spec.name == name).ok_or_else(|| {
            ConfigError::Value(format!(
                "{kind} {name:?}: use {} (a comma-separated list falls back from each to the next)",
                names(table)
            ))
        })?;
        (spec.build)(overrides)
    }
}

/// The table's names: `a, b or c`.
pub fn names<C>(table: &[ProviderSpec<C>]) -> String {
    let names: Vec<&str> = table.iter().map(|spec| spec.name).collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The help for a flag that takes a list of `table`'s names.
pub fn help<C>(table: &[ProviderSpec<C>], what: &str, default: &str) -> String {
    let entries: Vec<String> = table
        .iter()
        .map(|spec| format!("`{}` ({})", spec.name, spec.about))
        .collect();
    format!(
        "{what}: {}; a comma-separated list falls back from each to the next. [default: {default}]",
        entries.join(", ")
    )
}

/// The help for a flag that names the model of a list's first provider.
pub fn model_help<C>(table: &[ProviderSpec<C>], what: &str) -> String {
    let defaults: Vec<String> = table
        .iter()
        .filter_map(|spec| Some(format!("{} for {}", spec.default_model?, spec.name)))
        .collect();
    format!(
        "{what} (the first provider of the list). [default: {}]",
        defaults.join(", ")
    )
}

/// A provider's settings could not be read from the environment (a key missing).
fn setup(e: impl std::fmt::Display) -> ConfigError {
    ConfigError::Value(e.to_string())
}

/// Who listens.
pub const STT: &[ProviderSpec<SttChoice>] = &[
    ProviderSpec {
        name: "whisper",
        about: "embedded, offline",
        default_model: None,
        build: |_| Ok(SttChoice::Whisper),
    },
    ProviderSpec {
        name: "deepgram",
        about: "live streaming: DEEPGRAM_API_KEY; DEEPGRAM_URL, scheme and host, for another server",
        default_model: Some(deepgram_stt::DEFAULT_MODEL),
        build: |o| {
            let mut settings = deepgram_stt::DeepgramSettings::from_env().map_err(setup)?;
            o.model(&mut settings.model);
            Ok(SttChoice::Deepgram(settings))
        },
    },
    ProviderSpec {
        name: "assemblyai",
        about: "Universal-Streaming: ASSEMBLYAI_API_KEY; ASSEMBLYAI_URL",
        default_model: Some(assemblyai::DEFAULT_MODEL),
        build: |o| {
            let mut settings = assemblyai::AssemblyAiSettings::from_env().map_err(setup)?;
            o.model(&mut settings.model);
            Ok(SttChoice::AssemblyAi(settings))
        },
    },
    ProviderSpec {
        name: "openai",
        about: "realtime transcription: OPENAI_API_KEY; OPENAI_BASE_URL",
        default_model: Some(openai_stt::DEFAULT_MODEL),
        build: |o| {
            let mut settings = openai_stt::OpenAiSttSettings::from_env().map_err(setup)?;
            o.model(&mut settings.model);
            Ok(SttChoice::OpenAi(settings))
        },
    },
];

/// Who speaks.
pub const TTS: &[ProviderSpec<TtsChoice>] = &[
    ProviderSpec {
        name: "piper",
        about: "embedded, offline; the same as --voice piper",
        default_model: None,
        build: |o| {
            o.embed(Voice::Piper)?;
            Ok(TtsChoice::Embedded)
        },
    },
    ProviderSpec {
        name: "espeak",
        about: "embedded, offline; the same as --voice espeak",
        default_model: None,
        build: |o| {
            o.embed(Voice::Espeak)?;
            Ok(TtsChoice::Embedded)
        },
    },
    ProviderSpec {
        name: "cartesia",
        about: "streaming: CARTESIA_API_KEY; CARTESIA_URL, scheme and host, for another server",
        default_model: Some(cartesia::DEFAULT_MODEL),
        build: |o| {
            let mut settings = cartesia::CartesiaSettings::from_env().map_err(setup)?;
            o.model(&mut settings.model);
            o.voice_id(&mut settings.voice);
            Ok(TtsChoice::Cartesia(settings))
        },
    },
    ProviderSpec {
        name: "elevenlabs",
        about: "streaming: ELEVENLABS_API_KEY; ELEVENLABS_URL",
        default_model: Some(elevenlabs::DEFAULT_MODEL),
        build: |o| {
            let mut settings = elevenlabs::ElevenLabsSettings::from_env().map_err(setup)?;
            o.model(&mut settings.model);
            o.voice_id(&mut settings.voice);
            Ok(TtsChoice::ElevenLabs(settings))
        },
    },
    ProviderSpec {
        name: "openai",
        about: "OpenAI's speech API or a server that speaks it: OPENAI_API_KEY, OPENAI_BASE_URL",
        default_model: Some(openai_tts::DEFAULT_MODEL),
        build: |o| {
            let mut settings = openai_tts::OpenAiSpeechSettings::from_env().map_err(setup)?;
            o.model(&mut settings.model);
            o.voice_id(&mut settings.voice);
            Ok(TtsChoice::OpenAi(settings))
        },
    },
    ProviderSpec {
        name: "deepgram",
        about: "Aura, streaming: DEEPGRAM_API_KEY, DEEPGRAM_URL; its voice is its model",
        default_model: Some(aura::DEFAULT_MODEL),
        build: |o| {
            let mut settings = aura::AuraSettings::from_env().map_err(setup)?;
            // Aura's voice is its model.
            if let Some(voice) = o.voice_id.take() {
                settings.model = voice;
            } else {
                o.model(&mut settings.model);
            }
            Ok(TtsChoice::Deepgram(settings))
        },
    },
];

/// The text LLMs.
pub const LLM: &[ProviderSpec<TextLlm>] = &[
    ProviderSpec {
        name: "local",
        about: "embedded, offline",
        default_model: None,
        build: |_| Ok(TextLlm::Local),
    },
    ProviderSpec {
        name: "openai",
        about: "any OpenAI-compatible chat-completions server: OPENAI_API_KEY, OPENAI_BASE_URL, \
                e.g. Ollama's http://127.0.0.1:11434/v1 with no key",
        default_model: Some(openai::DEFAULT_MODEL),
        build: |o| {
            let mut settings = openai::OpenAiSettings::from_env().map_err(setup)?;
            o.model(&mut settings.model);
            settings.temperature = o.temperature;
            Ok(TextLlm::OpenAi(settings))
        },
    },
    ProviderSpec {
        name: "anthropic",
        about: "ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL",
        default_model: Some(anthropic::DEFAULT_MODEL),
        build: |o| {
            let mut settings = anthropic::AnthropicSettings::from_env().map_err(setup)?;
            o.model(&mut settings.model);
            settings.temperature = o.temperature;
            Ok(TextLlm::Anthropic(settings))
        },
    },
    ProviderSpec {
        name: "gemini",
        about: "GEMINI_API_KEY, GEMINI_BASE_URL",
        default_model: Some(gemini::DEFAULT_MODEL),
        build: |o| {
            let mut settings = gemini::GeminiSettings::from_env().map_err(setup)?;
            o.model(&mut settings.model);
            settings.temperature = o.temperature;
            Ok(TextLlm::Gemini(settings))
        },
    },
];

/// The realtime models, which listen and speak themselves (one, never a list).
pub const REALTIME: &[(&str, &str)] = &[
    ("openai-realtime", "OPENAI_API_KEY; OPENAI_REALTIME_URL"),
    ("gemini-live", "GEMINI_API_KEY; GEMINI_LIVE_URL"),
];

/// The `--llm` help.
pub fn llm_help() -> String {
    let realtime: Vec<String> = REALTIME
        .iter()
        .map(|(name, about)| format!("`{name}` ({about})"))
        .collect();
    format!(
        "{} Or a realtime model that listens and speaks itself: {}.",
        help(LLM, "The model, a text LLM", "local"),
        realtime.join(" or ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_name_is_refused_with_the_tables_names() {
        let error = ProviderSpec::build(STT, "stt", "whisperx", &mut Overrides::default())
            .expect_err("no such provider");
        assert_eq!(
            error.to_string(),
            ConfigError::Value(
                "stt \"whisperx\": use whisper, deepgram, assemblyai or openai (a comma-separated \
                 list falls back from each to the next)"
                    .into()
            )
            .to_string()
        );
    }

    #[test]
    fn the_help_names_every_provider_and_its_default_model() {
        let help = help(TTS, "Who speaks", "the --voice");
        for spec in TTS {
            assert!(help.contains(&format!("`{}`", spec.name)), "{help}");
        }
        let models = model_help(STT, "The STT's model");
        assert!(models.contains(&format!("{} for deepgram", deepgram_stt::DEFAULT_MODEL)));
        assert!(!models.contains("for whisper"), "{models}");
    }

    #[test]
    fn a_list_names_one_embedded_voice_at_most() {
        let mut overrides = Overrides::default();
        assert!(ProviderSpec::build(TTS, "tts", "piper", &mut overrides).is_ok());
        assert!(ProviderSpec::build(TTS, "tts", "espeak", &mut overrides).is_err());
        assert_eq!(overrides.embedded, Some(Voice::Piper));
    }

    #[test]
    fn the_first_provider_that_uses_the_model_takes_it() {
        let mut overrides = Overrides {
            model: Some("m".into()),
            ..Overrides::default()
        };
        let mut first = String::from("default");
        let mut second = String::from("default");
        overrides.model(&mut first);
        overrides.model(&mut second);
        assert_eq!((first.as_str(), second.as_str()), ("m", "default"));
    }
}
