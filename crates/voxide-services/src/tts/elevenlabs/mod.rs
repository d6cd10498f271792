//! ElevenLabs' streaming TTS over its multi-context WebSocket
//! (`wss://api.elevenlabs.io/v1/text-to-speech/{voice}/multi-stream-input`): one socket per
//! session, one ElevenLabs context per assistant turn. A context opens with a single space (the
//! socket's first message also carries the voice settings, which ElevenLabs takes only once per
//! socket), each sentence follows, and the turn ends with `flush` and `close_context`, answered
//! by the context's `isFinal`. An interruption sends `close_context`, and what still comes for
//! that context is dropped. Audio is 16-bit PCM at 24 kHz with per-character times, relative to
//! each message's audio, from which the words are timed.
//!
//! [`ElevenLabsCore`] is sans-IO and runs on the shared WebSocket driver
//! ([`crate::ws`]). ElevenLabs allows five open contexts per socket and counts a
//! closed one until its `isFinal`: a sixth waits for a slot, so rapid barge-ins never exceed the
//! cap. A closed context whose `isFinal` never comes is given up after [`DONE_WATCHDOG`]. Text
//! not yet answered with audio is sent again on a new socket.

mod wire;

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::WordTiming;
use super::socket::{Command, SocketProvider, SocketVoice};
use super::stream::TtsEvent;
use crate::ws::{self, ConnectRequest, Message, ReconnectPolicy, Step, Tick, WsCore, WsError};
use wire::ServerMessage;

/// ElevenLabs' API, when `ELEVENLABS_URL` names no other host.
pub const DEFAULT_URL: &str = "wss://api.elevenlabs.io";
/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "eleven_flash_v2_5";
/// The voice used when none is named (ElevenLabs' premade "Rachel").
pub const DEFAULT_VOICE: &str = "21m00Tcm4TlvDq8ikWAM";
/// The rate asked for (`pcm_24000`).
pub const SAMPLE_RATE: u32 = 24_000;
/// Contexts ElevenLabs lets one socket have open.
pub const MAX_CONTEXTS: usize = 5;
/// A closed context that hears nothing for this long is taken as ended.
pub const DONE_WATCHDOG: Duration = Duration::from_secs(10);
/// An open context is kept alive this often (ElevenLabs closes one idle for 20 s).
const KEEPALIVE_EVERY: Duration = Duration::from_secs(10);

/// Where and how to speak.
#[derive(Debug, Clone, PartialEq)]
pub struct ElevenLabsSettings {
    /// Scheme and host; the documented path is appended.
    pub url: String,
    /// Sent as `xi-api-key`.
    pub api_key: voxide_core::secret::Secret,
    /// The model.
    pub model: String,
    /// The voice's id.
    pub voice: String,
    /// Reconnection.
    pub reconnect: ReconnectPolicy,
}

impl ElevenLabsSettings {
    /// Settings for `api_key` with the defaults.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            url: DEFAULT_URL.to_owned(),
            api_key: voxide_core::secret::Secret::new(api_key),
            model: DEFAULT_MODEL.to_owned(),
            voice: DEFAULT_VOICE.to_owned(),
            reconnect: ReconnectPolicy::default(),
        }
    }

    /// From `ELEVENLABS_API_KEY` (required) and `ELEVENLABS_URL`.
    pub fn from_env() -> Result<Self, WsError> {
        let key = crate::key_from_env("ELEVENLABS_API_KEY", "--tts elevenlabs")
            .map_err(WsError::Permanent)?;
        let mut settings = Self::new(key);
        if let Some(url) = crate::url_from_env("ELEVENLABS_URL") {
            settings.url = url;
        }
        Ok(settings)
    }

    /// The socket's URL with its query: whole sentences go in, so ElevenLabs' `auto_mode`
    /// speaks each as it comes instead of waiting for a chunk schedule.
    pub fn socket_url(&self) -> String {
        format!(
            "{}/v1/text-to-speech/{}/multi-stream-input?model_id={}&output_format=pcm_{SAMPLE_RATE}\
             &auto_mode=true&inactivity_timeout=180",
            self.url.trim_end_matches('/'),
            self.voice,
            self.model,
        )
    }
}

/// The engine: one socket per session, started on the first context (or a warm-up).
pub type ElevenLabsTts = SocketVoice<ElevenLabsSettings>;

impl SocketProvider for ElevenLabsSettings {
    const NAME: &'static str = "elevenlabs";

    fn model(&self) -> &str {
        &self.model
    }

    fn sample_rate(&self) -> u32 {
        SAMPLE_RATE
    }

