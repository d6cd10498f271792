//! Who is speaking: the GE2E speaker encoder (Wan et al., 2018) as trained for Resemblyzer,
//! which maps a stretch of speech to a 256-dimensional embedding; stretches of one voice point
//! the same way (cosine similarity), other voices elsewhere. A café's talk and the user's
//! voice come at overlapping levels, but not in the same voice.
//!
//! The network: 40 mel bands of power (25 ms Hann windows every 10 ms at 16 kHz, centred with
//! zero padding), a 3-layer LSTM of 256 units, its last state through a linear layer, a ReLU
//! and an L2 norm. The weights come from PyPI's `resemblyzer` 0.1.4 ([`torch`] reads them).

pub mod torch;

use std::sync::{Arc, OnceLock};

use realfft::{RealFftPlanner, RealToComplex};

use crate::audio::mel::{self, BINS, HOP, N_FFT};
use crate::kernel::dots;
use crate::models::ModelError;

const NAME: &str = "ge2e-speaker";
const FILE: &str = "ge2e/pretrained.pt";
/// Mel bands the encoder reads.
const BANDS: usize = 40;
/// LSTM units per layer, and the embedding's size.
const UNITS: usize = 256;
const LAYERS: usize = 3;
/// The loudness a stretch is brought to before it is read (dBFS RMS), as in training.
const LEVEL_DBFS: f32 = -30.0;

struct Lstm {
    /// `[4 * UNITS][inputs]`: the input, forget, cell and output gates' input weights.
    input: Vec<f32>,
    inputs: usize,
    /// `[4 * UNITS][UNITS]`.
    hidden: Vec<f32>,
    /// Both biases summed, `[4 * UNITS]`.
    bias: Vec<f32>,
}

/// The loaded encoder, shared by every session.
pub struct SpeakerEncoder {
    layers: Vec<Lstm>,
    /// `[UNITS][UNITS]`.
    linear: Vec<f32>,
    linear_bias: Vec<f32>,
    /// `[BANDS][BINS]`.
    filters: Vec<f32>,
    window: Vec<f32>,
    fft: Arc<dyn RealToComplex<f32>>,
}

static SHARED: OnceLock<Arc<SpeakerEncoder>> = OnceLock::new();

impl SpeakerEncoder {
    /// The process-wide encoder, loaded on first use.
    pub fn shared() -> Result<Arc<Self>, ModelError> {
        if let Some(encoder) = SHARED.get() {
            return Ok(encoder.clone());
        }
        let encoder = Arc::new(Self::load_default()?);
        Ok(SHARED.get_or_init(|| encoder).clone())
    }

    /// Loads the encoder from the models folder.
    pub fn load_default() -> Result<Self, ModelError> {
        crate::models::load_model(NAME, FILE, Self::from_file)
    }

