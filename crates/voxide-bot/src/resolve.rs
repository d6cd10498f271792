//! A stack of layers into the bot's options: every value checked, every provider's settings
//! read from its environment, every tool built.

use std::time::Duration;

use super::filler::FillerParams;
use super::http_tool::HttpTool;
use super::mcp::McpServer;
use super::providers::{self, Overrides, ProviderSpec};
use super::{BotOptions, LlmChoice, SttChoice, TtsChoice, Voice};
use crate::answered_by::Voicemail;
use crate::config::{
    BotConfig, Builtin, ConfigError, ExampleConfig, FillerConfig, IdleConfig, VoicemailConfig,
};
use crate::flows::Flow;
use crate::services::llm::PriceTable;
use crate::services::llm::gemini_live::GeminiLiveSettings;
use crate::services::llm::local::ToolExample;
use crate::services::llm::openai_realtime::OpenAiRealtimeSettings;
use crate::turns::{BargeIn, IdleParams};

fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Value(message.into())
}

/// A table whose lines the TTS speaks, resolved by `resolve`: only a text LLM's bot has a TTS
/// (`what` says what needs one, and is refused for a realtime model).
fn spoken_by_tts<T, R>(
    llm: &LlmChoice,
    table: Option<&T>,
    what: &str,
    resolve: impl FnOnce(&T) -> Result<R, ConfigError>,
) -> Result<Option<R>, ConfigError> {
    match table {
        None => Ok(None),
        Some(_) if !matches!(llm, LlmChoice::Text(_)) => {
            Err(invalid(format!("{what} a text LLM, not a realtime one")))
        }
        Some(table) => resolve(table).map(Some),
    }
}

/// A provider's settings could not be read from the environment (a key missing).
fn setup(e: impl std::fmt::Display) -> ConfigError {
    invalid(e.to_string())
}

/// What the bot says when the user goes quiet and has not come back.
const IDLE_GOODBYE: &str = "It seems you have stepped away. I'll end the call now. Goodbye!";

/// `[idle]`, checked.
fn voicemail_params(voicemail: &VoicemailConfig) -> Result<Voicemail, ConfigError> {
    if voicemail
        .message
        .as_ref()
        .is_some_and(|m| m.trim().is_empty())
    {
        return Err(invalid(
            "voicemail.message is empty: leave it out to hang up on a machine",
        ));
    }
    Ok(Voicemail {
        message: voicemail.message.clone(),
        ask_llm: voicemail.ask_llm,
    })
}

fn idle_params(idle: &IdleConfig) -> Result<IdleParams, ConfigError> {
    if !(idle.after_secs >= 1.0 && idle.after_secs <= 600.0) {
        return Err(invalid("idle.after_secs must be between 1 and 600"));
    }
    let line_ok = |line: &String| !line.trim().is_empty() && line.chars().count() <= 500;
    if idle.check_ins.len() > 10 || !idle.check_ins.iter().all(line_ok) {
        return Err(invalid(
            "idle.check_ins: at most 10 lines, each of 1 to 500 characters",
        ));
    }
    let goodbye = idle
        .goodbye
        .clone()
        .unwrap_or_else(|| IDLE_GOODBYE.to_owned());
    if !line_ok(&goodbye) {
        return Err(invalid("idle.goodbye must be 1 to 500 characters"));
    }
    Ok(IdleParams {
        after: Duration::from_secs_f64(idle.after_secs),
        check_ins: idle.check_ins.clone(),
        goodbye,
    })
}

/// The most `[transfer]` destinations a bot may have.
const MOST_DESTINATIONS: usize = 32;

/// `[transfer]`, checked: names a model can say, and numbers or `sip:` URIs.
fn destinations(
    transfer: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let Some(transfer) = transfer else {
        return Ok(Vec::new());
    };
    if transfer.is_empty() || transfer.len() > MOST_DESTINATIONS {
        return Err(invalid(format!(
            "[transfer]: 1 to {MOST_DESTINATIONS} destinations"
        )));
    }
    let plain = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b) || extra.contains(&b))
    };
    for (name, to) in transfer {
        if !plain(name, b"") {
            return Err(invalid(format!(
                "[transfer] {name:?}: a name of letters, digits, _ and -"
            )));
        }
        let address = match to.strip_prefix("sip:") {
            Some(uri) => uri
                .split_once('@')
                .is_some_and(|(user, host)| plain(user, b"+*#.") && plain(host, b".:[]")),
            None => plain(to, b"+*#."),
        };
        if !address {
            return Err(invalid(format!(
                "[transfer] {name} = {to:?}: a number or sip:user@host"
            )));
        }
    }
    Ok(transfer
        .iter()
        .map(|(name, to)| (name.clone(), to.clone()))
        .collect())
}

