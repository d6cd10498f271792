//! Smart Turn v3: does the user's speech so far sound like a finished turn?
//!
//! The model reads the Whisper log-mel features of the last 8 s of the user's audio (shorter
//! audio is padded with silence in front) and returns the probability that the turn is complete.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, TryLockError};
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
    /// The network's weights are read-only while it runs, so every worker shares one copy.
    Native(Arc<Network>),
    /// An ONNX Runtime session runs one inference at a time: one a worker.
    Ort(Session),
}

/// The Smart Turn v3.2 model, shared by every session.
pub struct SmartTurn {
    /// One runner a worker thread.
    runners: Vec<Mutex<Runner>>,
    cores: usize,
    /// Inferences running now on voxide's engine, which sizes each one's threads by it.
    judging: AtomicUsize,
    inferences: AtomicU64,
    skipped: AtomicU64,
    late: AtomicU64,
    busy_ns: AtomicU64,
    /// Requests waiting for a worker, oldest first.
    waiting: Mutex<Vec<Job>>,
    /// Rung when a request joins `waiting`.
    arrived: Condvar,
    /// How many worker threads started, for [`SmartTurn::judge`]; they start on first use.
    started: OnceLock<usize>,
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
        reason: "the model's worker threads are gone".into(),
    }
}

impl SmartTurn {
    /// Loads the model from the models folder, on the faster engine for this CPU.
    pub fn load() -> Result<Self, ModelError> {
        Self::load_on(SmartTurnEngine::best())
    }

    /// Loads the model from the models folder, on `engine`, with as many workers as it uses
    /// well: one a core on voxide's engine, one for every two cores on ONNX Runtime.
    pub fn load_on(engine: SmartTurnEngine) -> Result<Self, ModelError> {
        let workers = match engine {
            SmartTurnEngine::Native => cores(),
            SmartTurnEngine::OnnxRuntime => cores() / 2,
        };
        Self::load_with(engine, workers)
    }

