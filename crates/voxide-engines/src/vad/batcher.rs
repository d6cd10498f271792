//! One thread runs the Silero model for every session of the process, a batch at a time: the
//! windows that arrived while the last inference ran go into the next one together, so the
//! per-call overhead is paid once per batch, not once per session.

use std::sync::{Arc, OnceLock, mpsc};

use tokio::sync::oneshot;

use super::silero::{SileroState, SileroVad};
use crate::models::ModelError;

/// Windows one inference takes at most.
const MAX_BATCH: usize = 256;

struct Job {
    state: SileroState,
    window: Vec<f32>,
    reply: oneshot::Sender<Result<(SileroState, f32), String>>,
}

/// The process-wide batched VAD.
pub struct VadBatcher {
    model: Arc<SileroVad>,
    jobs: mpsc::Sender<Job>,
}

static SHARED: OnceLock<Arc<VadBatcher>> = OnceLock::new();

impl VadBatcher {
    /// The batcher, starting its thread (and loading the model) on first use.
    pub fn shared() -> Result<Arc<Self>, ModelError> {
        if let Some(b) = SHARED.get() {
            return Ok(b.clone());
        }
        let model = SileroVad::shared()?;
        let batcher = SHARED.get_or_init(|| {
            let (jobs, rx) = mpsc::channel();
            let worker = model.clone();
            let spawned = std::thread::Builder::new()
                .name("voxide-vad".into())
                .spawn(move || run(&worker, &rx));
            if let Err(e) = spawned {
                tracing::error!("the VAD thread could not start: {e}");
            }
            Arc::new(Self { model, jobs })
        });
        Ok(batcher.clone())
    }

    /// The model (for fresh states).
    pub fn model(&self) -> &Arc<SileroVad> {
        &self.model
    }

    /// The speech probability of one window of one stream; the state comes back advanced.
    pub async fn probability(
        &self,
        state: SileroState,
        window: Vec<f32>,
    ) -> Result<(SileroState, f32), ModelError> {
        let (reply, answer) = oneshot::channel();
        let gone = || ModelError::Inference {
            name: "silero-vad".into(),
            reason: "the VAD thread has stopped".into(),
        };
        self.jobs
            .send(Job {
                state,
                window,
                reply,
            })
            .map_err(|_| gone())?;
        answer
            .await
            .map_err(|_| gone())?
            .map_err(|reason| ModelError::Inference {
                name: "silero-vad".into(),
                reason,
            })
    }
}

fn run(model: &SileroVad, jobs: &mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // One inference per sample rate present (nearly always one).
        while !batch.is_empty() {
            let rate = batch[0].state.sample_rate();
            let (same, rest): (Vec<Job>, Vec<Job>) = batch
                .into_iter()
                .partition(|j| j.state.sample_rate() == rate);
            batch = rest;
            let mut states: Vec<SileroState> = Vec::with_capacity(same.len());
            let mut windows = Vec::with_capacity(same.len());
            let mut replies = Vec::with_capacity(same.len());
            for job in same {
                states.push(job.state);
                windows.push(job.window);
                replies.push(job.reply);
            }
            let mut pairs: Vec<(&mut SileroState, &[f32])> = states
                .iter_mut()
                .zip(&windows)
                .map(|(s, w)| (s, w.as_slice()))
                .collect();
            let result = model.probabilities(&mut pairs);
            drop(pairs);
            match result {
                Ok(probs) => {
                    for ((reply, state), p) in replies.into_iter().zip(states).zip(probs) {
                        let _ = reply.send(Ok((state, p)));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.to_string()));
                    }
                }
            }
        }
    }
}