/// `[filler]`, checked.
fn filler_params(filler: &FillerConfig) -> Result<FillerParams, ConfigError> {
    let after = filler.after_secs.unwrap_or(1.5);
    if !(0.2..=30.0).contains(&after) {
        return Err(invalid("filler.after_secs must be between 0.2 and 30"));
    }
    let line_ok = |line: &String| !line.trim().is_empty() && line.chars().count() <= 200;
    if filler.lines.len() > 20 || !filler.lines.iter().all(line_ok) {
        return Err(invalid(
            "filler.lines: at most 20 lines, each of 1 to 200 characters",
        ));
    }
    Ok(FillerParams {
        after: Duration::from_secs_f64(after),
        lines: filler.lines.clone(),
        speak_progress: filler.speak_progress.unwrap_or(false),
    })
}

impl BotConfig {
    /// The bot these settings describe, every value checked. Provider keys come from the
    /// environment; MCP servers are described, not started ([`McpServer::start`]).
    pub fn resolve(&self) -> Result<BotOptions, ConfigError> {
        let defaults = BotOptions::default();
        let mut voice = self.voice.unwrap_or_default();
        let turn_timeout_secs = self
            .turn_timeout_secs
            .unwrap_or(defaults.turn_timeout.as_secs_f64());
        if !(turn_timeout_secs > 0.0 && turn_timeout_secs < 60.0) {
            return Err(invalid("the turn timeout must be between 0 and 60 seconds"));
        }
        let max_tokens = self.max_tokens.unwrap_or(defaults.max_tokens);
        if !(1..=2048).contains(&max_tokens) {
            return Err(invalid("max tokens must be between 1 and 2048"));
        }
        let max_context_tokens = self
            .max_context_tokens
            .unwrap_or(defaults.max_context_tokens);
        if !(1_000..=2_000_000).contains(&max_context_tokens) {
            return Err(invalid(
                "max context tokens must be between 1000 and 2000000",
            ));
        }
        let barge_in = self.barge_in(defaults.barge_in)?;
        if self
            .llm_temperature
            .is_some_and(|t| !(0.0..=2.0).contains(&t))
        {
            return Err(invalid("the LLM temperature must be between 0 and 2"));
        }
        let llm = self.llm_choice()?;
        let tts = match self.tts.as_deref() {
            None => vec![TtsChoice::Embedded],
            Some(spec) => tts_choice(
                spec,
                self.tts_model.clone(),
                self.tts_voice.clone(),
                &mut voice,
            )?,
        };
        let stt_spec = self.stt.as_deref().unwrap_or("whisper");
        if self
            .stt_prompt
            .as_deref()
            .is_some_and(|p| !p.trim().is_empty())
            && !stt_spec.split(',').any(|s| s.trim() == "whisper")
        {
            return Err(invalid(
                "stt_prompt is read by the embedded Whisper: list whisper in stt",
            ));
        }
        let stt = stt_choice(stt_spec, self.stt_model.clone())?;
        if self.greeting.is_some() && !matches!(llm, LlmChoice::Text(_)) {
            return Err(invalid(
                "a greeting is spoken by the TTS: it needs a text LLM, not a realtime one",
            ));
        }
        let idle = spoken_by_tts(
            &llm,
            self.idle.as_ref(),
            "idle check-ins are spoken by the TTS: they need",
            idle_params,
        )?;
        let voicemail = spoken_by_tts(
            &llm,
            self.voicemail.as_ref(),
            "[voicemail] is told apart before the turns: it needs",
            voicemail_params,
        )?;
        if voicemail.as_ref().is_some_and(|v| v.ask_llm)
            && matches!(&llm, LlmChoice::Text(llms) if matches!(llms.first(), Some(super::TextLlm::Local)))
        {
            tracing::warn!(
                "[voicemail] ask_llm with the embedded SmolLM2-135M: it is too small to read a \
                 greeting (it named no one in bench/telephony's calls); list a network LLM first"
            );
        }
        let filler = spoken_by_tts(
            &llm,
            self.filler.as_ref(),
            "a filler is spoken by the TTS: it needs",
            filler_params,
        )?;
        let (http_tools, mcp) = self.own_tools()?;
        let flow = self.flow()?;
        if self.summarize_context == Some(true) && !matches!(llm, LlmChoice::Text(_)) {
            return Err(invalid(
                "summarize_context folds a text LLM's conversation; a realtime provider keeps its own",
            ));
        }
        if let (Some(flow), LlmChoice::OpenAiRealtime(_) | LlmChoice::GeminiLive(_)) = (&flow, &llm)
            && let Some(gap) = flow.realtime_gap()
        {
            return Err(invalid(gap));
        }
        let options = BotOptions {
            name: self.name.clone(),
            llm,
            voice,
            turn_end: self.turn.unwrap_or_default(),
            turn_timeout: Duration::from_secs_f64(turn_timeout_secs),
            turn_words: self.turn_words.unwrap_or(defaults.turn_words),
            preemptive: self.preemptive.unwrap_or(defaults.preemptive),
            max_tokens,
            max_context_tokens,
            summarize_context: self.summarize_context.unwrap_or(false),
            function_call_report_level: self.function_call_report_level.unwrap_or_default(),
            record: self.record.unwrap_or(true),
            trace: self.trace.unwrap_or(true),
            barge_in,
            denoise: self.denoise.unwrap_or_default(),
            instructions: self.instructions()?.unwrap_or(defaults.instructions),
            greeting: self.greeting.clone(),
            idle,
            voicemail,
            placed_call: false,
            filler,
            prices: self
                .prices
                .iter()
                .fold(PriceTable::default(), |table, (model, price)| {
                    table.with(model.clone(), price.price())
                }),
            stt,
            stt_prompt: self.stt_prompt.clone(),
            tts,
            // A flow's nodes name the tools they offer: the built-in ones it names.
            builtin: self.builtin.clone().unwrap_or_else(|| match &flow {
                Some(flow) => Builtin::EVERY
                    .into_iter()
                    .filter(|b| {
                        let mut registry = crate::services::llm::FunctionRegistry::default();
                        super::tools::register(&mut registry, &[*b]);
                        registry
                            .direct_schemas()
                            .iter()
                            .any(|s| flow.names(&s.name))
                    })
                    .collect(),
                None => Builtin::ALL.to_vec(),
            }),
            flow,
            http_tools,
            transfer: destinations(self.transfer.as_ref())?,
            mcp,
            tool_examples: self.examples.iter().map(example).collect(),
            ..BotOptions::default()
        };
        options.check_tool_names().map_err(invalid)?;
        Ok(options)
    }

