//! OpenAI realtime transcription (`wss://api.openai.com/v1/realtime?intent=transcription`, or
//! any server that speaks it, such as speaches): the session is configured for the transcription
//! model with no server turn detection, and voxide's VAD decides the segments. Audio is sent from
//! the VAD's start (with a second from before it, so no onset is clipped) to its stop, which
//! commits the segment; the item's `completed` transcript answers the finalize. Silence between
//! turns is not sent, so it is not billed.
//!
//! The engine takes 16 kHz like the others and sends OpenAI's 24 kHz, so it can stand in a
//! fallback list beside them. [`OpenAiSttCore`] is sans-IO and runs on the shared WebSocket
//! driver ([`crate::ws`]); audio waits for `session.updated`, and every segment not yet
//! transcribed is sent and committed again on a new socket.

mod wire;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::preroll::Preroll;
use super::socket::{SocketProvider, SocketStt};
use super::stream::{SttEvent, SttInput};
use crate::ws::{self, ConnectRequest, Message, ReconnectPolicy, Step, Tick, WsCore, WsError};
use voxide_engines::audio::resample::StreamResampler;
use wire::{ClientEvent, ServerEvent};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "gpt-4o-transcribe";
/// The rate the engine takes, like the other engines.
pub const SAMPLE_RATE: u32 = 16_000;
/// The rate OpenAI takes.
pub const WIRE_RATE: u32 = 24_000;

/// Where and how to listen.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiSttSettings {
    /// Up to and including `/v1` (`http` or `ws`, with or without TLS): `/realtime` is appended.
    pub base_url: String,
    /// Sent as a bearer token; none for servers that need no key.
    pub api_key: Option<voxide_core::secret::Secret>,
    /// The transcription model.
    pub model: String,
    /// The language.
    pub language: String,
    /// How long a commit may wait for its transcript before the words so far are taken.
    pub finalize_timeout: Duration,
    /// Reconnection.
    pub reconnect: ReconnectPolicy,
}

impl OpenAiSttSettings {
    /// Settings for `base_url` and `api_key` with the defaults.
    pub fn new(base_url: impl Into<String>, api_key: Option<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: api_key.map(voxide_core::secret::Secret::new),
            model: DEFAULT_MODEL.to_owned(),
            language: "en".to_owned(),
            finalize_timeout: Duration::from_secs(5),
            reconnect: ReconnectPolicy::default(),
        }
    }

    /// From `OPENAI_API_KEY` and `OPENAI_BASE_URL`: a key is required for OpenAI's own API.
    pub fn from_env() -> Result<Self, WsError> {
        let (base_url, api_key) =
            crate::openai_from_env("--stt openai").map_err(WsError::Permanent)?;
        Ok(Self {
            api_key,
            ..Self::new(base_url, None)
        })
    }

    /// The socket's URL. No `model` in the query: on OpenAI's API it picks a conversation
    /// session, and the transcription set-up then fails.
    pub fn socket_url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        let base = if let Some(rest) = base.strip_prefix("https://") {
            format!("wss://{rest}")
        } else if let Some(rest) = base.strip_prefix("http://") {
            format!("ws://{rest}")
        } else {
            base.to_owned()
        };
        format!("{base}/realtime?intent=transcription")
    }
}

/// The engine.
pub type OpenAiStt = SocketStt<OpenAiSttSettings>;

impl SocketProvider for OpenAiSttSettings {
    const NAME: &'static str = "openai";
    const SAMPLE_RATE: u32 = SAMPLE_RATE;
    type Core = OpenAiSttCore;

    fn model(&self) -> &str {
        &self.model
    }

    fn core(&self, _now: Instant) -> OpenAiSttCore {
        OpenAiSttCore::new(self.clone())
    }

    fn reconnect(&self) -> ReconnectPolicy {
        self.reconnect.clone()
    }
}

