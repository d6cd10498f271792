//! Silero VAD through ONNX Runtime: one loaded model shared by every session, per-session state.
//!
//! The model takes 512 new samples at 16 kHz (256 at 8 kHz) preceded by the last 64 (32) samples
//! of the previous window, plus its recurrent state `[2, batch, 128]`, and returns the speech
//! probability and the next state. The batch dimension lets one call serve many sessions.

use std::sync::{Arc, Mutex, OnceLock};

use ort::session::Session;
use ort::value::Tensor;

use crate::models::ModelError;

const NAME: &str = "silero-vad";
const FILE: &str = "silero_vad.onnx";
const STATE: usize = 2 * 128;

/// The Silero VAD model.
pub struct SileroVad {
    session: Mutex<Session>,
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
    if sample_rate == 8_000 { 256 } else { 512 }
}

fn context_size(sample_rate: u32) -> usize {
    if sample_rate == 8_000 { 32 } else { 64 }
}

static SHARED: OnceLock<Arc<SileroVad>> = OnceLock::new();

impl SileroVad {
    /// Loads the model from the models folder.
    pub fn load() -> Result<Self, ModelError> {
        Ok(Self {
            session: Mutex::new(crate::onnx::session(NAME, FILE, 1)?),
        })
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
        let n = batch.len();
        let width = window + context;
        let mut input = Vec::with_capacity(n * width);
        // State layout is [2, batch, 128]: layer-major.
        let mut state = vec![0.0f32; STATE * n];
        for (b, (s, samples)) in batch.iter().enumerate() {
            if s.sample_rate != rate || samples.len() != window {
                return Err(inference(format!(
                    "every window must hold {window} samples at {rate} Hz"
                )));
            }
            input.extend_from_slice(&s.context);
            input.extend_from_slice(samples);
            for layer in 0..2 {
                let dst = (layer * n + b) * 128;
                state[dst..dst + 128].copy_from_slice(&s.state[layer * 128..(layer + 1) * 128]);
            }
        }
        let input =
            Tensor::from_array(([n, width], input)).map_err(|e| inference(e.to_string()))?;
        let state_in =
            Tensor::from_array(([2, n, 128], state)).map_err(|e| inference(e.to_string()))?;
        let sr = Tensor::from_array(((), vec![i64::from(rate)]))
            .map_err(|e| inference(e.to_string()))?;
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let _running =
            crate::onnx::running().ok_or_else(|| inference("the process is exiting".into()))?;
        let outputs = session
            .run(ort::inputs!["input" => input, "state" => state_in, "sr" => sr])
            .map_err(|e| inference(e.to_string()))?;
        let (_, probs) = outputs["output"]
            .try_extract_tensor::<f32>()
            .map_err(|e| inference(e.to_string()))?;
        let (_, next) = outputs["stateN"]
            .try_extract_tensor::<f32>()
            .map_err(|e| inference(e.to_string()))?;
        if probs.len() != n || next.len() != STATE * n {
            return Err(inference("unexpected output shape".into()));
        }
        for (b, (s, samples)) in batch.iter_mut().enumerate() {
            for layer in 0..2 {
                let src = (layer * n + b) * 128;
                s.state[layer * 128..(layer + 1) * 128].copy_from_slice(&next[src..src + 128]);
            }
            s.context.copy_from_slice(&samples[window - context..]);
        }
        Ok(probs.to_vec())
    }
}

fn inference(reason: String) -> ModelError {
    ModelError::Inference {
        name: NAME.into(),
        reason,
    }
}
