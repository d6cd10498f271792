//! The STT stage: the user's audio between VAD start and stop, transcribed off the async workers.
//!
//! Audio is kept from a little before the VAD confirmed speech (it confirms after `start_secs`),
//! so the first syllable is not lost. While the user speaks, the growing utterance is re-decoded
//! every half second for interim transcripts (turn logic and the UI use them); when the VAD hears
//! the end, the whole utterance is decoded for the final transcript. Better: at the first silence
//! after speech (`VadSilenceStarted`) the utterance so far is decoded at once, and when that
//! silence becomes the VAD's stop, those words are the final ones, ready a stop delay sooner;
//! speech that resumes makes a new silence start and a new decode. One worker per session runs
//! the requests in order and skips interim ones that a newer request made stale. Each final is
//! announced at the VAD stop ([`SystemFrame::TranscriptionPending`]) and closed after its
//! transcript ([`ControlFrame::TranscriptionDone`]), so the user aggregator knows when a turn's
//! words are all in.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use super::SttError;
use crate::audio::mel;
use crate::audio::resample::StreamResampler;
use crate::frames::{
    ControlFrame, DataFrame, Frame, FrameBody, MetricsData, SystemFrame, Transcription,
};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

/// Something that transcribes 16 kHz mono audio. Blocking: the stage calls it off the async
/// workers.
pub trait SttEngine: Send + Sync + 'static {
    /// The engine's name, for metrics.
    fn name(&self) -> &str;

    /// The words in `audio` (16 kHz, [-1, 1]).
    fn transcribe(&self, audio: &[f32]) -> Result<String, SttError>;
}

impl SttEngine for super::Whisper {
    fn name(&self) -> &str {
        "whisper"
    }

    fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
        super::Whisper::transcribe(self, audio)
    }
}

/// Audio kept from before the VAD confirmed speech.
const PREROLL_SECS: f32 = 0.6;
/// The pre-roll may reach this far back past the last VAD stop: the VAD stops only after
/// `stop_secs` (0.2 s by default) without speech, so the end of that span is silence, while the
/// next speech may begin well before the VAD is sure of it.
const BEFORE_STOP_SECS: f32 = 0.15;
/// New audio between two interim transcripts.
const INTERIM_SECS: f32 = 0.5;
const RATE: usize = mel::SAMPLE_RATE as usize;

enum Request {
    /// The utterance so far, for an interim transcript.
    Interim(Vec<i16>),
    /// The utterance up to the silence that may end it, decoded at once: if that silence
    /// becomes the VAD's stop, these are the final words, ready a stop delay sooner.
    Speculative(u64, Vec<i16>),
    /// The whole utterance, and the speculative decode that may already hold its words.
    Final {
        audio: Vec<i16>,
        speculative: Option<u64>,
    },
}

impl Request {
    /// Whether this request must still run when `newer` is queued behind it (a pending interim
    /// is pointless once a newer request exists).
    fn wanted_before(&self, newer: &Request) -> bool {
        match (self, newer) {
            (Request::Final { .. }, _) => true,
            (Request::Speculative(id, _), Request::Final { speculative, .. }) => {
                *speculative == Some(*id)
            }
            _ => false,
        }
    }
}

/// Transcribes the user's turns with an [`SttEngine`].
pub struct SttService {
    engine: Arc<dyn SttEngine>,
    user_id: String,
    resampler: Option<(u32, StreamResampler)>,
    /// The last [`PREROLL_SECS`] of audio, whatever the VAD says.
    preroll: VecDeque<i16>,
    /// Samples since the last VAD stop.
    since_stop: usize,
    utterance: Vec<i16>,
    speaking: bool,
    since_interim: usize,
    /// The speculative decode of the latest silence in this utterance.
    speculative: Option<u64>,
    next_speculative: u64,
    requests: Option<mpsc::UnboundedSender<Request>>,
    metrics: bool,
}

impl SttService {
    /// A stage transcribing with `engine`; transcripts carry `user_id`.
    pub fn new(engine: Arc<dyn SttEngine>, user_id: impl Into<String>) -> Self {
        Self {
            engine,
            user_id: user_id.into(),
            resampler: None,
            preroll: VecDeque::with_capacity((PREROLL_SECS * RATE as f32) as usize),
            since_stop: usize::MAX,
            utterance: Vec::new(),
            speaking: false,
            since_interim: 0,
            speculative: None,
            next_speculative: 0,
            requests: None,
            metrics: false,
        }
    }

    fn send(&self, request: Request) {
        if let Some(requests) = &self.requests {
            let _ = requests.send(request);
        }
    }

