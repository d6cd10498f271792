//! User turns: when the user's turn starts and ends, from the VAD and the turn model.
//!
//! The VAD says when speech starts and stops; a pause is not always the end of a turn ("Hello
//! there. [pause] What is the weather like?"). At each VAD stop the stop strategy decides: the
//! Smart Turn model judges the turn's audio so far (off the audio path, on its own
//! threads) and ends the turn at once when it sounds finished, otherwise waits for more
//! speech up to a timeout; or a plain speech timeout ends it after a fixed silence. A turn that
//! starts while the bot speaks interrupts the bot, at once or, per [`BargeIn`], once enough of
//! the user's words are transcribed, with the bot paused meanwhile and resumed when none come
//! (a false interruption). A turn that starts while the bot is still working out its answer to
//! the last one (the user went on after a pause) interrupts at once: that answer is to half a
//! question. Unless told not to, the stage holds the bot's audio from the VAD's
//! first window of speech over it and plays on if the onset fades: the bot goes quiet within a
//! chunk of the user's first word, not `start_secs` later, and a cough costs a short gap rather
//! than the answer. [`UserMute`] keeps the user out at chosen moments (the greeting, a
//! tool call).
//!
//! A transcript that comes with no speech the VAD heard (a soft voice under its thresholds, or
//! an STT that listens on its own) starts a turn too, which ends after a second without more
//! words.
//!
//! The stage sits after the STT so it sees the transcripts that confirm a barge-in.

mod audio;
mod mute;

pub use mute::{MuteStrategy, UserMute};

use audio::TurnAudio;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::audio::turn::{SmartTurn, TurnPrediction};
use crate::frames::{AudioFrame, ControlFrame, DataFrame, Frame, FrameBody, SystemFrame};
use crate::models::ModelError;
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

/// Silence after the last transcript that ends a turn the VAD never heard.
const TRANSCRIPT_TURN_TIMEOUT: Duration = Duration::from_secs(1);

/// Silence after which a pause the turn model has not judged yet ends the turn, as a silence
/// strategy would. The model is shared: when it is overloaded it serves the newest requests and
/// the rest never get a verdict, and such a turn should not wait out `incomplete_timeout`.
/// Verdicts come well inside it below saturation (p99 0.6 s at 30 sessions on one core).
pub const VERDICT_WAIT: Duration = Duration::from_secs(1);

/// How a user turn ends once the VAD hears silence.
#[derive(Clone)]
pub enum TurnStop {
    /// End after this much silence.
    SpeechTimeout(Duration),
    /// Ask the Smart Turn model; when it says the turn is unfinished, wait for more speech up to
    /// `incomplete_timeout` of silence.
    SmartTurn {
        /// The shared model.
        model: Arc<SmartTurn>,
        /// Silence after which an unfinished-sounding turn ends anyway.
        incomplete_timeout: Duration,
    },
}

impl std::fmt::Debug for TurnStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SpeechTimeout(d) => f.debug_tuple("SpeechTimeout").field(d).finish(),
            Self::SmartTurn {
                incomplete_timeout, ..
            } => f
                .debug_struct("SmartTurn")
                .field("incomplete_timeout", incomplete_timeout)
                .finish(),
        }
    }
}

/// When speech over the bot interrupts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BargeIn {
    /// Words the user's transcript must reach before speech over the bot interrupts it; 0: the
    /// VAD's start is enough. Shorter remarks ("mm-hm") are dropped while the bot talks on.
    pub min_words: usize,
    /// Pause the bot as soon as the user starts speaking over it and, when this long after the
    /// user stops no transcript has confirmed the interruption, resume it where it paused (a
    /// cough, a door). `None`: the bot keeps talking until the interruption is confirmed.
    pub resume_after: Option<Duration>,
    /// Hold the bot's audio from the VAD's first window of speech over it, before the start is
    /// confirmed, and play on if the onset fades (a click, a cough). Off: the bot talks on
    /// until the start is confirmed, `start_secs` into the user's speech.
    pub pause_at_onset: bool,
}

impl Default for BargeIn {
    fn default() -> Self {
        Self {
            min_words: 0,
            resume_after: None,
            pause_at_onset: true,
        }
    }
}

impl BargeIn {
    /// Whether an interruption waits for words (otherwise the VAD's start interrupts).
    fn waits(&self) -> bool {
        self.min_words > 0 || self.resume_after.is_some()
    }

    /// The words that confirm an interruption.
    fn words_needed(&self) -> usize {
        self.min_words.max(1)
    }
}

