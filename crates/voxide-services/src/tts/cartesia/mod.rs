//! Cartesia's streaming TTS over its WebSocket (`wss://api.cartesia.ai/tts/websocket`): one
//! socket per session, one Cartesia context per assistant turn. Each sentence goes with
//! `continue: true`; the turn's flush is an empty transcript with `continue: false`, answered by
//! `done`; an interruption sends `cancel`, and whatever still comes for that context is dropped.
//! Audio is raw 16-bit PCM at the output rate; word timestamps come with it.
//!
//! [`CartesiaCore`] is sans-IO and runs on the shared WebSocket driver ([`crate::ws`]).
//! Text a context sent that has not been answered with audio is sent again on the next socket,
//! so a socket that dies between the text and its first audio (or Cartesia's five-minute idle
//! close) loses no words; a context already speaking when its socket dies ends with an error,
//! and none of its unplayed words count as spoken.

mod wire;

use std::collections::HashMap;
use std::time::Instant;

use super::WordTiming;
use tokio::sync::mpsc;

use super::socket::{Command, SocketProvider, SocketVoice};
use super::stream::TtsEvent;
use crate::ws::{self, ConnectRequest, Message, ReconnectPolicy, Step, Tick, WsCore, WsError};
use wire::ServerMessage;

/// Cartesia's API, when `CARTESIA_URL` names no other host.
pub const DEFAULT_URL: &str = "wss://api.cartesia.ai";
/// The API version every socket names.
pub const API_VERSION: &str = "2026-03-01";
/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "sonic-3.5";
/// The voice used when none is named (Cartesia's "Barbershop Man").
pub const DEFAULT_VOICE: &str = "a0e99841-438c-4a64-b679-ae501e7d6091";
/// The rate asked for: the output's, so nothing is resampled.
pub const SAMPLE_RATE: u32 = 24_000;

/// Where and how to speak.
#[derive(Debug, Clone, PartialEq)]
pub struct CartesiaSettings {
    /// Scheme and host; `/tts/websocket` is appended.
    pub url: String,
    /// Sent as `X-API-Key`.
    pub api_key: voxide_core::secret::Secret,
    /// The model.
    pub model: String,
    /// The voice's id.
    pub voice: String,
    /// The language.
    pub language: String,
    /// Reconnection.
    pub reconnect: ReconnectPolicy,
}

impl CartesiaSettings {
    /// Settings for `api_key` with the defaults.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            url: DEFAULT_URL.to_owned(),
            api_key: voxide_core::secret::Secret::new(api_key),
            model: DEFAULT_MODEL.to_owned(),
            voice: DEFAULT_VOICE.to_owned(),
            language: "en".to_owned(),
            reconnect: ReconnectPolicy::default(),
        }
    }

    /// From `CARTESIA_API_KEY` (required) and `CARTESIA_URL`.
    pub fn from_env() -> Result<Self, WsError> {
        let key = crate::key_from_env("CARTESIA_API_KEY", "--tts cartesia")
            .map_err(WsError::Permanent)?;
        let mut settings = Self::new(key);
        if let Some(url) = crate::url_from_env("CARTESIA_URL") {
            settings.url = url;
        }
        Ok(settings)
    }
}

/// The engine: one socket per session, started on the first context (or a warm-up).
pub type CartesiaTts = SocketVoice<CartesiaSettings>;

impl SocketProvider for CartesiaSettings {
    const NAME: &'static str = "cartesia";

    fn model(&self) -> &str {
        &self.model
    }

    fn sample_rate(&self) -> u32 {
        SAMPLE_RATE
    }

    fn start(&self, commands: mpsc::Receiver<Command>, events: mpsc::Sender<(String, TtsEvent)>) {
        let core = CartesiaCore::new(self.clone());
        tokio::spawn(ws::drive(core, commands, events, self.reconnect.clone()));
    }
}

