//! Smart Turn v3: does the user's speech so far sound like a finished turn?
//!
//! The model reads the Whisper log-mel features of the last 8 s of the user's audio (shorter
//! audio is padded with silence in front) and returns the probability that the turn is complete.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Instant;

use tokio::sync::oneshot;

use ort::session::Session;
use ort::value::Tensor;

use super::engine::Network;
use crate::audio::mel::{self, LogMel};
use crate::audio::wav::to_f32;
use crate::models::ModelError;

const NAME: &str = "smart-turn-v3.2";
const FILE: &str = "smart-turn-v3.2-cpu.onnx";
/// Seconds of audio the model reads.
pub const WINDOW_SECS: usize = 8;
const SAMPLES: usize = WINDOW_SECS * mel::SAMPLE_RATE as usize;

/// The model's verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnPrediction {
    /// True when the turn sounds finished (probability above one half).
    pub complete: bool,
    /// The probability that it is finished.
    pub probability: f32,
}

/// What runs the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SmartTurnEngine {
    /// voxide's own int8 engine ([`super::engine`]), where the CPU has AVX-512 VNNI.
    Native,
    /// ONNX Runtime.
    OnnxRuntime,
}

impl SmartTurnEngine {
    /// The faster engine here: the native one needs VNNI, and an optimised build (unoptimised,
    /// voxide's own arithmetic is tens of times slower than ONNX Runtime's optimised library).
    pub fn best() -> Self {
        if super::engine::vectorised() && !cfg!(debug_assertions) {
            SmartTurnEngine::Native
        } else {
            SmartTurnEngine::OnnxRuntime
        }
    }
}

enum Runner {
    Native(Box<Network>),
    Ort(Session),
}

/// The Smart Turn v3.2 model, shared by every session.
pub struct SmartTurn {
    runner: Mutex<Runner>,
    threads: usize,
    inferences: AtomicU64,
    skipped: AtomicU64,
    late: AtomicU64,
    busy_ns: AtomicU64,
    /// The model's own thread, for [`SmartTurn::judge`], started on first use.
    worker: OnceLock<mpsc::Sender<Job>>,
}

/// A verdict one session waits for.
struct Job {
    audio: Vec<i16>,
    stale: Box<dyn Fn() -> bool + Send>,
    reply: oneshot::Sender<Result<Option<TurnPrediction>, ModelError>>,
}

impl Job {
    /// Nobody wants the verdict any more: the caller stopped waiting, or the request is stale.
    fn unwanted(&self) -> bool {
        self.reply.is_closed() || (self.stale)()
    }
}

/// What the shared model has done since it was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SmartTurnStats {
    /// Inferences run.
    pub inferences: u64,
    /// Requests dropped unrun because, while they waited, the user spoke again or the turn
    /// ended without them.
    pub skipped: u64,
    /// Verdicts worked out after their caller had stopped waiting (the turn ended by its
    /// timeout meanwhile).
    pub late: u64,
    /// Seconds spent in inferences (features included).
    pub busy_secs: f64,
}

static SHARED: OnceLock<Arc<SmartTurn>> = OnceLock::new();

fn gone() -> ModelError {
    ModelError::Inference {
        name: NAME.into(),
        reason: "the model's thread is gone".into(),
    }
}

impl SmartTurn {
    /// Loads the model from the models folder, on the faster engine for this CPU.
    pub fn load() -> Result<Self, ModelError> {
        Self::load_on(SmartTurnEngine::best())
    }

    /// Loads the model from the models folder, on `engine`.
    pub fn load_on(engine: SmartTurnEngine) -> Result<Self, ModelError> {
        // Two threads where two cores are free to us: an inference is long enough (tens of ms)
        // to gain from both, and it runs off every session's audio path. Never more threads
        // than cores: on one core two threads only take turns (76 ms an inference, not 48).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(2);
        let runner = match engine {
            SmartTurnEngine::OnnxRuntime => Runner::Ort(crate::onnx::session(NAME, FILE, threads)?),
            SmartTurnEngine::Native => {
                let path = crate::models::model_path(NAME, FILE)?;
                let invalid = |reason: String| ModelError::Invalid {
                    name: NAME.into(),
                    path: path.clone(),
                    reason,
                };
                let bytes = std::fs::read(&path).map_err(|e| invalid(e.to_string()))?;
                Runner::Native(Box::new(
                    Network::load(&bytes).map_err(|e| invalid(e.to_string()))?,
                ))
            }
        };
        Ok(Self {
            runner: Mutex::new(runner),
            threads,
            inferences: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            late: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            worker: OnceLock::new(),
        })
    }

    /// The process-wide model, loaded on first use.
    pub fn shared() -> Result<Arc<Self>, ModelError> {
        if let Some(model) = SHARED.get() {
            return Ok(model.clone());
        }
        let model = Arc::new(Self::load()?);
        Ok(SHARED.get_or_init(|| model).clone())
    }

    /// The engine that runs the network.
    pub fn engine(&self) -> SmartTurnEngine {
        match *self.runner.lock().unwrap_or_else(|p| p.into_inner()) {
            Runner::Native(_) => SmartTurnEngine::Native,
            Runner::Ort(_) => SmartTurnEngine::OnnxRuntime,
        }
    }

