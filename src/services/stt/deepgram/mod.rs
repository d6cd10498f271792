//! Deepgram live transcription (`wss://api.deepgram.com/v1/listen`): linear16 audio in binary
//! frames from the session's start, interim and final results back, `Finalize` at each VAD stop
//! (the final carrying `from_finalize` answers it), `KeepAlive` when no audio went for 4 s,
//! `CloseStream` at the end.
//!
//! [`DeepgramCore`] is sans-IO and runs on the shared WebSocket driver ([`crate::services::ws`]).
//! It keeps every sample Deepgram has not finalized: audio that came before the socket was open
//! and whatever a lost socket never finalized is sent again, in order, on the next one, so no
//! word is lost to a slow handshake or a dropped connection. Result times count from each
//! socket's start, so a final's end says how much of the kept audio is done with.

mod wire;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::kept::{KeptAudio, pcm_bytes};
use super::stream::{SttEngine, SttEvent, SttInput, SttStream, socket_stream};
use crate::services::ws::{
    self, ConnectRequest, Message, ReconnectPolicy, Step, Tick, WsCore, WsError,
};
use wire::{ClientMessage, ServerMessage};

/// Deepgram's API, when `DEEPGRAM_URL` names no other host.
pub const DEFAULT_URL: &str = "wss://api.deepgram.com";
/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "nova-3";
/// The rate audio is sent at.
pub const SAMPLE_RATE: u32 = 16_000;

/// Where and how to listen.
#[derive(Debug, Clone, PartialEq)]
pub struct DeepgramSettings {
    /// Scheme and host (`ws://127.0.0.1:9000` for a local server); `/v1/listen` is appended.
    pub url: String,
    /// Sent as `Authorization: Token …`.
    pub api_key: String,
    /// The model.
    pub model: String,
    /// The language.
    pub language: String,
    /// A socket that sends nothing back for this long while audio goes to it is reconnected.
    pub liveness_timeout: Duration,
    /// How long a `Finalize` may wait for its answer before the words so far are taken.
    pub finalize_timeout: Duration,
    /// Reconnection.
    pub reconnect: ReconnectPolicy,
}

impl DeepgramSettings {
    /// Settings for `api_key` with the defaults.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            url: DEFAULT_URL.to_owned(),
            api_key: api_key.into(),
            model: DEFAULT_MODEL.to_owned(),
            language: "en".to_owned(),
            liveness_timeout: Duration::from_secs(10),
            finalize_timeout: Duration::from_secs(2),
            reconnect: ReconnectPolicy::default(),
        }
    }

    /// From `DEEPGRAM_API_KEY` (required) and `DEEPGRAM_URL`.
    pub fn from_env() -> Result<Self, WsError> {
        let key = crate::services::key_from_env("DEEPGRAM_API_KEY", "--stt deepgram")
            .map_err(WsError::Permanent)?;
        let mut settings = Self::new(key);
        if let Some(url) = crate::services::url_from_env("DEEPGRAM_URL") {
            settings.url = url;
        }
        Ok(settings)
    }

    /// The `/v1/listen` URL with its query.
    pub fn listen_url(&self) -> String {
        format!(
            "{}/v1/listen?model={}&language={}&encoding=linear16&sample_rate={SAMPLE_RATE}&channels=1\
             &interim_results=true&punctuate=true&smart_format=true&vad_events=true",
            self.url.trim_end_matches('/'),
            self.model,
            self.language,
        )
    }
}

/// The engine.
pub struct DeepgramStt {
    settings: DeepgramSettings,
}

impl DeepgramStt {
    /// An engine for `settings`.
    pub fn new(settings: DeepgramSettings) -> Self {
        Self { settings }
    }

    /// Its settings.
    pub fn settings(&self) -> &DeepgramSettings {
        &self.settings
    }
}

impl SttEngine for DeepgramStt {
    fn name(&self) -> &str {
        "deepgram"
    }

    fn model(&self) -> &str {
        &self.settings.model
    }

    fn sample_rate(&self) -> u32 {
        SAMPLE_RATE
    }

    fn start(&self) -> SttStream {
        let core = DeepgramCore::new(self.settings.clone(), Instant::now());
        socket_stream(core, self.settings.reconnect.clone())
    }
}

/// No audio for this long and a `KeepAlive` goes (Deepgram closes after 10 s of nothing).
const KEEPALIVE_AFTER: Duration = Duration::from_secs(4);
/// Unfinalized audio kept for a new socket, at most (30 s): a provider that finalizes nothing
/// for longer does not make the session grow without end.
const MAX_KEPT: usize = 30 * SAMPLE_RATE as usize;
/// Audio goes in pieces of at most this many samples (100 ms) when sent again.
const REPLAY_PIECE: usize = SAMPLE_RATE as usize / 10;