    fn start(&self, commands: mpsc::Receiver<Command>, events: mpsc::Sender<(String, TtsEvent)>) {
        let core = ElevenLabsCore::new(self.clone());
        tokio::spawn(ws::drive(core, commands, events, self.reconnect.clone()));
    }
}

/// One context's state in the core.
#[derive(Debug)]
struct Context {
    id: String,
    /// Sentences with no audio back yet: sent when the context opens on a socket.
    unanswered: Vec<String>,
    /// Opened on the current socket (it holds one of the five slots until its `isFinal`).
    open: bool,
    flushed: bool,
    /// Dropped by the service: only its `isFinal` is awaited.
    cancelled: bool,
    speaking: bool,
    /// Audio received, in samples: where the next message's alignment starts.
    audio_samples: usize,
    /// The last time anything was sent for it or heard of it.
    active: Instant,
}

/// ElevenLabs' protocol, sans-IO.
pub struct ElevenLabsCore {
    settings: ElevenLabsSettings,
    connected: bool,
    /// The voice settings went in this socket's first message.
    configured: bool,
    /// In the order they were opened.
    contexts: Vec<Context>,
    /// The driver gave up, for this reason: every context fails at once.
    gave_up: Option<String>,
}

impl ElevenLabsCore {
    /// A core that has not connected yet.
    pub fn new(settings: ElevenLabsSettings) -> Self {
        Self {
            settings,
            connected: false,
            configured: false,
            contexts: Vec::new(),
            gave_up: None,
        }
    }

    fn json(value: impl serde::Serialize) -> Message {
        Message::Text(serde_json::json!(value).to_string().into())
    }

    fn text(context: &str, text: &str) -> Message {
        // ElevenLabs wants each piece to end in a space.
        let text = format!("{} ", text.trim_end());
        Self::json(wire::Text {
            text: &text,
            context_id: context,
        })
    }

    fn close(context: &str) -> Vec<Message> {
        vec![
            Self::json(wire::Flush {
                context_id: context,
                flush: true,
            }),
            Self::json(wire::CloseContext {
                context_id: context,
                close_context: true,
            }),
        ]
    }

    fn find(&mut self, id: &str) -> Option<&mut Context> {
        self.contexts.iter_mut().find(|c| c.id == id)
    }

    fn open_count(&self) -> usize {
        self.contexts.iter().filter(|c| c.open).count()
    }

    /// Opens every waiting context a slot allows, in order: its init, its text so far, and its
    /// close if the turn is all in.
    fn open_waiting(&mut self, now: Instant) -> Vec<Message> {
        if !self.connected {
            return Vec::new();
        }
        let mut free = MAX_CONTEXTS.saturating_sub(self.open_count());
        let mut out = Vec::new();
        for context in self.contexts.iter_mut().filter(|c| !c.open && !c.cancelled) {
            if free == 0 {
                break;
            }
            free -= 1;
            let voice_settings = (!self.configured).then_some(wire::VoiceSettings {
                stability: 0.5,
                similarity_boost: 0.8,
                speed: 1.0,
            });
            self.configured = true;
            out.push(Self::json(wire::Init {
                text: " ",
                context_id: &context.id,
                voice_settings,
            }));
            out.extend(
                context
                    .unanswered
                    .iter()
                    .map(|t| Self::text(&context.id, t)),
            );
            if context.flushed {
                out.extend(Self::close(&context.id));
            }
            context.open = true;
            context.active = now;
        }
        out
    }

