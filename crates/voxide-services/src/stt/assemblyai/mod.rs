//! AssemblyAI Universal-Streaming v3 (`wss://streaming.assemblyai.com/v3/ws`): 16-bit PCM in
//! binary frames of 50 ms to 1 s from the session's start, the current turn's words back as
//! they come, `ForceEndpoint` at each VAD stop (the formatted final `Turn` answers it),
//! `Terminate` at the end.
//!
//! [`AssemblyAiCore`] is sans-IO and runs on the shared WebSocket driver
//! ([`crate::ws`]). Audio waits until the session's `Begin`; everything AssemblyAI has
//! not finalized is kept and sent again on the next socket, so a slow handshake or a dropped
//! connection loses no words. Frames shorter than AssemblyAI's 50 ms minimum are held until the
//! next audio, and the last one of a turn is padded with silence.
//!
//! A VAD stop with no turn open at AssemblyAI (no speech reported since its last final: it had
//! ended the turn itself) waits only [`NO_TURN_GRACE`] for a final before it is answered with the
//! turns already ended, since AssemblyAI may have nothing for `ForceEndpoint` to end.

mod wire;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::kept::{KeptAudio, pcm_bytes};
use super::socket::{SocketProvider, SocketStt};
use super::stream::{SttEvent, SttInput};
use crate::ws::{self, ConnectRequest, Message, ReconnectPolicy, Step, Tick, WsCore, WsError};
use wire::{ClientMessage, ServerMessage};

/// AssemblyAI's API, when `ASSEMBLYAI_URL` names no other host.
pub const DEFAULT_URL: &str = "wss://streaming.assemblyai.com";
/// The model used when none is named (AssemblyAI requires one).
pub const DEFAULT_MODEL: &str = "universal-streaming-english";
/// The rate audio is sent at.
pub const SAMPLE_RATE: u32 = 16_000;

/// Where and how to listen.
#[derive(Debug, Clone, PartialEq)]
pub struct AssemblyAiSettings {
    /// Scheme and host (`ws://127.0.0.1:9000` for a local server); `/v3/ws` is appended.
    pub url: String,
    /// Sent as `Authorization`.
    pub api_key: voxide_core::secret::Secret,
    /// The speech model.
    pub model: String,
    /// A socket that sends nothing back for this long, while a turn is open and audio goes to
    /// it, is reconnected.
    pub liveness_timeout: Duration,
    /// How long a `ForceEndpoint` may wait for its final before the words so far are taken.
    pub finalize_timeout: Duration,
    /// Reconnection.
    pub reconnect: ReconnectPolicy,
}

impl AssemblyAiSettings {
    /// Settings for `api_key` with the defaults.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            url: DEFAULT_URL.to_owned(),
            api_key: voxide_core::secret::Secret::new(api_key),
            model: DEFAULT_MODEL.to_owned(),
            liveness_timeout: Duration::from_secs(10),
            finalize_timeout: Duration::from_secs(2),
            reconnect: ReconnectPolicy::default(),
        }
    }

    /// From `ASSEMBLYAI_API_KEY` (required) and `ASSEMBLYAI_URL`.
    pub fn from_env() -> Result<Self, WsError> {
        let key = crate::key_from_env("ASSEMBLYAI_API_KEY", "--stt assemblyai")
            .map_err(WsError::Permanent)?;
        let mut settings = Self::new(key);
        if let Some(url) = crate::url_from_env("ASSEMBLYAI_URL") {
            settings.url = url;
        }
        Ok(settings)
    }

    /// The `/v3/ws` URL with its query.
    pub fn socket_url(&self) -> String {
        format!(
            "{}/v3/ws?sample_rate={SAMPLE_RATE}&encoding=pcm_s16le&speech_model={}&format_turns=true",
            self.url.trim_end_matches('/'),
            self.model,
        )
    }
}

/// The engine.
pub type AssemblyAiStt = SocketStt<AssemblyAiSettings>;