/// Deepgram's protocol, sans-IO.
pub struct DeepgramCore {
    settings: DeepgramSettings,
    connected: bool,
    /// Audio Deepgram has not finalized.
    kept: KeptAudio,
    /// Final segments since the last finalize was answered.
    finals: Vec<String>,
    /// When each finalize still unanswered was asked for.
    owed: VecDeque<Instant>,
    /// Of those, how many were sent on the current socket.
    sent_finalizes: usize,
    last_sent: Instant,
    last_heard: Instant,
    /// Audio went out since the provider last said anything.
    waiting: bool,
    /// The driver gave up: every finalize is answered at once with what there is.
    gave_up: bool,
}

impl DeepgramCore {
    /// A core that has not connected yet.
    pub fn new(settings: DeepgramSettings, now: Instant) -> Self {
        Self {
            settings,
            connected: false,
            kept: KeptAudio::new(MAX_KEPT),
            finals: Vec::new(),
            owed: VecDeque::new(),
            sent_finalizes: 0,
            last_sent: now,
            last_heard: now,
            waiting: false,
            gave_up: false,
        }
    }

    fn text(&self, also: &str) -> String {
        let mut words: Vec<&str> = self.finals.iter().map(String::as_str).collect();
        if !also.is_empty() {
            words.push(also);
        }
        words.join(" ")
    }

    /// Answers the oldest finalize with the words so far.
    fn answer(&mut self) -> SttEvent {
        self.owed.pop_front();
        self.sent_finalizes = self.sent_finalizes.saturating_sub(1);
        SttEvent::Finalized(std::mem::take(&mut self.finals).join(" "))
    }

    /// Drops the kept audio up to `end` seconds from the socket's start: it is final.
    fn finalized_up_to(&mut self, end: f64) {
        self.kept
            .done_up_to((end.max(0.0) * f64::from(SAMPLE_RATE)).round() as usize);
    }

    fn audio_message(samples: &[i16]) -> Message {
        Message::Binary(pcm_bytes(samples).into())
    }

    fn text_message(message: ClientMessage) -> Message {
        Message::Text(message.json().into())
    }

    /// What a message from Deepgram says.
    fn heard(&mut self, message: Message, now: Instant) -> Vec<SttEvent> {
        self.last_heard = now;
        self.waiting = false;
        let text = match message {
            Message::Text(text) => text,
            _ => return Vec::new(),
        };
        let parsed: ServerMessage = match serde_json::from_str(&text) {
            Ok(parsed) => parsed,
            Err(e) => {
                crate::warnings::warn(
                    "deepgram_unreadable_message",
                    format_args!("an unreadable Deepgram message was skipped ({e}): {text:.200}"),
                );
                return Vec::new();
            }
        };
        let ServerMessage::Results(results) = parsed else {
            return Vec::new();
        };
        let transcript = results.transcript().to_owned();
        if !results.is_final {
            return if transcript.is_empty() {
                Vec::new()
            } else {
                vec![SttEvent::Interim(self.text(&transcript))]
            };
        }
        self.finalized_up_to(results.end());
        if !transcript.is_empty() {
            self.finals.push(transcript);
        }
        if results.from_finalize && !self.owed.is_empty() {
            return vec![self.answer()];
        }
        if self.finals.is_empty() {
            Vec::new()
        } else {
            vec![SttEvent::Interim(self.text(""))]
        }
    }
}

impl WsCore for DeepgramCore {
    type Input = SttInput;
    type Output = SttEvent;

    fn request(&self) -> Result<ConnectRequest, WsError> {
        let auth = format!("Token {}", self.settings.api_key);
        ws::connect_request(&self.settings.listen_url(), &[("Authorization", &auth)])
    }

    fn opened(&mut self, now: Instant) -> Vec<Message> {
        self.connected = true;
        self.kept.restart();
        self.last_sent = now;
        self.last_heard = now;
        let mut out: Vec<Message> = self
            .kept
            .pieces_from(0, REPLAY_PIECE)
            .iter()
            .map(|piece| Self::audio_message(piece))
            .collect();
        self.waiting = !out.is_empty();
        // Finalizes the last socket took with it are asked again, after their audio.
        self.sent_finalizes = self.owed.len();
        out.extend((0..self.owed.len()).map(|_| Self::text_message(ClientMessage::Finalize)));
        out
    }

    fn lost(&mut self, _now: Instant) -> Vec<SttEvent> {
        self.connected = false;
        self.sent_finalizes = 0;
        self.waiting = false;
        // What it had not finalized goes again on the next socket.
        Vec::new()
    }