/// Turns VAD events into user turns.
pub struct UserTurns {
    stop: TurnStop,
    barge_in: BargeIn,
    events: Option<mpsc::UnboundedSender<Input>>,
    pending: Arc<Mutex<Pending>>,
    /// VAD starts so far, counted as they pass (not when the turn task gets to them), so a turn
    /// verdict can tell that the user spoke again while it was worked out.
    speech_starts: Arc<AtomicU64>,
    /// A user turn is open: set here when one starts, cleared by the turn task when it ends.
    turn_open: Arc<AtomicBool>,
    /// The bot owes an answer: set by the turn task when a turn ends, cleared here when the
    /// bot stops speaking or is interrupted.
    answer_due: Arc<AtomicBool>,
    /// The VAD hears speech (between its start and stop frames).
    vad_speaking: bool,
    /// Finals the STT announced and has not delivered yet: transcripts of speech the VAD heard.
    owed: usize,
    bot_speaking: bool,
    interruptions: bool,
    /// The bot's audio is held for a VAD onset that has neither started nor faded yet.
    onset_paused: bool,
}

impl UserTurns {
    /// Turns ended by `stop`; speech over the bot interrupts it at the VAD's start.
    pub fn new(stop: TurnStop) -> Self {
        Self::with_barge_in(stop, BargeIn::default())
    }

    /// Turns ended by `stop`; speech over the bot interrupts it as `barge_in` says.
    pub fn with_barge_in(stop: TurnStop, barge_in: BargeIn) -> Self {
        Self {
            stop,
            barge_in,
            events: None,
            pending: Arc::default(),
            speech_starts: Arc::default(),
            turn_open: Arc::default(),
            answer_due: Arc::default(),
            vad_speaking: false,
            owed: 0,
            bot_speaking: false,
            interruptions: true,
            onset_paused: false,
        }
    }

    /// A transcript of speech the VAD did not hear, outside any turn: opens a turn, ahead of
    /// the transcript so the aggregator keeps its words for it; returns whether it did.
    fn missed_speech(&mut self, text: &str, cx: &mut FrameContext<'_>) -> bool {
        let words = word_count(text);
        // Words of a barge-in still waiting for them belong to that barge-in.
        if words == 0
            || self.vad_speaking
            || self.owed > 0
            || self.turn_open.load(Ordering::SeqCst)
            || lock(&self.pending).active
        {
            return false;
        }
        if self.bot_speaking && self.interruptions && words < self.barge_in.min_words {
            // A remark over the bot, as for speech the VAD heard.
            return false;
        }
        tracing::debug!(
            text,
            "transcript without VAD speech: the user's turn starts"
        );
        self.turn_open.store(true, Ordering::SeqCst);
        cx.push_downstream(SystemFrame::UserStartedSpeaking);
        let answering = self.answer_due.swap(false, Ordering::SeqCst);
        if self.interruptions && (self.bot_speaking || answering) {
            self.onset_paused = false;
            cx.push_both_ways(SystemFrame::Interruption);
        }
        true
    }

    /// Speech may be starting over the bot: hold its audio until the VAD decides.
    fn on_onset(&mut self, cx: &mut FrameContext<'_>) {
        let hold = self.barge_in.pause_at_onset
            && self.bot_speaking
            && self.interruptions
            && !self.onset_paused
            && !self.turn_open.load(Ordering::SeqCst)
            && !lock(&self.pending).paused;
        if hold {
            self.onset_paused = true;
            cx.push_downstream(SystemFrame::PausePlayback);
        }
    }

    /// A transcript: counts toward a pending interruption; returns whether to pass it on.
    fn on_transcript(&mut self, text: &str, is_final: bool, cx: &mut FrameContext<'_>) -> bool {
        let mut pending = lock(&self.pending);
        if !pending.active {
            return true;
        }
        let words = word_count(text);
        let heard = pending.final_words + words;
        if is_final {
            pending.final_words += words;
        }
        if heard >= self.barge_in.words_needed() {
            *pending = Pending::default();
            tracing::debug!(words = heard, "barge-in confirmed");
            self.onset_paused = false;
            // Transcripts are uninterruptible, so this one still reaches the aggregator.
            cx.push_both_ways(SystemFrame::Interruption);
            return true;
        }
        // Too short to interrupt: while the bot talks on, the remark is not a turn.
        !pending.turn_over
    }
}

/// An interruption waiting for the user's words.
#[derive(Debug, Default)]
struct Pending {
    /// Speech started over the bot and no transcript has confirmed it yet.
    active: bool,
    /// The bot's playback is paused for it.
    paused: bool,
    /// The turn it started has ended.
    turn_over: bool,
    /// Words in the turn's final transcripts so far.
    final_words: usize,
}

