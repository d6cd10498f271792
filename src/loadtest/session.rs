//! One caller: connects the way a client does, speaks its recorded turns paced by a 20 ms clock
//! (silence between them, as a microphone sends), and times what it hears from the audio itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::{Instant, MissedTickBehavior};

use super::impair::{Impairment, Network};
use super::link::Link;
use super::signal::{Change, Voice};
use super::{Protocol, Recorder};
use crate::audio::mulaw;
use crate::audio::resample::StreamResampler;
use crate::bot::calculator::{format_number, read_number};
use crate::text::{word_edits, word_list};

/// The bot's audio is over after this much quiet.
const HANGOVER_SECS: f64 = 0.8;
/// Samples of one 20 ms frame at 16 kHz.
pub(super) const FRAME: usize = 320;

/// One recorded user turn, encoded once for every session.
pub struct TurnAudio {
    /// The WAV it came from.
    pub name: String,
    /// 20 ms frames as the wire carries them (PCM bytes, μ-law bytes for Twilio, Opus packets
    /// for WebRTC).
    frames: Vec<Vec<u8>>,
    /// Where its speech starts and ends, in seconds from its start.
    pub speech_start: f64,
    pub speech_end: f64,
    /// What it says (the `.txt` beside the WAV), to score the bot's transcript against.
    pub reference: Option<String>,
}

impl TurnAudio {
    /// `samples` (mono 16 kHz) with `tone` (the room, empty for none) under them, encoded for
    /// `protocol`; `None` when they hold no speech. Where the speech starts and ends is read
    /// from the clean samples.
    pub fn new(name: String, samples: &[i16], tone: &[i16], protocol: Protocol) -> Option<Self> {
        let (start, end) = super::signal::speech_bounds(samples, 16_000)?;
        let frames = encode(&super::room::mix(samples, tone), protocol)?;
        Some(Self {
            name,
            frames,
            speech_start: start as f64 / 16_000.0,
            speech_end: end as f64 / 16_000.0,
            reference: None,
        })
    }
}

/// `samples` (mono 16 kHz) as the 20 ms frames `protocol` carries: PCM bytes, μ-law bytes for
/// Twilio and SIP, Opus packets for WebRTC.
pub(super) fn encode(samples: &[i16], protocol: Protocol) -> Option<Vec<Vec<u8>>> {
    Some(match protocol {
        Protocol::Ws => samples
            .chunks(FRAME)
            .map(|c| {
                let mut frame: Vec<u8> = c.iter().flat_map(|s| s.to_le_bytes()).collect();
                frame.resize(FRAME * 2, 0);
                frame
            })
            .collect(),
        Protocol::WebRtc | Protocol::WebRtcStart => super::webrtc::opus_frames(samples)?,
        Protocol::Twilio | Protocol::Sip => {
            let narrow = StreamResampler::new(16_000, 8_000)
                .map(|mut r| r.process(samples))
                .unwrap_or_default();
            narrow
                .chunks(FRAME / 2)
                .map(|c| {
                    let mut frame: Vec<u8> = c.iter().map(|s| mulaw::encode(*s)).collect();
                    frame.resize(FRAME / 2, mulaw::encode(0));
                    frame
                })
                .collect()
        }
    })
}

/// What the session's driver is told of each turn.
#[derive(Debug, Clone, Default)]
pub struct TurnResult {
    pub session: usize,
    pub turn: usize,
    pub audio: String,
    /// When its first frame went, in seconds from the run's start.
    pub user_start: f64,
    /// When its speech ended.
    pub speech_end: f64,
    pub onset: Option<f64>,
    pub reply_end: Option<f64>,
    /// The turn talked over the bot's reply: its speech's onset to the bot's audio stopping, ms.
    pub barge_in_stop_ms: Option<f64>,
    /// What the bot heard: its final transcripts of the turn, joined.
    pub transcript: Option<String>,
    /// Against the turn's reference text: words wrong (replaced, added or left out) and
    /// words in the reference.
    pub word_errors: Option<(usize, usize)>,
    /// What went wrong, by kind.
    pub error: Option<String>,
}