    fn input(&mut self, input: SttInput, now: Instant) -> (Vec<Message>, Vec<SttEvent>) {
        if self.gave_up {
            return match input {
                SttInput::Finalize => (Vec::new(), vec![SttEvent::Finalized(String::new())]),
                _ => (Vec::new(), Vec::new()),
            };
        }
        match input {
            SttInput::Audio(samples) if samples.is_empty() => (Vec::new(), Vec::new()),
            SttInput::Audio(samples) => {
                self.kept.push(&samples);
                if !self.connected {
                    return (Vec::new(), Vec::new());
                }
                self.last_sent = now;
                if !self.waiting {
                    self.waiting = true;
                    self.last_heard = now;
                }
                (vec![Self::audio_message(&samples)], Vec::new())
            }
            SttInput::Finalize => {
                self.owed.push_back(now);
                if !self.connected {
                    return (Vec::new(), Vec::new());
                }
                self.sent_finalizes += 1;
                self.last_sent = now;
                (
                    vec![Self::text_message(ClientMessage::Finalize)],
                    Vec::new(),
                )
            }
            // Deepgram listens to all of it; the VAD's other verdicts change nothing here.
            SttInput::SpeechStarted | SttInput::SilenceStarted => (Vec::new(), Vec::new()),
        }
    }

    fn message(&mut self, message: Message, now: Instant) -> Result<Step<SttEvent>, WsError> {
        Ok((Vec::new(), self.heard(message, now)))
    }

    fn tick(&mut self, now: Instant) -> (Tick, Vec<SttEvent>) {
        let mut tick = Tick::default();
        let mut said = Vec::new();
        while self
            .owed
            .front()
            .is_some_and(|asked| now.duration_since(*asked) >= self.settings.finalize_timeout)
        {
            crate::warnings::warn(
                "deepgram_finalize_unanswered",
                "Deepgram did not answer a Finalize in time; the words so far are the turn's",
            );
            said.push(self.answer());
        }
        if self.connected {
            if self.waiting && now.duration_since(self.last_heard) >= self.settings.liveness_timeout
            {
                tick.reconnect = Some(format!(
                    "Deepgram sent nothing for {:?} while audio went to it",
                    self.settings.liveness_timeout
                ));
            } else if now.duration_since(self.last_sent) >= KEEPALIVE_AFTER {
                self.last_sent = now;
                tick.send.push(Self::text_message(ClientMessage::KeepAlive));
            }
        }
        (tick, said)
    }

    fn next_deadline(&self) -> Option<Instant> {
        let finalize = self
            .owed
            .front()
            .map(|asked| *asked + self.settings.finalize_timeout);
        let socket = self.connected.then(|| {
            let keepalive = self.last_sent + KEEPALIVE_AFTER;
            if self.waiting {
                keepalive.min(self.last_heard + self.settings.liveness_timeout)
            } else {
                keepalive
            }
        });
        [finalize, socket].into_iter().flatten().min()
    }

    fn closing(&mut self) -> Vec<Message> {
        vec![Self::text_message(ClientMessage::CloseStream)]
    }

