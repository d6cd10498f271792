//! A bot on recorded audio (`voxide run`): one session fed by a WAV file at real-time pace (or
//! as fast as the pipeline goes), the bot's audio written time-aligned with the input, and the
//! session's events written as JSON lines on the input's clock.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::{BotError, BotOptions};
use crate::audio::wav::{self, Wav, WavError};
use crate::events::Event;
use crate::frames::{AudioFrame, MetricsData, SystemFrame};
use crate::pipeline::Session;
use crate::transports::file::{EventLog, InputClock, WavRecorder};
use crate::transports::{OutputOptions, Pacing};

/// Why a file run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The input could not be read.
    #[error("cannot read the input {path}: {source}")]
    Input {
        /// The file.
        path: PathBuf,
        /// Why.
        source: WavError,
    },
    /// The bot could not be built (a model is missing).
    #[error(transparent)]
    Bot(#[from] BotError),
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What a file run does.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The user's audio.
    pub input: PathBuf,
    /// Where the bot's audio goes.
    pub output: PathBuf,
    /// Where the events go, as JSON lines.
    pub events: Option<PathBuf>,
    /// Feed the input as fast as the pipeline takes it, not at real-time pace.
    pub fast: bool,
    /// After the input ends, how long to wait at most for the bot to finish.
    pub max_tail: Duration,
    /// Silence after the last activity that counts as the bot being done.
    pub settle: Duration,
    /// The bot.
    pub bot: BotOptions,
}

/// A file run's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Seconds of input audio.
    pub input_secs: f64,
    /// Seconds fed in all (input plus the silence while the bot finished).
    pub fed_secs: f64,
    /// Final transcripts of the user's turns.
    pub transcripts: Vec<String>,
    /// What the bot said, sentence by sentence.
    pub bot_text: Vec<String>,
    /// Voice-to-voice latency of each answered turn, from the end of the user's speech, ms.
    pub voice_to_voice_ms: Vec<f64>,
    /// How long each turn's end waited after the user's speech ended, ms.
    pub turn_wait_ms: Vec<f64>,
    /// Tool calls made.
    pub tool_calls: Vec<String>,
    /// Errors the session reported.
    pub errors: Vec<String>,
    /// Why the session ended.
    pub end: String,
}

/// The run's view of the session, from its events.
#[derive(Default)]
struct Progress {
    /// A user turn is open: its words may still be on their way.
    user_turn: bool,
    bot_speaking: bool,
    /// A user turn ended and the bot has not started answering.
    unanswered: bool,
    running_tools: usize,
    last_activity: Duration,
    summary: RunSummary,
}

impl Progress {
    fn on(&mut self, event: &Event, at: Duration) {
        match event {
            Event::UserStartedSpeaking => {
                self.user_turn = true;
                self.unanswered = false;
            }
            Event::UserStoppedSpeaking => {
                self.user_turn = false;
                self.unanswered = true;
            }
            Event::BotStartedSpeaking => {
                self.bot_speaking = true;
                self.unanswered = false;
            }
            Event::BotStoppedSpeaking => self.bot_speaking = false,
            Event::UserTranscription {
                text,
                is_final: true,
            } => self.summary.transcripts.push(text.clone()),
            Event::BotText { text } => self.summary.bot_text.push(text.clone()),
            Event::ToolCallStarted { name, .. } => {
                self.running_tools += 1;
                self.summary.tool_calls.push(name.clone());
            }
            Event::ToolCallResult { .. } | Event::ToolCallCancelled { .. } => {
                self.running_tools = self.running_tools.saturating_sub(1);
            }
            Event::Metrics { data } => {
                for m in data {
                    match m {
                        MetricsData::VoiceToVoice { seconds } => {
                            self.summary.voice_to_voice_ms.push(seconds * 1e3);
                        }
                        MetricsData::TurnWait { seconds } => {
                            self.summary.turn_wait_ms.push(seconds * 1e3);
                        }
                        _ => {}
                    }
                }
                return;
            }
            Event::Error { message, .. } => self.summary.errors.push(message.clone()),
            _ => return,
        }
        self.last_activity = at;
    }

    fn settled(&self, now: Duration, settle: Duration) -> bool {
        !self.user_turn
            && !self.bot_speaking
            && !self.unanswered
            && self.running_tools == 0
            && now.saturating_sub(self.last_activity) >= settle
    }
}

