//! Silero VAD: one loaded model shared by every session, per-session state.
//!
//! The model takes 512 new samples at 16 kHz (256 at 8 kHz) preceded by the last 64 (32) samples
//! of the previous window, plus its recurrent state, and returns the speech probability and the
//! next state. voxide runs the network itself ([`super::engine`]); a batch of windows from many
//! sessions costs one pass through each layer's weights.

use std::sync::{Arc, OnceLock};

use super::engine::{Network, STATE};
use crate::models::ModelError;

const NAME: &str = "silero-vad";
const FILE: &str = "silero_vad.onnx";

/// The Silero VAD model.
pub struct SileroVad {
    network: Network,
}

/// One stream's state: the recurrent state and the context samples.
#[derive(Debug, Clone)]
pub struct SileroState {
    sample_rate: u32,
    state: [f32; STATE],
    context: Vec<f32>,
}

impl SileroState {
    /// The stream's sample rate.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// New samples per window at this rate.
    pub fn window(&self) -> usize {
        window_size(self.sample_rate)
    }

    /// Forgets everything heard (e.g. after a long pause).
    pub fn reset(&mut self) {
        self.state = [0.0; STATE];
        self.context.iter_mut().for_each(|s| *s = 0.0);
    }
}

/// New samples per model window: 512 at 16 kHz, 256 at 8 kHz.
pub fn window_size(sample_rate: u32) -> usize {
    Network::window(sample_rate)
}

fn context_size(sample_rate: u32) -> usize {
    Network::context(sample_rate)
}

static SHARED: OnceLock<Arc<SileroVad>> = OnceLock::new();

impl SileroVad {
    /// Loads the model from the models folder.
    pub fn load() -> Result<Self, ModelError> {
        let network = crate::models::load_model(NAME, FILE, Network::load)?;
        Ok(Self { network })
    }

    /// The process-wide model, loaded on first use.
    pub fn shared() -> Result<Arc<Self>, ModelError> {
        if let Some(vad) = SHARED.get() {
            return Ok(vad.clone());
        }
        let vad = Arc::new(Self::load()?);
        Ok(SHARED.get_or_init(|| vad).clone())
    }

    /// A fresh state for a stream at `sample_rate` (8 or 16 kHz).
    pub fn new_state(&self, sample_rate: u32) -> SileroState {
        SileroState {
            sample_rate,
            state: [0.0; STATE],
            context: vec![0.0; context_size(sample_rate)],
        }
    }

    /// The speech probability of one window (`state.window()` samples in [-1, 1]).
    pub fn probability(&self, state: &mut SileroState, window: &[f32]) -> Result<f32, ModelError> {
        let mut out = self.probabilities(&mut [(state, window)])?;
        Ok(out.pop().unwrap_or(0.0))
    }

    /// Speech probabilities of one window from each of several streams, in one inference.
    /// Every stream must have the same sample rate.
    pub fn probabilities(
        &self,
        batch: &mut [(&mut SileroState, &[f32])],
    ) -> Result<Vec<f32>, ModelError> {
        let Some((first, _)) = batch.first() else {
            return Ok(Vec::new());
        };
        let rate = first.sample_rate;
        let window = window_size(rate);
        let context = context_size(rate);
        let width = window + context;
        let mut input = Vec::with_capacity(batch.len() * width);
        let mut state = Vec::with_capacity(batch.len() * STATE);
        for (s, samples) in batch.iter() {
            if s.sample_rate != rate || samples.len() != window {
                return Err(inference(format!(
                    "every window must hold {window} samples at {rate} Hz"
                )));
            }
            input.extend_from_slice(&s.context);
            input.extend_from_slice(samples);
            state.extend_from_slice(&s.state);
        }
        let probabilities = self.network.run(rate, &input, &mut state);
        for ((s, samples), next) in batch.iter_mut().zip(state.chunks_exact(STATE)) {
            s.state.copy_from_slice(next);
            s.context.copy_from_slice(&samples[window - context..]);
        }
        Ok(probabilities)
    }
}

fn inference(reason: String) -> ModelError {
    ModelError::Inference {
        name: NAME.into(),
        reason,
    }
}