    /// Loads the model from the models folder, on `engine`, with `workers` threads to judge
    /// turns at once (at least one).
    ///
    /// One worker serves the pauses of about 50 sessions a core, so a server with more cores
    /// needs more of them, or the model caps it whatever its size. An inference is long enough
    /// (tens of ms) to gain from a second thread, and it runs off every session's audio path:
    /// voxide's engine takes two while at most half the cores are judging (so alone on two
    /// cores an inference takes 20 ms, and two at once 37 ms each); an ONNX Runtime
    /// session has its threads fixed, two where the workers leave two cores each. Never more
    /// threads than cores: on one core two threads only take turns.
    pub fn load_with(engine: SmartTurnEngine, workers: usize) -> Result<Self, ModelError> {
        let workers = workers.max(1);
        let cores = cores();
        let threads = (cores / workers).clamp(1, 2);
        let runners = match engine {
            SmartTurnEngine::OnnxRuntime => (0..workers)
                .map(|_| {
                    Ok(Mutex::new(Runner::Ort(crate::onnx::session(
                        NAME, FILE, threads,
                    )?)))
                })
                .collect::<Result<Vec<_>, ModelError>>()?,
            SmartTurnEngine::Native => {
                let network = Arc::new(crate::models::load_model(NAME, FILE, Network::load)?);
                (0..workers)
                    .map(|_| Mutex::new(Runner::Native(network.clone())))
                    .collect()
            }
        };
        Ok(Self {
            runners,
            cores,
            judging: AtomicUsize::new(0),
            inferences: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            late: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            waiting: Mutex::new(Vec::new()),
            arrived: Condvar::new(),
            started: OnceLock::new(),
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
        match *lock(&self.runners[0]) {
            Runner::Native(_) => SmartTurnEngine::Native,
            Runner::Ort(_) => SmartTurnEngine::OnnxRuntime,
        }
    }

    /// How many requests [`SmartTurn::judge`] runs at once.
    pub fn workers(&self) -> usize {
        self.runners.len()
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

    /// Judges the turn from the user's audio at 16 kHz (only the last 8 s count) on one of the
    /// model's own threads, newest request first; `None` when `stale` says, as its turn comes, that
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
        if *self.started.get_or_init(|| self.start_workers()) == 0 {
            return Err(gone());
        }
        let (reply, verdict) = oneshot::channel();
        lock(&self.waiting).push(Job {
            audio,
            stale,
            reply,
        });
        self.arrived.notify_one();
        Ok(verdict)
    }

    /// Starts the worker threads; returns how many started. Each holds the model for the rest
    /// of the process, as the shared model lives that long anyway.
    fn start_workers(self: &Arc<Self>) -> usize {
        (0..self.runners.len())
            .filter(|&worker| {
                let model = self.clone();
                std::thread::Builder::new()
                    .name(format!("smart-turn-{worker}"))
                    .spawn(move || model.serve(worker))
                    .inspect_err(|e| tracing::warn!("a Smart Turn worker did not start: {e}"))
                    .is_ok()
            })
            .count()
    }

    /// A worker thread: runs the waiting requests newest first, on its own runner.
    ///
    /// Newest first, because under overload the oldest requests are the ones least likely to
    /// be answered in time: their turns are nearest their timeouts, and their users the likeliest
    /// to have spoken again. Served in order, every request would wait out the whole queue and
    /// every verdict would come late; served newest first, most come at once and the rest end by
    /// their timeouts. Below saturation no request waits for long, and the order is moot.
    fn serve(&self, worker: usize) {
        loop {
            let job = self.next_job();
            let mut runner = lock(&self.runners[worker]);
            let verdict = self.run_unless(&mut runner, &to_f32(&job.audio), || job.unwanted());
            drop(runner);
            if job.reply.send(verdict).is_err() {
                // The turn ended by its timeout while the model worked.
                self.late.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits for the newest request still wanted, answering the unwanted ones as it goes.
    fn next_job(&self) -> Job {
        loop {
            let mut jobs = {
                let mut waiting = lock(&self.waiting);
                while waiting.is_empty() {
                    waiting = self
                        .arrived
                        .wait(waiting)
                        .unwrap_or_else(|p| p.into_inner());
                }
                std::mem::take(&mut *waiting)
            };
            // Out of the lock: whether a request is stale is the caller's code to answer, and
            // new requests must not wait for it.
            for job in jobs.extract_if(.., |job| job.unwanted()) {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                let _ = job.reply.send(Ok(None));
            }
            let newest = jobs.pop();
            if !jobs.is_empty() {
                // The rest go back before those that came meanwhile, for another worker.
                let mut waiting = lock(&self.waiting);
                let arrived = std::mem::replace(&mut *waiting, jobs);
                waiting.extend(arrived);
                drop(waiting);
                self.arrived.notify_one();
            }
            if let Some(job) = newest {
                return job;
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
        // A free runner if there is one, else wait for the first.
        let mut runner = self
            .runners
            .iter()
            .find_map(|runner| match runner.try_lock() {
                Ok(runner) => Some(runner),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            })
            .unwrap_or_else(|| lock(&self.runners[0]));
        self.run_unless(&mut runner, audio, stale)
    }

    fn run_unless(
        &self,
        runner: &mut Runner,
        audio: &[f32],
        stale: impl Fn() -> bool,
    ) -> Result<Option<TurnPrediction>, ModelError> {
        if stale() {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let started = Instant::now();
        let verdict = self.infer(runner, audio);
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
            Runner::Native(network) => {
                let judging = self.judging.fetch_add(1, Ordering::Relaxed) + 1;
                let threads = if judging * 2 <= self.cores { 2 } else { 1 };
                let probability = network.probability(&features, threads);
                self.judging.fetch_sub(1, Ordering::Relaxed);
                probability.map_err(|e| inference(e.to_string()))?
            }
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

/// The cores this process may run on.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The lock's contents, even if a panic poisoned it: what it guards stays consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