/// The shortest segment OpenAI commits (100 ms); a shorter one is padded with silence.
const MIN_COMMIT: usize = WIRE_RATE as usize / 10;
/// Audio goes in appends of at most this many samples (1 s) when sent again.
const APPEND_PIECE: usize = WIRE_RATE as usize;
/// A segment's audio kept for a new socket, at most (2 minutes).
const MAX_SEGMENT: usize = 120 * WIRE_RATE as usize;

/// One stretch of speech, from the VAD's start to its stop.
#[derive(Debug, Default)]
struct Segment {
    /// Its audio at the wire's rate, kept until its transcript comes.
    audio: Vec<i16>,
    /// How much of `audio` the current socket has.
    sent: usize,
    /// When its finalize is due, once committed.
    due: Option<Instant>,
    /// Its commit went on the current socket.
    commit_sent: bool,
    /// The item its commit made on the current socket.
    item: Option<String>,
}

/// OpenAI's transcription protocol, sans-IO.
pub struct OpenAiSttCore {
    settings: OpenAiSttSettings,
    ready: bool,
    resampler: Option<StreamResampler>,
    /// The audio a segment begins with, at the wire's rate.
    preroll: Preroll,
    /// Segments not yet answered, oldest first; the last may still be open.
    segments: VecDeque<Segment>,
    /// Words of items so far, and whole transcripts that came.
    partial: HashMap<String, String>,
    done: HashMap<String, String>,
    gave_up: bool,
}

impl OpenAiSttCore {
    /// A core that has not connected yet.
    pub fn new(settings: OpenAiSttSettings) -> Self {
        Self {
            settings,
            ready: false,
            resampler: StreamResampler::new(SAMPLE_RATE, WIRE_RATE).ok(),
            preroll: Preroll::new(WIRE_RATE),
            segments: VecDeque::new(),
            partial: HashMap::new(),
            done: HashMap::new(),
            gave_up: false,
        }
    }

    fn event(event: &ClientEvent) -> Message {
        Message::Text(serde_json::to_string(event).unwrap_or_default().into())
    }

    fn append(samples: &[i16]) -> Message {
        use base64::Engine as _;
        let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        Self::event(&ClientEvent::Append {
            audio: base64::engine::general_purpose::STANDARD.encode(bytes),
        })
    }

    fn open_segment(&mut self) -> Option<&mut Segment> {
        self.segments.back_mut().filter(|s| s.due.is_none())
    }

    /// What the current socket does not have of each segment, and the commits of those that
    /// ended.
    fn unsent(&mut self) -> Vec<Message> {
        if !self.ready {
            return Vec::new();
        }
        let mut out = Vec::new();
        for segment in &mut self.segments {
            let rest = &segment.audio[segment.sent.min(segment.audio.len())..];
            out.extend(rest.chunks(APPEND_PIECE).map(Self::append));
            segment.sent = segment.audio.len();
            if segment.due.is_some() && !segment.commit_sent && !segment.audio.is_empty() {
                segment.commit_sent = true;
                out.push(Self::event(&ClientEvent::Commit));
            }
        }
        out
    }

    /// Answers the finalizes whose transcripts are in, in order.
    fn answers(&mut self) -> Vec<SttEvent> {
        let mut said = Vec::new();
        while let Some(front) = self.segments.front() {
            if front.due.is_none() {
                break;
            }
            let text = if front.audio.is_empty() {
                String::new()
            } else {
                match front.item.as_ref().and_then(|item| self.done.remove(item)) {
                    Some(text) => text,
                    None => break,
                }
            };
            if let Some(item) = &front.item {
                self.partial.remove(item);
            }
            self.segments.pop_front();
            said.push(SttEvent::Finalized(text.trim().to_owned()));
        }
        said
    }

    /// The session as voxide wants it: transcription only, PCM at the wire rate, no server
    /// turn detection.
    fn session_update(&self) -> Message {
        let update = ClientEvent::SessionUpdate {
            session: wire::Session {
                kind: "transcription",
                audio: wire::Audio {
                    input: wire::Input {
                        format: wire::Format {
                            kind: "audio/pcm",
                            rate: WIRE_RATE,
                        },
                        transcription: wire::Transcription {
                            model: &self.settings.model,
                            language: &self.settings.language,
                        },
                        turn_detection: None,
                    },
                },
            },
        };
        Self::event(&update)
    }