impl SocketProvider for AssemblyAiSettings {
    const NAME: &'static str = "assemblyai";
    const SAMPLE_RATE: u32 = SAMPLE_RATE;
    type Core = AssemblyAiCore;

    fn model(&self) -> &str {
        &self.model
    }

    fn core(&self, now: Instant) -> AssemblyAiCore {
        AssemblyAiCore::new(self.clone(), now)
    }

    fn reconnect(&self) -> ReconnectPolicy {
        self.reconnect.clone()
    }
}

/// The shortest frame AssemblyAI takes (50 ms).
const MIN_FRAME: usize = SAMPLE_RATE as usize / 20;
/// The longest (1 s).
const MAX_FRAME: usize = SAMPLE_RATE as usize;
/// Nothing sent for this long and a `KeepAlive` goes.
const KEEPALIVE_AFTER: Duration = Duration::from_secs(5);
/// How long a `ForceEndpoint` sent with no turn open waits for a final.
pub const NO_TURN_GRACE: Duration = Duration::from_millis(300);
/// Unfinalized audio kept for a new socket, at most (30 s).
const MAX_KEPT: usize = 30 * SAMPLE_RATE as usize;

/// AssemblyAI's protocol, sans-IO.
pub struct AssemblyAiCore {
    settings: AssemblyAiSettings,
    connected: bool,
    /// The session began: audio may go.
    ready: bool,
    /// Audio AssemblyAI has not finalized.
    kept: KeptAudio,
    /// The position up to which the current socket was sent audio.
    sent_to: usize,
    /// Turns ended since the last finalize was answered.
    finals: Vec<String>,
    /// The open turn's words so far.
    current: String,
    /// AssemblyAI heard speech it has not ended a turn for.
    turn_open: bool,
    /// A finalize timed out and took the open turn's words: its late final is not news.
    taken: bool,
    /// When each finalize still unanswered is due.
    owed: VecDeque<Instant>,
    last_sent: Instant,
    last_heard: Instant,
    /// Audio went out since the provider last said anything.
    waiting: bool,
    gave_up: bool,
}

impl AssemblyAiCore {
    /// A core that has not connected yet.
    pub fn new(settings: AssemblyAiSettings, now: Instant) -> Self {
        Self {
            settings,
            connected: false,
            ready: false,
            kept: KeptAudio::new(MAX_KEPT),
            sent_to: 0,
            finals: Vec::new(),
            current: String::new(),
            turn_open: false,
            taken: false,
            owed: VecDeque::new(),
            last_sent: now,
            last_heard: now,
            waiting: false,
            gave_up: false,
        }
    }

    fn text(&self) -> String {
        let mut words: Vec<&str> = self.finals.iter().map(String::as_str).collect();
        if !self.current.is_empty() {
            words.push(&self.current);
        }
        words.join(" ")
    }

    /// Answers every finalize owed: the first with the words so far, the rest with none.
    fn answer_all(&mut self, with_current: bool) -> Vec<SttEvent> {
        let text = if with_current {
            self.text()
        } else {
            self.finals.join(" ")
        };
        self.finals.clear();
        (0..self.owed.len())
            .map(|i| SttEvent::Finalized(if i == 0 { text.clone() } else { String::new() }))
            .inspect(|_| {
                self.owed.pop_front();
            })
            .collect()
    }

