//! Deepgram Aura's streaming TTS (`wss://api.deepgram.com/v1/speak`): one socket per session.
//! Each sentence goes as `Speak`; the turn ends with one `Flush` (Deepgram allows 20 a minute),
//! answered by `Flushed`; an interruption sends `Clear`, and audio that comes before its
//! `Cleared` belongs to the cut turn and is dropped. Audio comes back in binary frames of
//! linear16 at 24 kHz, with no word timings: each sentence's words are timed from where the
//! turn's audio stands when it is sent, at a nominal speaking rate.
//!
//! [`AuraCore`] is sans-IO and runs on the shared WebSocket driver ([`crate::ws`]);
//! sentences not yet answered with audio are sent again on a new socket.

use std::time::Instant;

use serde::Deserialize;

use super::estimated_words;
use tokio::sync::mpsc;

use super::socket::{Command, SocketProvider, SocketVoice};
use super::stream::TtsEvent;
use crate::ws::{self, ConnectRequest, Message, ReconnectPolicy, Step, Tick, WsCore, WsError};

/// Deepgram's API, when `DEEPGRAM_URL` names no other host.
pub const DEFAULT_URL: &str = "wss://api.deepgram.com";
/// The voice model used when none is named.
pub const DEFAULT_MODEL: &str = "aura-2-thalia-en";
/// The rate asked for: the output's.
pub const SAMPLE_RATE: u32 = 24_000;

/// Where and how to speak.
#[derive(Debug, Clone, PartialEq)]
pub struct AuraSettings {
    /// Scheme and host; `/v1/speak` is appended.
    pub url: String,
    /// Sent as `Authorization: Token …`.
    pub api_key: voxide_core::secret::Secret,
    /// The voice model.
    pub model: String,
    /// Reconnection.
    pub reconnect: ReconnectPolicy,
}

impl AuraSettings {
    /// Settings for `api_key` with the defaults.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            url: DEFAULT_URL.to_owned(),
            api_key: voxide_core::secret::Secret::new(api_key),
            model: DEFAULT_MODEL.to_owned(),
            reconnect: ReconnectPolicy::default(),
        }
    }

    /// From `DEEPGRAM_API_KEY` (required) and `DEEPGRAM_URL`.
    pub fn from_env() -> Result<Self, WsError> {
        let key = crate::key_from_env("DEEPGRAM_API_KEY", "--tts deepgram")
            .map_err(WsError::Permanent)?;
        let mut settings = Self::new(key);
        if let Some(url) = crate::url_from_env("DEEPGRAM_URL") {
            settings.url = url;
        }
        Ok(settings)
    }
}

/// The engine: one socket per session, started on the first context (or a warm-up).
pub type AuraTts = SocketVoice<AuraSettings>;

impl SocketProvider for AuraSettings {
    const NAME: &'static str = "deepgram";

    fn model(&self) -> &str {
        &self.model
    }

    fn sample_rate(&self) -> u32 {
        SAMPLE_RATE
    }

    fn start(&self, commands: mpsc::Receiver<Command>, events: mpsc::Sender<(String, TtsEvent)>) {
        let core = AuraCore::new(self.clone());
        tokio::spawn(ws::drive(core, commands, events, self.reconnect.clone()));
    }
}

/// A message from the server.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum ServerMessage {
    /// Everything sent before the `Flush` has been spoken.
    Flushed,
    /// Everything before the `Clear` was dropped.
    Cleared,
    /// Something Deepgram will not do (too many flushes).
    Warning {
        #[serde(default)]
        description: String,
    },
    /// The socket's model and ids.
    Metadata,
    #[serde(other)]
    Other,
}

/// The turn being spoken.
#[derive(Debug)]
struct Turn {
    context: String,
    /// Sentences sent with no audio back yet: sent again on a new socket.
    unanswered: Vec<String>,
    flushed: bool,
    speaking: bool,
    /// Seconds of the turn's audio so far, and where the words timed so far end.
    audio_secs: f64,
    words_end: f64,
}

/// Deepgram Aura's protocol, sans-IO. Turns are spoken one after another; a turn's audio is
/// whatever arrives after its first `Speak` until its `Flushed`.
pub struct AuraCore {
    settings: AuraSettings,
    connected: bool,
    turn: Option<Turn>,
    /// `Clear`s not yet answered by `Cleared`: audio until then is the cut turn's.
    clearing: usize,
    gave_up: Option<String>,
}