/// Runs one session on a recorded file.
pub async fn run(options: RunOptions) -> Result<RunSummary, RunError> {
    let input = wav::read(&options.input).map_err(|source| RunError::Input {
        path: options.input.clone(),
        source,
    })?;
    let rate = input.sample_rate;
    let mono = input.to_mono();
    let clock = InputClock::default();
    let recorder = WavRecorder::new(clock.clone());
    let output = OutputOptions {
        pacing: if options.fast {
            Pacing::Unpaced
        } else {
            Pacing::RealTime
        },
        ..OutputOptions::default()
    };
    let bot = super::build(&options.bot, recorder.clone(), output)?;
    let builder = Session::builder(bot.pipeline)
        .params(bot.params)
        .resources(bot.resources)
        .idle_timeout(None);
    let events = builder.subscribe();
    let session = builder.spawn();
    let handle = session.handle();

    let log = match &options.events {
        Some(path) => Some(
            EventLog::create(path)
                .await
                .map_err(|source| RunError::Output {
                    path: path.clone(),
                    source,
                })?,
        ),
        None => None,
    };
    let progress = Arc::new(Mutex::new(Progress::default()));
    let writer = tokio::spawn(follow(
        events,
        log,
        progress.clone(),
        clock.clone(),
        options.fast,
    ));
    feed(&handle, &mono, rate, &progress, &clock, &options).await;
    tracing::debug!(fed = ?clock.now(), "input done; ending the session");
    let _ = handle.stop_when_done().await;
    let end = session.join().await;
    tracing::debug!(?end, "session ended");
    let log_result = writer.await;

    let fed = clock.now();
    let wav = recorder.finish(fed).unwrap_or(Wav {
        samples: vec![0; (fed.as_secs_f64() * 24_000.0) as usize],
        sample_rate: 24_000,
        channels: 1,
    });
    wav::write(&options.output, &wav).map_err(|e| RunError::Output {
        path: options.output.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    if let (Some(path), Ok(Err(source))) = (&options.events, log_result) {
        return Err(RunError::Output {
            path: path.clone(),
            source,
        });
    }
    let mut summary =
        std::mem::take(&mut progress.lock().unwrap_or_else(|p| p.into_inner()).summary);
    summary.input_secs = input.seconds();
    summary.fed_secs = fed.as_secs_f64();
    summary.end = format!("{end:?}");
    Ok(summary)
}

/// Follows the session's events into the run's progress and the events file (on the input's
/// clock in a fast run); the file's first write error, if any.
async fn follow(
    mut events: tokio::sync::broadcast::Receiver<crate::events::SessionEvent>,
    mut log: Option<EventLog>,
    progress: Arc<Mutex<Progress>>,
    clock: InputClock,
    fast: bool,
) -> std::io::Result<()> {
    let mut failure = None;
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(lost = n, "the event log fell behind");
                continue;
            }
            Err(_) => break,
        };
        // On the input's clock: in a fast run the wall clock says nothing about it.
        let at = if fast { clock.now() } else { event.elapsed };
        progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .on(&event.event, at);
        if let Some(log) = &mut log
            && failure.is_none()
            && let Err(e) = log.write(&event, at).await
        {
            failure = Some(e);
        }
        if matches!(event.event, Event::SessionEnded { .. }) {
            break;
        }
    }
    match (log, failure) {
        (_, Some(e)) => Err(e),
        (Some(mut log), None) => log.flush().await,
        (None, None) => Ok(()),
    }
}

/// Feeds the input in 20 ms pieces (at real-time pace unless the run is fast), then silence
/// until the bot has finished or the tail runs out.
async fn feed(
    handle: &crate::pipeline::SessionHandle,
    mono: &[i16],
    rate: u32,
    progress: &Mutex<Progress>,
    clock: &InputClock,
    options: &RunOptions,
) {
    let chunk = (rate / 50).max(1) as usize;
    let chunk_time = Duration::from_secs_f64(chunk as f64 / f64::from(rate));
    let silence = vec![0i16; chunk];
    let mut tick = tokio::time::interval(chunk_time);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut pieces = mono.chunks(chunk);
    let mut tail = Duration::ZERO;
    loop {
        let piece = match pieces.next() {
            Some(piece) => piece,
            None => {
                let done = progress
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .settled(clock.now(), options.settle);
                if done || tail >= options.max_tail {
                    break;
                }
                tail += chunk_time;
                &silence[..]
            }
        };
        if options.fast {
            tokio::task::yield_now().await;
        } else {
            tick.tick().await;
        }
        let frame = SystemFrame::InputAudio(AudioFrame::new(piece.to_vec(), rate, 1));
        if handle.queue_frame(frame).await.is_err() {
            break;
        }
        clock.advance(chunk_time);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_not_settled_while_the_users_turn_is_open() {
        let settle = Duration::from_secs(2);
        let mut progress = Progress::default();
        progress.on(&Event::UserStartedSpeaking, Duration::from_secs(1));
        assert!(
            !progress.settled(Duration::from_secs(9), settle),
            "its words may still be on their way"
        );
        progress.on(&Event::UserStoppedSpeaking, Duration::from_secs(10));
        assert!(
            !progress.settled(Duration::from_secs(13), settle),
            "unanswered"
        );
        progress.on(&Event::BotStartedSpeaking, Duration::from_secs(11));
        progress.on(&Event::BotStoppedSpeaking, Duration::from_secs(12));
        assert!(!progress.settled(Duration::from_secs(13), settle));
        assert!(progress.settled(Duration::from_secs(14), settle));
    }
}