    /// The encoder in a checkpoint's bytes.
    fn from_file(bytes: &[u8]) -> Result<Self, String> {
        let mut tensors = torch::read_state(bytes, "model_state").map_err(|e| e.to_string())?;
        let mut get = |name: &str, shape: &[usize]| {
            let t = tensors.remove(name).ok_or_else(|| format!("no {name}"))?;
            if t.shape != shape {
                return Err(format!("{name} is {:?}, not {shape:?}", t.shape));
            }
            Ok(t.values)
        };
        let mut layers = Vec::with_capacity(LAYERS);
        for l in 0..LAYERS {
            let inputs = if l == 0 { BANDS } else { UNITS };
            let input = get(&format!("lstm.weight_ih_l{l}"), &[4 * UNITS, inputs])?;
            let hidden = get(&format!("lstm.weight_hh_l{l}"), &[4 * UNITS, UNITS])?;
            let b1 = get(&format!("lstm.bias_ih_l{l}"), &[4 * UNITS])?;
            let b2 = get(&format!("lstm.bias_hh_l{l}"), &[4 * UNITS])?;
            let bias = b1.iter().zip(&b2).map(|(a, b)| a + b).collect();
            layers.push(Lstm {
                input,
                inputs,
                hidden,
                bias,
            });
        }
        let linear = get("linear.weight", &[UNITS, UNITS])?;
        let linear_bias = get("linear.bias", &[UNITS])?;
        let window = (0..N_FFT)
            .map(|i| 0.5 - 0.5 * (2.0 * std::f32::consts::PI * i as f32 / N_FFT as f32).cos())
            .collect();
        Ok(Self {
            layers,
            linear,
            linear_bias,
            filters: mel::mel_filters(BANDS)
                .into_iter()
                .map(|w| w as f32)
                .collect(),
            window,
            fft: RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT),
        })
    }

    /// The embedding of `audio` (16 kHz, [-1, 1]): unit length, every value at least 0.
    pub fn embed(&self, audio: &[f32]) -> Vec<f32> {
        let mut x = self.bands(audio);
        let frames = x.len() / BANDS;
        let mut h = vec![0f32; UNITS];
        let mut gates = vec![0f32; 4 * UNITS];
        let mut recurrent = vec![0f32; 4 * UNITS];
        for layer in &self.layers {
            // Every frame's input through the gates at once; then the recurrence, a frame at a
            // time.
            let mut projected = vec![0f32; frames * 4 * UNITS];
            dots(&layer.input, layer.inputs, &x, &mut projected);
            let mut out = Vec::with_capacity(frames * UNITS);
            h.fill(0.0);
            let mut c = vec![0f32; UNITS];
            for frame in projected.chunks_exact(4 * UNITS) {
                dots(&layer.hidden, UNITS, &h, &mut recurrent);
                for (g, ((p, r), b)) in gates
                    .iter_mut()
                    .zip(frame.iter().zip(&recurrent).zip(&layer.bias))
                {
                    *g = p + r + b;
                }
                for u in 0..UNITS {
                    let i = sigmoid(gates[u]);
                    let f = sigmoid(gates[UNITS + u]);
                    let cell = gates[2 * UNITS + u].tanh();
                    let o = sigmoid(gates[3 * UNITS + u]);
                    c[u] = f * c[u] + i * cell;
                    h[u] = o * c[u].tanh();
                }
                out.extend_from_slice(&h);
            }
            x = out;
        }
        let mut e = vec![0f32; UNITS];
        dots(&self.linear, UNITS, &h, &mut e);
        for (v, b) in e.iter_mut().zip(&self.linear_bias) {
            *v = (*v + b).max(0.0);
        }
        let norm = dot(&e, &e).sqrt();
        if norm > 0.0 {
            e.iter_mut().for_each(|v| *v /= norm);
        }
        e
    }

    /// The mel bands' power of `audio` brought to [`LEVEL_DBFS`], `[frames][BANDS]`.
    fn bands(&self, audio: &[f32]) -> Vec<f32> {
        let power = audio.iter().map(|s| s * s).sum::<f32>() / audio.len().max(1) as f32;
        let gain = 10f32.powf(LEVEL_DBFS / 20.0) / (power.sqrt() + 1e-9);
        let pad = N_FFT / 2;
        let mut padded = vec![0f32; audio.len() + 2 * pad];
        for (p, s) in padded[pad..].iter_mut().zip(audio) {
            *p = s * gain;
        }
        let frames = 1 + audio.len() / HOP;
        let mut input = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut out = Vec::with_capacity(frames * BANDS);
        for f in 0..frames {
            for (i, slot) in input.iter_mut().enumerate() {
                *slot = padded[f * HOP + i] * self.window[i];
            }
            if self.fft.process(&mut input, &mut spectrum).is_err() {
                out.extend([0.0; BANDS]);
                continue;
            }
            let power: Vec<f32> = spectrum.iter().map(|c| c.norm_sqr()).collect();
            for band in self.filters.chunks_exact(BINS) {
                out.push(dot(band, &power));
            }
        }
        out
    }
}

/// The cosine similarity of two embeddings (each of unit length).
pub fn similarity(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::wav;

    const HELLO: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../assets/test/hello_16k.wav"
    );

    /// The embeddings `scripts/speaker_probe.py`'s numpy encoder (librosa's mel bands) gives
    /// for the test question, whole and its first half second: their first eight values.
    const WHOLE: [f32; 8] = [0.18269, 0.0, 0.16658, 0.0, 0.0, 0.0, 0.00584, 0.0];
    const HALF_SECOND: [f32; 8] = [0.0, 0.0, 0.0, 0.0, 0.02590, 0.04527, 0.0, 0.05591];

    #[test]
    fn the_encoder_gives_the_reference_embeddings() {
        let encoder =
            SpeakerEncoder::load_default().expect("the model loads; run scripts/setup.sh");
        let audio = wav::to_f32(&wav::read(HELLO).expect("test audio").to_mono());
        let whole = encoder.embed(&audio);
        let half = encoder.embed(&audio[..8_000]);
        for (got, want) in [(&whole, WHOLE), (&half, HALF_SECOND)] {
            assert_eq!(got.len(), UNITS);
            assert!((dot(got, got) - 1.0).abs() < 1e-4);
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 2e-3, "{:?} against {want:?}", &got[..8]);
            }
        }
        assert!((similarity(&whole, &half) - 0.3527).abs() < 5e-3);
    }
}