    fn failed(&mut self, error: &WsError) -> Vec<SttEvent> {
        self.gave_up = true;
        let mut said = vec![SttEvent::Failed(format!("Deepgram: {error}"))];
        while !self.owed.is_empty() {
            said.push(self.answer());
        }
        said
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core() -> (DeepgramCore, Instant) {
        let now = Instant::now();
        (DeepgramCore::new(DeepgramSettings::new("k"), now), now)
    }

    fn results(
        start: f64,
        duration: f64,
        text: &str,
        is_final: bool,
        from_finalize: bool,
    ) -> Message {
        Message::Text(
            serde_json::json!({"type": "Results", "channel_index": [0, 1], "start": start,
                "duration": duration, "is_final": is_final, "speech_final": false,
                "from_finalize": from_finalize,
                "channel": {"alternatives": [{"transcript": text, "confidence": 0.9, "words": []}]},
                "metadata": {"request_id": "r"}})
            .to_string()
            .into(),
        )
    }

    /// Samples of audio in `sent`.
    fn samples_in(sent: &[Message]) -> usize {
        sent.iter()
            .map(|m| match m {
                Message::Binary(b) => b.len() / 2,
                _ => 0,
            })
            .sum()
    }

    #[test]
    fn audio_before_the_socket_opens_is_sent_first_then_the_finalize() {
        let (mut core, now) = core();
        assert_eq!(core.input(SttInput::Audio(vec![1; 4_000]), now).0, vec![]);
        assert_eq!(core.input(SttInput::Finalize, now).0, vec![]);
        let sent = core.opened(now);
        let audio = samples_in(&sent);
        assert_eq!(audio, 4_000);
        assert_eq!(
            sent.last(),
            Some(&Message::Text(r#"{"type":"Finalize"}"#.into()))
        );
    }

    #[test]
    fn finals_are_joined_and_the_from_finalize_one_answers() {
        let (mut core, now) = core();
        core.opened(now);
        core.input(SttInput::Audio(vec![0; 32_000]), now);
        let interim = core.message(results(0.0, 1.0, "what time", false, false), now);
        assert_eq!(
            interim,
            Ok((vec![], vec![SttEvent::Interim("what time".into())]))
        );
        core.message(results(0.0, 1.2, "What time is it?", true, false), now)
            .expect("valid");
        core.input(SttInput::Finalize, now);
        let answer = core
            .message(results(1.2, 0.8, "And the date?", true, true), now)
            .expect("valid")
            .1;
        assert_eq!(
            answer,
            vec![SttEvent::Finalized("What time is it? And the date?".into())]
        );
        // All 2 s of audio are final: nothing is kept for a reconnect.
        assert!(core.kept.is_empty());
    }

    #[test]
    fn a_lost_socket_gets_the_unfinalized_audio_and_the_finalize_again() {
        let (mut core, now) = core();
        core.opened(now);
        core.input(SttInput::Audio(vec![7; 32_000]), now);
        // The first second is final; the socket dies before the rest is.
        core.message(results(0.0, 1.0, "Hello", true, false), now)
            .expect("valid");
        core.input(SttInput::Finalize, now);
        core.lost(now);
        core.input(SttInput::Audio(vec![8; 1_600]), now);
        let sent = core.opened(now);
        let audio = samples_in(&sent);
        assert_eq!(
            audio,
            16_000 + 1_600,
            "the unfinalized second and what came since"
        );
        assert_eq!(
            sent.last(),
            Some(&Message::Text(r#"{"type":"Finalize"}"#.into()))
        );
        // The new socket counts from 0 again.
        let answer = core
            .message(results(0.0, 1.1, "there", true, true), now)
            .expect("valid")
            .1;
        assert_eq!(answer, vec![SttEvent::Finalized("Hello there".into())]);
    }

    #[test]
    fn kept_audio_is_bounded_and_stays_aligned_with_the_socket() {
        let (mut core, now) = core();
        core.opened(now);
        for _ in 0..40 {
            core.input(SttInput::Audio(vec![0; SAMPLE_RATE as usize]), now);
        }
        assert_eq!(core.kept.len(), MAX_KEPT);
        // A final up to 35 s drops the first 5 s still kept.
        core.message(results(0.0, 35.0, "long", true, false), now)
            .expect("valid");
        assert_eq!(core.kept.len(), 5 * SAMPLE_RATE as usize);
    }

    #[test]
    fn keepalive_when_idle_a_reconnect_when_silent_and_overdue_finalizes_answered() {
        let (mut core, now) = core();
        core.opened(now);
        let (tick, _) = core.tick(now + KEEPALIVE_AFTER);
        assert_eq!(
            tick.send,
            vec![Message::Text(r#"{"type":"KeepAlive"}"#.into())]
        );
        assert_eq!(tick.reconnect, None);

        let later = now + Duration::from_secs(5);
        core.input(SttInput::Audio(vec![0; 320]), later);
        core.input(SttInput::Finalize, later);
        let (tick, said) = core.tick(later + Duration::from_secs(2));
        assert_eq!(said, vec![SttEvent::Finalized(String::new())]);
        assert_eq!(tick.reconnect, None);
        let (tick, _) = core.tick(later + Duration::from_secs(10));
        assert!(
            tick.reconnect.is_some(),
            "audio went out and nothing came back"
        );
    }

    #[test]
    fn unreadable_messages_are_skipped_and_a_failure_answers_what_is_owed() {
        let (mut core, now) = core();
        core.opened(now);
        assert_eq!(
            core.message(Message::Text("{not json".into()), now),
            Ok((vec![], vec![]))
        );
        assert_eq!(
            core.message(Message::Text(r#"{"type":"Surprise"}"#.into()), now),
            Ok((vec![], vec![]))
        );
        core.input(SttInput::Finalize, now);
        let said = core.failed(&WsError::Permanent("HTTP 401".into()));
        assert!(matches!(&said[0], SttEvent::Failed(m) if m.contains("401")));
        assert_eq!(said[1], SttEvent::Finalized(String::new()));
        let (_, later) = core.input(SttInput::Finalize, now);
        assert_eq!(later, vec![SttEvent::Finalized(String::new())]);
    }
}