    /// The audio not yet sent on this socket, in frames AssemblyAI takes; a tail under 50 ms
    /// waits for more unless `pad` fills it with silence.
    fn unsent(&mut self, pad: bool, now: Instant) -> Vec<Message> {
        let waiting = self.kept.end() - self.sent_to.max(self.kept.start());
        if waiting == 0 || (waiting < MIN_FRAME && !pad) {
            return Vec::new();
        }
        if waiting < MIN_FRAME {
            self.kept.push(&vec![0; MIN_FRAME - waiting]);
        }
        let mut pieces = self.kept.pieces_from(self.sent_to, MAX_FRAME);
        // A short last piece joins the one before it when the two fit in a frame.
        if pieces.len() > 1 && pieces.last().is_some_and(|p| p.len() < MIN_FRAME) {
            let last = pieces.pop().unwrap_or_default();
            let head = pieces.pop().unwrap_or_default();
            let split = head.len() + last.len() - MIN_FRAME;
            pieces.push(head[..split].to_vec());
            pieces.push([&head[split..], &last[..]].concat());
        }
        self.sent_to = self.kept.end();
        self.last_sent = now;
        if !self.waiting {
            self.waiting = true;
            self.last_heard = now;
        }
        pieces
            .iter()
            .map(|piece| Message::Binary(pcm_bytes(piece).into()))
            .collect()
    }

    fn control(message: ClientMessage) -> Message {
        Message::Text(message.json().into())
    }

    /// A session began (the first, or one after a lost socket): the kept audio goes again, and
    /// finalizes owed wait for the replay's final.
    fn began(&mut self, now: Instant) -> Step<SttEvent> {
        self.ready = true;
        self.kept.restart();
        self.sent_to = 0;
        let owed = !self.owed.is_empty();
        let mut send = self.unsent(owed, now);
        if owed {
            if send.is_empty() {
                return (Vec::new(), self.answer_all(false));
            }
            // The kept audio is the turn the lost socket did not finish.
            self.turn_open = true;
            let due = now + self.settings.finalize_timeout;
            self.owed.iter_mut().for_each(|d| *d = due);
            send.push(Self::control(ClientMessage::ForceEndpoint));
        }
        (send, Vec::new())
    }

    /// A turn's formatted final: its words are kept, and answer the finalizes owed.
    fn turn_ended(&mut self, turn: &wire::Turn) -> Vec<SttEvent> {
        if let Some(end) = turn.end_ms() {
            self.kept
                .done_up_to((end * u64::from(SAMPLE_RATE) / 1000) as usize);
        }
        self.current.clear();
        self.turn_open = false;
        if std::mem::take(&mut self.taken) {
            return Vec::new();
        }
        let transcript = turn.transcript.trim();
        if !transcript.is_empty() {
            self.finals.push(transcript.to_owned());
        }
        if !self.owed.is_empty() {
            return self.answer_all(false);
        }
        if self.finals.is_empty() {
            Vec::new()
        } else {
            vec![SttEvent::Interim(self.text())]
        }
    }

    /// What a message from AssemblyAI says, and what to send back.
    fn heard(&mut self, message: Message, now: Instant) -> Step<SttEvent> {
        self.last_heard = now;
        self.waiting = false;
        let Message::Text(text) = message else {
            return (Vec::new(), Vec::new());
        };
        let Some(parsed) =
            ws::read_wire::<ServerMessage>(&text, "AssemblyAI", "assemblyai_unreadable_message")
        else {
            return (Vec::new(), Vec::new());
        };
        match parsed {
            ServerMessage::Begin { id } => {
                tracing::debug!(session = %id, "AssemblyAI session began");
                self.began(now)
            }
            ServerMessage::SpeechStarted => {
                self.turn_open = true;
                (Vec::new(), Vec::new())
            }
            ServerMessage::Turn(turn) if turn.end_of_turn && turn.turn_is_formatted => {
                (Vec::new(), self.turn_ended(&turn))
            }
            // A turn in progress, or an ended one before its formatted copy.
            ServerMessage::Turn(turn) => {
                if self.taken {
                    return (Vec::new(), Vec::new());
                }
                // Words not yet final come before any transcript: the turn is open.
                self.turn_open = true;
                let transcript = turn.transcript.trim();
                if transcript.is_empty() {
                    return (Vec::new(), Vec::new());
                }
                self.current = transcript.to_owned();
                (Vec::new(), vec![SttEvent::Interim(self.text())])
            }
            ServerMessage::Error { error_code, error } => {
                voxide_core::warnings::warn(
                    "assemblyai_error",
                    format_args!("AssemblyAI reported an error ({error_code:?}): {error}"),
                );
                (Vec::new(), Vec::new())
            }
            ServerMessage::Termination | ServerMessage::Unknown => (Vec::new(), Vec::new()),
        }
    }
}

