//! The STT stage: the user's audio, all of it from the session's start, to a streaming
//! [`SttEngine`], and its transcripts back into the pipeline.
//!
//! The stage resamples the audio to the engine's rate and passes on the VAD's verdicts. At each
//! VAD stop it asks the engine to finalize and announces the final transcript it owes
//! ([`SystemFrame::TranscriptionPending`], ahead of the stop); the engine's answer becomes the
//! turn's final transcript and [`ControlFrame::TranscriptionDone`], so the user aggregator knows
//! when a turn's words are all in. Interim transcripts go on as they come.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::stream::{SttEngine, SttEvent, SttInput};
use voxide_core::events::Event;
use voxide_core::frames::{
    ControlFrame, DataFrame, Frame, FrameBody, MetricsData, SystemFrame, Transcription,
};
use voxide_core::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};
use voxide_engines::audio::resample::StreamResampler;

/// Transcribes the user's turns with an [`SttEngine`].
pub struct SttService {
    engine: Arc<dyn SttEngine>,
    user_id: String,
    resampler: Option<(u32, StreamResampler)>,
    input: Option<mpsc::Sender<SttInput>>,
    /// Each finalize still unanswered, oldest first.
    finalizing: Option<mpsc::UnboundedSender<Asked>>,
    /// Whether the VAD heard speech since the last stop.
    speaking: bool,
    /// Samples sent to the engine since the last finalize.
    sent: usize,
    /// How long the VAD waits after the speech before its stop: the real end of speech is this
    /// long before the finalize.
    speech_end_offset: Duration,
}

/// A finalize: when it was asked for, and the audio the turn sent.
struct Asked {
    at: Instant,
    seconds: f64,
}

impl SttService {
    /// A stage transcribing with `engine`; transcripts carry `user_id`.
    pub fn new(engine: Arc<dyn SttEngine>, user_id: impl Into<String>) -> Self {
        Self {
            engine,
            user_id: user_id.into(),
            resampler: None,
            input: None,
            finalizing: None,
            speaking: false,
            sent: 0,
            speech_end_offset: Duration::ZERO,
        }
    }

    /// Times the STT from the estimated end of speech, `offset` before the VAD's stop (its
    /// `stop_secs`), as pipecat does.
    pub fn with_speech_end_offset(mut self, offset: Duration) -> Self {
        self.speech_end_offset = offset;
        self
    }

    /// Sends `input` to the engine's stream. Audio the stream has no room for is dropped with a
    /// warning (the engine has stalled for seconds); a verdict always gets through.
    fn send(&self, input: SttInput, cx: &mut FrameContext<'_>) {
        let Some(sender) = &self.input else {
            return;
        };
        match sender.try_send(input) {
            Ok(()) | Err(TrySendError::Closed(_)) => {}
            Err(TrySendError::Full(SttInput::Audio(_))) => {
                voxide_core::warnings::warn(
                    "stt_audio_dropped",
                    format_args!(
                        "{} is not keeping up: audio dropped while its input is full",
                        self.engine.name()
                    ),
                );
            }
            Err(TrySendError::Full(input)) => {
                let sender = sender.clone();
                cx.spawn(async move {
                    let _ = sender.send(input).await;
                    Ok(())
                });
            }
        }
    }

    fn resampled(&mut self, samples: &[i16], rate: u32) -> Result<Vec<i16>, ProcessorError> {
        let target = self.engine.sample_rate();
        if rate == target {
            return Ok(samples.to_vec());
        }
        // A new rate mid-stream gets a new resampler.
        if self.resampler.as_ref().is_none_or(|(r, _)| *r != rate) {
            let resampler = StreamResampler::new(rate, target)
                .map_err(|e| ProcessorError::new(e.to_string()))?;
            self.resampler = Some((rate, resampler));
        }
        Ok(match &mut self.resampler {
            Some((_, r)) => r.process(samples),
            None => Vec::new(),
        })
    }
}

