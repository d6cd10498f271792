//! Silero VAD v5's network run by voxide itself, with the weights read from `silero_vad.onnx`.
//!
//! The file holds two networks of one shape behind an `If` on the sample rate (16 and 8 kHz).
//! Each takes the window with the last samples of the one before (576 at 16 kHz) and:
//! 1. pads it on the right by reflection, cuts it into 4 frames, and takes the magnitude of a
//!    fixed Fourier basis over each (a strided convolution in the file);
//! 2. runs four 3-tap convolutions with ReLUs (strides 1, 2, 2, 1) down to one position of 128;
//! 3. steps an LSTM cell whose `h` and `c` are the stream's state;
//! 4. reads the speech probability off `h` (ReLU, one weighted sum, sigmoid).
//!
//! A batch of windows from many streams goes through each layer as one product (see
//! [`super::kernel`]): about 680 000 multiply-adds a window, nearly all in the Fourier basis, the
//! first convolution and the LSTM's gates.

use crate::audio::onnx_file::{self, Data, FormatError, Graph, Tensor};
use crate::kernel::{LANES, dots};

/// Width of the encoder's output and of the LSTM.
const HIDDEN: usize = 128;
/// Floats of one stream's state: the LSTM's `h`, then its `c`.
pub const STATE: usize = 2 * HIDDEN;
/// Frames the padded input is cut into.
const FRAMES: usize = 4;

fn bad(what: impl Into<String>) -> FormatError {
    FormatError(what.into())
}

/// `n` rounded up to a whole number of kernel lanes.
fn padded(n: usize) -> usize {
    n.div_ceil(LANES) * LANES
}

/// The network at both rates.
pub struct Network {
    wide: Branch,
    narrow: Branch,
}

impl Network {
    /// Reads the weights out of the model file's bytes.
    pub fn load(bytes: &[u8]) -> Result<Self, FormatError> {
        let graph = onnx_file::parse(bytes)?;
        let branches: Vec<&Graph> = graph
            .nodes
            .iter()
            .filter(|node| node.op == "If")
            .flat_map(|node| node.graphs.iter().map(|(_, g)| g))
            .collect();
        let mut wide = None;
        let mut narrow = None;
        for branch in branches {
            let Some(loaded) = Branch::load(branch)? else {
                continue;
            };
            match loaded.filter {
                256 => wide = Some(loaded),
                128 => narrow = Some(loaded),
                other => return Err(bad(format!("a Fourier basis {other} samples long"))),
            }
        }
        Ok(Self {
            wide: wide.ok_or_else(|| bad("no 16 kHz network in the file"))?,
            narrow: narrow.ok_or_else(|| bad("no 8 kHz network in the file"))?,
        })
    }

    /// Samples of context before each window at `sample_rate` (64 at 16 kHz, 32 at 8 kHz).
    pub fn context(sample_rate: u32) -> usize {
        if sample_rate == 8_000 { 32 } else { 64 }
    }

    /// New samples a window holds at `sample_rate` (512 at 16 kHz, 256 at 8 kHz).
    pub fn window(sample_rate: u32) -> usize {
        if sample_rate == 8_000 { 256 } else { 512 }
    }

    /// The speech probability of each of a batch of windows at `sample_rate`: `inputs` holds
    /// each window after its context, `states` each stream's [`STATE`] floats, advanced here.
    ///
    /// # Panics
    /// If the lengths do not agree with each other and the rate.
    pub fn run(&self, sample_rate: u32, inputs: &[f32], states: &mut [f32]) -> Vec<f32> {
        let branch = if sample_rate == 8_000 {
            &self.narrow
        } else {
            &self.wide
        };
        branch.run(inputs, states)
    }
}

/// A 3-tap convolution with its ReLU; weights stored per output as the 3 taps' input channels
/// one after the other (so a column is 3 positions of the input, copied whole), padded to
/// whole lanes.
struct Conv {
    weight: Vec<f32>,
    bias: Vec<f32>,
    inputs: usize,
    outputs: usize,
    stride: usize,
}

impl Conv {
    fn load(weight: &Tensor, bias: &Tensor, stride: usize) -> Result<Self, FormatError> {
        let (outputs, inputs) = match weight.dims[..] {
            [o, i, 3] => (o, i),
            ref other => return Err(bad(format!("a convolution of shape {other:?}"))),
        };
        let w = floats(weight)?;
        let k = padded(3 * inputs);
        let mut packed = vec![0.0; outputs * k];
        for o in 0..outputs {
            for c in 0..inputs {
                for t in 0..3 {
                    packed[o * k + t * inputs + c] = w[(o * inputs + c) * 3 + t];
                }
            }
        }
        let bias = floats(bias)?.to_vec();
        if bias.len() != outputs {
            return Err(bad("a convolution's bias is not one per output"));
        }
        Ok(Self {
            weight: packed,
            bias,
            inputs,
            outputs,
            stride,
        })
    }