/// Words in a transcript, punctuation aside.
fn word_count(text: &str) -> usize {
    text.split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .count()
}

fn lock(pending: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    pending.lock().unwrap_or_else(|p| p.into_inner())
}

/// A turn-model verdict being worked out. Dropped, it is no longer wanted: a request still
/// waiting for the model is skipped.
struct Verdict {
    judged: Pin<Box<dyn Future<Output = Result<Option<TurnPrediction>, ModelError>> + Send>>,
    /// The VAD starts counted when it was asked: more since, and the pause was not the end.
    seen: u64,
    /// Not back by then: the turn ends without it ([`VERDICT_WAIT`]).
    by: Instant,
}

/// What the turn task learns from the frames passing by.
enum Input {
    Audio(AudioFrame),
    /// The VAD heard what may be the start of speech.
    Onset,
    /// The VAD confirmed a start; `held`: the bot's audio is held for its onset, and the task
    /// now owns releasing it.
    VadStarted {
        held: bool,
    },
    VadStopped,
    BotSpeaking(bool),
    Interruptions(bool),
    /// The pending interruption was confirmed or dropped elsewhere: forget its timer.
    Settled,
    /// A transcript opened a turn the VAD did not hear.
    TranscriptTurn,
    /// A transcript came while the VAD heard nothing: it keeps such a turn open.
    Words,
}

impl FrameProcessor for UserTurns {
    fn name(&self) -> &str {
        "UserTurns"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let input = match &frame.body {
            FrameBody::System(SystemFrame::Start(start)) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let _ = tx.send(Input::Interruptions(start.params.allow_interruptions));
                self.interruptions = start.params.allow_interruptions;
                self.events = Some(tx);
                let task = TurnTask {
                    stop: self.stop.clone(),
                    barge_in: self.barge_in,
                    pending: self.pending.clone(),
                    pusher: cx.pusher(),
                    audio: TurnAudio::default(),
                    speech_starts: self.speech_starts.clone(),
                    turn_open: self.turn_open.clone(),
                    answer_due: self.answer_due.clone(),
                };
                cx.spawn(task.run(rx));
                None
            }
            FrameBody::System(SystemFrame::InputAudio(audio)) => Some(Input::Audio(audio.clone())),
            FrameBody::System(SystemFrame::VadSpeechOnset) => {
                self.on_onset(cx);
                Some(Input::Onset)
            }
            FrameBody::System(SystemFrame::VadOnsetFaded) => {
                if std::mem::take(&mut self.onset_paused) {
                    tracing::debug!("the onset faded: the bot plays on");
                    cx.push_downstream(SystemFrame::ResumePlayback);
                }
                None
            }
            FrameBody::System(SystemFrame::Interruption) => {
                // An interruption from elsewhere (the session, a realtime LLM's own turn
                // detection) released the hold as it cut the bot off, and dropped the answer in
                // the making.
                self.onset_paused = false;
                self.answer_due.store(false, Ordering::SeqCst);
                None
            }
            FrameBody::System(SystemFrame::VadUserStartedSpeaking) => {
                self.speech_starts.fetch_add(1, Ordering::SeqCst);
                self.vad_speaking = true;
                self.turn_open.store(true, Ordering::SeqCst);
                Some(Input::VadStarted {
                    held: std::mem::take(&mut self.onset_paused),
                })
            }
            FrameBody::System(SystemFrame::VadUserStoppedSpeaking) => {
                self.vad_speaking = false;
                Some(Input::VadStopped)
            }
            FrameBody::System(SystemFrame::TranscriptionPending) => {
                self.owed += 1;
                None
            }
            FrameBody::Control(ControlFrame::TranscriptionDone) => {
                self.owed = self.owed.saturating_sub(1);
                None
            }
            FrameBody::System(SystemFrame::BotStartedSpeaking) => {
                self.bot_speaking = true;
                Some(Input::BotSpeaking(true))
            }
            FrameBody::System(SystemFrame::BotStoppedSpeaking) => {
                self.bot_speaking = false;
                self.answer_due.store(false, Ordering::SeqCst);
                Some(Input::BotSpeaking(false))
            }
            FrameBody::Data(DataFrame::Transcription(t) | DataFrame::InterimTranscription(t)) => {
                if self.missed_speech(&t.text, cx) {
                    if let Some(events) = &self.events {
                        let _ = events.send(Input::TranscriptTurn);
                    }
                    cx.push(frame, direction);
                    return Ok(());
                }
                if !self.vad_speaking
                    && self.owed == 0
                    && let Some(events) = &self.events
                {
                    let _ = events.send(Input::Words);
                }
                let is_final = matches!(&frame.body, FrameBody::Data(DataFrame::Transcription(_)));
                let was_pending = lock(&self.pending).active;
                if !self.on_transcript(&t.text, is_final, cx) {
                    tracing::debug!(text = %t.text, "remark over the bot dropped");
                    return Ok(());
                }
                (was_pending && !lock(&self.pending).active).then_some(Input::Settled)
            }
            _ => None,
        };
        if let (Some(input), Some(events)) = (input, &self.events) {
            let _ = events.send(input);
        }
        cx.push(frame, direction);
        Ok(())
    }
}