    /// The bot's flow, checked, if it has one.
    fn flow(&self) -> Result<Option<std::sync::Arc<Flow>>, ConfigError> {
        if self.nodes.is_empty() {
            return Ok(None);
        }
        let destinations = destinations(self.transfer.as_ref())?;
        let flow = Flow::new(
            &self.nodes,
            self.initial_node.as_deref(),
            self.context_strategy,
            &self.global_functions,
        )
        .and_then(|flow| flow.with_destinations(&destinations))
        .map_err(|e| match &self.flow_file {
            Some(file) => invalid(format!("{}: {e}", file.display())),
            None => invalid(e),
        })?;
        Ok(Some(std::sync::Arc::new(flow)))
    }

    /// When speech over the bot interrupts it.
    fn barge_in(&self, defaults: BargeIn) -> Result<BargeIn, ConfigError> {
        let resume_after = match self.resume_after_secs {
            None => None,
            Some(secs) if secs > 0.0 && secs < 30.0 => Some(Duration::from_secs_f64(secs)),
            Some(_) => return Err(invalid("the resume delay must be between 0 and 30 seconds")),
        };
        Ok(BargeIn {
            min_words: self.interrupt_min_words.unwrap_or(defaults.min_words),
            resume_after,
            pause_at_onset: self.pause_at_onset.unwrap_or(defaults.pause_at_onset),
            backchannels: self.backchannels.unwrap_or(defaults.backchannels),
        })
    }

    /// The bot's own tools: its HTTP tools and its MCP servers (described, not started).
    fn own_tools(&self) -> Result<(Vec<HttpTool>, Vec<McpServer>), ConfigError> {
        let http_tools = self
            .tools
            .iter()
            .map(|tool| HttpTool::new(tool).map_err(invalid))
            .collect::<Result<Vec<_>, _>>()?;
        let mcp = self
            .mcp
            .iter()
            .map(|server| McpServer::new(server).map_err(invalid))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((http_tools, mcp))
    }

