//! The output side every transport shares: bot audio played at real-time pace, 20 ms at a time,
//! with truthful bot started/stopped speaking frames and an immediate stop on interruption.
//!
//! Each output audio frame is played as the stage's job, so the frames behind it (the bot's
//! text, the end of the response, the end of the session) leave the stage only once the audio
//! before them has been played. An interruption drops the job mid-frame and the runtime drops
//! the queued frames: playback stops within one chunk. A pause holds playback between chunks
//! (the bot still counts as speaking) until a resume or an interruption.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::frames::{
    AudioFrame, ControlFrame, DataFrame, Frame, FrameBody, MetricsData, SystemFrame,
};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

pub use crate::audio::AudioSink;

/// How playback keeps time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// One chunk per chunk duration of wall-clock time, as a listener hears it.
    RealTime,
    /// As fast as the sink takes it (offline runs and load tests).
    Unpaced,
}

/// Options of the output stage.
#[derive(Debug, Clone)]
pub struct OutputOptions {
    /// Chunk length.
    pub chunk: Duration,
    /// Silence after the last chunk before the bot counts as stopped.
    pub stop_gap: Duration,
    /// How often a `BotSpeaking` tick goes upstream while the bot speaks.
    pub speaking_tick: Duration,
    /// How long before the VAD's stop the user's speech actually ended (its `stop_secs`), so
    /// voice-to-voice latency and the turn wait count from the end of speech.
    pub speech_end_offset: Duration,
    /// Real-time or unpaced.
    pub pacing: Pacing,
}

impl Default for OutputOptions {
    fn default() -> Self {
        Self {
            chunk: Duration::from_millis(20),
            stop_gap: Duration::from_millis(300),
            speaking_tick: Duration::from_millis(200),
            speech_end_offset: Duration::ZERO,
            pacing: Pacing::RealTime,
        }
    }
}

struct Playback<S> {
    sink: S,
    /// When the next chunk is due; `None` when nothing is playing.
    next_slot: Option<Instant>,
    speaking: bool,
    /// When the user's speech in their last turn ended (the VAD heard its silence), until the
    /// bot answers it.
    user_stopped: Option<Instant>,
    /// When the VAD last heard silence after speech in the open turn.
    vad_stopped: Option<Instant>,
}

/// The output stage around an [`AudioSink`].
pub struct AudioOutput<S: AudioSink> {
    playback: Arc<Mutex<Playback<S>>>,
    options: OutputOptions,
    wake: Arc<Notify>,
    /// Playback is held (a possible interruption is being confirmed).
    paused: watch::Sender<bool>,
}

fn lock<S>(playback: &Mutex<Playback<S>>) -> std::sync::MutexGuard<'_, Playback<S>> {
    playback.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: AudioSink> AudioOutput<S> {
    /// An output playing into `sink`.
    pub fn new(sink: S, options: OutputOptions) -> Self {
        Self {
            playback: Arc::new(Mutex::new(Playback {
                sink,
                next_slot: None,
                speaking: false,
                user_stopped: None,
                vad_stopped: None,
            })),
            options,
            wake: Arc::new(Notify::new()),
            paused: watch::Sender::new(false),
        }
    }

    fn started_speaking(&self, cx: &mut FrameContext<'_>) {
        let latency = {
            let mut playback = lock(&self.playback);
            if playback.speaking {
                return;
            }
            playback.speaking = true;
            playback.user_stopped.take().map(|t| t.elapsed())
        };
        self.wake.notify_one();
        cx.push_upstream(SystemFrame::BotStartedSpeaking);
        cx.push_downstream(SystemFrame::BotStartedSpeaking);
        if let Some(latency) = latency {
            let seconds = (latency + self.options.speech_end_offset).as_secs_f64();
            cx.push_downstream(SystemFrame::Metrics(vec![MetricsData::VoiceToVoice {
                seconds,
            }]));
        }
    }
}