    /// Positions out of `positions` in (padding 1 on each side).
    fn positions_out(&self, positions: usize) -> usize {
        (positions - 1) / self.stride + 1
    }

    /// `x`: `n` streams × `positions` × `self.inputs`; returns `n` × positions out ×
    /// `self.outputs`.
    fn run(&self, x: &[f32], positions: usize) -> Vec<f32> {
        let k = padded(3 * self.inputs);
        let n = x.len() / (positions * self.inputs);
        let out_positions = self.positions_out(positions);
        let mut columns = vec![0.0; n * out_positions * k];
        for (s, stream) in x.chunks_exact(positions * self.inputs).enumerate() {
            for p in 0..out_positions {
                let column = &mut columns[(s * out_positions + p) * k..][..k];
                for t in 0..3 {
                    // Input position p·stride + t − 1; outside the input it is the zero padding.
                    let Some(at) = (p * self.stride + t).checked_sub(1) else {
                        continue;
                    };
                    if at < positions {
                        column[t * self.inputs..(t + 1) * self.inputs]
                            .copy_from_slice(&stream[at * self.inputs..(at + 1) * self.inputs]);
                    }
                }
            }
        }
        let mut out = vec![0.0; n * out_positions * self.outputs];
        dots(&self.weight, k, &columns, &mut out);
        for position in out.chunks_exact_mut(self.outputs) {
            for (y, b) in position.iter_mut().zip(&self.bias) {
                *y = (*y + b).max(0.0);
            }
        }
        out
    }
}

/// The network at one rate.
struct Branch {
    /// Samples a frame spans (256 at 16 kHz); frames start `filter / 2` apart.
    filter: usize,
    /// Frequency bins of the basis (129 at 16 kHz): its rows are their real parts, then their
    /// imaginary parts.
    bins: usize,
    basis: Vec<f32>,
    encoder: [Conv; 4],
    /// Rows of the input and hidden weights side by side (`[x, h]` columns), gates i, f, g, o.
    gates: Vec<f32>,
    gate_bias: Vec<f32>,
    head: Vec<f32>,
    head_bias: f32,
}

impl Branch {
    /// The network in one branch of the file's `If`; `None` for a branch without one.
    fn load(graph: &Graph) -> Result<Option<Self>, FormatError> {
        let named = |suffix: &str| {
            graph
                .nodes
                .iter()
                .filter(|node| node.op == "Constant")
                .find(|node| node.outputs.first().is_some_and(|o| o.ends_with(suffix)))
                .and_then(|node| node.tensors.first().map(|(_, t)| t))
                .ok_or_else(|| bad(format!("no constant {suffix}")))
        };
        let Ok(basis) = named("stft.forward_basis_buffer") else {
            return Ok(None);
        };
        let (rows, filter) = match basis.dims[..] {
            [rows, 1, filter] if rows % 2 == 0 && filter.is_multiple_of(LANES) => (rows, filter),
            ref other => return Err(bad(format!("a Fourier basis of shape {other:?}"))),
        };
        let conv = |i: usize, stride: usize| {
            Conv::load(
                named(&format!("encoder.{i}.reparam_conv.weight"))?,
                named(&format!("encoder.{i}.reparam_conv.bias"))?,
                stride,
            )
        };
        let encoder = [conv(0, 1)?, conv(1, 2)?, conv(2, 2)?, conv(3, 1)?];
        let chain = [rows / 2, HIDDEN, 64, 64, HIDDEN];
        for (i, layer) in encoder.iter().enumerate() {
            if (layer.inputs, layer.outputs) != (chain[i], chain[i + 1]) {
                return Err(bad(format!(
                    "encoder.{i} is not {} → {}",
                    chain[i],
                    chain[i + 1]
                )));
            }
        }
        let input_weights = floats(named("decoder.rnn.weight_ih")?)?;
        let hidden_weights = floats(named("decoder.rnn.weight_hh")?)?;
        let input_bias = floats(named("decoder.rnn.bias_ih")?)?;
        let hidden_bias = floats(named("decoder.rnn.bias_hh")?)?;
        let gates_len = 4 * HIDDEN;
        if input_weights.len() != gates_len * HIDDEN
            || hidden_weights.len() != gates_len * HIDDEN
            || input_bias.len() != gates_len
            || hidden_bias.len() != gates_len
        {
            return Err(bad("the LSTM is not 128 wide"));
        }
        let mut gates = Vec::with_capacity(gates_len * 2 * HIDDEN);
        for (x, h) in input_weights
            .chunks_exact(HIDDEN)
            .zip(hidden_weights.chunks_exact(HIDDEN))
        {
            gates.extend_from_slice(x);
            gates.extend_from_slice(h);
        }
        let head = floats(named("decoder.decoder.2.weight")?)?.to_vec();
        let head_bias = match floats(named("decoder.decoder.2.bias")?)? {
            [b] => *b,
            _ => return Err(bad("the output has more than one bias")),
        };
        if head.len() != HIDDEN {
            return Err(bad("the output does not read 128 values"));
        }
        Ok(Some(Self {
            filter,
            bins: rows / 2,
            basis: floats(basis)?.to_vec(),
            encoder,
            gates,
            gate_bias: input_bias
                .iter()
                .zip(hidden_bias)
                .map(|(a, b)| a + b)
                .collect(),
            head,
            head_bias,
        }))
    }