    /// What a message from ElevenLabs says, and what a freed slot lets go.
    fn heard(&mut self, message: Message, now: Instant) -> Step<(String, TtsEvent)> {
        let Message::Text(text) = message else {
            return (Vec::new(), Vec::new());
        };
        let Some(parsed) = crate::ws::read_wire::<ServerMessage>(
            &text,
            "ElevenLabs",
            "elevenlabs_unreadable_message",
        ) else {
            return (Vec::new(), Vec::new());
        };
        let Some(id) = parsed.context_id.clone() else {
            if let Some(error) = parsed.error.or(parsed.message) {
                voxide_core::warnings::warn(
                    "elevenlabs_error",
                    format_args!("ElevenLabs reported an error: {error}"),
                );
            }
            return (Vec::new(), Vec::new());
        };
        let Some(context) = self.find(&id) else {
            return (Vec::new(), Vec::new());
        };
        context.active = now;
        let mut said = Vec::new();
        if !context.cancelled {
            if let Some(audio) = parsed.audio.as_deref().filter(|a| !a.is_empty()) {
                match crate::pcm_from_base64(audio) {
                    Ok(samples) if !samples.is_empty() => {
                        let offset = context.audio_samples as f64 / f64::from(SAMPLE_RATE);
                        if let Some(alignment) = &parsed.alignment {
                            let words = words(alignment, offset);
                            if !words.is_empty() {
                                let text = words
                                    .iter()
                                    .map(|w| w.word.as_str())
                                    .collect::<Vec<_>>()
                                    .join(" ");
                                said.push((id.clone(), TtsEvent::Words { text, words }));
                            }
                        }
                        context.speaking = true;
                        context.unanswered.clear();
                        context.audio_samples += samples.len();
                        said.push((id.clone(), TtsEvent::Audio(samples)));
                    }
                    Ok(_) => {}
                    Err(e) => voxide_core::warnings::warn(
                        "elevenlabs_bad_audio",
                        format_args!("ElevenLabs audio that is not base64 PCM was skipped: {e}"),
                    ),
                }
            }
            if let Some(error) = parsed.error.or(parsed.message) {
                said.push((id.clone(), TtsEvent::Error(format!("ElevenLabs: {error}"))));
                context.cancelled = true;
            }
        }
        if parsed.is_final != Some(true) {
            return (Vec::new(), said);
        }
        // The context is over and its slot free.
        let Some(index) = self.contexts.iter().position(|c| c.id == id) else {
            return (Vec::new(), said);
        };
        let context = self.contexts.remove(index);
        if !context.cancelled {
            let event = if context.flushed {
                TtsEvent::Done
            } else {
                TtsEvent::Error("ElevenLabs closed the context before its text was all in".into())
            };
            said.push((id, event));
        }
        (self.open_waiting(now), said)
    }
}

/// The words of an alignment, timed from `offset` seconds (where this message's audio starts in
/// the context's).
fn words(alignment: &wire::Alignment, offset: f64) -> Vec<WordTiming> {
    let mut words = Vec::new();
    let mut current: Option<WordTiming> = None;
    let timed = alignment
        .chars
        .iter()
        .zip(&alignment.starts_ms)
        .zip(&alignment.durations_ms);
    for ((ch, start), duration) in timed {
        let start = offset + start / 1000.0;
        let end = start + duration / 1000.0;
        if ch.trim().is_empty() {
            words.extend(current.take());
            continue;
        }
        match &mut current {
            Some(word) => {
                word.word.push_str(ch);
                word.end_secs = end;
            }
            None => {
                current = Some(WordTiming {
                    word: ch.clone(),
                    start_secs: start,
                    end_secs: end,
                });
            }
        }
    }
    words.extend(current);
    words
}

impl WsCore for ElevenLabsCore {
    type Input = Command;
    type Output = (String, TtsEvent);

    fn request(&self) -> Result<ConnectRequest, WsError> {
        ws::connect_request(
            &self.settings.socket_url(),
            &[("xi-api-key", self.settings.api_key.expose())],
        )
    }

    fn opened(&mut self, now: Instant) -> Vec<Message> {
        self.connected = true;
        self.configured = false;
        self.open_waiting(now)
    }

    fn lost(&mut self, _now: Instant) -> Vec<(String, TtsEvent)> {
        self.connected = false;
        // Cancelled contexts are gone with the socket; one cut off mid-speech cannot be resumed;
        // one not yet answered opens again on the next socket.
        let mut said = Vec::new();
        self.contexts.retain_mut(|context| {
            if context.cancelled {
                return false;
            }
            if context.speaking {
                let error = "ElevenLabs' connection was lost mid-sentence".to_owned();
                said.push((context.id.clone(), TtsEvent::Error(error)));
                return false;
            }
            context.open = false;
            true
        });
        said
    }