/// One context's state in the core.
#[derive(Debug, Default)]
struct Context {
    /// Sentences sent with no audio back yet: sent again on a new socket.
    unanswered: Vec<String>,
    flushed: bool,
    speaking: bool,
}

/// Cartesia's protocol, sans-IO.
pub struct CartesiaCore {
    settings: CartesiaSettings,
    connected: bool,
    contexts: HashMap<String, Context>,
    /// The driver gave up, for this reason: every context fails at once.
    gave_up: Option<String>,
}

impl CartesiaCore {
    /// A core that has not connected yet.
    pub fn new(settings: CartesiaSettings) -> Self {
        Self {
            settings,
            connected: false,
            contexts: HashMap::new(),
            gave_up: None,
        }
    }

    fn generate(&self, context: &str, text: &str, more: bool) -> Message {
        let message = wire::Generate {
            model_id: &self.settings.model,
            transcript: text,
            voice: wire::Voice {
                mode: "id",
                id: &self.settings.voice,
            },
            language: &self.settings.language,
            context_id: context,
            more,
            output_format: wire::OutputFormat {
                container: "raw",
                encoding: "pcm_s16le",
                sample_rate: SAMPLE_RATE,
            },
            add_timestamps: true,
            max_buffer_delay_ms: 0,
        };
        Message::Text(serde_json::json!(message).to_string().into())
    }
    /// Audio for a context: it is speaking now.
    fn chunk(&mut self, context_id: String, data: &str) -> Vec<(String, TtsEvent)> {
        let Some(state) = self.contexts.get_mut(&context_id) else {
            return Vec::new();
        };
        state.speaking = true;
        state.unanswered.clear();
        match crate::pcm_from_base64(data) {
            Ok(samples) if !samples.is_empty() => vec![(context_id, TtsEvent::Audio(samples))],
            Ok(_) => Vec::new(),
            Err(e) => {
                voxide_core::warnings::warn(
                    "cartesia_bad_audio",
                    format_args!("Cartesia audio that is not base64 PCM was skipped: {e}"),
                );
                Vec::new()
            }
        }
    }

    /// An error: the context it names fails; one naming none is logged.
    fn error(&mut self, context_id: Option<String>, text: &str) -> Vec<(String, TtsEvent)> {
        match context_id {
            Some(id) if self.contexts.remove(&id).is_some() => {
                vec![(id, TtsEvent::Error(format!("Cartesia: {text}")))]
            }
            _ => {
                voxide_core::warnings::warn(
                    "cartesia_error",
                    format_args!("Cartesia reported an error: {text}"),
                );
                Vec::new()
            }
        }
    }

    /// What a message from Cartesia says.
    fn heard(&mut self, message: Message) -> Vec<(String, TtsEvent)> {
        let Message::Text(text) = message else {
            return Vec::new();
        };
        let Some(parsed) =
            crate::ws::read_wire::<ServerMessage>(&text, "Cartesia", "cartesia_unreadable_message")
        else {
            return Vec::new();
        };
        match parsed {
            ServerMessage::Chunk { context_id, data } => self.chunk(context_id, &data),
            ServerMessage::Timestamps {
                context_id,
                word_timestamps,
            } if self.contexts.contains_key(&context_id) => {
                let words: Vec<WordTiming> = word_timestamps
                    .words
                    .iter()
                    .zip(&word_timestamps.start)
                    .zip(&word_timestamps.end)
                    .map(|((word, start), end)| WordTiming {
                        word: word.clone(),
                        start_secs: *start,
                        end_secs: *end,
                    })
                    .collect();
                let text = word_timestamps.words.join(" ");
                vec![(context_id, TtsEvent::Words { text, words })]
            }
            ServerMessage::Done { context_id } if self.contexts.remove(&context_id).is_some() => {
                vec![(context_id, TtsEvent::Done)]
            }
            ServerMessage::Error {
                context_id,
                title,
                message,
                error,
            } => {
                let text = [title, message, error]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(": ");
                self.error(context_id, &text)
            }
            _ => Vec::new(),
        }
    }
}