impl<S: AudioSink> AudioOutput<S> {
    /// The user's turn ended: the clock starts where their speech ended, not where the turn
    /// detector decided it had; the wait between the two is its own metric. A turn the VAD
    /// never heard (a transcript opened it) ends where it is.
    fn user_stopped(&mut self, cx: &mut FrameContext<'_>) {
        let now = Instant::now();
        let speech_ended = {
            let mut playback = lock(&self.playback);
            let ended = playback.vad_stopped.take().unwrap_or(now);
            playback.user_stopped = Some(ended);
            ended
        };
        let waited = now.duration_since(speech_ended) + self.options.speech_end_offset;
        cx.push_downstream(SystemFrame::Metrics(vec![MetricsData::TurnWait {
            seconds: waited.as_secs_f64(),
        }]));
    }

    /// The bot is no longer speaking: said both ways, if it was.
    fn stopped_speaking(&mut self, cx: &mut FrameContext<'_>) {
        let was_speaking = std::mem::take(&mut lock(&self.playback).speaking);
        if was_speaking {
            cx.push_upstream(SystemFrame::BotStoppedSpeaking);
            cx.push_downstream(SystemFrame::BotStoppedSpeaking);
        }
    }
}

impl<S: AudioSink> FrameProcessor for AudioOutput<S> {
    fn name(&self) -> &str {
        "AudioOutput"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if direction == Direction::Upstream {
            cx.push(frame, direction);
            return Ok(());
        }
        match &frame.body {
            FrameBody::System(SystemFrame::Start(_)) => {
                let watcher = Watcher {
                    playback: self.playback.clone(),
                    wake: self.wake.clone(),
                    paused: self.paused.subscribe(),
                    options: self.options.clone(),
                    pusher: cx.pusher(),
                };
                cx.spawn(watcher.run());
            }
            FrameBody::System(SystemFrame::UserStoppedSpeaking) => self.user_stopped(cx),
            FrameBody::System(SystemFrame::VadUserStoppedSpeaking) => {
                lock(&self.playback).vad_stopped = Some(Instant::now());
            }
            FrameBody::System(SystemFrame::VadUserStartedSpeaking) => {
                lock(&self.playback).vad_stopped = None;
            }
            FrameBody::System(SystemFrame::UserStartedSpeaking) => {
                lock(&self.playback).user_stopped = None;
            }
            FrameBody::System(SystemFrame::PausePlayback) => {
                self.paused.send_replace(true);
            }
            FrameBody::System(SystemFrame::ResumePlayback) => {
                // The pause is not idleness: the stop gap counts from the resume.
                let mut playback = lock(&self.playback);
                if playback.next_slot.is_some() {
                    playback.next_slot = Some(Instant::now());
                }
                drop(playback);
                self.paused.send_replace(false);
            }
            FrameBody::System(SystemFrame::Interruption) => {
                self.paused.send_replace(false);
                {
                    let mut playback = lock(&self.playback);
                    playback.sink.clear();
                    playback.next_slot = None;
                }
                self.stopped_speaking(cx);
            }
            FrameBody::Data(DataFrame::OutputAudio(audio)) => {
                self.started_speaking(cx);
                let job = play(
                    self.playback.clone(),
                    self.paused.subscribe(),
                    audio.clone(),
                    self.options.chunk,
                    self.options.pacing,
                );
                cx.push(frame, direction);
                cx.run(job);
                return Ok(());
            }
            // Whatever played last counts as finished now, before the session ends.
            FrameBody::Control(ControlFrame::End(_)) => self.stopped_speaking(cx),
            // After the speech before it: this stage plays each frame's audio in turn.
            FrameBody::Data(DataFrame::Phone(action)) => {
                let carried = lock(&self.playback).sink.phone(action);
                if !carried {
                    tracing::warn!(
                        ?action,
                        "this transport has no phone line: the action is dropped"
                    );
                }
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Plays one frame's audio chunk by chunk.
async fn play<S: AudioSink>(
    playback: Arc<Mutex<Playback<S>>>,
    mut paused: watch::Receiver<bool>,
    audio: AudioFrame,
    chunk: Duration,
    pacing: Pacing,
) -> Result<(), ProcessorError> {
    let channels = usize::from(audio.channels.max(1));
    let mono: Vec<i16> = if channels == 1 {
        audio.samples.to_vec()
    } else {
        audio.samples.iter().step_by(channels).copied().collect()
    };
    let per_chunk = ((u128::from(audio.sample_rate) * chunk.as_micros()) / 1_000_000).max(1);
    for piece in mono.chunks(per_chunk as usize) {
        // The sender lives as long as the stage; if it is gone, so is this job.
        let _ = paused.wait_for(|held| !held).await;
        let due = {
            let mut playback = lock(&playback);
            playback.sink.write(piece, audio.sample_rate);
            let length = Duration::from_secs_f64(piece.len() as f64 / f64::from(audio.sample_rate));
            let now = Instant::now();
            // A late chunk starts now rather than rushing to catch up.
            let start = playback.next_slot.filter(|s| *s > now).unwrap_or(now);
            let due = start + length;
            playback.next_slot = Some(due);
            due
        };
        if pacing == Pacing::RealTime {
            tokio::time::sleep_until(due).await;
        }
    }
    Ok(())
}

/// Ends the bot's speech once the audio has run out, and ticks while it speaks.
struct Watcher<S> {
    playback: Arc<Mutex<Playback<S>>>,
    wake: Arc<Notify>,
    paused: watch::Receiver<bool>,
    options: OutputOptions,
    pusher: FramePusher,
}

impl<S: AudioSink> Watcher<S> {
    async fn run(self) -> Result<(), ProcessorError> {
        loop {
            self.wake.notified().await;
            let mut last_tick = Instant::now();
            loop {
                tokio::time::sleep(self.options.chunk).await;
                if *self.paused.borrow() {
                    // Held, not finished: the bot still has the floor.
                    last_tick = Instant::now();
                    continue;
                }
                let stopped = {
                    let mut playback = lock(&self.playback);
                    if !playback.speaking {
                        break;
                    }
                    let idle_since = playback.next_slot.unwrap_or_else(Instant::now);
                    let stopped = Instant::now() >= idle_since + self.options.stop_gap;
                    if stopped {
                        playback.speaking = false;
                        playback.next_slot = None;
                    }
                    stopped
                };
                if stopped {
                    for direction in [Direction::Upstream, Direction::Downstream] {
                        let _ = self
                            .pusher
                            .push(SystemFrame::BotStoppedSpeaking.into(), direction)
                            .await;
                    }
                    break;
                }
                if last_tick.elapsed() >= self.options.speaking_tick {
                    last_tick = Instant::now();
                    let _ = self
                        .pusher
                        .push(SystemFrame::BotSpeaking.into(), Direction::Upstream)
                        .await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Event;
    use crate::pipeline::{Pipeline, Session};

    struct Silent;

    impl AudioSink for Silent {
        fn write(&mut self, _: &[i16], _: u32) {}
    }

    #[tokio::test(start_paused = true)]
    async fn latency_counts_from_the_end_of_speech_and_the_turn_wait_is_reported_apart() {
        let options = OutputOptions {
            speech_end_offset: Duration::from_millis(200),
            ..OutputOptions::default()
        };
        let session = Session::builder(Pipeline::new().then(AudioOutput::new(Silent, options)))
            .idle_timeout(None)
            .spawn();
        let mut events = session.handle().subscribe();
        let handle = session.handle();
        handle
            .queue_frame(SystemFrame::VadUserStoppedSpeaking)
            .await
            .expect("queued");
        // The turn detector takes half a second to end the turn, then the answer takes 300 ms.
        tokio::time::sleep(Duration::from_millis(500)).await;
        handle
            .queue_frame(SystemFrame::UserStoppedSpeaking)
            .await
            .expect("queued");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let audio = crate::frames::AudioFrame::new(vec![100i16; 1_600], 16_000, 1);
        handle
            .queue_frame(DataFrame::OutputAudio(audio))
            .await
            .expect("queued");
        tokio::time::sleep(Duration::from_millis(500)).await;
        handle.cancel();
        let _ = session.join().await;
        let (mut wait, mut v2v) = (None, None);
        while let Ok(event) = events.try_recv() {
            if let Event::Metrics { data } = event.event {
                for m in data {
                    match m {
                        MetricsData::TurnWait { seconds } => wait = Some(seconds),
                        MetricsData::VoiceToVoice { seconds } => v2v = Some(seconds),
                        _ => {}
                    }
                }
            }
        }
        let ms = |s: Option<f64>| (s.expect("reported") * 1e3).round();
        assert_eq!(
            ms(wait),
            700.0,
            "the VAD's 200 ms window and the detector's 500 ms"
        );
        assert_eq!(
            ms(v2v),
            1_000.0,
            "from the end of speech, not the end of the turn"
        );
    }
}
