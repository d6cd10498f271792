//! One caller: connects the way a client does, speaks its recorded turns paced by a 20 ms clock
//! (silence between them, as a microphone sends), and times what it hears from the audio itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::{Instant, MissedTickBehavior};

use super::Recorder;
use super::impair::Network;
use super::link::Link;
use super::plan::{Heard, NetworkCounts, Plan};

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

/// Runs session `index`: connects, speaks every turn, and says how it went.
pub async fn run(
    index: usize,
    plan: Arc<Plan>,
    recorder: Recorder,
    live: &super::Live,
) -> SessionResult {
    let started = Instant::now();
    let (trace, traceparent) = new_traceparent();
    let mut result = SessionResult {
        session: index,
        started: plan.secs(started),
        trace_id: trace,
        ..SessionResult::default()
    };
    recorder.event(plan.secs(started), index, "connect_started", json!({}));
    let heard = Arc::new(Mutex::new(Heard::new(
        plan.protocol.output_rate(),
        traceparent,
    )));
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
            outcome.word_errors = Some(crate::word_errors(reference, &transcript));
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

/// A fresh W3C `traceparent` for a session's requests (`00-{trace}-{span}-01`, sampled) and
/// its trace id in hex: the server's spans for the session hang under it.
fn new_traceparent() -> (String, String) {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 24];
    // The system's random source does not fail where voxide runs; zeros would only cost the
    // link between the report and the server's trace.
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let trace = hex(&bytes[..16]);
    let header = format!("00-{trace}-{}-01", hex(&bytes[16..]));
    (trace, header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_session_sends_a_sampled_w3c_traceparent_of_its_own() {
        let (trace, header) = new_traceparent();
        let parts: Vec<&str> = header.split('-').collect();
        assert_eq!(parts.len(), 4, "{header}");
        assert_eq!((parts[0], parts[1], parts[3]), ("00", trace.as_str(), "01"));
        assert_eq!((parts[1].len(), parts[2].len()), (32, 16));
        assert!(header.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
        assert_ne!(new_traceparent().0, trace, "a fresh trace each time");
    }
}
