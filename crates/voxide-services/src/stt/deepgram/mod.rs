//! Deepgram live transcription (`wss://api.deepgram.com/v1/listen`): linear16 audio in binary
//! frames from the session's start, interim and final results back, `Finalize` at the first
//! silence after speech (the final carrying `from_finalize` answers it, usually before the VAD's
//! stop asks for the words), `KeepAlive` when no audio went for 4 s, `CloseStream` at the end.
//!
//! [`DeepgramCore`] is sans-IO and runs on the shared WebSocket driver ([`crate::ws`]).
//! It keeps every sample Deepgram has not finalized: audio that came before the socket was open
//! and whatever a lost socket never finalized is sent again, in order, on the next one, so no
//! word is lost to a slow handshake or a dropped connection. Result times count from each
//! socket's start, so a final's end says how much of the kept audio is done with.

mod wire;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::kept::{KeptAudio, pcm_bytes};
use super::socket::{SocketProvider, SocketStt};
use super::stream::{SttEvent, SttInput};
use crate::ws::{self, ConnectRequest, Message, ReconnectPolicy, Step, Tick, WsCore, WsError};
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
    pub api_key: voxide_core::secret::Secret,
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
            api_key: voxide_core::secret::Secret::new(api_key),
            model: DEFAULT_MODEL.to_owned(),
            language: "en".to_owned(),
            liveness_timeout: Duration::from_secs(10),
            finalize_timeout: Duration::from_secs(2),
            reconnect: ReconnectPolicy::default(),
        }
    }

    /// From `DEEPGRAM_API_KEY` (required) and `DEEPGRAM_URL`.
    pub fn from_env() -> Result<Self, WsError> {
        let key = crate::key_from_env("DEEPGRAM_API_KEY", "--stt deepgram")
            .map_err(WsError::Permanent)?;
        let mut settings = Self::new(key);
        if let Some(url) = crate::url_from_env("DEEPGRAM_URL") {
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
pub type DeepgramStt = SocketStt<DeepgramSettings>;

impl SocketProvider for DeepgramSettings {
    const NAME: &'static str = "deepgram";
    const SAMPLE_RATE: u32 = SAMPLE_RATE;
    type Core = DeepgramCore;

    fn model(&self) -> &str {
        &self.model
    }

    fn core(&self, now: Instant) -> DeepgramCore {
        DeepgramCore::new(self.clone(), now)
    }

    fn reconnect(&self) -> ReconnectPolicy {
        self.reconnect.clone()
    }
}

/// No audio for this long and a `KeepAlive` goes (Deepgram closes after 10 s of nothing).
const KEEPALIVE_AFTER: Duration = Duration::from_secs(4);
/// Unfinalized audio kept for a new socket, at most (30 s): a provider that finalizes nothing
/// for longer does not make the session grow without end.
const MAX_KEPT: usize = 30 * SAMPLE_RATE as usize;
/// Audio goes in pieces of at most this many samples (100 ms) when sent again.
const REPLAY_PIECE: usize = SAMPLE_RATE as usize / 10;

/// A VAD stop waiting for its words.
#[derive(Debug, Clone, Copy)]
struct Owed {
    /// When the stop asked.
    asked: Instant,
    /// It sent a `Finalize` of its own; otherwise the early ones in flight answer it.
    own: bool,
}

/// Deepgram's protocol, sans-IO.
pub struct DeepgramCore {
    settings: DeepgramSettings,
    connected: bool,
    /// Audio Deepgram has not finalized.
    kept: KeptAudio,
    /// Final segments since the last finalize was answered.
    finals: Vec<String>,
    /// The VAD stops not answered yet, oldest first.
    owed: VecDeque<Owed>,
    /// `Finalize`s sent early (at a first silence, before any stop asked) on this socket and not
    /// answered yet.
    early: usize,
    /// An early `Finalize` went at the last first silence: all speech since the last stop is
    /// being finalized, and the stop need not ask again.
    covered: bool,
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
            early: 0,
            covered: false,
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
        SttEvent::Finalized(std::mem::take(&mut self.finals).join(" "))
    }

    /// A `from_finalize` final came: the oldest `Finalize` in flight is answered, and with it
    /// the stop that waits on it, if any.
    fn finalize_answered(&mut self) -> Option<SttEvent> {
        if self.early > 0 {
            self.early -= 1;
            // A stop waits on the early finalizes; the last one answers it.
            let waits = self.owed.front().is_some_and(|owed| !owed.own);
            return (self.early == 0 && waits).then(|| self.answer());
        }
        (!self.owed.is_empty()).then(|| self.answer())
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
        let Some(parsed) =
            ws::read_wire::<ServerMessage>(&text, "Deepgram", "deepgram_unreadable_message")
        else {
            return Vec::new();
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
        if results.from_finalize {
            if let Some(answer) = self.finalize_answered() {
                return vec![answer];
            }
            if self.early == 0 && self.owed.is_empty() && !self.finals.is_empty() {
                // The early finalizes are all answered before any stop: the words of the
                // speech before the first silence are all in.
                return vec![SttEvent::Settled(self.text(""))];
            }
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
        let auth = format!("Token {}", self.settings.api_key.expose());
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
        // Finalizes the last socket took with it are asked again, after their audio, each for
        // its own stop now.
        self.owed.iter_mut().for_each(|owed| owed.own = true);
        out.extend((0..self.owed.len()).map(|_| Self::text_message(ClientMessage::Finalize)));
        out
    }

    fn lost(&mut self, _now: Instant) -> Vec<SttEvent> {
        self.connected = false;
        self.early = 0;
        self.covered = false;
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
            // Speech is over for now: Deepgram finalizes it while the VAD waits out its stop
            // window, so the words are usually in when the stop asks for them. More speech
            // before the stop makes another first silence, and another early finalize.
            SttInput::SilenceStarted => {
                self.covered = self.connected && self.owed.is_empty();
                if !self.covered {
                    return (Vec::new(), Vec::new());
                }
                self.early += 1;
                self.last_sent = now;
                (
                    vec![Self::text_message(ClientMessage::Finalize)],
                    Vec::new(),
                )
            }
            SttInput::SpeechStarted => {
                self.covered = false;
                (Vec::new(), Vec::new())
            }
            // Deepgram hears all the audio: where speech began is its own to find.
            SttInput::SpeechOnset { .. } | SttInput::OnsetNearSpeaker | SttInput::OnsetFaded => {
                (Vec::new(), Vec::new())
            }
            SttInput::Finalize if std::mem::take(&mut self.covered) => {
                // Only silence since the early finalize: its answer is this stop's.
                self.owed.push_back(Owed {
                    asked: now,
                    own: false,
                });
                if self.early == 0 {
                    return (Vec::new(), vec![self.answer()]);
                }
                (Vec::new(), Vec::new())
            }
            SttInput::Finalize => {
                self.owed.push_back(Owed {
                    asked: now,
                    own: true,
                });
                if !self.connected {
                    return (Vec::new(), Vec::new());
                }
                self.last_sent = now;
                (
                    vec![Self::text_message(ClientMessage::Finalize)],
                    Vec::new(),
                )
            }
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
            .is_some_and(|owed| now.duration_since(owed.asked) >= self.settings.finalize_timeout)
        {
            // Deepgram may leave a finalize unanswered (nothing left to flush): the early ones
            // still counted would hold up every later stop.
            self.early = 0;
            voxide_core::warnings::warn(
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
            .map(|owed| owed.asked + self.settings.finalize_timeout);
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

    const FINALIZE: &str = r#"{"type":"Finalize"}"#;

    #[test]
    fn a_first_silence_finalizes_early_settles_the_words_and_the_stop_takes_them_at_once() {
        let (mut core, now) = core();
        core.opened(now);
        core.input(SttInput::SpeechStarted, now);
        core.input(SttInput::Audio(vec![0; 16_000]), now);
        let (sent, said) = core.input(SttInput::SilenceStarted, now);
        assert_eq!(sent, vec![Message::Text(FINALIZE.into())]);
        assert_eq!(said, vec![]);
        let early = core.message(results(0.0, 1.0, "What time is it?", true, true), now);
        assert_eq!(
            early,
            Ok((vec![], vec![SttEvent::Settled("What time is it?".into())]))
        );
        // The stop window was silence: no second finalize, the words are the stop's now.
        let (sent, said) = core.input(SttInput::Finalize, now);
        assert_eq!(sent, vec![]);
        assert_eq!(said, vec![SttEvent::Finalized("What time is it?".into())]);
    }

    #[test]
    fn words_settle_only_once_every_early_finalize_is_answered() {
        let (mut core, now) = core();
        core.opened(now);
        core.input(SttInput::SpeechStarted, now);
        core.input(SttInput::Audio(vec![0; 16_000]), now);
        core.input(SttInput::SilenceStarted, now);
        core.input(SttInput::Audio(vec![0; 16_000]), now);
        core.input(SttInput::SilenceStarted, now);
        let first = core
            .message(results(0.0, 1.0, "Book a table", true, true), now)
            .expect("valid")
            .1;
        assert_eq!(first, vec![SttEvent::Interim("Book a table".into())]);
        let second = core
            .message(results(1.0, 1.0, "for two.", true, true), now)
            .expect("valid")
            .1;
        assert_eq!(
            second,
            vec![SttEvent::Settled("Book a table for two.".into())]
        );
    }

    #[test]
    fn a_stop_waits_for_every_early_finalize_of_its_speech() {
        let (mut core, now) = core();
        core.opened(now);
        core.input(SttInput::SpeechStarted, now);
        core.input(SttInput::Audio(vec![0; 16_000]), now);
        core.input(SttInput::SilenceStarted, now);
        // The user went on before the stop: a second first silence, a second early finalize.
        core.input(SttInput::Audio(vec![0; 16_000]), now);
        let (sent, _) = core.input(SttInput::SilenceStarted, now);
        assert_eq!(sent, vec![Message::Text(FINALIZE.into())]);
        assert_eq!(core.input(SttInput::Finalize, now), (vec![], vec![]));
        let first = core
            .message(results(0.0, 1.0, "Book a table", true, true), now)
            .expect("valid")
            .1;
        assert_eq!(first, vec![SttEvent::Interim("Book a table".into())]);
        let second = core
            .message(results(1.0, 1.0, "for two.", true, true), now)
            .expect("valid")
            .1;
        assert_eq!(
            second,
            vec![SttEvent::Finalized("Book a table for two.".into())]
        );
    }

    #[test]
    fn an_early_finalize_deepgram_leaves_unanswered_costs_only_its_own_turn() {
        let (mut core, now) = core();
        core.opened(now);
        core.input(SttInput::SpeechStarted, now);
        core.input(SttInput::SilenceStarted, now);
        core.input(SttInput::Finalize, now);
        let (_, said) = core.tick(now + Duration::from_secs(2));
        assert_eq!(said, vec![SttEvent::Finalized(String::new())]);
        // The next turn's early answer is its own, not the lost one's.
        let later = now + Duration::from_secs(3);
        core.input(SttInput::SpeechStarted, later);
        core.input(SttInput::SilenceStarted, later);
        core.message(results(1.0, 1.0, "Next.", true, true), later)
            .expect("valid");
        let (_, said) = core.input(SttInput::Finalize, later);
        assert_eq!(said, vec![SttEvent::Finalized("Next.".into())]);
    }

    #[test]
    fn a_stop_whose_early_finalize_went_down_with_the_socket_asks_again() {
        let (mut core, now) = core();
        core.opened(now);
        core.input(SttInput::SpeechStarted, now);
        core.input(SttInput::Audio(vec![0; 16_000]), now);
        core.input(SttInput::SilenceStarted, now);
        core.input(SttInput::Finalize, now);
        core.lost(now);
        let sent = core.opened(now);
        assert_eq!(samples_in(&sent), 16_000);
        assert_eq!(sent.last(), Some(&Message::Text(FINALIZE.into())));
        let answer = core
            .message(results(0.0, 1.0, "Hello.", true, true), now)
            .expect("valid")
            .1;
        assert_eq!(answer, vec![SttEvent::Finalized("Hello.".into())]);
    }

    #[test]
    fn a_first_silence_while_a_stop_is_owed_leaves_the_next_stop_its_own_finalize() {
        let (mut core, now) = core();
        core.opened(now);
        core.input(SttInput::Finalize, now);
        assert_eq!(core.input(SttInput::SilenceStarted, now), (vec![], vec![]));
        let (sent, _) = core.input(SttInput::Finalize, now);
        assert_eq!(sent, vec![Message::Text(FINALIZE.into())]);
        let first = core
            .message(results(0.0, 1.0, "One.", true, true), now)
            .expect("valid")
            .1;
        assert_eq!(first, vec![SttEvent::Finalized("One.".into())]);
        let second = core
            .message(results(1.0, 1.0, "Two.", true, true), now)
            .expect("valid")
            .1;
        assert_eq!(second, vec![SttEvent::Finalized("Two.".into())]);
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