impl TurnResult {
    /// The end of the user's speech to the bot's first sound, in ms.
    pub fn v2v_ms(&self) -> Option<f64> {
        self.onset.map(|o| (o - self.speech_end) * 1000.0)
    }
}

/// One session's outcome.
#[derive(Debug, Clone, Default)]
pub struct SessionResult {
    pub session: usize,
    /// Seconds from the run's start.
    pub started: f64,
    pub connected: Option<f64>,
    pub first_audio: Option<f64>,
    pub turns: Vec<TurnResult>,
    /// Why it ended early, by kind (`connect`, `dropped`).
    pub error: Option<String>,
    /// How late each 20 ms frame went out, in ms.
    pub pacing_lag_ms: Vec<f64>,
    /// The node that answered (`X-Voxide-Node`).
    pub node: Option<String>,
    /// The trace the server's spans of the session are in, where it traces (`--otlp-endpoint`).
    pub trace_id: String,
    /// Trickled-candidate `PATCH`es sent.
    pub trickle_sent: usize,
    /// The statuses of those refused (`0`: no answer).
    pub trickle_refused: Vec<u16>,
    /// What the network did to the caller's audio as the bot reported it (its last `network`
    /// metrics), over WebRTC.
    pub bot_heard: Option<NetworkCounts>,
    /// What the network did to the bot's voice as the caller's jitter buffer saw it, over
    /// WebRTC.
    pub caller_heard: Option<NetworkCounts>,
    /// Whether the bot sent any transcript.
    pub transcribed: bool,
}

/// Packets one way, by what became of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NetworkCounts {
    pub received: u64,
    pub lost: u64,
    pub recovered: u64,
    pub concealed: u64,
    pub late: u64,
}

impl NetworkCounts {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Self) {
        self.received += other.received;
        self.lost += other.lost;
        self.recovered += other.recovered;
        self.concealed += other.concealed;
        self.late += other.late;
    }
}

impl From<crate::transports::jitter::NetworkStats> for NetworkCounts {
    fn from(stats: crate::transports::jitter::NetworkStats) -> Self {
        Self {
            received: stats.received,
            lost: stats.lost,
            recovered: stats.recovered,
            concealed: stats.concealed,
            late: stats.late,
        }
    }
}

/// What the reader heard, shared with the speaker.
pub(super) struct Heard {
    /// Follows the bot's audio (the speaker's clock ends speech that no audio follows).
    pub(super) voice: Voice,
    onsets: Vec<f64>,
    offsets: Vec<f64>,
    /// Server events: (seconds, type, with `-` read as `_`).
    events: Vec<(f64, String)>,
    /// The connection ended, for this reason.
    pub(super) closed: Option<String>,
    /// The node that answered the connection.
    pub(super) node: Option<String>,
    /// The W3C `traceparent` the connection carries: the server's trace of the session is
    /// then the one [`SessionResult::trace_id`] names.
    pub(super) traceparent: String,
    /// Trickle `PATCH`es sent, and the statuses of those refused.
    pub(super) trickle_sent: usize,
    pub(super) trickle_refused: Vec<u16>,
    /// The bot's final transcripts of the caller, in order.
    transcripts: Vec<String>,
    /// The bot's last report of what the network did to the caller's audio.
    bot_network: Option<NetworkCounts>,
    /// What the network did to the bot's voice, as the caller's jitter buffer saw it.
    pub(super) caller_network: Option<NetworkCounts>,
}

/// The words of `text` as a WER scores them: lowercase, without punctuation, and a number
/// said in words written in digits ("twenty six" and "26" are the same word), as the usual
/// English normaliser does, so a recogniser is not charged for how it writes a number.
pub(super) fn scored_words(text: &str) -> Vec<String> {
    /// The longest run of words read as one number.
    const LONGEST: usize = 6;
    let words = word_list(&text.replace('-', " "));
    let mut out = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        let number = (1..=LONGEST.min(words.len() - i)).rev().find_map(|n| {
            let run = &words[i..i + n];
            let spelled = run.iter().all(|w| NUMBER_WORDS.contains(&w.as_str()));
            spelled
                .then(|| read_number(&run.join(" ")))
                .flatten()
                .map(|value| (n, format_number(value)))
        });
        match number {
            Some((n, digits)) => {
                out.push(digits);
                i += n;
            }
            None => {
                out.push(words[i].clone());
                i += 1;
            }
        }
    }
    out
}