    fn input(&mut self, command: Command, now: Instant) -> Step<(String, TtsEvent)> {
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
            Command::Text { context: id, text } => {
                let characters = text.chars().count() as u64;
                let said = vec![(id.clone(), TtsEvent::Characters(characters))];
                if self.find(&id).is_none() {
                    self.contexts.push(Context {
                        id: id.clone(),
                        unanswered: Vec::new(),
                        open: false,
                        flushed: false,
                        cancelled: false,
                        speaking: false,
                        audio_samples: 0,
                        active: now,
                    });
                }
                let connected = self.connected;
                let Some(context) = self.find(&id) else {
                    return (Vec::new(), said);
                };
                context.active = now;
                let send = (connected && context.open).then(|| Self::text(&id, &text));
                if !context.speaking {
                    context.unanswered.push(text);
                }
                match send {
                    Some(message) => (vec![message], said),
                    None => (self.open_waiting(now), said),
                }
            }
            Command::Flush { context: id } => {
                let connected = self.connected;
                let Some(context) = self.find(&id) else {
                    // A turn with no text: nothing to speak.
                    return (Vec::new(), vec![(id, TtsEvent::Done)]);
                };
                context.flushed = true;
                context.active = now;
                if connected && context.open {
                    (Self::close(&id), Vec::new())
                } else {
                    (Vec::new(), Vec::new())
                }
            }
            Command::Cancel { context: id } => {
                let connected = self.connected;
                let Some(context) = self.find(&id) else {
                    return (Vec::new(), Vec::new());
                };
                if !(connected && context.open) {
                    // It never reached ElevenLabs.
                    self.contexts.retain(|c| c.id != id);
                    return (Vec::new(), Vec::new());
                }
                context.cancelled = true;
                context.active = now;
                let close = wire::CloseContext {
                    context_id: &id,
                    close_context: true,
                };
                (vec![Self::json(close)], Vec::new())
            }
        }
    }

    fn message(
        &mut self,
        message: Message,
        now: Instant,
    ) -> Result<Step<(String, TtsEvent)>, WsError> {
        Ok(self.heard(message, now))
    }

    fn tick(&mut self, now: Instant) -> (Tick, Vec<(String, TtsEvent)>) {
        let mut tick = Tick::default();
        let mut said = Vec::new();
        let mut freed = false;
        self.contexts.retain_mut(|context| {
            if !context.open {
                return true;
            }
            let idle = now.duration_since(context.active);
            if context.cancelled || context.flushed {
                if idle < DONE_WATCHDOG {
                    return true;
                }
                // Its `isFinal` never came: the slot is taken back.
                freed = true;
                if !context.cancelled {
                    voxide_core::warnings::warn(
                        "elevenlabs_no_final",
                        "ElevenLabs never ended a closed context; it counts as ended",
                    );
                    let error = "ElevenLabs did not finish the turn".to_owned();
                    said.push((context.id.clone(), TtsEvent::Error(error)));
                }
                return false;
            }
            if idle >= KEEPALIVE_EVERY {
                context.active = now;
                tick.send.push(Self::json(wire::Text {
                    text: "",
                    context_id: &context.id,
                }));
            }
            true
        });
        if freed {
            tick.send.extend(self.open_waiting(now));
        }
        (tick, said)
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.contexts
            .iter()
            .filter(|c| c.open)
            .map(|c| {
                c.active
                    + if c.cancelled || c.flushed {
                        DONE_WATCHDOG
                    } else {
                        KEEPALIVE_EVERY
                    }
            })
            .min()
    }

    fn closing(&mut self) -> Vec<Message> {
        vec![Self::json(wire::CloseSocket { close_socket: true })]
    }

    fn failed(&mut self, error: &WsError) -> Vec<(String, TtsEvent)> {
        let reason = format!("ElevenLabs: {error}");
        self.gave_up = Some(reason.clone());
        self.contexts
            .drain(..)
            .filter(|c| !c.cancelled)
            .map(|c| (c.id, TtsEvent::Failed(reason.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn text(context: &str, text: &str) -> Command {
        Command::Text {
            context: context.into(),
            text: text.into(),
        }
    }

    fn sent(messages: &[Message]) -> Vec<serde_json::Value> {
        messages
            .iter()
            .map(|m| match m {
                Message::Text(t) => serde_json::from_str(t).expect("JSON"),
                other => panic!("text only: {other:?}"),
            })
            .collect()
    }

    fn audio(context: &str, samples: usize, chars: &str, starts_key: &str) -> Message {
        let pcm: Vec<u8> = vec![0; samples * 2];
        let chars: Vec<String> = chars.chars().map(String::from).collect();
        let starts: Vec<f64> = (0..chars.len()).map(|i| i as f64 * 50.0).collect();
        let durations: Vec<f64> = vec![50.0; chars.len()];
        Message::Text(
            serde_json::json!({"audio": base64::engine::general_purpose::STANDARD.encode(pcm),
                "isFinal": null, "contextId": context,
                "alignment": {"chars": chars, starts_key: starts, "charDurationsMs": durations}})
            .to_string()
            .into(),
        )
    }

    fn final_for(context: &str) -> Message {
        Message::Text(
            serde_json::json!({"isFinal": true, "context_id": context})
                .to_string()
                .into(),
        )
    }

    #[test]
    fn voice_settings_go_once_per_socket_and_a_turn_ends_with_flush_and_close() {
        let now = Instant::now();
        let mut core = ElevenLabsCore::new(ElevenLabsSettings::new("k"));
        assert!(core.opened(now).is_empty());
        let first = sent(&core.input(text("a", "Hello there."), now).0);
        assert_eq!(first[0]["text"], " ");
        assert!(first[0]["voice_settings"].is_object());
        assert_eq!(first[1]["text"], "Hello there. ");
        let flush = sent(
            &core
                .input(
                    Command::Flush {
                        context: "a".into(),
                    },
                    now,
                )
                .0,
        );
        assert_eq!(flush[0]["flush"], true);
        assert_eq!(flush[1]["close_context"], true);
        let (_, said) = core.message(final_for("a"), now).expect("valid");
        assert_eq!(said, vec![("a".to_owned(), TtsEvent::Done)]);
        let second = sent(&core.input(text("b", "Yes."), now).0);
        assert!(second[0].get("voice_settings").is_none(), "{second:?}");
        // A new socket takes them again.
        core.lost(now);
        let again = sent(&core.opened(now));
        assert!(again[0]["voice_settings"].is_object());
        assert_eq!(again[1]["text"], "Yes. ");
    }

    #[test]
    fn word_times_run_on_across_messages_with_either_spelling_of_the_keys() {
        let now = Instant::now();
        let mut core = ElevenLabsCore::new(ElevenLabsSettings::new("k"));
        core.opened(now);
        core.input(text("a", "Hi you. Bye."), now);
        let (_, said) = core
            .message(audio("a", 12_000, "Hi you. ", "charStartTimesMs"), now)
            .expect("valid");
        let TtsEvent::Words { text, words } = &said[0].1 else {
            panic!("words first: {said:?}");
        };
        assert_eq!(text, "Hi you.");
        assert_eq!((words[1].start_secs, words[1].end_secs), (0.15, 0.35));
        let (_, said) = core
            .message(audio("a", 2_400, "Bye.", "charsStartTimesMs"), now)
            .expect("valid");
        let TtsEvent::Words { words, .. } = &said[0].1 else {
            panic!("words first: {said:?}");
        };
        // The second message's audio starts half a second into the context's.
        assert_eq!(words[0].word, "Bye.");
        assert!((words[0].start_secs - 0.5).abs() < 1e-9);
        assert!(matches!(&said[1].1, TtsEvent::Audio(s) if s.len() == 2_400));
    }

    #[test]
    fn a_sixth_context_waits_for_a_slot_and_late_audio_of_a_cancelled_one_is_dropped() {
        let now = Instant::now();
        let mut core = ElevenLabsCore::new(ElevenLabsSettings::new("k"));
        core.opened(now);
        for n in 0..5 {
            let id = format!("c{n}");
            core.input(text(&id, "Cut."), now);
            let (close, _) = core.input(Command::Cancel { context: id }, now);
            assert_eq!(sent(&close)[0]["close_context"], true);
        }
        let (waiting, _) = core.input(text("c5", "Six."), now);
        assert!(waiting.is_empty(), "five are open until their isFinal");
        let (_, said) = core
            .message(audio("c0", 480, "Cut.", "charStartTimesMs"), now)
            .expect("valid");
        assert!(said.is_empty(), "a cancelled context's audio is stale");
        let (opened, said) = core.message(final_for("c0"), now).expect("valid");
        assert!(said.is_empty());
        let opened = sent(&opened);
        assert_eq!(
            (opened[0]["context_id"].as_str(), opened[1]["text"].as_str()),
            (Some("c5"), Some("Six. "))
        );
        // A closed context whose isFinal never comes gives its slot back.
        let (tick, _) = core.tick(now + DONE_WATCHDOG);
        assert_eq!(core.open_count(), 1);
        // Only the open one is kept alive.
        assert_eq!(
            sent(&tick.send),
            vec![serde_json::json!({"text": "", "context_id": "c5"})]
        );
    }

    #[test]
    fn unanswered_text_goes_again_on_a_new_socket_and_a_cut_turn_ends_with_an_error() {
        let now = Instant::now();
        let mut core = ElevenLabsCore::new(ElevenLabsSettings::new("k"));
        core.opened(now);
        core.input(text("a", "Not yet heard."), now);
        core.input(text("b", "Already speaking."), now);
        core.message(audio("b", 480, "Al", "charStartTimesMs"), now)
            .expect("valid");
        let said = core.lost(now);
        assert_eq!(said.len(), 1);
        assert!(matches!(&said[0], (id, TtsEvent::Error(_)) if id == "b"));
        let again = sent(&core.opened(now));
        assert_eq!(again[1]["text"], "Not yet heard. ");
        let failed = core.failed(&WsError::Permanent("HTTP 401".into()));
        assert!(matches!(&failed[0], (id, TtsEvent::Failed(m)) if id == "a" && m.contains("401")));
    }
}
