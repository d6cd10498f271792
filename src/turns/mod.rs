//! User turns: when the user's turn starts and ends, from the VAD and the turn model.
//!
//! The VAD says when speech starts and stops; a pause is not always the end of a turn ("Hello
//! there. [pause] What is the weather like?"). At each VAD stop the stop strategy decides: the
//! Smart Turn model judges the last seconds of the user's audio (off the audio path, on a
//! blocking thread) and ends the turn at once when it sounds finished, otherwise waits for more
//! speech up to a timeout; or a plain speech timeout ends it after a fixed silence. A turn that
//! starts while the bot speaks interrupts the bot. [`UserMute`] keeps the user out at chosen
//! moments (the greeting, a tool call).

mod mute;

pub use mute::{MuteStrategy, UserMute};

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::audio::resample::StreamResampler;
use crate::audio::turn::SmartTurn;
use crate::audio::turn::smart_turn::WINDOW_SECS;
use crate::audio::wav::to_f32;
use crate::frames::{AudioFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

/// The sample rate the turn model reads.
const MODEL_RATE: u32 = 16_000;

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

/// Turns VAD events into user turns.
pub struct UserTurns {
    stop: TurnStop,
    events: Option<mpsc::UnboundedSender<Input>>,
}

impl UserTurns {
    /// Turns ended by `stop`.
    pub fn new(stop: TurnStop) -> Self {
        Self { stop, events: None }
    }
}

/// What the turn task learns from the frames passing by.
enum Input {
    Audio(AudioFrame),
    VadStarted,
    VadStopped,
    BotSpeaking(bool),
    Interruptions(bool),
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
                self.events = Some(tx);
                let task = TurnTask {
                    stop: self.stop.clone(),
                    pusher: cx.pusher(),
                    audio: Vec::new(),
                    resampler: None,
                };
                cx.spawn(task.run(rx));
                None
            }
            FrameBody::System(SystemFrame::InputAudio(audio)) => Some(Input::Audio(audio.clone())),
            FrameBody::System(SystemFrame::VadUserStartedSpeaking) => Some(Input::VadStarted),
            FrameBody::System(SystemFrame::VadUserStoppedSpeaking) => Some(Input::VadStopped),
            FrameBody::System(SystemFrame::BotStartedSpeaking) => Some(Input::BotSpeaking(true)),
            FrameBody::System(SystemFrame::BotStoppedSpeaking) => Some(Input::BotSpeaking(false)),
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
    pusher: FramePusher,
    /// The user's recent audio at 16 kHz, for the turn model.
    audio: Vec<f32>,
    resampler: Option<(u32, StreamResampler)>,
}

impl TurnTask {
    async fn run(
        mut self,
        mut inputs: mpsc::UnboundedReceiver<Input>,
    ) -> Result<(), ProcessorError> {
        let (mut in_turn, mut bot_speaking, mut interruptions) = (false, false, true);
        let mut deadline: Option<Instant> = None;
        loop {
            let input = match deadline {
                Some(at) => match tokio::time::timeout_at(at, inputs.recv()).await {
                    Ok(input) => input,
                    Err(_) => {
                        deadline = None;
                        in_turn = false;
                        self.end_turn().await;
                        continue;
                    }
                },
                None => inputs.recv().await,
            };
            let Some(input) = input else { break };
            match input {
                Input::Audio(audio) => self.keep(&audio),
                Input::Interruptions(allowed) => interruptions = allowed,
                Input::BotSpeaking(speaking) => bot_speaking = speaking,
                Input::VadStarted => {
                    deadline = None;
                    if !in_turn {
                        in_turn = true;
                        self.push(SystemFrame::UserStartedSpeaking).await;
                        if bot_speaking && interruptions {
                            self.push(SystemFrame::Interruption).await;
                        }
                    }
                }
                Input::VadStopped if in_turn => match &self.stop {
                    TurnStop::SpeechTimeout(silence) => deadline = Some(Instant::now() + *silence),
                    TurnStop::SmartTurn {
                        model,
                        incomplete_timeout,
                    } => {
                        let (model, audio) = (model.clone(), self.audio.clone());
                        let verdict =
                            tokio::task::spawn_blocking(move || model.predict(&audio)).await;
                        match verdict {
                            Ok(Ok(p)) if p.complete => {
                                tracing::debug!(probability = p.probability, "turn complete");
                                in_turn = false;
                                self.end_turn().await;
                            }
                            Ok(Ok(p)) => {
                                tracing::debug!(probability = p.probability, "turn unfinished");
                                deadline = Some(Instant::now() + *incomplete_timeout);
                            }
                            Ok(Err(e)) => {
                                tracing::warn!(error = %e, "turn model failed; ending the turn");
                                in_turn = false;
                                self.end_turn().await;
                            }
                            Err(e) => return Err(ProcessorError::new(e.to_string())),
                        }
                    }
                },
                Input::VadStopped => {}
            }
        }
        Ok(())
    }

    /// Keeps the last seconds of the user's audio, resampled for the model.
    fn keep(&mut self, audio: &AudioFrame) {
        if self
            .resampler
            .as_ref()
            .is_none_or(|(rate, _)| *rate != audio.sample_rate)
        {
            match StreamResampler::new(audio.sample_rate, MODEL_RATE) {
                Ok(r) => self.resampler = Some((audio.sample_rate, r)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot resample the input for the turn model");
                    return;
                }
            }
        }
        let Some((_, resampler)) = &mut self.resampler else {
            return;
        };
        let channels = usize::from(audio.channels.max(1));
        let mono: Vec<i16> = audio.samples.iter().step_by(channels).copied().collect();
        self.audio.extend(to_f32(&resampler.process(&mono)));
        let keep = WINDOW_SECS * MODEL_RATE as usize;
        // Trim in steps so the buffer is not shifted on every frame.
        if self.audio.len() > keep + MODEL_RATE as usize {
            self.audio.drain(..self.audio.len() - keep);
        }
    }

    async fn end_turn(&mut self) {
        self.push(SystemFrame::UserStoppedSpeaking).await;
    }

    async fn push(&self, frame: SystemFrame) {
        let _ = self.pusher.push(frame.into(), Direction::Downstream).await;
    }
}