    fn on_audio(&mut self, samples: &[i16], rate: u32) -> Result<(), ProcessorError> {
        let audio = if rate == mel::SAMPLE_RATE {
            samples.to_vec()
        } else {
            // A new rate mid-stream gets a new resampler.
            if self.resampler.as_ref().is_none_or(|(r, _)| *r != rate) {
                let resampler = StreamResampler::new(rate, mel::SAMPLE_RATE)
                    .map_err(|e| ProcessorError::new(e.to_string()))?;
                self.resampler = Some((rate, resampler));
            }
            match &mut self.resampler {
                Some((_, r)) => r.process(samples),
                None => Vec::new(),
            }
        };
        let cap = (PREROLL_SECS * RATE as f32) as usize;
        let excess = (self.preroll.len() + audio.len()).saturating_sub(cap);
        self.preroll.drain(..excess.min(self.preroll.len()));
        self.preroll
            .extend(&audio[audio.len().saturating_sub(cap)..]);
        if self.speaking {
            self.utterance.extend_from_slice(&audio);
            self.since_interim += audio.len();
            if self.since_interim as f32 >= INTERIM_SECS * RATE as f32 {
                self.since_interim = 0;
                self.send(Request::Interim(self.utterance.clone()));
            }
        } else {
            self.since_stop = self.since_stop.saturating_add(audio.len());
        }
        Ok(())
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
                self.metrics = start.params.enable_metrics;
                let (tx, rx) = mpsc::unbounded_channel();
                self.requests = Some(tx);
                let worker = Worker {
                    engine: self.engine.clone(),
                    user_id: self.user_id.clone(),
                    pusher: cx.pusher(),
                    metrics: self.metrics,
                    speculative: None,
                };
                cx.spawn(worker.run(rx));
            }
            FrameBody::System(SystemFrame::InputAudio(audio)) => {
                let (samples, rate) = (audio.samples.clone(), audio.sample_rate);
                if let Err(e) = self.on_audio(&samples, rate) {
                    cx.push_error(e.message);
                }
            }
            FrameBody::System(SystemFrame::VadUserStartedSpeaking) => {
                self.speaking = true;
                self.speculative = None;
                self.since_interim = 0;
                // Speech that follows the last utterance closely must not lose its first
                // syllable, nor take that utterance's last words with it.
                let reach = self
                    .since_stop
                    .saturating_add((BEFORE_STOP_SECS * RATE as f32) as usize);
                let skip = self.preroll.len().saturating_sub(reach);
                self.utterance = self.preroll.iter().skip(skip).copied().collect();
            }
            FrameBody::System(SystemFrame::VadSilenceStarted) if self.speaking => {
                self.next_speculative += 1;
                self.speculative = Some(self.next_speculative);
                self.since_interim = 0;
                self.send(Request::Speculative(
                    self.next_speculative,
                    self.utterance.clone(),
                ));
            }
            FrameBody::System(SystemFrame::VadUserStoppedSpeaking) if self.speaking => {
                self.speaking = false;
                self.since_stop = 0;
                let audio = std::mem::take(&mut self.utterance);
                // Every stop follows a silence start, so the last speculative decode ends where
                // the speech did.
                let speculative = self.speculative.take();
                self.send(Request::Final { audio, speculative });
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

/// Runs one session's transcription requests in order.
struct Worker {
    engine: Arc<dyn SttEngine>,
    user_id: String,
    pusher: FramePusher,
    metrics: bool,
    /// The last speculative decode: its id and words.
    speculative: Option<(u64, String)>,
}

impl Worker {
    async fn run(
        mut self,
        mut requests: mpsc::UnboundedReceiver<Request>,
    ) -> Result<(), ProcessorError> {
        while let Some(mut request) = requests.recv().await {
            // A newer request makes a pending interim one pointless.
            while let Ok(newer) = requests.try_recv() {
                if request.wanted_before(&newer) {
                    self.handle(request).await;
                }
                request = newer;
            }
            self.handle(request).await;
        }
        Ok(())
    }

    async fn handle(&mut self, request: Request) {
        match request {
            Request::Interim(audio) => {
                if let Some(text) = self.decode(&audio).await {
                    self.emit(text, false).await;
                }
            }
            Request::Speculative(id, audio) => {
                let text = self.decode(&audio).await.unwrap_or_default();
                self.emit(text.clone(), false).await;
                self.speculative = Some((id, text));
            }
            Request::Final { audio, speculative } => {
                let started = Instant::now();
                // The speech ended where the speculative decode was cut: its words are the
                // final ones, and they are ready already.
                let known = match (speculative, self.speculative.take()) {
                    (Some(id), Some((done, text))) if id == done => Some(text),
                    _ => None,
                };
                let text = match known {
                    Some(text) => Some(text),
                    None => self.decode(&audio).await,
                };
                if self.metrics {
                    let time = MetricsData::ProcessingTime {
                        processor: self.pusher.name().to_owned(),
                        seconds: started.elapsed().as_secs_f64(),
                    };
                    let _ = self
                        .pusher
                        .push(
                            SystemFrame::Metrics(vec![time]).into(),
                            Direction::Downstream,
                        )
                        .await;
                }
                if let Some(text) = text {
                    self.emit(text, true).await;
                }
                // Owed for every final, words or not, so the aggregator never waits in vain.
                let done = ControlFrame::TranscriptionDone.into();
                let _ = self.pusher.push(done, Direction::Downstream).await;
            }
        }
    }

    /// The words in `audio`, or `None` after reporting an error.
    async fn decode(&self, audio: &[i16]) -> Option<String> {
        if audio.is_empty() {
            return Some(String::new());
        }
        let engine = self.engine.clone();
        let samples = crate::audio::wav::to_f32(audio);
        match tokio::task::spawn_blocking(move || engine.transcribe(&samples)).await {
            Ok(Ok(text)) => Some(text),
            Ok(Err(e)) => {
                self.error(e.to_string()).await;
                None
            }
            Err(e) => {
                self.error(format!("transcription stopped: {e}")).await;
                None
            }
        }
    }

    /// Pushes `text` as a transcript, unless it holds no words.
    async fn emit(&self, text: String, is_final: bool) {
        if text.trim().is_empty() {
            return;
        }
        let transcription = Box::new(Transcription::new(text.trim(), &self.user_id));
        let frame = if is_final {
            DataFrame::Transcription(transcription)
        } else {
            DataFrame::InterimTranscription(transcription)
        };
        let _ = self.pusher.push(frame.into(), Direction::Downstream).await;
    }

    async fn error(&self, message: String) {
        let error = crate::frames::ErrorFrame {
            message,
            fatal: false,
            processor: Some(self.pusher.name().to_owned()),
        };
        let _ = self
            .pusher
            .push(
                SystemFrame::Error(Box::new(error)).into(),
                Direction::Upstream,
            )
            .await;
    }
}