/// The words a number is said in.
const NUMBER_WORDS: &[&str] = &[
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
    "thirty",
    "forty",
    "fifty",
    "sixty",
    "seventy",
    "eighty",
    "ninety",
    "hundred",
    "thousand",
    "million",
    "and",
];

/// Transcripts a session keeps at most (a bot that sends more is not heard further).
const MAX_TRANSCRIPTS: usize = 10_000;

impl Heard {
    /// A server event.
    pub(super) fn event(&mut self, at: f64, kind: &str) {
        self.events.push((at, kind.replace('-', "_")));
    }

    /// A server message's content, RTVI or `/ws`: a final transcript of the caller, or the
    /// bot's network metrics.
    pub(super) fn message(&mut self, kind: &str, message: &Value) {
        match kind {
            "user-transcription" if message["data"]["final"] == true => {
                self.transcript(message["data"]["text"].as_str());
            }
            "user_transcription" if message["final"] == true => {
                self.transcript(message["text"].as_str());
            }
            "metrics" => {
                if let Some(network) = message["data"]["network"]
                    .as_array()
                    .and_then(|list| list.last())
                    .and_then(|n| serde_json::from_value(n["value"].clone()).ok())
                {
                    self.bot_network = Some(network);
                }
            }
            _ => {}
        }
    }

    fn transcript(&mut self, text: Option<&str>) {
        if let Some(text) = text
            && self.transcripts.len() < MAX_TRANSCRIPTS
        {
            self.transcripts.push(text.trim().to_owned());
        }
    }

    pub(super) fn note(
        &mut self,
        changes: impl IntoIterator<Item = Change>,
        index: usize,
        recorder: &Recorder,
    ) {
        for change in changes {
            match change {
                Change::Onset(at) => {
                    self.onsets.push(at);
                    recorder.event(at, index, "bot_audio_onset", json!({}));
                }
                Change::Offset(at) => {
                    self.offsets.push(at);
                    recorder.event(at, index, "bot_audio_end", json!({}));
                }
            }
        }
    }
}

/// How a session speaks.
pub struct Plan {
    pub protocol: Protocol,
    /// The socket's URL.
    pub url: String,
    pub turns: usize,
    pub think: Duration,
    /// Talk over the bot this long after its reply starts (each turn after the first).
    pub barge_in_at: Option<Duration>,
    pub response_timeout: Duration,
    pub audio: Arc<Vec<TurnAudio>>,
    /// The frames the gaps between turns loop through (one of digital silence, or the room).
    pub gap: Arc<Vec<Vec<u8>>>,
    /// The run's clock.
    pub origin: Instant,
    /// The bearer token a guarded server wants.
    pub auth_token: Option<String>,
    /// What the network does to the caller's frames.
    pub network: Impairment,
    /// What the network does to the bot's voice on its way back (WebRTC).
    pub received: Impairment,
}

impl Plan {
    /// What session `index` says at its turn `turn`: the sessions take the WAVs in turn, each
    /// from where the one before stops, so a run covers as many of them as it has turns.
    fn turn_audio(&self, index: usize, turn: usize) -> &TurnAudio {
        &self.audio[(index * self.turns + turn) % self.audio.len()]
    }

    pub(super) fn secs(&self, at: Instant) -> f64 {
        at.duration_since(self.origin).as_secs_f64()
    }
}