    /// A segment OpenAI could not transcribe: an error, and the segment answered empty so the
    /// ones after it are not held.
    fn segment_failed(&mut self, item_id: String, why: &str) -> Vec<SttEvent> {
        let mut said = vec![SttEvent::Error(format!(
            "OpenAI could not transcribe a segment: {why}"
        ))];
        if self
            .segments
            .iter()
            .any(|s| s.item.as_ref() == Some(&item_id))
        {
            self.done.insert(item_id, String::new());
        }
        said.extend(self.answers());
        said
    }

    fn heard(&mut self, message: Message) -> Step<SttEvent> {
        let Message::Text(text) = message else {
            return (Vec::new(), Vec::new());
        };
        let Some(parsed) =
            ws::read_wire::<ServerEvent>(&text, "OpenAI", "openai_stt_unreadable_message")
        else {
            return (Vec::new(), Vec::new());
        };
        match parsed {
            ServerEvent::SessionCreated => (vec![self.session_update()], Vec::new()),
            ServerEvent::SessionUpdated if !self.ready => {
                self.ready = true;
                (self.unsent(), Vec::new())
            }
            ServerEvent::Committed { item_id } => {
                if let Some(segment) = self
                    .segments
                    .iter_mut()
                    .find(|s| s.commit_sent && s.item.is_none())
                {
                    segment.item = Some(item_id);
                }
                (Vec::new(), Vec::new())
            }
            ServerEvent::Delta { item_id, delta } => {
                let words = self.partial.entry(item_id).or_default();
                words.push_str(&delta);
                let interim = words.trim().to_owned();
                (Vec::new(), vec![SttEvent::Interim(interim)])
            }
            ServerEvent::Completed {
                item_id,
                transcript,
            } => {
                if self
                    .segments
                    .iter()
                    .any(|s| s.item.as_ref() == Some(&item_id))
                {
                    self.done.insert(item_id, transcript);
                }
                (Vec::new(), self.answers())
            }
            ServerEvent::Failed { item_id, error } => {
                let why = error.map(|e| e.message).unwrap_or_default();
                (Vec::new(), self.segment_failed(item_id, &why))
            }
            ServerEvent::Error { error } => {
                voxide_core::warnings::warn(
                    "openai_stt_error",
                    format_args!(
                        "OpenAI reported an error ({}): {}",
                        error.code.as_deref().unwrap_or("no code"),
                        error.message
                    ),
                );
                (Vec::new(), Vec::new())
            }
            ServerEvent::SessionUpdated | ServerEvent::Other => (Vec::new(), Vec::new()),
        }
    }
}

impl WsCore for OpenAiSttCore {
    type Input = SttInput;
    type Output = SttEvent;