impl FrameProcessor for SttService {
    fn name(&self) -> &str {
        "SttService"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::System(SystemFrame::Start(start)) => {
                let stream = self.engine.start();
                let (finalizing, asked) = mpsc::unbounded_channel();
                self.input = Some(stream.input);
                self.finalizing = Some(finalizing);
                let pump = Pump {
                    engine: self.engine.clone(),
                    user_id: self.user_id.clone(),
                    pusher: cx.pusher(),
                    metrics: start.params.enable_metrics,
                    usage_metrics: start.params.enable_usage_metrics,
                    speech_end_offset: self.speech_end_offset,
                    asked,
                    pending: VecDeque::new(),
                };
                cx.spawn(pump.run(stream.events));
            }
            FrameBody::System(SystemFrame::InputAudio(audio)) => {
                match self.resampled(&audio.samples, audio.sample_rate) {
                    Ok(samples) if !samples.is_empty() => {
                        self.sent += samples.len();
                        self.send(SttInput::Audio(samples), cx);
                    }
                    Ok(_) => {}
                    Err(e) => cx.push_error(e.message),
                }
            }
            FrameBody::System(SystemFrame::VadSpeechOnset { near_speaker }) if !self.speaking => {
                self.send(
                    SttInput::SpeechOnset {
                        near_speaker: *near_speaker,
                    },
                    cx,
                );
            }
            FrameBody::System(SystemFrame::VadOnsetNearSpeaker) if !self.speaking => {
                self.send(SttInput::OnsetNearSpeaker, cx);
            }
            FrameBody::System(SystemFrame::VadOnsetFaded) if !self.speaking => {
                self.send(SttInput::OnsetFaded, cx);
            }
            FrameBody::System(SystemFrame::VadUserStartedSpeaking) => {
                self.speaking = true;
                self.send(SttInput::SpeechStarted, cx);
            }
            FrameBody::System(SystemFrame::VadSilenceStarted) if self.speaking => {
                self.send(SttInput::SilenceStarted, cx);
            }
            FrameBody::System(SystemFrame::VadUserStoppedSpeaking) if self.speaking => {
                self.speaking = false;
                if let Some(finalizing) = &self.finalizing {
                    let seconds = std::mem::take(&mut self.sent) as f64
                        / f64::from(self.engine.sample_rate().max(1));
                    let _ = finalizing.send(Asked {
                        at: Instant::now(),
                        seconds,
                    });
                }
                self.send(SttInput::Finalize, cx);
                // The turn may end before the final transcript is ready; this tells the user
                // aggregator to wait for it rather than commit the turn without its last words.
                // Sent ahead of the VAD stop, so it is ahead of any turn end that stop causes.
                cx.push_downstream(SystemFrame::TranscriptionPending);
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Turns a stream's events into frames.
struct Pump {
    engine: Arc<dyn SttEngine>,
    user_id: String,
    pusher: FramePusher,
    metrics: bool,
    usage_metrics: bool,
    speech_end_offset: Duration,
    /// Each finalize, as the stage sends them.
    asked: mpsc::UnboundedReceiver<Asked>,
    pending: VecDeque<Asked>,
}

impl Pump {
    async fn run(mut self, mut events: mpsc::Receiver<SttEvent>) -> Result<(), ProcessorError> {
        while let Some(event) = events.recv().await {
            match event {
                SttEvent::Interim(text) => self.transcript(text, false).await,
                SttEvent::Settled(text) => {
                    self.transcript(text.clone(), false).await;
                    self.push(
                        SystemFrame::TranscriptionSettled(text).into(),
                        Direction::Downstream,
                    )
                    .await;
                }
                SttEvent::Finalized(text) => {
                    while let Ok(at) = self.asked.try_recv() {
                        self.pending.push_back(at);
                    }
                    if let Some(asked) = self.pending.pop_front() {
                        self.metrics(asked).await;
                    }
                    self.transcript(text, true).await;
                    // Owed for every finalize, words or not, so the aggregator never waits in
                    // vain.
                    self.push(
                        ControlFrame::TranscriptionDone.into(),
                        Direction::Downstream,
                    )
                    .await;
                }
                SttEvent::Switched { from, to, reason } => {
                    self.pusher.emit(Event::SttFallback { from, to, reason });
                }
                SttEvent::Error(message) | SttEvent::Failed(message) => {
                    self.pusher.push_error(message).await;
                }
            }
        }
        Ok(())
    }

    /// The finalize's time (from the VAD's stop, and as pipecat times an STT: from the estimated
    /// end of speech) and the turn's audio, as the session asked.
    async fn metrics(&self, asked: Asked) {
        let mut data = Vec::new();
        let model = self.engine.model().to_owned();
        let processor = self.pusher.name().to_owned();
        if self.metrics {
            let waited = asked.at.elapsed();
            data.push(MetricsData::ProcessingTime {
                processor: processor.clone(),
                seconds: waited.as_secs_f64(),
            });
            data.push(MetricsData::Ttfb {
                processor: processor.clone(),
                model: Some(model.clone()),
                seconds: (waited + self.speech_end_offset).as_secs_f64(),
            });
        }
        if self.usage_metrics {
            data.push(MetricsData::SttUsage {
                processor,
                cost_usd: crate::llm::stt_cost(&model, asked.seconds),
                model: Some(model),
                seconds: asked.seconds,
            });
        }
        if !data.is_empty() {
            self.push(SystemFrame::Metrics(data).into(), Direction::Downstream)
                .await;
        }
    }

    async fn push(&self, frame: Frame, direction: Direction) {
        let _ = self.pusher.push(frame, direction).await;
    }

    /// Pushes `text` as a transcript, unless it holds no words.
    async fn transcript(&self, text: String, is_final: bool) {
        if text.trim().is_empty() {
            return;
        }
        let transcription = Box::new(Transcription::new(text.trim(), &self.user_id));
        let frame = if is_final {
            DataFrame::Transcription(transcription)
        } else {
            DataFrame::InterimTranscription(transcription)
        };
        self.push(frame.into(), Direction::Downstream).await;
    }
}
