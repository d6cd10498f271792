//! The VAD stage: input audio in, `VadSpeechOnset` / `VadOnsetFaded` /
//! `VadUserStartedSpeaking` / `UserSpeaking` (ticks) / `VadSilenceStarted` /
//! `VadUserStoppedSpeaking` out.
//!
//! Audio passes through untouched at once; a task per session feeds it to the state machine,
//! with the model run by the process-wide [`VadBatcher`] thread. If audio stops arriving while
//! the user speaks (a dropped connection, a muted mic), the stage ends the speech after
//! `audio_idle_timeout` rather than leaving the turn open.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::analyzer::{QuickChange, VadAnalyzer, VadEvent, VadParams, VadState};
use super::batcher::VadBatcher;
use crate::frames::{AudioFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};
use voxide_engines::speaker::SpeakerEncoder;

/// Detects the user's speech in the input audio.
pub struct VadStage {
    params: VadParams,
    audio_idle_timeout: Duration,
    batcher: Arc<VadBatcher>,
    voiceprint: Option<Arc<SpeakerEncoder>>,
    audio: Option<mpsc::Sender<AudioFrame>>,
}

impl VadStage {
    /// A stage with `params`, using the shared batched model.
    pub fn new(batcher: Arc<VadBatcher>, params: VadParams) -> Self {
        Self {
            params,
            audio_idle_timeout: Duration::from_secs(1),
            batcher,
            voiceprint: None,
            audio: None,
        }
    }

    /// Follows the user's voice with `encoder` where the room talks, so a user who talks on is
    /// not read as the café's level (the embeddings run on a blocking thread).
    pub fn voiceprint(mut self, encoder: Arc<SpeakerEncoder>) -> Self {
        self.voiceprint = Some(encoder);
        self
    }

    /// How long audio may stop mid-speech before the speech is ended.
    pub fn audio_idle_timeout(mut self, timeout: Duration) -> Self {
        self.audio_idle_timeout = timeout;
        self
    }
}

impl FrameProcessor for VadStage {
    fn name(&self) -> &str {
        "VadStage"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::System(SystemFrame::Start(_)) => {
                let (tx, rx) = mpsc::channel(crate::audio::AUDIO_QUEUE);
                self.audio = Some(tx);
                let detector = Detector {
                    batcher: self.batcher.clone(),
                    voiceprint: self.voiceprint.clone(),
                    params: self.params,
                    idle: self.audio_idle_timeout,
                    pusher: cx.pusher(),
                };
                cx.spawn(detector.run(rx));
            }
            FrameBody::System(SystemFrame::InputAudio(audio)) => {
                if let Some(tx) = &self.audio
                    && let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(audio.clone())
                {
                    crate::warnings::audio_dropped("vad_in");
                }
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

struct Detector {
    batcher: Arc<VadBatcher>,
    voiceprint: Option<Arc<SpeakerEncoder>>,
    params: VadParams,
    idle: Duration,
    pusher: FramePusher,
}

impl Detector {
    async fn run(self, mut audio: mpsc::Receiver<AudioFrame>) -> Result<(), ProcessorError> {
        let mut analyzer: Option<(u32, VadAnalyzer)> = None;
        let mut state = None;
        loop {
            // Anything but silence waits for audio only so long: speech, and an onset (the bot
            // may be paused for it), must not outlast the audio.
            let hearing = analyzer
                .as_ref()
                .is_some_and(|(_, a)| a.state() != VadState::Quiet);
            let next = if hearing {
                match tokio::time::timeout(self.idle, audio.recv()).await {
                    Ok(next) => next,
                    Err(_) => {
                        if let Some((_, a)) = &mut analyzer {
                            let was_speaking = a.state() == VadState::Speaking;
                            if let Some(event) = a.force_stop() {
                                tracing::debug!("audio stopped mid-speech; ending the speech");
                                if was_speaking {
                                    self.push_frame(SystemFrame::VadSilenceStarted).await;
                                }
                                self.push(event).await;
                            }
                        }
                        continue;
                    }
                }
            } else {
                audio.recv().await
            };
            let Some(chunk) = next else { break };
            // A stream that changes rate starts over.
            if analyzer
                .as_ref()
                .is_none_or(|(rate, _)| *rate != chunk.sample_rate)
            {
                let mut fresh =
                    VadAnalyzer::new(self.batcher.model().clone(), chunk.sample_rate, self.params)
                        .map_err(|e| ProcessorError::new(e.to_string()))?;
                if let Some(encoder) = &self.voiceprint {
                    fresh = fresh.with_voiceprint(encoder.clone());
                }
                state = Some(self.batcher.model().new_state(fresh.model_rate()));
                analyzer = Some((chunk.sample_rate, fresh));
            }
            let Some((_, a)) = &mut analyzer else {
                continue;
            };
            let mono = mono(&chunk);
            for window in a.windows(&mono) {
                let Some(s) = state.take() else { break };
                let (next_state, confidence) = self
                    .batcher
                    .probability(s, window.clone())
                    .await
                    .map_err(|e| ProcessorError::new(e.to_string()))?;
                state = Some(next_state);
                let before = a.state();
                let event = a.apply(confidence, &window);
                // Quiet straight after speaking: a stop delay of one window.
                let silent = matches!(a.state(), VadState::Stopping | VadState::Quiet);
                if before == VadState::Speaking && silent {
                    self.push_frame(SystemFrame::VadSilenceStarted).await;
                } else if before == VadState::Stopping && a.state() == VadState::Speaking {
                    self.push_frame(SystemFrame::VadSpeechResumed).await;
                }
                if let Some(event) = event {
                    self.push(event).await;
                }
                if let Some(job) = a.voice_job() {
                    let heard = tokio::task::spawn_blocking(move || job.run())
                        .await
                        .map_err(|e| {
                            ProcessorError::new(format!("the voice check stopped: {e}"))
                        })?;
                    a.voice_heard(heard);
                }
            }
            match a.between_windows() {
                Some(QuickChange::SilenceStarted) => {
                    self.push_frame(SystemFrame::VadSilenceStarted).await;
                }
                Some(QuickChange::SpeechResumed) => {
                    self.push_frame(SystemFrame::VadSpeechResumed).await;
                }
                None => {}
            }
        }
        Ok(())
    }

    async fn push(&self, event: VadEvent) {
        let frame = match event {
            VadEvent::Onset { near_speaker } => SystemFrame::VadSpeechOnset { near_speaker },
            VadEvent::OnsetNearSpeaker => SystemFrame::VadOnsetNearSpeaker,
            VadEvent::OnsetFaded => SystemFrame::VadOnsetFaded,
            VadEvent::Started => SystemFrame::VadUserStartedSpeaking,
            VadEvent::Speaking => SystemFrame::UserSpeaking,
            VadEvent::Stopped => SystemFrame::VadUserStoppedSpeaking,
        };
        self.push_frame(frame).await;
    }

    async fn push_frame(&self, frame: SystemFrame) {
        let _ = self.pusher.push(frame.into(), Direction::Downstream).await;
    }
}

/// The first channel of interleaved audio.
fn mono(chunk: &AudioFrame) -> Vec<i16> {
    let channels = usize::from(chunk.channels.max(1));
    chunk.samples.iter().step_by(channels).copied().collect()
}