    fn request(&self) -> Result<ConnectRequest, WsError> {
        let auth = self
            .settings
            .api_key
            .as_ref()
            .map(|k| format!("Bearer {}", k.expose()));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| ("Authorization", a))
            .into_iter()
            .collect();
        ws::connect_request(&self.settings.socket_url(), &headers)
    }

    fn opened(&mut self, _now: Instant) -> Vec<Message> {
        // The session is configured once the server says it was created.
        Vec::new()
    }

    fn lost(&mut self, _now: Instant) -> Vec<SttEvent> {
        self.ready = false;
        // Every segment not yet transcribed goes again on the next socket.
        for segment in &mut self.segments {
            segment.sent = 0;
            segment.commit_sent = false;
            segment.item = None;
        }
        self.partial.clear();
        self.done.clear();
        Vec::new()
    }

    fn input(&mut self, input: SttInput, now: Instant) -> Step<SttEvent> {
        if self.gave_up {
            return match input {
                SttInput::Finalize => (Vec::new(), vec![SttEvent::Finalized(String::new())]),
                _ => (Vec::new(), Vec::new()),
            };
        }
        match input {
            SttInput::Audio(samples) => {
                let wire = match &mut self.resampler {
                    Some(resampler) => resampler.process(&samples),
                    None => samples,
                };
                self.preroll.audio(&wire);
                let ready = self.ready;
                if let Some(segment) = self.open_segment() {
                    segment.audio.extend_from_slice(&wire);
                    let excess = segment.audio.len().saturating_sub(MAX_SEGMENT);
                    let trimmed = excess.min(segment.sent);
                    segment.audio.drain(..trimmed);
                    segment.sent -= trimmed;
                    if ready {
                        segment.sent = segment.audio.len();
                        return (vec![Self::append(&wire)], Vec::new());
                    }
                    return (Vec::new(), Vec::new());
                }
                (Vec::new(), Vec::new())
            }
            SttInput::SpeechStarted => {
                if self.open_segment().is_none() {
                    self.segments.push_back(Segment {
                        audio: self.preroll.start(),
                        ..Segment::default()
                    });
                }
                (self.unsent(), Vec::new())
            }
            SttInput::SpeechOnset { near_speaker } => {
                self.preroll.onset(near_speaker);
                (Vec::new(), Vec::new())
            }
            SttInput::OnsetNearSpeaker => {
                self.preroll.came_near();
                (Vec::new(), Vec::new())
            }
            SttInput::OnsetFaded => {
                self.preroll.faded();
                (Vec::new(), Vec::new())
            }
            SttInput::SilenceStarted => (Vec::new(), Vec::new()),
            SttInput::Finalize => {
                self.preroll.stopped();
                let due = Some(now + self.settings.finalize_timeout);
                match self.open_segment() {
                    Some(segment) => {
                        if segment.audio.len() < MIN_COMMIT {
                            segment.audio.resize(MIN_COMMIT, 0);
                        }
                        segment.due = due;
                    }
                    // No speech since the last stop: nothing to transcribe.
                    None => self.segments.push_back(Segment {
                        due,
                        ..Segment::default()
                    }),
                }
                (self.unsent(), self.answers())
            }
        }
    }

    fn message(&mut self, message: Message, _now: Instant) -> Result<Step<SttEvent>, WsError> {
        Ok(self.heard(message))
    }

    fn tick(&mut self, now: Instant) -> (Tick, Vec<SttEvent>) {
        let mut said = Vec::new();
        while let Some(front) = self.segments.front() {
            if front.due.is_none_or(|due| now < due) {
                break;
            }
            voxide_core::warnings::warn(
                "openai_stt_unanswered",
                "OpenAI did not transcribe a segment in time; the words so far are the turn's",
            );
            let words = front
                .item
                .as_ref()
                .and_then(|item| self.partial.remove(item))
                .unwrap_or_default();
            self.segments.pop_front();
            said.push(SttEvent::Finalized(words.trim().to_owned()));
        }
        (Tick::default(), said)
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.segments.front().and_then(|s| s.due)
    }

    fn closing(&mut self) -> Vec<Message> {
        Vec::new()
    }

    fn failed(&mut self, error: &WsError) -> Vec<SttEvent> {
        self.gave_up = true;
        let mut said = vec![SttEvent::Failed(format!("OpenAI transcription: {error}"))];
        let owed = self.segments.iter().filter(|s| s.due.is_some()).count();
        said.extend((0..owed).map(|_| SttEvent::Finalized(String::new())));
        self.segments.clear();
        said
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core() -> (OpenAiSttCore, Instant) {
        let settings = OpenAiSttSettings::new("http://127.0.0.1:9/v1", Some("k".into()));
        (OpenAiSttCore::new(settings), Instant::now())
    }

    fn server(json: serde_json::Value) -> Message {
        Message::Text(json.to_string().into())
    }

    fn kinds(sent: &[Message]) -> Vec<String> {
        sent.iter()
            .map(|m| match m {
                Message::Text(t) => {
                    serde_json::from_str::<serde_json::Value>(t).expect("JSON")["type"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                }
                other => panic!("text only: {other:?}"),
            })
            .collect()
    }

    /// Samples at the wire's rate in the appends of `sent`.
    fn appended(sent: &[Message]) -> usize {
        use base64::Engine as _;
        sent.iter()
            .filter_map(|m| match m {
                Message::Text(t) => serde_json::from_str::<serde_json::Value>(t).ok(),
                _ => None,
            })
            .filter_map(|v| v["audio"].as_str().map(str::to_owned))
            .map(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .expect("base64")
                    .len()
                    / 2
            })
            .sum()
    }

    fn ready(core: &mut OpenAiSttCore, now: Instant) -> Vec<Message> {
        core.opened(now);
        let (update, _) = core
            .message(server(serde_json::json!({"type": "session.created"})), now)
            .expect("valid");
        assert_eq!(kinds(&update), ["session.update"]);
        core.message(server(serde_json::json!({"type": "session.updated"})), now)
            .expect("valid")
            .0
    }

    #[test]
    fn the_session_is_set_up_for_transcription_with_no_model_in_the_url() {
        let (core, _) = core();
        assert_eq!(
            core.settings.socket_url(),
            "ws://127.0.0.1:9/v1/realtime?intent=transcription"
        );
        let update = ClientEvent::SessionUpdate {
            session: wire::Session {
                kind: "transcription",
                audio: wire::Audio {
                    input: wire::Input {
                        format: wire::Format {
                            kind: "audio/pcm",
                            rate: WIRE_RATE,
                        },
                        transcription: wire::Transcription {
                            model: DEFAULT_MODEL,
                            language: "en",
                        },
                        turn_detection: None,
                    },
                },
            },
        };
        let json: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&update).expect("json")).expect("json");
        assert_eq!(json["session"]["audio"]["input"]["format"]["rate"], 24_000);
        assert!(json["session"]["audio"]["input"]["turn_detection"].is_null());
    }

    #[test]
    fn a_segment_runs_from_the_preroll_to_the_commit_and_its_transcript_answers() {
        let (mut core, now) = core();
        assert!(ready(&mut core, now).is_empty());
        // Two seconds of silence: none of it sent, and with no onset before the start only
        // its last 0.6 s opens the segment.
        for _ in 0..100 {
            assert!(core.input(SttInput::Audio(vec![0; 320]), now).0.is_empty());
        }
        let (sent, _) = core.input(SttInput::SpeechStarted, now);
        let preroll = appended(&sent);
        assert!((14_000..=14_400).contains(&preroll), "{preroll}");
        let (sent, _) = core.input(SttInput::Audio(vec![500; 320]), now);
        assert_eq!(appended(&sent), 480, "16 kHz in, 24 kHz out");
        let (sent, said) = core.input(SttInput::Finalize, now);
        assert_eq!(kinds(&sent), ["input_audio_buffer.commit"]);
        assert!(said.is_empty());
        let item = serde_json::json!({"type": "input_audio_buffer.committed", "item_id": "i1", "previous_item_id": null});
        core.message(server(item), now).expect("valid");
        let delta = serde_json::json!({"type": "conversation.item.input_audio_transcription.delta", "item_id": "i1", "content_index": 0, "delta": "What "});
        let (_, said) = core.message(server(delta), now).expect("valid");
        assert_eq!(said, vec![SttEvent::Interim("What".into())]);
        let done = serde_json::json!({"type": "conversation.item.input_audio_transcription.completed", "item_id": "i1", "content_index": 0, "transcript": "What time is it?"});
        let (_, said) = core.message(server(done), now).expect("valid");
        assert_eq!(said, vec![SttEvent::Finalized("What time is it?".into())]);
    }

    #[test]
    fn words_that_faded_as_onsets_before_the_start_open_the_segment() {
        let (mut core, now) = core();
        ready(&mut core, now);
        let fed = |core: &mut OpenAiSttCore, secs: f32| {
            for _ in 0..(secs * 50.0).round() as usize {
                core.input(SttInput::Audio(vec![0; 320]), now);
            }
        };
        fed(&mut core, 3.0);
        // A voice's first words over a room's noise: an onset that faded, then one that led to
        // the start 1.2 s after the first.
        core.input(SttInput::SpeechOnset { near_speaker: true }, now);
        fed(&mut core, 0.6);
        core.input(SttInput::OnsetFaded, now);
        fed(&mut core, 0.1);
        core.input(SttInput::SpeechOnset { near_speaker: true }, now);
        fed(&mut core, 0.5);
        let (sent, _) = core.input(SttInput::SpeechStarted, now);
        // From 0.3 s before the first onset: 1.5 s at 24 kHz.
        let preroll = appended(&sent);
        assert!((35_500..=36_000).contains(&preroll), "{preroll}");
    }

    #[test]
    fn a_stop_with_no_speech_is_answered_in_order_with_no_words() {
        let (mut core, now) = core();
        ready(&mut core, now);
        let (sent, said) = core.input(SttInput::Finalize, now);
        assert!(sent.is_empty(), "nothing to commit");
        assert_eq!(said, vec![SttEvent::Finalized(String::new())]);
    }

    #[test]
    fn a_lost_socket_gets_the_untranscribed_segment_and_its_commit_again() {
        let (mut core, now) = core();
        // Speech before the session is ready waits for it.
        core.input(SttInput::SpeechStarted, now);
        core.input(SttInput::Audio(vec![500; 16_000]), now);
        core.input(SttInput::Finalize, now);
        let sent = ready(&mut core, now);
        assert_eq!(
            kinds(&sent).last().map(String::as_str),
            Some("input_audio_buffer.commit")
        );
        let heard = appended(&sent);
        core.lost(now);
        let sent = ready(&mut core, now);
        assert_eq!(appended(&sent), heard, "all of it again");
        assert_eq!(
            kinds(&sent).last().map(String::as_str),
            Some("input_audio_buffer.commit")
        );
        let item = serde_json::json!({"type": "input_audio_buffer.committed", "item_id": "i9"});
        core.message(server(item), now).expect("valid");
        let done = serde_json::json!({"type": "conversation.item.input_audio_transcription.completed", "item_id": "i9", "transcript": " Hello. "});
        let (_, said) = core.message(server(done), now).expect("valid");
        assert_eq!(said, vec![SttEvent::Finalized("Hello.".into())]);
    }

    #[test]
    fn an_overdue_transcript_takes_the_words_so_far_and_a_failure_answers_what_is_owed() {
        let (mut core, now) = core();
        ready(&mut core, now);
        core.input(SttInput::SpeechStarted, now);
        core.input(SttInput::Audio(vec![500; 3_200]), now);
        core.input(SttInput::Finalize, now);
        core.message(
            server(serde_json::json!({"type": "input_audio_buffer.committed", "item_id": "a"})),
            now,
        )
        .expect("valid");
        core.message(server(serde_json::json!({"type": "conversation.item.input_audio_transcription.delta", "item_id": "a", "delta": "book a"})), now).expect("valid");
        let (_, said) = core.tick(now + Duration::from_secs(5));
        assert_eq!(said, vec![SttEvent::Finalized("book a".into())]);
        // A late transcript for it is not news.
        let late = serde_json::json!({"type": "conversation.item.input_audio_transcription.completed", "item_id": "a", "transcript": "book a table"});
        assert_eq!(core.message(server(late), now), Ok((vec![], vec![])));
        core.input(SttInput::SpeechStarted, now);
        core.input(SttInput::Finalize, now);
        let said = core.failed(&WsError::Permanent("HTTP 401".into()));
        assert!(matches!(&said[0], SttEvent::Failed(m) if m.contains("401")));
        assert_eq!(said[1], SttEvent::Finalized(String::new()));
    }
}