    fn run(&self, inputs: &[f32], states: &mut [f32]) -> Vec<f32> {
        let hop = self.filter / 2;
        let pad = self.filter / 4;
        let width = FRAMES * hop + self.filter / 2 - pad;
        let n = states.len() / STATE;
        assert_eq!(states.len(), n * STATE, "state length");
        assert_eq!(inputs.len(), n * width, "each input is {width} samples");

        // 1. Frames of the input padded by reflection, through the Fourier basis.
        let mut frames = vec![0.0; n * FRAMES * self.filter];
        let mut signal = vec![0.0; width + pad];
        for (input, out) in inputs
            .chunks_exact(width)
            .zip(frames.chunks_exact_mut(FRAMES * self.filter))
        {
            signal[..width].copy_from_slice(input);
            for i in 0..pad {
                signal[width + i] = input[width - 2 - i];
            }
            for (f, frame) in out.chunks_exact_mut(self.filter).enumerate() {
                frame.copy_from_slice(&signal[f * hop..f * hop + self.filter]);
            }
        }
        let mut spectrum = vec![0.0; n * FRAMES * 2 * self.bins];
        dots(&self.basis, self.filter, &frames, &mut spectrum);
        let magnitudes: Vec<f32> = spectrum
            .chunks_exact(2 * self.bins)
            .flat_map(|frame| {
                let (re, im) = frame.split_at(self.bins);
                re.iter().zip(im).map(|(r, i)| (r * r + i * i).sqrt())
            })
            .collect();

        // 2. The encoder, down to one position.
        let mut x = magnitudes;
        let mut positions = FRAMES;
        for layer in &self.encoder {
            x = layer.run(&x, positions);
            positions = layer.positions_out(positions);
        }

        // 3. The LSTM cell over [x, h].
        let mut columns = Vec::with_capacity(n * 2 * HIDDEN);
        for (features, state) in x.chunks_exact(HIDDEN).zip(states.chunks_exact(STATE)) {
            columns.extend_from_slice(features);
            columns.extend_from_slice(&state[..HIDDEN]);
        }
        let mut gates = vec![0.0; n * 4 * HIDDEN];
        dots(&self.gates, 2 * HIDDEN, &columns, &mut gates);

        // 4. The new state, and the probability read off h.
        let mut probabilities = Vec::with_capacity(n);
        for (g, state) in gates
            .chunks_exact(4 * HIDDEN)
            .zip(states.chunks_exact_mut(STATE))
        {
            let (h, c) = state.split_at_mut(HIDDEN);
            let mut logit = self.head_bias;
            for u in 0..HIDDEN {
                let gate = |q: usize| g[q * HIDDEN + u] + self.gate_bias[q * HIDDEN + u];
                let cell = sigmoid(gate(1)) * c[u] + sigmoid(gate(0)) * gate(2).tanh();
                c[u] = cell;
                h[u] = sigmoid(gate(3)) * cell.tanh();
                logit += h[u].max(0.0) * self.head[u];
            }
            probabilities.push(sigmoid(logit));
        }
        probabilities
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn floats(tensor: &Tensor) -> Result<&[f32], FormatError> {
    match &tensor.data {
        Data::F32(v) => Ok(v),
        _ => Err(bad("a weight that is not float")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_holds_no_silero_networks_is_an_error_not_a_panic() {
        // Not protobuf at all, a truncated field, and a valid model whose graph is empty.
        for bytes in [&b"not a model"[..], &[0x3a, 0x05, 0x0a], &[0x3a, 0x00]] {
            let error = Network::load(bytes).err().expect("an error");
            assert!(!error.0.is_empty());
        }
        let empty = Network::load(&[0x3a, 0x00]).err().expect("an error");
        assert_eq!(empty.0, "no 16 kHz network in the file");
    }
}
