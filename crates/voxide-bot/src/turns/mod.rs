//! User turns: when the user's turn starts and ends, from the VAD and the turn model.
//!
//! The VAD says when speech starts and stops; a pause is not always the end of a turn ("Hello
//! there. [pause] What is the weather like?"). At each VAD stop the stop strategy decides: the
//! Smart Turn model judges the turn's audio so far (off the audio path, on its own
//! threads) and ends the turn at once when it sounds finished, otherwise waits for more
//! speech up to a timeout; or a plain speech timeout ends it after a fixed silence. Weighed
//! with the words and with the answer guessed ahead, the model is asked only when the words
//! leave the pause in doubt: a whole sentence settles it alone. A turn that
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
//!
//! All of that is one sans-IO [`TurnMachine`]: frames and the time go in, frames to push come
//! out. [`UserTurns`] drives it: it feeds it the frames passing by, runs the turn model when it
//! asks, and wakes it at its one deadline.

mod audio;
pub mod backchannel;
pub mod idle;
pub mod machine;
mod mute;
pub mod words;

pub use idle::{IdleParams, UserIdle};
pub use machine::TurnMachine;
pub use mute::{MuteStrategy, UserMute};

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::audio::turn::{SmartTurn, TurnPrediction};
use crate::frames::{DataFrame, Frame, FrameBody, SystemFrame};
use crate::models::ModelError;
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};
use machine::{Action, Input, StopRule};

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
        /// Weigh the turn's words with the verdict ([`machine::StopRule::Model`]).
        words: bool,
    },
}

impl std::fmt::Debug for TurnStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SpeechTimeout(d) => f.debug_tuple("SpeechTimeout").field(d).finish(),
            Self::SmartTurn {
                incomplete_timeout,
                words,
                ..
            } => f
                .debug_struct("SmartTurn")
                .field("incomplete_timeout", incomplete_timeout)
                .field("words", words)
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
    /// Reactions over the bot ("yeah", "mm hmm", "I see": [`backchannel`]) are no words: speech
    /// over the bot interrupts it once the transcript holds a word that is not one (at least
    /// `min_words` of them), and a remark of reactions alone is dropped while the bot talks on.
    pub backchannels: bool,
}

impl Default for BargeIn {
    fn default() -> Self {
        Self {
            min_words: 0,
            resume_after: None,
            pause_at_onset: true,
            backchannels: false,
        }
    }
}

impl TurnStop {
    /// The rule the machine follows.
    fn rule(&self) -> StopRule {
        match self {
            Self::SpeechTimeout(silence) => StopRule::Silence(*silence),
            Self::SmartTurn {
                incomplete_timeout,
                words,
                ..
            } => StopRule::Model {
                incomplete_timeout: *incomplete_timeout,
                words: *words,
            },
        }
    }

    fn model(&self) -> Option<Arc<SmartTurn>> {
        match self {
            Self::SpeechTimeout(_) => None,
            Self::SmartTurn { model, .. } => Some(model.clone()),
        }
    }
}

impl BargeIn {
    /// Whether an interruption waits for words (otherwise the VAD's start interrupts).
    fn waits(&self) -> bool {
        self.min_words > 0 || self.resume_after.is_some() || self.backchannels
    }

    /// The words of `text` that count towards an interruption.
    fn words_in(&self, text: &str) -> usize {
        if self.backchannels {
            backchannel::meaning_words(text)
        } else {
            machine::word_count(text)
        }
    }

    /// The words that confirm an interruption.
    fn words_needed(&self) -> usize {
        self.min_words.max(1)
    }
}

/// Turns VAD events into user turns: the driver of a [`TurnMachine`].
pub struct UserTurns {
    model: Option<Arc<SmartTurn>>,
    shared: Arc<Shared>,
}

/// What the stage and its timer task share.
struct Shared {
    machine: Mutex<TurnMachine>,
    /// The deadline moved, or a verdict was asked for: the timer task looks again.
    wake: Notify,
    /// A verdict the model is working out, on its way to the timer task.
    asked: Mutex<Option<Asked>>,
}

type Judged = Pin<Box<dyn Future<Output = Result<Option<TurnPrediction>, ModelError>> + Send>>;

/// A turn-model verdict being worked out. Dropped, it is no longer wanted: a request still
/// waiting for the model is skipped.
struct Asked {
    id: u64,
    judged: Judged,
}