impl AuraCore {
    /// A core that has not connected yet.
    pub fn new(settings: AuraSettings) -> Self {
        Self {
            settings,
            connected: false,
            turn: None,
            clearing: 0,
            gave_up: None,
        }
    }

    fn speak(text: &str) -> Message {
        Message::Text(
            serde_json::json!({"type": "Speak", "text": text})
                .to_string()
                .into(),
        )
    }

    fn control(kind: &str) -> Message {
        Message::Text(serde_json::json!({ "type": kind }).to_string().into())
    }

    fn send_now(&self, messages: Vec<Message>) -> Vec<Message> {
        if self.connected { messages } else { Vec::new() }
    }
    /// What a message from Aura says.
    fn heard(&mut self, message: Message) -> Vec<(String, TtsEvent)> {
        match message {
            Message::Binary(bytes) => {
                if self.clearing > 0 {
                    return Vec::new();
                }
                let Some(turn) = &mut self.turn else {
                    return Vec::new();
                };
                let samples: Vec<i16> = bytes
                    .chunks_exact(2)
                    .map(|b| i16::from_le_bytes([b[0], b[1]]))
                    .collect();
                if samples.is_empty() {
                    return Vec::new();
                }
                turn.speaking = true;
                turn.unanswered.clear();
                turn.audio_secs += samples.len() as f64 / f64::from(SAMPLE_RATE);
                vec![(turn.context.clone(), TtsEvent::Audio(samples))]
            }
            Message::Text(text) => {
                let Some(parsed) = crate::ws::read_wire::<ServerMessage>(
                    &text,
                    "Deepgram Aura",
                    "aura_unreadable_message",
                ) else {
                    return Vec::new();
                };
                match parsed {
                    ServerMessage::Cleared => {
                        self.clearing = self.clearing.saturating_sub(1);
                        Vec::new()
                    }
                    ServerMessage::Flushed if self.clearing == 0 => {
                        match self.turn.take_if(|t| t.flushed) {
                            Some(turn) => vec![(turn.context, TtsEvent::Done)],
                            None => Vec::new(),
                        }
                    }
                    ServerMessage::Warning { description } => {
                        voxide_core::warnings::warn(
                            "aura_warning",
                            format_args!("Deepgram Aura warned: {description}"),
                        );
                        Vec::new()
                    }
                    _ => Vec::new(),
                }
            }
            _ => Vec::new(),
        }
    }
}

impl WsCore for AuraCore {
    type Input = Command;
    type Output = (String, TtsEvent);

    fn request(&self) -> Result<ConnectRequest, WsError> {
        let url = format!(
            "{}/v1/speak?model={}&encoding=linear16&sample_rate={SAMPLE_RATE}",
            self.settings.url.trim_end_matches('/'),
            self.settings.model
        );
        let auth = format!("Token {}", self.settings.api_key.expose());
        ws::connect_request(&url, &[("Authorization", &auth)])
    }

    fn opened(&mut self, _now: Instant) -> Vec<Message> {
        self.connected = true;
        self.clearing = 0;
        let Some(turn) = &self.turn else {
            return Vec::new();
        };
        let mut out: Vec<Message> = turn.unanswered.iter().map(|t| Self::speak(t)).collect();
        if turn.flushed {
            out.push(Self::control("Flush"));
        }
        out
    }