/// Runs session `index`: connects, speaks every turn, and says how it went.
pub async fn run(
    index: usize,
    plan: Arc<Plan>,
    recorder: Recorder,
    live: &super::Live,
) -> SessionResult {
    let started = Instant::now();
    let (trace, traceparent) = crate::observe::trace::new_traceparent();
    let mut result = SessionResult {
        session: index,
        started: plan.secs(started),
        trace_id: trace.hex(),
        ..SessionResult::default()
    };
    recorder.event(plan.secs(started), index, "connect_started", json!({}));
    let heard = Arc::new(Mutex::new(Heard {
        voice: Voice::new(plan.protocol.output_rate(), HANGOVER_SECS),
        onsets: Vec::new(),
        offsets: Vec::new(),
        events: Vec::new(),
        closed: None,
        node: None,
        traceparent,
        trickle_sent: 0,
        trickle_refused: Vec::new(),
        transcripts: Vec::new(),
        bot_network: None,
        caller_network: None,
    }));
    let connecting = Link::connect(&plan, index, heard.clone(), recorder.clone());
    let connected = tokio::time::timeout(Duration::from_secs(20), connecting)
        .await
        .unwrap_or_else(|_| Err("connect_timeout".to_owned()));
    let link = match connected {
        Ok(link) => link,
        Err(kind) => {
            recorder.event(
                plan.secs(Instant::now()),
                index,
                "error",
                json!({"kind": kind}),
            );
            result.error = Some(kind);
            return result;
        }
    };
    let connected = Instant::now();
    result.connected = Some(plan.secs(connected));
    recorder.event(plan.secs(connected), index, "connected", json!({}));
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let network = plan.network.network(index);
    let mut caller = Caller {
        index,
        network,
        plan,
        recorder,
        heard,
        link,
        tick,
        sent: 0,
        transcribed: 0,
        result,
    };
    caller.talk(live).await;
    caller.hang_up().await
}

/// One session's caller once connected: its clock, what it sent and heard, its results.
struct Caller {
    index: usize,
    /// The network between the caller and the bot.
    network: Network,
    plan: Arc<Plan>,
    recorder: Recorder,
    heard: Arc<Mutex<Heard>>,
    link: Link,
    tick: tokio::time::Interval,
    sent: usize,
    /// Transcripts already given to a turn.
    transcribed: usize,
    result: SessionResult,
}

/// A turn's speech as it went out.
struct Spoken {
    outcome: TurnResult,
    /// When the first sample of the speech was spoken, run seconds.
    onset: Option<f64>,
}

impl Caller {
    /// Sends the next frame on the clock; when it went, in run seconds. A mic sends a frame
    /// once it is captured, so that is when its last sample was spoken.
    async fn send_frame(&mut self, bytes: &[u8]) -> Result<f64, ()> {
        let scheduled = self.tick.tick().await;
        let now = Instant::now();
        self.result
            .pacing_lag_ms
            .push(now.saturating_duration_since(scheduled).as_secs_f64() * 1000.0);
        self.sent += 1;
        let fate = self.network.fate();
        self.link.send(bytes, self.sent - 1, fate).await?;
        Ok(self.plan.secs(now))
    }

