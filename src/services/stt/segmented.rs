//! A segment decoder (Whisper) as a streaming engine: the audio between the VAD's start and stop
//! is one utterance, decoded off the async workers.
//!
//! Audio is kept from a little before the VAD confirmed speech (it confirms after `start_secs`),
//! so the first syllable is not lost. While the user speaks, the growing utterance is re-decoded
//! every half second for interim transcripts; at the finalize (the VAD's stop) the whole
//! utterance is decoded for the final one. Better: at the first silence after speech the
//! utterance so far is decoded at once and its words are settled ([`SttEvent::Settled`]: the turn
//! may be guessed on them), and when that silence becomes the VAD's stop, those words are the
//! final ones, ready a stop delay sooner; speech that resumes makes a new silence start
//! and a new decode. One worker per stream runs the requests in order and skips interim ones that
//! a newer request made stale.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::SttError;
use super::stream::{EVENT_QUEUE, INPUT_QUEUE, SttEngine, SttEvent, SttInput, SttStream};
use crate::audio::mel;

/// Something that transcribes one utterance of 16 kHz mono audio. Blocking: the stream calls it
/// off the async workers.
pub trait Transcriber: Send + Sync + 'static {
    /// The engine's name, for metrics.
    fn name(&self) -> &str;

    /// The words in `audio` (16 kHz, [-1, 1]).
    fn transcribe(&self, audio: &[f32]) -> Result<String, SttError>;

    /// The words so far of an utterance still going on, for an interim transcript: as
    /// [`Transcriber::transcribe`], minus any pains taken over final words.
    fn transcribe_partial(&self, audio: &[f32]) -> Result<String, SttError> {
        self.transcribe(audio)
    }
}

impl Transcriber for super::Whisper {
    fn name(&self) -> &str {
        "whisper"
    }

    fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
        super::Whisper::transcribe(self, audio)
    }
}

impl Transcriber for super::PromptedWhisper {
    fn name(&self) -> &str {
        "whisper"
    }

    fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
        super::PromptedWhisper::transcribe(self, audio)
    }

    /// Without the second listen: the words of a request half said read as garbled.
    fn transcribe_partial(&self, audio: &[f32]) -> Result<String, SttError> {
        super::PromptedWhisper::transcribe_partial(self, audio)
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

/// A [`Transcriber`] as an [`SttEngine`].
pub struct Segmented(Arc<dyn Transcriber>);

impl Segmented {
    /// The streaming engine over `transcriber`.
    pub fn shared(transcriber: Arc<dyn Transcriber>) -> Arc<dyn SttEngine> {
        Arc::new(Self(transcriber))
    }
}

impl SttEngine for Segmented {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn sample_rate(&self) -> u32 {
        mel::SAMPLE_RATE
    }

    fn start(&self) -> SttStream {
        let (input, inputs) = mpsc::channel(INPUT_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let worker = Worker {
            transcriber: self.0.clone(),
            events: events_tx,
            speculative: None,
        };
        tokio::spawn(worker.run(requests));
        tokio::spawn(Segmenter::new(requests_tx).run(inputs));
        SttStream { input, events }
    }
}

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

/// Cuts the audio into utterances at the VAD's verdicts.
struct Segmenter {
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
    requests: mpsc::UnboundedSender<Request>,
}

impl Segmenter {
    fn new(requests: mpsc::UnboundedSender<Request>) -> Self {
        Self {
            preroll: VecDeque::with_capacity((PREROLL_SECS * RATE as f32) as usize),
            since_stop: usize::MAX,
            utterance: Vec::new(),
            speaking: false,
            since_interim: 0,
            speculative: None,
            next_speculative: 0,
            requests,
        }
    }

    async fn run(mut self, mut inputs: mpsc::Receiver<SttInput>) {
        while let Some(input) = inputs.recv().await {
            self.handle(input);
        }
    }

    fn send(&self, request: Request) {
        let _ = self.requests.send(request);
    }

    fn handle(&mut self, input: SttInput) {
        match input {
            SttInput::Audio(audio) => self.audio(&audio),
            SttInput::SpeechStarted => {
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
            SttInput::SilenceStarted if self.speaking => {
                self.next_speculative += 1;
                self.speculative = Some(self.next_speculative);
                self.since_interim = 0;
                self.send(Request::Speculative(
                    self.next_speculative,
                    self.utterance.clone(),
                ));
            }
            SttInput::SilenceStarted => {}
            SttInput::Finalize => {
                self.speaking = false;
                self.since_stop = 0;
                let audio = std::mem::take(&mut self.utterance);
                // Every stop follows a silence start, so the last speculative decode ends where
                // the speech did.
                let speculative = self.speculative.take();
                self.send(Request::Final { audio, speculative });
            }
        }
    }

    fn audio(&mut self, audio: &[i16]) {
        let cap = (PREROLL_SECS * RATE as f32) as usize;
        let excess = (self.preroll.len() + audio.len()).saturating_sub(cap);
        self.preroll.drain(..excess.min(self.preroll.len()));
        self.preroll
            .extend(&audio[audio.len().saturating_sub(cap)..]);
        if self.speaking {
            self.utterance.extend_from_slice(audio);
            self.since_interim += audio.len();
            if self.since_interim as f32 >= INTERIM_SECS * RATE as f32 {
                self.since_interim = 0;
                self.send(Request::Interim(self.utterance.clone()));
            }
        } else {
            self.since_stop = self.since_stop.saturating_add(audio.len());
        }
    }
}

/// Runs one stream's decodes in order.
struct Worker {
    transcriber: Arc<dyn Transcriber>,
    events: mpsc::Sender<SttEvent>,
    /// The last speculative decode: its id and words.
    speculative: Option<(u64, String)>,
}

impl Worker {
    async fn run(mut self, mut requests: mpsc::UnboundedReceiver<Request>) {
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
    }

    async fn handle(&mut self, request: Request) {
        match request {
            Request::Interim(audio) => {
                if let Some(text) = self.decode_partial(&audio).await {
                    self.send(SttEvent::Interim(text)).await;
                }
            }
            Request::Speculative(id, audio) => {
                let text = self.decode(&audio).await.unwrap_or_default();
                // The final words if the silence becomes the stop: the turn may be guessed now.
                self.send(SttEvent::Settled(text.clone())).await;
                self.speculative = Some((id, text));
            }
            Request::Final { audio, speculative } => {
                // The speech ended where the speculative decode was cut: its words are the
                // final ones, and they are ready already.
                let known = match (speculative, self.speculative.take()) {
                    (Some(id), Some((done, text))) if id == done => Some(text),
                    _ => None,
                };
                let text = match known {
                    Some(text) => text,
                    None => self.decode(&audio).await.unwrap_or_default(),
                };
                // Owed for every finalize, words or not.
                self.send(SttEvent::Finalized(text)).await;
            }
        }
    }

    async fn send(&self, event: SttEvent) {
        let _ = self.events.send(event).await;
    }

    /// The words in `audio`, or `None` after reporting an error.
    async fn decode(&self, audio: &[i16]) -> Option<String> {
        self.off_runtime(audio, |t, samples| t.transcribe(samples))
            .await
    }

    /// The words so far in the `audio` of an utterance still going on.
    async fn decode_partial(&self, audio: &[i16]) -> Option<String> {
        self.off_runtime(audio, |t, samples| t.transcribe_partial(samples))
            .await
    }

    /// `transcribe` on `audio`, off the async workers; `None` after reporting an error.
    async fn off_runtime(
        &self,
        audio: &[i16],
        transcribe: fn(&dyn Transcriber, &[f32]) -> Result<String, SttError>,
    ) -> Option<String> {
        if audio.is_empty() {
            return Some(String::new());
        }
        let transcriber = self.transcriber.clone();
        let samples = crate::audio::wav::to_f32(audio);
        match tokio::task::spawn_blocking(move || transcribe(&*transcriber, &samples)).await {
            Ok(Ok(text)) => Some(text),
            Ok(Err(e)) => {
                self.send(SttEvent::Error(e.to_string())).await;
                None
            }
            Err(e) => {
                self.send(SttEvent::Error(format!("transcription stopped: {e}")))
                    .await;
                None
            }
        }
    }
}