    fn lost(&mut self, _now: Instant) -> Vec<(String, TtsEvent)> {
        self.connected = false;
        // A turn cut off mid-speech cannot be resumed on a new socket.
        match self.turn.take_if(|t| t.speaking) {
            Some(turn) => {
                let error = "Deepgram's connection was lost mid-sentence".to_owned();
                vec![(turn.context, TtsEvent::Error(error))]
            }
            None => Vec::new(),
        }
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
                let mut sent = Vec::new();
                if self.turn.as_ref().is_some_and(|t| t.context != context) {
                    // A new turn before the old one's cancel came (the two are sent from
                    // different tasks): the old one is over all the same.
                    self.turn = None;
                    if self.connected {
                        self.clearing += 1;
                        sent.push(Self::control("Clear"));
                    }
                }
                let turn = self.turn.get_or_insert_with(|| Turn {
                    context: context.clone(),
                    unanswered: Vec::new(),
                    flushed: false,
                    speaking: false,
                    audio_secs: 0.0,
                    words_end: 0.0,
                });
                if !turn.speaking {
                    turn.unanswered.push(text.clone());
                }
                let start = turn.audio_secs.max(turn.words_end);
                let words = estimated_words(&text, start);
                turn.words_end = words.last().map_or(start, |w| w.end_secs);
                let characters = text.chars().count() as u64;
                let said = vec![
                    (context.clone(), TtsEvent::Characters(characters)),
                    (
                        context,
                        TtsEvent::Words {
                            text: text.clone(),
                            words,
                        },
                    ),
                ];
                (self.send_now(vec![Self::speak(&text)]), said)
            }
            Command::Flush { context } => match &mut self.turn {
                Some(turn) if turn.context == context => {
                    turn.flushed = true;
                    (self.send_now(vec![Self::control("Flush")]), Vec::new())
                }
                // A turn with no text: nothing to speak.
                _ => (Vec::new(), vec![(context, TtsEvent::Done)]),
            },
            Command::Cancel { context } => {
                if self.turn.as_ref().is_some_and(|t| t.context == context) {
                    self.turn = None;
                    if self.connected {
                        self.clearing += 1;
                        return (vec![Self::control("Clear")], Vec::new());
                    }
                }
                (Vec::new(), Vec::new())
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
        vec![Self::control("Close")]
    }

    fn failed(&mut self, error: &WsError) -> Vec<(String, TtsEvent)> {
        let reason = format!("Deepgram Aura: {error}");
        self.gave_up = Some(reason.clone());
        self.turn
            .take()
            .map(|turn| (turn.context, TtsEvent::Failed(reason)))
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(context: &str, text: &str) -> Command {
        Command::Text {
            context: context.into(),
            text: text.into(),
        }
    }

    fn audio(samples: usize) -> Message {
        Message::Binary(vec![0u8; samples * 2].into())
    }

    #[test]
    fn a_turn_is_spoken_then_flushed_once() {
        let now = Instant::now();
        let mut core = AuraCore::new(AuraSettings::new("k"));
        core.opened(now);
        let (sent, said) = core.input(text("a", "Hello there."), now);
        assert_eq!(sent, vec![AuraCore::speak("Hello there.")]);
        assert!(matches!(&said[1].1, TtsEvent::Words { words, .. } if words.len() == 2));
        assert_eq!(core.message(audio(2_400), now).expect("audio").1.len(), 1);
        let (sent, _) = core.input(
            Command::Flush {
                context: "a".into(),
            },
            now,
        );
        assert_eq!(sent, vec![AuraCore::control("Flush")]);
        let done = core
            .message(
                Message::Text(r#"{"type":"Flushed","sequence_id":0}"#.into()),
                now,
            )
            .expect("valid");
        assert_eq!(done.1, vec![("a".to_owned(), TtsEvent::Done)]);
    }

    #[test]
    fn audio_before_cleared_belongs_to_the_cut_turn() {
        let now = Instant::now();
        let mut core = AuraCore::new(AuraSettings::new("k"));
        core.opened(now);
        core.input(text("a", "This is cut short."), now);
        let (sent, _) = core.input(
            Command::Cancel {
                context: "a".into(),
            },
            now,
        );
        assert_eq!(sent, vec![AuraCore::control("Clear")]);
        core.input(text("b", "Yes?"), now);
        assert!(core.message(audio(480), now).expect("audio").1.is_empty());
        core.message(
            Message::Text(r#"{"type":"Cleared","sequence_id":1}"#.into()),
            now,
        )
        .expect("valid");
        let heard = core.message(audio(480), now).expect("audio").1;
        assert_eq!(heard[0].0, "b");
    }

    #[test]
    fn unanswered_sentences_go_again_on_a_new_socket() {
        let now = Instant::now();
        let mut core = AuraCore::new(AuraSettings::new("k"));
        core.input(text("a", "Nothing is lost."), now);
        core.input(
            Command::Flush {
                context: "a".into(),
            },
            now,
        );
        assert!(core.lost(now).is_empty());
        let sent = core.opened(now);
        assert_eq!(
            sent,
            vec![
                AuraCore::speak("Nothing is lost."),
                AuraCore::control("Flush")
            ]
        );
    }
}