impl WsCore for CartesiaCore {
    type Input = Command;
    type Output = (String, TtsEvent);

    fn request(&self) -> Result<ConnectRequest, WsError> {
        let url = format!("{}/tts/websocket", self.settings.url.trim_end_matches('/'));
        ws::connect_request(
            &url,
            &[
                ("X-API-Key", self.settings.api_key.expose()),
                ("Cartesia-Version", API_VERSION),
            ],
        )
    }

    fn opened(&mut self, _now: Instant) -> Vec<Message> {
        self.connected = true;
        let mut out = Vec::new();
        for (id, context) in &self.contexts {
            for text in &context.unanswered {
                out.push(self.generate(id, text, true));
            }
            if context.flushed {
                out.push(self.generate(id, "", false));
            }
        }
        out
    }

    fn lost(&mut self, _now: Instant) -> Vec<(String, TtsEvent)> {
        self.connected = false;
        // A context cut off mid-speech cannot be resumed on a new socket; one not yet answered
        // is sent again there.
        let cut: Vec<String> = self
            .contexts
            .iter()
            .filter(|(_, c)| c.speaking)
            .map(|(id, _)| id.clone())
            .collect();
        cut.into_iter()
            .map(|id| {
                self.contexts.remove(&id);
                let error = "Cartesia's connection was lost mid-sentence".to_owned();
                (id, TtsEvent::Error(error))
            })
            .collect()
    }

    fn input(
        &mut self,
        command: Command,
        _now: Instant,
    ) -> (Vec<Message>, Vec<(String, TtsEvent)>) {
        if let Some(reason) = &self.gave_up {
            return match command {
                Command::Text { context, .. } | Command::Flush { context } => (
                    Vec::new(),
                    vec![(context, TtsEvent::Failed(reason.clone()))],
                ),
                Command::Cancel { .. } => (Vec::new(), Vec::new()),
            };
        }
        match command {
            Command::Text { context, text } => {
                let message = self.generate(&context, &text, true);
                let characters = text.chars().count() as u64;
                let state = self.contexts.entry(context.clone()).or_default();
                if !state.speaking {
                    state.unanswered.push(text);
                }
                let said = vec![(context, TtsEvent::Characters(characters))];
                (
                    if self.connected {
                        vec![message]
                    } else {
                        Vec::new()
                    },
                    said,
                )
            }
            Command::Flush { context } => {
                let message = self.generate(&context, "", false);
                self.contexts.entry(context).or_default().flushed = true;
                (
                    if self.connected {
                        vec![message]
                    } else {
                        Vec::new()
                    },
                    Vec::new(),
                )
            }
            Command::Cancel { context } => {
                self.contexts.remove(&context);
                let cancel = wire::Cancel {
                    context_id: &context,
                    cancel: true,
                };
                let message = Message::Text(serde_json::json!(cancel).to_string().into());
                (
                    if self.connected {
                        vec![message]
                    } else {
                        Vec::new()
                    },
                    Vec::new(),
                )
            }
        }
    }

    fn message(
        &mut self,
        message: Message,
        _now: Instant,
    ) -> Result<Step<(String, TtsEvent)>, WsError> {
        Ok((Vec::new(), self.heard(message)))
    }

    fn tick(&mut self, _now: Instant) -> (Tick, Vec<(String, TtsEvent)>) {
        (Tick::default(), Vec::new())
    }

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn closing(&mut self) -> Vec<Message> {
        Vec::new()
    }

    fn failed(&mut self, error: &WsError) -> Vec<(String, TtsEvent)> {
        let reason = format!("Cartesia: {error}");
        self.gave_up = Some(reason.clone());
        self.contexts
            .drain()
            .map(|(id, _)| (id, TtsEvent::Failed(reason.clone())))
            .collect()
    }
}