struct TurnTask {
    stop: TurnStop,
    barge_in: BargeIn,
    pending: Arc<Mutex<Pending>>,
    pusher: FramePusher,
    /// The user's recent audio, for the turn model.
    audio: TurnAudio,
    speech_starts: Arc<AtomicU64>,
    turn_open: Arc<AtomicBool>,
    answer_due: Arc<AtomicBool>,
}

impl TurnTask {
    async fn run(
        mut self,
        mut inputs: mpsc::UnboundedReceiver<Input>,
    ) -> Result<(), ProcessorError> {
        let (mut in_turn, mut bot_speaking, mut interruptions) = (false, false, true);
        // The open turn was started by a transcript, not the VAD: words keep it open.
        let mut by_transcript = false;
        // The turn's end (silence or an unfinished-sounding pause running out).
        let mut deadline: Option<Instant> = None;
        // When a paused bot resumes if no words confirm the interruption.
        let mut resume_at: Option<Instant> = None;
        // The turn model's verdict on the latest pause, while it is worked out.
        let mut verdict: Option<Verdict> = None;
        loop {
            let next = [deadline, resume_at, verdict.as_ref().map(|v| v.by)]
                .into_iter()
                .flatten()
                .min();
            let input = tokio::select! {
                biased;
                input = inputs.recv() => input,
                judged = async {
                    match &mut verdict {
                        Some(v) => v.judged.as_mut().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let seen = verdict.take().map_or(0, |v| v.seen);
                    let judged = match judged {
                        Ok(Some(p)) => Ok(p),
                        // Skipped: the user spoke again before the model was free.
                        Ok(None) => continue,
                        Err(e) => Err(e),
                    };
                    if !in_turn || self.speech_starts.load(Ordering::SeqCst) != seen {
                        // The user spoke again while the model worked (the pause was not the
                        // end, whatever it says), or the turn has ended already.
                        continue;
                    }
                    match judged {
                        Ok(p) if p.complete => {
                            tracing::debug!(probability = p.probability, "turn complete");
                            in_turn = false;
                            deadline = None;
                            self.end_turn(&mut resume_at).await;
                        }
                        Ok(p) => {
                            // The deadline set at the pause stands: more speech, or the end.
                            tracing::debug!(probability = p.probability, "turn unfinished");
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "turn model failed; ending the turn");
                            in_turn = false;
                            deadline = None;
                            self.end_turn(&mut resume_at).await;
                        }
                    }
                    continue;
                }
                () = async {
                    match next {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    let now = Instant::now();
                    if verdict.as_ref().is_some_and(|v| v.by <= now) {
                        tracing::debug!("no verdict in time: the turn ends on its silence");
                        deadline = Some(now);
                    }
                    if deadline.is_some_and(|d| d <= now) {
                        deadline = None;
                        in_turn = false;
                        by_transcript = false;
                        // A verdict still to come is too late: the turn ends now, judged or not.
                        verdict = None;
                        self.end_turn(&mut resume_at).await;
                    }
                    if resume_at.is_some_and(|r| r <= now) {
                        resume_at = None;
                        self.resume().await;
                    }
                    continue;
                }
            };
            let Some(input) = input else { break };
            match input {
                Input::Audio(audio) => self.audio.keep(&audio),
                Input::Onset => self.audio.onset(),
                Input::Interruptions(allowed) => interruptions = allowed,
                Input::BotSpeaking(speaking) => {
                    bot_speaking = speaking;
                    // The bot finished on its own: what the user says now is a plain turn.
                    if !speaking {
                        let mut pending = lock(&self.pending);
                        if pending.active && !pending.paused {
                            *pending = Pending::default();
                        }
                    }
                }
                Input::Settled => resume_at = None,
                Input::TranscriptTurn => {
                    // The stage announced the turn (and any interruption) ahead of the words.
                    in_turn = true;
                    by_transcript = true;
                    *lock(&self.pending) = Pending::default();
                    deadline = Some(Instant::now() + TRANSCRIPT_TURN_TIMEOUT);
                }
                Input::Words if in_turn && by_transcript => {
                    deadline = Some(Instant::now() + TRANSCRIPT_TURN_TIMEOUT);
                }
                Input::Words => {}
                Input::VadStarted { mut held } => {
                    deadline = None;
                    by_transcript = false;
                    // The pause being judged was not the end.
                    verdict = None;
                    if !in_turn {
                        in_turn = true;
                        self.audio.start_turn();
                        self.push(SystemFrame::UserStartedSpeaking).await;
                        let answering = self.answer_due.swap(false, Ordering::SeqCst);
                        if bot_speaking && interruptions {
                            held = self.barge_in_started(&mut resume_at, held).await;
                        } else {
                            // A turn over silence is a plain turn, whatever came before it.
                            *lock(&self.pending) = Pending::default();
                            if answering && interruptions {
                                // The user went on: the answer being worked out is to half
                                // of what they meant.
                                self.interrupt().await;
                            }
                        }
                    }
                    if held {
                        self.push(SystemFrame::ResumePlayback).await;
                    }
                }
                Input::VadStopped if in_turn => match &self.stop {
                    TurnStop::SpeechTimeout(silence) => deadline = Some(Instant::now() + *silence),
                    TurnStop::SmartTurn {
                        model,
                        incomplete_timeout,
                    } => {
                        // The turn ends by this time whatever the model says, or however long
                        // it takes to say it (sessions share it, so under load it queues).
                        deadline = Some(Instant::now() + *incomplete_timeout);
                        let model = model.clone();
                        let audio = self.audio.turn();
                        let starts = self.speech_starts.clone();
                        let seen = starts.load(Ordering::SeqCst);
                        let spoke_again = move || starts.load(Ordering::SeqCst) != seen;
                        let judged = Box::pin(model.judge(audio, spoke_again));
                        verdict = Some(Verdict {
                            judged,
                            seen,
                            by: Instant::now() + VERDICT_WAIT,
                        });
                    }
                },
                Input::VadStopped => {}
            }
        }
        Ok(())
    }

    /// The user started talking over the bot: interrupt now, or wait for words (paused).
    /// `held`: the bot is already paused for the onset. Returns whether it still needs
    /// resuming (the policy lets the bot talk on while words are awaited).
    async fn barge_in_started(&mut self, resume_at: &mut Option<Instant>, held: bool) -> bool {
        if !self.barge_in.waits() {
            // The interruption releases any pause as it drops the bot's audio.
            self.interrupt().await;
            return false;
        }
        let pause = self.barge_in.resume_after.is_some();
        let was_paused = {
            let mut pending = lock(&self.pending);
            let was_paused = pending.paused;
            *pending = Pending {
                active: true,
                paused: was_paused || pause,
                ..Pending::default()
            };
            was_paused
        };
        *resume_at = None;
        if pause && !was_paused && !held {
            self.push(SystemFrame::PausePlayback).await;
        }
        held && !pause
    }

    /// A paused bot whose interruption no words confirmed plays on.
    async fn resume(&mut self) {
        let resumed = {
            let mut pending = lock(&self.pending);
            let resumed = pending.active && pending.paused;
            if resumed {
                pending.paused = false;
            }
            resumed
        };
        if resumed {
            tracing::debug!("false interruption: the bot resumes");
            self.push(SystemFrame::ResumePlayback).await;
        }
    }
    async fn end_turn(&mut self, resume_at: &mut Option<Instant>) {
        self.turn_open.store(false, Ordering::SeqCst);
        self.audio.end_turn();
        let paused = {
            let mut pending = lock(&self.pending);
            pending.turn_over = pending.active;
            // A remark over the bot (a barge-in still short of words) is not a turn to answer.
            if !pending.active {
                self.answer_due.store(true, Ordering::SeqCst);
            }
            pending.active && pending.paused
        };
        if paused && let Some(after) = self.barge_in.resume_after {
            *resume_at = Some(Instant::now() + after);
        }
        self.push(SystemFrame::UserStoppedSpeaking).await;
    }

    /// Interrupts the bot: downstream to cut its output, upstream so the stages before this one
    /// hear of it too.
    async fn interrupt(&self) {
        let _ = self
            .pusher
            .push(SystemFrame::Interruption.into(), Direction::Upstream)
            .await;
        self.push(SystemFrame::Interruption).await;
    }

    async fn push(&self, frame: SystemFrame) {
        let _ = self.pusher.push(frame.into(), Direction::Downstream).await;
    }
}