    /// The instruction, from the text or the file.
    fn instructions(&self) -> Result<Option<String>, ConfigError> {
        match (&self.instructions, &self.instructions_file) {
            (Some(_), Some(_)) => Err(invalid("give instructions or instructions_file, not both")),
            (Some(text), None) => Ok(Some(text.clone())),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map(|text| Some(text.trim().to_owned()))
                .map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                }),
            (None, None) => Ok(None),
        }
    }

    /// The `llm` value: one realtime model, or text LLMs each the fallback of the one before.
    fn llm_choice(&self) -> Result<LlmChoice, ConfigError> {
        let spec = self.llm.as_deref().unwrap_or("local");
        let names: Vec<&str> = spec.split(',').map(str::trim).collect();
        match names[..] {
            ["openai-realtime"] => {
                let mut settings = OpenAiRealtimeSettings::from_env().map_err(setup)?;
                if std::env::var_os("OPENAI_REALTIME_URL").is_none()
                    && let Some(url) = &self.realtime_url
                {
                    settings.url = url.clone();
                }
                if let Some(model) = &self.realtime_model {
                    settings.model = model.clone();
                }
                return Ok(LlmChoice::OpenAiRealtime(settings));
            }
            ["gemini-live"] => {
                let mut settings = GeminiLiveSettings::from_env().map_err(setup)?;
                if std::env::var_os("GEMINI_LIVE_URL").is_none()
                    && let Some(url) = &self.realtime_url
                {
                    settings.url = url.clone();
                }
                if let Some(model) = &self.realtime_model {
                    settings.model = model.clone();
                }
                return Ok(LlmChoice::GeminiLive(settings));
            }
            _ => {}
        }
        let mut overrides = Overrides {
            model: self.llm_model.clone(),
            temperature: self.llm_temperature,
            ..Overrides::default()
        };
        let mut list = Vec::new();
        for name in names {
            if providers::REALTIME
                .iter()
                .any(|(realtime, _)| *realtime == name)
            {
                return Err(invalid(format!(
                    "llm {spec:?}: {name} listens and speaks itself and has no fallback list"
                )));
            }
            if !providers::LLM.iter().any(|p| p.name == name) {
                let realtime: Vec<&str> = providers::REALTIME.iter().map(|(n, _)| *n).collect();
                return Err(invalid(format!(
                    "llm {name:?}: use {} (a comma-separated list falls back from each to the \
                     next), {}",
                    providers::names(providers::LLM),
                    realtime.join(" or ")
                )));
            }
            let llm = ProviderSpec::build(providers::LLM, "llm", name, &mut overrides)?;
            if list.contains(&llm) {
                return Err(invalid(format!("llm {spec:?} names {name} twice")));
            }
            list.push(llm);
        }
        Ok(LlmChoice::Text(list))
    }
}

fn example(example: &ExampleConfig) -> ToolExample {
    match &example.call {
        Some(name) => ToolExample::call(
            &example.user,
            name,
            example
                .arguments
                .clone()
                .unwrap_or_else(|| serde_json::json!({})),
        ),
        None => ToolExample::words(&example.user),
    }
}

/// The `tts` value: voices, each the fallback of the one before. Naming an embedded voice
/// picks it as `voice`.
fn tts_choice(
    spec: &str,
    model: Option<String>,
    voice_id: Option<String>,
    voice: &mut Voice,
) -> Result<Vec<TtsChoice>, ConfigError> {
    let mut overrides = Overrides {
        model,
        voice_id,
        ..Overrides::default()
    };
    let mut list = Vec::new();
    for name in spec.split(',').map(str::trim) {
        let tts = ProviderSpec::build(providers::TTS, "tts", name, &mut overrides).map_err(
            |e| match e {
                ConfigError::Value(why) if !why.starts_with("tts ") => {
                    invalid(format!("tts {spec:?}: {why}"))
                }
                other => other,
            },
        )?;
        if list.contains(&tts) {
            return Err(invalid(format!("tts {spec:?} names {name} twice")));
        }
        list.push(tts);
    }
    if let Some(embedded) = overrides.embedded {
        *voice = embedded;
    }
    Ok(list)
}

/// The `stt` value: engines, each the fallback of the one before.
fn stt_choice(spec: &str, model: Option<String>) -> Result<Vec<SttChoice>, ConfigError> {
    let mut overrides = Overrides {
        model,
        ..Overrides::default()
    };
    let mut list = Vec::new();
    for name in spec.split(',').map(str::trim) {
        let stt = ProviderSpec::build(providers::STT, "stt", name, &mut overrides)?;
        if list.contains(&stt) {
            return Err(invalid(format!("stt {spec:?} names {name} twice")));
        }
        list.push(stt);
    }
    Ok(list)
}