impl WsCore for AssemblyAiCore {
    type Input = SttInput;
    type Output = SttEvent;

    fn request(&self) -> Result<ConnectRequest, WsError> {
        ws::connect_request(
            &self.settings.socket_url(),
            &[("Authorization", self.settings.api_key.expose())],
        )
    }

    fn opened(&mut self, now: Instant) -> Vec<Message> {
        // Nothing goes before the session's `Begin`.
        self.connected = true;
        self.last_sent = now;
        self.last_heard = now;
        Vec::new()
    }

    fn lost(&mut self, _now: Instant) -> Vec<SttEvent> {
        self.connected = false;
        self.ready = false;
        self.waiting = false;
        // The open turn's audio is kept and heard again on the next socket.
        self.current.clear();
        self.turn_open = false;
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
                self.kept.push(&samples);
                if !self.ready {
                    return (Vec::new(), Vec::new());
                }
                (self.unsent(false, now), Vec::new())
            }
            SttInput::Finalize => {
                let wait = if self.turn_open || !self.ready {
                    self.settings.finalize_timeout
                } else {
                    NO_TURN_GRACE
                };
                self.owed.push_back(now + wait);
                if !self.ready {
                    return (Vec::new(), Vec::new());
                }
                let mut send = self.unsent(true, now);
                send.push(Self::control(ClientMessage::ForceEndpoint));
                (send, Vec::new())
            }
            // AssemblyAI listens to all of it; its own speech events say when a turn is open.
            SttInput::SpeechOnset { .. }
            | SttInput::OnsetNearSpeaker
            | SttInput::OnsetFaded
            | SttInput::SpeechStarted
            | SttInput::SilenceStarted => (Vec::new(), Vec::new()),
        }
    }

    fn message(&mut self, message: Message, now: Instant) -> Result<Step<SttEvent>, WsError> {
        Ok(self.heard(message, now))
    }

    fn tick(&mut self, now: Instant) -> (Tick, Vec<SttEvent>) {
        let mut tick = Tick::default();
        let mut said = Vec::new();
        if self.owed.front().is_some_and(|due| now >= *due) {
            if self.turn_open {
                voxide_core::warnings::warn(
                    "assemblyai_finalize_unanswered",
                    "AssemblyAI did not end a turn in time; the words so far are the turn's",
                );
            }
            said = self.answer_all(true);
            self.taken = self.turn_open;
            self.current.clear();
            self.turn_open = false;
        }
        if self.ready {
            if self.turn_open
                && self.waiting
                && now.duration_since(self.last_heard) >= self.settings.liveness_timeout
            {
                tick.reconnect = Some(format!(
                    "AssemblyAI sent nothing for {:?} in an open turn",
                    self.settings.liveness_timeout
                ));
            } else if now.duration_since(self.last_sent) >= KEEPALIVE_AFTER {
                self.last_sent = now;
                tick.send.push(Self::control(ClientMessage::KeepAlive));
            }
        }
        (tick, said)
    }

    fn next_deadline(&self) -> Option<Instant> {
        let finalize = self.owed.front().copied();
        let socket = self.ready.then(|| {
            let keepalive = self.last_sent + KEEPALIVE_AFTER;
            if self.turn_open && self.waiting {
                keepalive.min(self.last_heard + self.settings.liveness_timeout)
            } else {
                keepalive
            }
        });
        [finalize, socket].into_iter().flatten().min()
    }

    fn closing(&mut self) -> Vec<Message> {
        vec![Self::control(ClientMessage::Terminate)]
    }

    fn failed(&mut self, error: &WsError) -> Vec<SttEvent> {
        self.gave_up = true;
        let mut said = vec![SttEvent::Failed(format!("AssemblyAI: {error}"))];
        said.extend(self.answer_all(true));
        said
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core() -> (AssemblyAiCore, Instant) {
        let now = Instant::now();
        (AssemblyAiCore::new(AssemblyAiSettings::new("k"), now), now)
    }

    fn text(json: serde_json::Value) -> Message {
        Message::Text(json.to_string().into())
    }

    fn begin() -> Message {
        text(serde_json::json!({"type": "Begin", "id": "s1", "expires_at": 1_750_000_000}))
    }

    fn turn(transcript: &str, end_of_turn: bool, formatted: bool, end_ms: u64) -> Message {
        text(
            serde_json::json!({"type": "Turn", "turn_order": 0, "turn_is_formatted": formatted,
            "end_of_turn": end_of_turn, "transcript": transcript, "end_of_turn_confidence": 0.5,
            "words": [{"start": 0, "end": end_ms, "text": transcript, "confidence": 0.9,
                       "word_is_final": true}]}),
        )
    }

    /// Samples of audio in `sent`, and whether every frame is 50 ms to 1 s.
    fn frames(sent: &[Message]) -> (usize, bool) {
        let sizes: Vec<usize> = sent
            .iter()
            .filter_map(|m| match m {
                Message::Binary(b) => Some(b.len() / 2),
                _ => None,
            })
            .collect();
        (
            sizes.iter().sum(),
            sizes.iter().all(|n| (MIN_FRAME..=MAX_FRAME).contains(n)),
        )
    }

    #[test]
    fn audio_waits_for_begin_and_goes_in_frames_of_50_ms_to_1_s() {
        let (mut core, now) = core();
        core.opened(now);
        for _ in 0..60 {
            assert_eq!(core.input(SttInput::Audio(vec![1; 320]), now).0, vec![]);
        }
        let (sent, _) = core.message(begin(), now).expect("valid");
        assert_eq!(frames(&sent), (19_200, true));
        // 20 ms frames are held until there are 50 ms of them.
        assert!(core.input(SttInput::Audio(vec![1; 320]), now).0.is_empty());
        assert!(core.input(SttInput::Audio(vec![1; 320]), now).0.is_empty());
        let (sent, _) = core.input(SttInput::Audio(vec![1; 320]), now);
        assert_eq!(frames(&sent), (960, true));
    }

    #[test]
    fn a_finalize_pads_the_tail_and_the_formatted_final_answers_it() {
        let (mut core, now) = core();
        core.opened(now);
        core.message(begin(), now).expect("valid");
        core.input(SttInput::Audio(vec![1; 1_000]), now);
        core.message(
            text(serde_json::json!({"type": "SpeechStarted", "timestamp": 10})),
            now,
        )
        .expect("valid");
        let (_, said) = core
            .message(turn("what time", false, false, 500), now)
            .expect("valid");
        assert_eq!(said, vec![SttEvent::Interim("what time".into())]);
        core.input(SttInput::Audio(vec![1; 320]), now);
        let (sent, said) = core.input(SttInput::Finalize, now);
        assert!(said.is_empty());
        assert!(frames(&sent).1, "the 20 ms tail is padded to 50 ms");
        assert_eq!(
            sent.last(),
            Some(&Message::Text(r#"{"type":"ForceEndpoint"}"#.into()))
        );
        // The raw final is not the answer; the formatted one is.
        let (_, said) = core
            .message(turn("what time is it", true, false, 900), now)
            .expect("valid");
        assert_eq!(said, vec![SttEvent::Interim("what time is it".into())]);
        let (_, said) = core
            .message(turn("What time is it?", true, true, 900), now)
            .expect("valid");
        assert_eq!(said, vec![SttEvent::Finalized("What time is it?".into())]);
    }

    #[test]
    fn a_finalize_with_no_open_turn_waits_a_short_grace_for_the_ended_turns() {
        let (mut core, now) = core();
        core.opened(now);
        core.message(begin(), now).expect("valid");
        core.input(SttInput::Audio(vec![1; 16_000]), now);
        core.message(turn("Hello.", true, true, 700), now)
            .expect("valid");
        let (sent, said) = core.input(SttInput::Finalize, now);
        assert_eq!(
            sent.last(),
            Some(&Message::Text(r#"{"type":"ForceEndpoint"}"#.into()))
        );
        assert!(said.is_empty());
        assert_eq!(core.next_deadline(), Some(now + NO_TURN_GRACE));
        let (_, said) = core.tick(now + NO_TURN_GRACE);
        assert_eq!(said, vec![SttEvent::Finalized("Hello.".into())]);
    }

    #[test]
    fn a_lost_socket_hears_the_unfinalized_audio_and_the_finalize_again() {
        let (mut core, now) = core();
        core.opened(now);
        core.message(begin(), now).expect("valid");
        core.input(SttInput::Audio(vec![1; 32_000]), now);
        // The first half second ended a turn; the rest was still open when the socket died.
        core.message(turn("Hi.", true, true, 500), now)
            .expect("valid");
        core.message(turn("what", false, false, 900), now)
            .expect("valid");
        core.input(SttInput::Finalize, now);
        core.lost(now);
        core.input(SttInput::Audio(vec![1; 800]), now);
        assert!(core.opened(now).is_empty(), "nothing before Begin");
        let (sent, _) = core.message(begin(), now).expect("valid");
        assert_eq!(frames(&sent), (24_000 + 800, true));
        assert_eq!(
            sent.last(),
            Some(&Message::Text(r#"{"type":"ForceEndpoint"}"#.into()))
        );
        let (_, said) = core
            .message(turn("What time is it?", true, true, 1_550), now)
            .expect("valid");
        assert_eq!(
            said,
            vec![SttEvent::Finalized("Hi. What time is it?".into())]
        );
        assert!(core.kept.is_empty());
    }

    #[test]
    fn an_overdue_final_takes_the_open_turn_and_its_late_final_is_dropped() {
        let (mut core, now) = core();
        core.opened(now);
        core.message(begin(), now).expect("valid");
        core.input(SttInput::Audio(vec![1; 8_000]), now);
        core.message(turn("book a table", false, false, 400), now)
            .expect("valid");
        core.input(SttInput::Finalize, now);
        let (_, said) = core.tick(now + Duration::from_secs(2));
        assert_eq!(said, vec![SttEvent::Finalized("book a table".into())]);
        let (_, said) = core
            .message(turn("Book a table.", true, true, 450), now)
            .expect("valid");
        assert!(said.is_empty(), "the turn was already answered");
    }

    #[test]
    fn keepalive_when_idle_terminate_at_the_end_and_a_failure_answers_what_is_owed() {
        let (mut core, now) = core();
        core.opened(now);
        core.message(begin(), now).expect("valid");
        let (tick, _) = core.tick(now + KEEPALIVE_AFTER);
        assert_eq!(
            tick.send,
            vec![Message::Text(r#"{"type":"KeepAlive"}"#.into())]
        );
        assert_eq!(
            core.closing(),
            vec![Message::Text(r#"{"type":"Terminate"}"#.into())]
        );
        assert_eq!(
            core.message(Message::Text("{oops".into()), now),
            Ok((vec![], vec![]))
        );
        core.lost(now);
        core.input(SttInput::Finalize, now);
        let said = core.failed(&WsError::Permanent("HTTP 401".into()));
        assert!(matches!(&said[0], SttEvent::Failed(m) if m.contains("401")));
        assert_eq!(said[1], SttEvent::Finalized(String::new()));
    }
}