impl UserTurns {
    /// Turns ended by `stop`; speech over the bot interrupts it at the VAD's start.
    pub fn new(stop: TurnStop) -> Self {
        Self::with_barge_in(stop, BargeIn::default())
    }

    /// Turns ended by `stop`; speech over the bot interrupts it as `barge_in` says.
    pub fn with_barge_in(stop: TurnStop, barge_in: BargeIn) -> Self {
        Self {
            model: stop.model(),
            shared: Arc::new(Shared {
                machine: Mutex::new(TurnMachine::new(stop.rule(), barge_in)),
                wake: Notify::new(),
                asked: Mutex::new(None),
            }),
        }
    }

    /// Hands on the turn's words at each pause whose words are all in, before the turn ends,
    /// for the LLM to start on ([`DataFrame::UserTurnGuess`]).
    pub fn preemptive(self, on: bool) -> Self {
        lock(&self.shared.machine).set_preemptive(on);
        self
    }

    /// Asks the model about the turn's audio; the timer task awaits the verdict.
    fn judge(&self, id: u64, audio: Vec<i16>) {
        let Some(model) = &self.model else {
            return;
        };
        let shared = Arc::downgrade(&self.shared);
        // Skipped, as its turn comes, once the machine has stopped waiting for it.
        let stale = move || {
            shared
                .upgrade()
                .is_none_or(|s| !lock(&s.machine).awaits(id))
        };
        let judged = Box::pin(model.judge(audio, stale));
        *lock(&self.shared.asked) = Some(Asked { id, judged });
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
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
        let is_start = matches!(frame.body, FrameBody::System(SystemFrame::Start(_)));
        let (actions, moved) = {
            let Some(input) = Input::of(&frame.body) else {
                cx.push(frame, direction);
                return Ok(());
            };
            let mut machine = lock(&self.shared.machine);
            let before = machine.next_deadline();
            let actions = machine.handle(input, Instant::now());
            (actions, machine.next_deadline() != before)
        };
        if is_start {
            cx.spawn(drive(self.shared.clone(), cx.pusher()));
        }
        let mut frame = Some(frame);
        let mut wake = moved;
        for action in actions {
            match action {
                Action::Forward => {
                    if let Some(frame) = frame.take() {
                        cx.push(frame, direction);
                    }
                }
                Action::Push(pushed) => cx.push_downstream(pushed),
                Action::Answer(text) => cx.push_downstream(DataFrame::UserTurn(text)),
                Action::Guess { id, text } => {
                    cx.push_downstream(DataFrame::UserTurnGuess { id, text });
                }
                // Downstream to cut the bot's output, upstream so the stages before this one
                // hear of it too.
                Action::Interrupt => cx.push_both_ways(SystemFrame::Interruption),
                Action::Judge { id, audio } => {
                    self.judge(id, audio);
                    wake = true;
                }
            }
        }
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }
}

/// The timer task: wakes the machine at its deadline and hands it the model's verdicts.
async fn drive(shared: Arc<Shared>, pusher: FramePusher) -> Result<(), ProcessorError> {
    let mut judging: Option<Asked> = None;
    loop {
        let deadline = lock(&shared.machine).next_deadline();
        let input = tokio::select! {
            () = shared.wake.notified() => {
                if let Some(asked) = lock(&shared.asked).take() {
                    judging = Some(asked);
                }
                continue;
            }
            judged = async {
                match &mut judging {
                    Some(asked) => asked.judged.as_mut().await,
                    None => std::future::pending().await,
                }
            } => {
                let id = judging.take().map_or(0, |asked| asked.id);
                Input::Verdict { id, judged: judged.map_err(|e| e.to_string()) }
            }
            () = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => Input::Tick,
        };
        let actions = lock(&shared.machine).handle(input, Instant::now());
        for action in actions {
            let (frame, direction): (Frame, _) = match action {
                Action::Push(frame) => (frame.into(), Direction::Downstream),
                Action::Answer(text) => (DataFrame::UserTurn(text).into(), Direction::Downstream),
                Action::Guess { id, text } => (
                    DataFrame::UserTurnGuess { id, text }.into(),
                    Direction::Downstream,
                ),
                Action::Interrupt => {
                    let _ = pusher
                        .push(SystemFrame::Interruption.into(), Direction::Upstream)
                        .await;
                    (SystemFrame::Interruption.into(), Direction::Downstream)
                }
                // Verdicts and ticks bring no frame and ask for no verdict.
                Action::Forward | Action::Judge { .. } => continue,
            };
            let _ = pusher.push(frame, direction).await;
        }
    }
}