    fn heard(&self) -> std::sync::MutexGuard<'_, Heard> {
        self.heard.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every turn: the speech, then silence until the reply has ended (or the turn talks over
    /// it).
    async fn talk(&mut self, live: &super::Live) {
        // The turn being spoken talks over the reply to the one before.
        let mut barging_in = false;
        for turn in 0..self.plan.turns {
            let Ok(spoken) = self.speak(turn).await else {
                return;
            };
            let mut outcome = spoken.outcome;
            if barging_in {
                outcome.barge_in_stop_ms = self.bot_fell_silent(spoken.onset);
            }
            barging_in = self.await_reply(turn, &mut outcome).await;
            self.score(turn, &mut outcome);
            let dropped = outcome.error.as_deref() == Some("dropped");
            live.turn(outcome.v2v_ms());
            self.result.turns.push(outcome);
            if dropped {
                self.result.error = Some("dropped".into());
                return;
            }
        }
    }

    /// Sends turn `turn`'s audio; an error when the link dropped (recorded).
    async fn speak(&mut self, turn: usize) -> Result<Spoken, ()> {
        let plan = self.plan.clone();
        let audio = plan.turn_audio(self.index, turn);
        let mut outcome = TurnResult {
            session: self.index,
            turn,
            audio: audio.name.clone(),
            ..TurnResult::default()
        };
        // The frame holding the speech's last sample, and how much of it follows that sample.
        let end_frame = ((audio.speech_end / 0.02).ceil() as usize).saturating_sub(1);
        let after_end = (end_frame + 1) as f64 * 0.02 - audio.speech_end;
        // The frame holding the speech's first sample, and how much of it comes before.
        let start_frame = (audio.speech_start / 0.02) as usize;
        let before_start = audio.speech_start - start_frame as f64 * 0.02;
        let mut onset = None;
        let mut begun = None;
        for (k, bytes) in audio.frames.iter().enumerate() {
            let Ok(at) = self.send_frame(bytes).await else {
                self.result.error = Some("dropped".into());
                outcome.error = Some("dropped".into());
                self.result.turns.push(outcome);
                return Err(());
            };
            begun.get_or_insert(at);
            if k == start_frame {
                // Sent as the frame ended: its first sample was spoken 20 ms earlier.
                onset = Some(at - 0.02 + before_start);
            }
            if k == end_frame {
                outcome.speech_end = at - after_end;
            }
        }
        let begun = begun.unwrap_or_default();
        outcome.user_start = begun;
        let (index, recorder) = (self.index, &self.recorder);
        recorder.event(begun, index, "user_audio_start", json!({"turn": turn}));
        recorder.event(
            outcome.speech_end,
            index,
            "user_speech_end",
            json!({"turn": turn}),
        );
        Ok(Spoken { outcome, onset })
    }

    /// Gives the turn the bot's transcripts since the last turn, and scores them against the
    /// turn's reference.
    fn score(&mut self, turn: usize, outcome: &mut TurnResult) {
        let heard: Vec<String> = {
            let heard = self.heard();
            heard.transcripts[self.transcribed.min(heard.transcripts.len())..].to_vec()
        };
        self.transcribed += heard.len();
        let transcript = heard.join(" ");
        let reference = self.plan.turn_audio(self.index, turn).reference.as_deref();
        if let Some(reference) = reference {
            let reference = scored_words(reference);
            let errors = word_edits(&reference, &scored_words(&transcript));
            outcome.word_errors = Some((errors, reference.len()));
        }
        outcome.transcript = (!heard.is_empty()).then_some(transcript);
    }

    /// How long the bot took to fall silent once the user talked over it, ms.
    fn bot_fell_silent(&self, onset: Option<f64>) -> Option<f64> {
        let now = self.plan.secs(Instant::now());
        let mut heard = self.heard();
        let quiet = heard.voice.quiet_until(now);
        heard.note(quiet, self.index, &self.recorder);
        let onset = onset?;
        heard
            .offsets
            .iter()
            .copied()
            .find(|o| *o > onset)
            .map(|o| (o - onset) * 1000.0)
    }

    /// The gap (silence or room tone) until the reply has ended (or never came), then the think
    /// time; whether the next turn talks over the reply instead.
    async fn await_reply(&mut self, turn: usize, outcome: &mut TurnResult) -> bool {
        let deadline = outcome.speech_end + self.plan.response_timeout.as_secs_f64();
        let gap = self.plan.gap.clone();
        let mut quiet_from: Option<f64> = None;
        loop {
            let frame = &gap[self.sent % gap.len()];
            let Ok(at) = self.send_frame(frame).await else {
                outcome.error = Some("dropped".into());
                return false;
            };
            if !self.follow_reply(at, outcome) {
                outcome.error = Some("dropped".into());
                return false;
            }
            let talk_over = self
                .plan
                .barge_in_at
                .filter(|_| turn + 1 < self.plan.turns)
                .zip(outcome.onset)
                .is_some_and(|(after, onset)| at - onset >= after.as_secs_f64());
            if talk_over && outcome.reply_end.is_none() {
                return true;
            }
            if outcome.reply_end.is_some() {
                let since = *quiet_from.get_or_insert(at);
                if at - since >= self.plan.think.as_secs_f64() {
                    return false;
                }
            } else if outcome.onset.is_none() && at > deadline {
                outcome.error = Some("no_response".into());
                let kind = json!({"kind": "no_response", "turn": turn});
                self.recorder.event(at, self.index, "error", kind);
                return false;
            } else if at > deadline + 60.0 {
                outcome.error = Some("reply_never_ended".into());
                return false;
            }
        }
    }

    /// Notes the reply's onset and end as heard by `at`; false when the link has closed.
    fn follow_reply(&self, at: f64, outcome: &mut TurnResult) -> bool {
        let mut heard = self.heard();
        // A server that sends nothing after a reply ends it on the clock.
        let quiet = heard.voice.quiet_until(at);
        heard.note(quiet, self.index, &self.recorder);
        if heard.closed.is_some() {
            return false;
        }
        if outcome.onset.is_none() {
            outcome.onset = heard
                .onsets
                .iter()
                .copied()
                .find(|o| *o > outcome.speech_end);
        }
        if let Some(onset) = outcome.onset
            && outcome.reply_end.is_none()
        {
            let stopped = heard
                .events
                .iter()
                .find(|(t, kind)| *t > onset && kind == "bot_stopped_speaking")
                .map(|(t, _)| *t);
            outcome.reply_end = heard
                .offsets
                .iter()
                .copied()
                .find(|o| *o > onset)
                .or(stopped);
        }
        true
    }

    /// Closes the link; the session's result.
    async fn hang_up(mut self) -> SessionResult {
        let first = self.heard().onsets.first().copied();
        self.result.first_audio = first;
        self.link.close().await;
        {
            let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
            self.result.node = heard.node.take();
            self.result.trickle_sent = heard.trickle_sent;
            self.result.trickle_refused = std::mem::take(&mut heard.trickle_refused);
            self.result.bot_heard = heard.bot_network;
            self.result.caller_heard = heard.caller_network;
            self.result.transcribed = !heard.transcripts.is_empty();
        }
        self.recorder.event(
            self.plan.secs(Instant::now()),
            self.index,
            "closed",
            json!({"error": self.result.error}),
        );
        self.result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard() -> Heard {
        Heard {
            voice: Voice::new(16_000, HANGOVER_SECS),
            onsets: Vec::new(),
            offsets: Vec::new(),
            events: Vec::new(),
            closed: None,
            node: None,
            traceparent: String::new(),
            trickle_sent: 0,
            trickle_refused: Vec::new(),
            transcripts: Vec::new(),
            bot_network: None,
            caller_network: None,
        }
    }

    #[test]
    fn numbers_score_the_same_in_words_and_in_digits() {
        assert_eq!(
            scored_words("What's fifteen plus twenty-six? Add one hundred and four."),
            ["whats", "15", "plus", "26", "add", "104"]
        );
        assert_eq!(
            scored_words("What's 15 plus 26?"),
            ["whats", "15", "plus", "26"]
        );
        assert_eq!(
            scored_words("and a time for you to go"),
            ["and", "a", "time", "for", "you", "to", "go"],
            "a lone 'and' and words like numbers stay words"
        );
    }

    #[test]
    fn final_transcripts_and_the_bots_network_report_are_heard_in_both_dialects() {
        let mut heard = heard();
        let rtvi =
            |kind: &str, data: Value| json!({"label": "rtvi-ai", "type": kind, "data": data});
        heard.message(
            "user-transcription",
            &rtvi(
                "user-transcription",
                json!({"text": "what is", "final": false}),
            ),
        );
        heard.message(
            "user-transcription",
            &rtvi(
                "user-transcription",
                json!({"text": " What is the time? ", "final": true}),
            ),
        );
        heard.message(
            "user_transcription",
            &json!({"type": "user_transcription", "text": "Thanks.", "final": true}),
        );
        heard.message(
            "metrics",
            &rtvi(
                "metrics",
                json!({"network": [{"processor": "webrtc", "value": {"received": 90,
                    "lost": 10, "recovered": 6, "concealed": 4, "late": 1, "reordered": 2,
                    "duplicated": 0, "jitter_ms": 9.5, "depth_ms": 40.0, "sent_loss": null}}]}),
            ),
        );
        assert_eq!(heard.transcripts, ["What is the time?", "Thanks."]);
        assert_eq!(
            heard.bot_network,
            Some(NetworkCounts {
                received: 90,
                lost: 10,
                recovered: 6,
                concealed: 4,
                late: 1,
            })
        );
    }
}