    /// What the model has done so far.
    pub fn stats(&self) -> SmartTurnStats {
        SmartTurnStats {
            inferences: self.inferences.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            late: self.late.load(Ordering::Relaxed),
            busy_secs: self.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    /// Judges the turn from the user's audio at 16 kHz (only the last 8 s count) on the model's
    /// own thread, newest request first; `None` when `stale` says, as its turn comes, that
    /// the answer is no longer wanted, or the caller stopped waiting for it. A waiting request
    /// holds its audio and nothing more: no blocking-pool thread, no buffers of the model's.
    /// The request is queued at the call, not when the future is first polled.
    pub fn judge(
        self: &Arc<Self>,
        audio: Vec<i16>,
        stale: impl Fn() -> bool + Send + 'static,
    ) -> impl Future<Output = Result<Option<TurnPrediction>, ModelError>> + Send + 'static {
        let queued = self.queue(audio, Box::new(stale));
        async move {
            let verdict = queued?;
            verdict.await.map_err(|_| gone())?
        }
    }

    fn queue(
        self: &Arc<Self>,
        audio: Vec<i16>,
        stale: Box<dyn Fn() -> bool + Send>,
    ) -> Result<oneshot::Receiver<Result<Option<TurnPrediction>, ModelError>>, ModelError> {
        let worker = match self.worker.get() {
            Some(worker) => worker,
            None => {
                let (tx, rx) = mpsc::channel();
                let model = self.clone();
                std::thread::Builder::new()
                    .name("voxide-smart-turn".into())
                    .spawn(move || model.serve(rx))
                    .map_err(|e| ModelError::Inference {
                        name: NAME.into(),
                        reason: e.to_string(),
                    })?;
                // Two first callers at once: the loser's thread finds its queue closed and ends.
                self.worker.get_or_init(|| tx)
            }
        };
        let (reply, verdict) = oneshot::channel();
        let job = Job {
            audio,
            stale,
            reply,
        };
        worker.send(job).map_err(|_| gone())?;
        Ok(verdict)
    }

    /// The model's thread: runs the waiting requests newest first. It holds the model for the
    /// rest of the process, as the shared model lives that long anyway.
    ///
    /// Newest first, because under overload the oldest requests are the ones least likely to
    /// be answered in time: their turns are nearest their timeouts, and their users the likeliest
    /// to have spoken again. Served in order, every request would wait out the whole queue and
    /// every verdict would come late; served newest first, most come at once and the rest end by
    /// their timeouts. Below saturation at most one request waits, and the order is moot.
    fn serve(&self, jobs: mpsc::Receiver<Job>) {
        let mut waiting: Vec<Job> = Vec::new();
        loop {
            if waiting.is_empty() {
                match jobs.recv() {
                    Ok(job) => waiting.push(job),
                    Err(_) => return,
                }
            }
            waiting.extend(jobs.try_iter());
            for job in waiting.extract_if(.., |job| job.unwanted()) {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                let _ = job.reply.send(Ok(None));
            }
            let Some(job) = waiting.pop() else { continue };
            let verdict = self.predict_unless(&to_f32(&job.audio), || job.unwanted());
            if job.reply.send(verdict).is_err() {
                // The turn ended by its timeout while the model worked.
                self.late.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Judges the turn from the user's audio at 16 kHz in [-1, 1] (only the last 8 s count).
    /// Blocking, tens of milliseconds: call it off the async runtime.
    pub fn predict(&self, audio: &[f32]) -> Result<TurnPrediction, ModelError> {
        self.predict_unless(audio, || false)?
            .ok_or_else(|| ModelError::Inference {
                name: NAME.into(),
                reason: "skipped".into(),
            })
    }

    /// Like [`SmartTurn::predict`], but returns `None` without running when `stale` says, once
    /// the model is free, that the answer is no longer wanted (the user spoke again, or the
    /// turn ended by its timeout). Sessions
    /// share the model, so under load requests wait for it, and the wait makes many of them
    /// stale: skipping those keeps the model's work to the pauses that still matter.
    pub fn predict_unless(
        &self,
        audio: &[f32],
        stale: impl Fn() -> bool,
    ) -> Result<Option<TurnPrediction>, ModelError> {
        let mut runner = self.runner.lock().unwrap_or_else(|p| p.into_inner());
        if stale() {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let started = Instant::now();
        let verdict = self.infer(&mut runner, audio);
        self.inferences.fetch_add(1, Ordering::Relaxed);
        let busy = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(busy, Ordering::Relaxed);
        verdict.map(Some)
    }

    fn infer(&self, runner: &mut Runner, audio: &[f32]) -> Result<TurnPrediction, ModelError> {
        let tail = &audio[audio.len().saturating_sub(SAMPLES)..];
        let mut window = vec![0.0f32; SAMPLES - tail.len()];
        window.extend_from_slice(tail);
        let features = LogMel::shared().features(&window, true);
        let frames = features.len() / mel::N_MELS;
        let inference = |reason: String| ModelError::Inference {
            name: NAME.into(),
            reason,
        };
        // Either engine: once the models are closed, no new inference starts.
        let _running =
            crate::onnx::running().ok_or_else(|| inference("the process is exiting".into()))?;
        let probability = match runner {
            Runner::Native(network) => network
                .probability(&features, self.threads)
                .map_err(|e| inference(e.to_string()))?,
            Runner::Ort(session) => {
                let input = Tensor::from_array(([1, mel::N_MELS, frames], features))
                    .map_err(|e| inference(e.to_string()))?;
                let outputs = session
                    .run(ort::inputs!["input_features" => input])
                    .map_err(|e| inference(e.to_string()))?;
                let (_, logits) = outputs["logits"]
                    .try_extract_tensor::<f32>()
                    .map_err(|e| inference(e.to_string()))?;
                // The exported model ends in a sigmoid: its "logits" are probabilities already.
                logits
                    .first()
                    .copied()
                    .ok_or_else(|| inference("empty output".into()))?
            }
        };
        Ok(TurnPrediction {
            complete: probability > 0.5,
            probability,
        })
    }
}
