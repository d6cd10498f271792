//! Smart Turn's network run by voxide itself: the int8 Whisper-tiny encoder and the
//! attention-pooled classifier of `smart-turn-v3.2-cpu.onnx`, read from that file.
//!
//! The file is a QDQ graph: every activation goes through a fixed `u8` quantisation between
//! the operators. This engine computes that graph's own arithmetic: each product of
//! quantised operands exactly in integers, each quantisation at the same place with the same
//! scale, the rest (layer norms, GELU, softmax) in `f32`. What makes it faster than a general
//! runtime is what the model's shape allows:
//! - one pass per row block does a whole attention layer, from the queries to the MLP's output;
//! - the softmax reads a 256-entry table, as its input has only 256 possible steps from the
//!   row's maximum; the convolutions' GELUs likewise;
//! - the products use AVX-512 VNNI (64 byte multiply-adds an instruction) where the CPU has it.

mod gemm;
mod graph;
mod vector;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use crate::audio::onnx_file::FormatError;
use crate::audio::onnx_file::Node;
use gemm::{Kernel, PackedB, gemm, split};
use graph::{Quant, Requant, Walker, Weights, input, output};
use vector::gelu;

/// Columns per packed block: one 512-bit register of `i32` sums.
pub const BLOCK: usize = 16;

/// Whether this CPU runs the engine's products on AVX-512 VNNI (else on plain Rust, several
/// times slower).
pub fn vectorised() -> bool {
    Kernel::detect() != Kernel::Portable
}

/// Mel bins of the input.
const MELS: usize = 80;
/// Frames of the input (8 s at 100 per second).
const FRAMES: usize = 800;
/// Positions after the strided convolution.
const POSITIONS: usize = FRAMES / 2;
/// Width of the encoder.
const WIDTH: usize = 384;
const HEADS: usize = 6;
const HEAD: usize = WIDTH / HEADS;
const LAYERS: usize = 4;
const NORM_EPSILON: f32 = 1e-5;

fn bad(what: impl Into<String>) -> FormatError {
    FormatError(what.into())
}

/// A layer norm's scale and shift.
struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

impl Norm {
    fn load(walker: &Walker, weight: &str, bias: &str) -> Result<Self, FormatError> {
        Ok(Self {
            weight: walker.floats(weight)?.to_vec(),
            bias: walker.floats(bias)?.to_vec(),
        })
    }

    fn apply(&self, x: &[f32], out: &mut [f32]) {
        let n = x.len() as f32;
        let mean = x.iter().sum::<f32>() / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let inv = 1.0 / (var + NORM_EPSILON).sqrt();
        for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(&self.weight).zip(&self.bias) {
            *o = (v - mean) * inv * w + b;
        }
    }
}

/// One projection as the file holds it: weights `k × n`, the quantisation of its output, and
/// the bias added after it (zeros where there is none).
struct Projection {
    weights: Weights,
    out: Quant,
    bias: Vec<f32>,
}

impl Projection {
    /// The projection of the `MatMul` `node`.
    fn load(walker: &Walker, node: &Node) -> Result<Self, FormatError> {
        let weights = walker.weights(input(node, 1)?)?;
        let [_, n] = weights.dims[..] else {
            return Err(bad(format!("{}: weights are not a matrix", output(node)?)));
        };
        if weights.scales.len() != n {
            return Err(bad(format!(
                "{}: {} scales for {n} columns",
                output(node)?,
                weights.scales.len()
            )));
        }
        let (out, after) = walker.quant(output(node)?)?;
        let bias = match walker.readers(after, "Add").first() {
            Some(add) => walker.floats(input(add, 1)?)?.to_vec(),
            None => vec![0.0; n],
        };
        if bias.len() != n {
            return Err(bad(format!(
                "{}: a bias of {} for {n} columns",
                output(node)?,
                bias.len()
            )));
        }
        Ok(Self { weights, out, bias })
    }
}

/// A quantised product with a weight matrix: `u8` input times packed `i8` weights, each
/// column's sum requantised as the file says, then its bias added.
struct Linear {
    weights: PackedB,
    /// Per column: the requantisation's multiplier, the output's zero point and scale, the
    /// bias.
    multiplier: Vec<f32>,
    zero: Vec<f32>,
    scale: Vec<f32>,
    bias: Vec<f32>,
}

impl Linear {
    /// The projections side by side (they read the same input, quantised by `input`).
    fn new(parts: &[Projection], input: Quant) -> Self {
        let k = parts.first().map_or(0, |p| p.weights.dims[0]);
        let columns: Vec<(usize, usize)> = parts
            .iter()
            .enumerate()
            .flat_map(|(i, p)| (0..p.weights.dims[1]).map(move |c| (i, c)))
            .collect();
        let per_column = |f: &dyn Fn(&Projection, usize) -> f32| -> Vec<f32> {
            columns.iter().map(|&(i, c)| f(&parts[i], c)).collect()
        };
        Self {
            weights: PackedB::weights(k, columns.len(), |r, col| {
                let (i, c) = columns[col];
                let w = &parts[i].weights;
                w.codes[r * w.dims[1] + c]
            }),
            // As ONNX Runtime computes it: (input scale · weight scale) / output scale.
            multiplier: per_column(&|p, c| input.scale * p.weights.scales[c] / p.out.scale),
            zero: per_column(&|p, _| f32::from(p.out.zero)),
            scale: per_column(&|p, _| p.out.scale),
            bias: per_column(&|p, c| p.bias[c]),
        }
    }

    /// The product of the `MatMul` `node`, its input quantised by `input`.
    fn load(walker: &Walker, node: &Node, input: Quant) -> Result<Self, FormatError> {
        Ok(Self::new(&[Projection::load(walker, node)?], input))
    }

    /// The real outputs for `rows` of input codes (`k` wide, zero point `zero`), row-major.
    fn values(&self, kernel: Kernel, rows: &[u8], zero: u8) -> Vec<f32> {
        let n = self.weights.n();
        let mut sums = vec![0; rows.len() / self.weights.k() * n];
        gemm(kernel, rows, zero, &self.weights, &mut sums);
        let mut values = vec![0.0; sums.len()];
        for (sums, values) in sums.chunks_exact(n).zip(values.chunks_exact_mut(n)) {
            vector::requantize(
                sums,
                &self.multiplier,
                &self.zero,
                &self.scale,
                &self.bias,
                values,
            );
        }
        values
    }
}

/// A 1-D convolution of kernel 3, padding 1, as a product over unfolded input.
struct Conv {
    weights: PackedB,
    bias: Vec<i32>,
    /// Per output channel: (input scale · weight scale) / output scale.
    multiplier: Vec<f32>,
    out: Quant,
}

impl Conv {
    fn load(walker: &Walker, node: &Node, input_quant: Quant) -> Result<Self, FormatError> {
        let w: Weights = walker.weights(input(node, 1)?)?;
        let [n, c, 3] = w.dims[..] else {
            return Err(bad("a convolution's kernel is not 3 wide"));
        };
        let k = c * 3;
        let (bias, _) = walker.bias(input(node, 2)?)?;
        let out = walker.quant(output(node)?)?.0;
        if bias.len() != n || w.scales.len() != n {
            return Err(bad(
                "a convolution's bias or scales do not match its channels",
            ));
        }
        Ok(Self {
            // Weight [n][c][3] is the product's B[c * 3 + tap][n].
            weights: PackedB::weights(k, n, |r, col| w.codes[col * k + r]),
            multiplier: w
                .scales
                .iter()
                .map(|&s| input_quant.scale * s / out.scale)
                .collect(),
            bias,
            out,
        })
    }

    /// Output codes at positions `rows` of input codes `x` (time-major, `channels` wide,
    /// zero point `zero`, which also pads it), with stride `stride`.
    fn run(
        &self,
        kernel: Kernel,
        x: &[u8],
        channels: usize,
        zero: u8,
        stride: usize,
        rows: std::ops::Range<usize>,
    ) -> Vec<u8> {
        let k = channels * 3;
        let frames = x.len() / channels;
        let mut unfolded = vec![zero; rows.len() * k];
        for (row, out) in rows.clone().zip(unfolded.chunks_exact_mut(k)) {
            for tap in 0..3 {
                // Input frame row * stride + tap - 1, or the padding.
                let Some(frame) = (row * stride + tap).checked_sub(1).filter(|&f| f < frames)
                else {
                    continue;
                };
                let from = &x[frame * channels..(frame + 1) * channels];
                for (c, &v) in from.iter().enumerate() {
                    out[c * 3 + tap] = v;
                }
            }
        }
        let n = self.weights.n();
        let mut sums = vec![0; rows.len() * n];
        gemm(kernel, &unfolded, zero, &self.weights, &mut sums);
        let mut codes = vec![0u8; sums.len()];
        for (sums, codes) in sums.chunks_exact(n).zip(codes.chunks_exact_mut(n)) {
            let zero = f32::from(self.out.zero);
            vector::requantize_columns(sums, &self.bias, &self.multiplier, zero, codes);
        }
        codes
    }
}

/// One encoder layer: self-attention, then the MLP, each around a residual.
struct Layer {
    norm1: Norm,
    norm1_out: Quant,
    /// Queries, keys and values in one product (columns in that order).
    qkv: Linear,
    /// The 1/⁴√64 both queries and keys are scaled by.
    qk_scale: f32,
    q: Quant,
    k: Quant,
    v: Quant,
    scores: Quant,
    softmax: Softmax,
    probs: Quant,
    attended: Quant,
    merged: Quant,
    out: Linear,
    norm2: Norm,
    norm2_out: Quant,
    fc1: Linear,
    gelu: Quant,
    fc2: Linear,
}

impl Layer {
    /// The query, key and value projections: they read the same normed input, and their
    /// biases tell them apart (keys have none).
    fn projections<'a>(
        walker: &'a Walker,
        normed: &str,
        index: usize,
    ) -> Result<(&'a Node, &'a Node, &'a Node), FormatError> {
        let (mut q, mut k, mut v) = (None, None, None);
        for mm in walker.readers(normed, "MatMul") {
            let (_, after) = walker.quant(output(mm)?)?;
            let bias = walker
                .readers(after, "Add")
                .first()
                .map(|add| input(add, 1).map(str::to_owned))
                .transpose()?;
            match bias.as_deref() {
                Some(b) if b.ends_with("q_proj.bias") => q = Some(mm),
                Some(b) if b.ends_with("v_proj.bias") => v = Some(mm),
                None => k = Some(mm),
                Some(other) => return Err(bad(format!("unexpected projection bias {other}"))),
            }
        }
        match (q, k, v) {
            (Some(q), Some(k), Some(v)) => Ok((q, k, v)),
            _ => Err(bad(format!(
                "layer {index}: queries, keys or values not found"
            ))),
        }
    }

    fn load(walker: &Walker, index: usize) -> Result<Self, FormatError> {
        let p = format!("inner.encoder.layers.{index}.");
        let ln1 = walker.layer_norm(&format!("{p}self_attn_layer_norm.weight"))?;
        let (norm1_out, normed) = walker.quant(output(ln1)?)?;
        let (qm, km, vm) = Self::projections(walker, normed, index)?;
        let qkv = Linear::new(
            &[
                Projection::load(walker, qm)?,
                Projection::load(walker, km)?,
                Projection::load(walker, vm)?,
            ],
            norm1_out,
        );
        // Follow each projection to the quantisation the attention reads.
        let after = |mm: &Node| -> Result<&str, FormatError> {
            let (_, dq) = walker.quant(output(mm)?)?;
            Ok(match walker.readers(dq, "Add").first() {
                Some(add) => output(add)?,
                None => dq,
            })
        };
        let q_mul = walker.next(after(qm)?, "Mul")?;
        let k_mul = walker.next(after(km)?, "Mul")?;
        let qk_scale = walker.scalar(input(q_mul, 1)?)?;
        let (q_quant, q_dq) = walker.quant(output(q_mul)?)?;
        let (k_quant, _) = walker.quant(output(k_mul)?)?;
        let (v_quant, _) = walker.quant(after(vm)?)?;
        let scores_mm = walker.reader(q_dq, "MatMul")?;
        let (scores, scores_dq) = walker.quant(output(scores_mm)?)?;
        let softmax_node = walker.reader(scores_dq, "Softmax")?;
        let (probs, probs_dq) = walker.quant(output(softmax_node)?)?;
        let attend = walker.reader(probs_dq, "MatMul")?;
        let (attended, attended_dq) = walker.quant(output(attend)?)?;
        let (merged, merged_dq) = walker.quant(attended_dq)?;
        let out = Linear::load(walker, walker.reader(merged_dq, "MatMul")?, merged)?;
        let ln2 = walker.layer_norm(&format!("{p}final_layer_norm.weight"))?;
        let (norm2_out, normed2) = walker.quant(output(ln2)?)?;
        let fc1_node = walker.reader(normed2, "MatMul")?;
        let fc1 = Linear::load(walker, fc1_node, norm2_out)?;
        // GELU is x · ½(1 + erf(x/√2)), its last Mul quantised.
        let (_, fc1_dq) = walker.quant(output(fc1_node)?)?;
        let fc1_biased = output(walker.reader(fc1_dq, "Add")?)?;
        let gelu_mul = walker
            .readers(fc1_biased, "Mul")
            .into_iter()
            .find(|m| m.inputs.first().map(String::as_str) == Some(fc1_biased))
            .ok_or_else(|| bad(format!("layer {index}: no GELU after fc1")))?;
        let (gelu, gelu_dq) = walker.quant(output(gelu_mul)?)?;
        let fc2 = Linear::load(walker, walker.reader(gelu_dq, "MatMul")?, gelu)?;

        let softmax = Softmax::new(scores, probs);
        Ok(Self {
            norm1: Norm::load(walker, input(ln1, 1)?, input(ln1, 2)?)?,
            norm1_out,
            qkv,
            qk_scale,
            q: q_quant,
            k: k_quant,
            v: v_quant,
            scores,
            softmax,
            probs,
            attended,
            merged,
            out,
            norm2: Norm::load(walker, input(ln2, 1)?, input(ln2, 2)?)?,
            norm2_out,
            fc1,
            gelu,
            fc2,
        })
    }
}

/// A small dense layer of the classifier (`Gemm`): integer sums over `u8` input codes and
/// `i8` weights, plus the `i32` bias, requantised.
struct Dense {
    /// `n × k`, row-major.
    weights: Vec<i8>,
    bias: Vec<i32>,
    input_zero: i32,
    out: Vec<Requant>,
}

impl Dense {
    /// The `Gemm` `node` (weights `n × k`, as PyTorch's `Linear` exports them) reading input
    /// quantised by `input`, and the name of its dequantised output.
    fn load<'g>(
        walker: &Walker<'g>,
        node: &Node,
        input_quant: Quant,
    ) -> Result<(Self, &'g str), FormatError> {
        let w = walker.weights(input(node, 1)?)?;
        let [n, _] = w.dims[..] else {
            return Err(bad("a classifier layer's weights are not a matrix"));
        };
        let (bias, _) = walker.bias(input(node, 2)?)?;
        if w.scales.len() != n || bias.len() != n {
            return Err(bad(
                "a classifier layer's scales or bias do not match its outputs",
            ));
        }
        let (out, after) = walker.quant(output(node)?)?;
        let dense = Self {
            weights: w.codes,
            bias,
            input_zero: i32::from(input_quant.zero),
            out: w
                .scales
                .iter()
                .map(|&s| Requant::new(input_quant.scale, s, out))
                .collect(),
        };
        Ok((dense, after))
    }

    /// The real outputs for input codes `x`.
    fn apply(&self, x: &[u8]) -> Vec<f32> {
        self.weights
            .chunks_exact(x.len())
            .zip(&self.bias)
            .zip(&self.out)
            .map(|((row, &bias), out)| {
                let sum: i32 = row
                    .iter()
                    .zip(x)
                    .map(|(&w, &x)| i32::from(w) * (i32::from(x) - self.input_zero))
                    .sum();
                out.value(sum + bias)
            })
            .collect()
    }
}

/// The quantised GELU whose input is the tensor `x`: its last `Mul` reads `x` first.
fn gelu_after<'g>(walker: &Walker<'g>, x: &str) -> Result<(Quant, &'g str), FormatError> {
    let mul = walker
        .readers(x, "Mul")
        .into_iter()
        .find(|m| m.inputs.first().map(String::as_str) == Some(x))
        .ok_or_else(|| bad(format!("no GELU after {x}")))?;
    walker.quant(output(mul)?)
}

/// The classifier on the encoder's output: attention pooling over positions, then three
/// dense layers and a sigmoid.
struct Head {
    norm: Norm,
    norm_out: Quant,
    pool_hidden: Linear,
    tanh: Quant,
    pool_score: Linear,
    pooled: Quant,
    dense: [Dense; 3],
    dense_norm: Norm,
    gelus: [Quant; 2],
}

impl Head {
    fn load(walker: &Walker) -> Result<Self, FormatError> {
        let ln = walker.layer_norm("inner.encoder.layer_norm.weight")?;
        let (norm_out, normed) = walker.quant(output(ln)?)?;
        let hidden_node = walker.reader(normed, "MatMul")?;
        let pool_hidden = Linear::load(walker, hidden_node, norm_out)?;
        let (_, hidden_dq) = walker.quant(output(hidden_node)?)?;
        let hidden = output(walker.reader(hidden_dq, "Add")?)?;
        let (tanh, tanh_dq) = walker.quant(output(walker.reader(hidden, "Tanh")?)?)?;
        let score_node = walker.reader(tanh_dq, "MatMul")?;
        let pool_score = Linear::load(walker, score_node, tanh)?;
        let (_, score_dq) = walker.quant(output(score_node)?)?;
        let score = output(walker.reader(score_dq, "Add")?)?;
        let weights = output(walker.reader(score, "Softmax")?)?;
        let weighted = output(walker.reader(weights, "Mul")?)?;
        let (pooled, pooled_dq) = walker.quant(output(walker.reader(weighted, "ReduceSum")?)?)?;
        let (first, first_dq) = Dense::load(walker, walker.reader(pooled_dq, "Gemm")?, pooled)?;
        let dense_ln = walker.reader(first_dq, "LayerNormalization")?;
        let (gelu1, gelu1_dq) = gelu_after(walker, output(dense_ln)?)?;
        let (second, second_dq) = Dense::load(walker, walker.reader(gelu1_dq, "Gemm")?, gelu1)?;
        let (gelu2, gelu2_dq) = gelu_after(walker, second_dq)?;
        let (third, third_dq) = Dense::load(walker, walker.reader(gelu2_dq, "Gemm")?, gelu2)?;
        walker.reader(third_dq, "Sigmoid")?;
        if pool_hidden.weights.k() != WIDTH || pool_score.weights.n() != 1 {
            return Err(bad("the pooling layers do not fit the encoder"));
        }
        Ok(Self {
            norm: Norm::load(walker, input(ln, 1)?, input(ln, 2)?)?,
            norm_out,
            pool_hidden,
            tanh,
            pool_score,
            pooled,
            dense: [first, second, third],
            dense_norm: Norm::load(walker, input(dense_ln, 1)?, input(dense_ln, 2)?)?,
            gelus: [gelu1, gelu2],
        })
    }

    /// The probability that the turn is complete, from the encoder's output `h`.
    fn run(&self, kernel: Kernel, h: &[f32]) -> f32 {
        let codes = norm_codes(&self.norm, self.norm_out, h);
        let hidden_values = self.pool_hidden.values(kernel, &codes, self.norm_out.zero);
        let mut hidden = vec![0u8; hidden_values.len()];
        let tanh_zero = f32::from(self.tanh.zero);
        vector::tanh_quantize(&hidden_values, self.tanh.scale, tanh_zero, &mut hidden);
        let scores = self.pool_score.values(kernel, &hidden, self.tanh.zero);
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = exps.iter().sum();
        let mut pooled = vec![0.0f32; WIDTH];
        for (row, e) in codes.chunks_exact(WIDTH).zip(&exps) {
            let w = e / total;
            for (p, &c) in pooled.iter_mut().zip(row) {
                *p += self.norm_out.value(c) * w;
            }
        }
        let x: Vec<u8> = pooled.iter().map(|&p| self.pooled.code(p)).collect();
        let x = self.dense[0].apply(&x);
        let mut normed = vec![0.0; x.len()];
        self.dense_norm.apply(&x, &mut normed);
        let x: Vec<u8> = normed
            .iter()
            .map(|&v| self.gelus[0].code(gelu(v)))
            .collect();
        let x = self.dense[1].apply(&x);
        let x: Vec<u8> = x.iter().map(|&v| self.gelus[1].code(gelu(v))).collect();
        let logit = self.dense[2].apply(&x).first().copied().unwrap_or(0.0);
        1.0 / (1.0 + (-logit).exp())
    }
}

/// Smart Turn v3's network, loaded from its ONNX file.
pub struct Network {
    kernel: Kernel,
    input: Quant,
    conv1: Conv,
    /// conv1's output code to the code of its GELU.
    gelu1: [u8; 256],
    /// The quantisation of conv2's input (conv1's GELU).
    conv2_input: Quant,
    conv2: Conv,
    /// conv2's output code to its GELU's value.
    gelu2: [f32; 256],
    /// The learned position embeddings, `POSITIONS × WIDTH`.
    positions: Vec<f32>,
    layers: Vec<Layer>,
    head: Head,
}

impl Network {
    /// Reads the network from the bytes of `smart-turn-v3.2-cpu.onnx`.
    pub fn load(bytes: &[u8]) -> Result<Self, FormatError> {
        let graph = crate::audio::onnx_file::parse(bytes)?;
        let walker = Walker::new(&graph);
        let (input, input_dq) = walker.quant("input_features")?;
        let conv1_node = walker.reader(input_dq, "Conv")?;
        let conv1 = Conv::load(&walker, conv1_node, input)?;
        let (_, conv1_dq) = walker.quant(output(conv1_node)?)?;
        let (gelu1_quant, gelu1_dq) = gelu_after(&walker, conv1_dq)?;
        let conv2_node = walker.reader(gelu1_dq, "Conv")?;
        let conv2 = Conv::load(&walker, conv2_node, gelu1_quant)?;
        let positions = walker
            .floats("inner.encoder.embed_positions.weight")?
            .to_vec();
        if conv1.weights.k() != MELS * 3
            || conv1.weights.n() != WIDTH
            || conv2.weights.k() != WIDTH * 3
            || positions.len() != POSITIONS * WIDTH
        {
            return Err(bad("the convolutions do not have Whisper tiny's shape"));
        }
        let gelu1 = std::array::from_fn(|c| gelu1_quant.code(gelu(conv1.out.value(c as u8))));
        let gelu2 = std::array::from_fn(|c| gelu(conv2.out.value(c as u8)));
        let layers = (0..LAYERS)
            .map(|i| Layer::load(&walker, i))
            .collect::<Result<Vec<_>, _>>()?;
        for layer in &layers {
            if layer.qkv.weights.k() != WIDTH
                || layer.qkv.weights.n() != 3 * WIDTH
                || layer.fc2.weights.n() != WIDTH
            {
                return Err(bad("an encoder layer does not have Whisper tiny's shape"));
            }
        }
        Ok(Self {
            kernel: Kernel::detect(),
            input,
            conv1,
            gelu1,
            conv2_input: gelu1_quant,
            conv2,
            gelu2,
            positions,
            layers,
            head: Head::load(&walker)?,
        })
    }

    /// The probability that the turn is complete, from Whisper log-mel features
    /// (`80 × 800`, mel-major), on `threads` threads.
    pub fn probability(&self, features: &[f32], threads: usize) -> Result<f32, FormatError> {
        if features.len() != MELS * FRAMES {
            return Err(bad(format!(
                "{} features, not {MELS} mels × {FRAMES} frames",
                features.len()
            )));
        }
        let kernel = self.kernel;
        let mut x = vec![0u8; FRAMES * MELS];
        for (mel, row) in features.chunks_exact(FRAMES).enumerate() {
            for (frame, &v) in row.iter().enumerate() {
                x[frame * MELS + mel] = self.input.code(v);
            }
        }
        let g1: Vec<u8> = split(threads, FRAMES, |rows| {
            self.conv1
                .run(kernel, &x, MELS, self.input.zero, 1, rows)
                .into_iter()
                .map(|c| self.gelu1[usize::from(c)])
                .collect::<Vec<u8>>()
        })
        .concat();
        let mut h: Vec<f32> = split(threads, POSITIONS, |rows| {
            let first = rows.start * WIDTH;
            self.conv2
                .run(kernel, &g1, WIDTH, self.conv2_input.zero, 2, rows)
                .into_iter()
                .enumerate()
                .map(|(i, c)| self.gelu2[usize::from(c)] + self.positions[first + i])
                .collect::<Vec<f32>>()
        })
        .concat();
        for layer in &self.layers {
            h = layer.run(kernel, &h, threads);
        }
        Ok(self.head.run(kernel, &h))
    }
}

impl Layer {
    /// The layer on the residual stream `h` (`POSITIONS × WIDTH`).
    fn run(&self, kernel: Kernel, h: &[f32], threads: usize) -> Vec<f32> {
        // Queries, keys and values for every position: the attention of any row needs all
        // keys and values.
        let parts = split(threads, POSITIONS, |rows| {
            let x = &h[rows.start * WIDTH..rows.end * WIDTH];
            let normed = norm_codes(&self.norm1, self.norm1_out, x);
            let values = self.qkv.values(kernel, &normed, self.norm1_out.zero);
            let mut q = vec![0u8; rows.len() * WIDTH];
            let mut k = vec![0u8; rows.len() * WIDTH];
            let mut v = vec![0u8; rows.len() * WIDTH];
            for (row, ((q, k), v)) in values.chunks_exact(3 * WIDTH).zip(
                q.chunks_exact_mut(WIDTH)
                    .zip(k.chunks_exact_mut(WIDTH))
                    .zip(v.chunks_exact_mut(WIDTH)),
            ) {
                let (qs, rest) = row.split_at(WIDTH);
                let (ks, vs) = rest.split_at(WIDTH);
                let quant = |x: &[f32], factor: f32, by: Quant, out: &mut [u8]| {
                    vector::quantize(x, factor, by.scale, f32::from(by.zero), out);
                };
                quant(qs, self.qk_scale, self.q, q);
                quant(ks, self.qk_scale, self.k, k);
                quant(vs, 1.0, self.v, v);
            }
            (q, k, v)
        });
        let mut q = Vec::with_capacity(POSITIONS * WIDTH);
        let mut k = Vec::with_capacity(POSITIONS * WIDTH);
        let mut v = Vec::with_capacity(POSITIONS * WIDTH);
        for (qp, kp, vp) in parts {
            q.extend(qp);
            k.extend(kp);
            v.extend(vp);
        }
        // Each head's keys (transposed) and values, packed for the products, half the heads on
        // each thread.
        let packed: Vec<(PackedB, PackedB)> = split(threads, HEADS, |heads| {
            heads
                .map(|head| {
                    let keys = PackedB::activations(HEAD, POSITIONS, self.k.zero, |d, t| {
                        k[t * WIDTH + head * HEAD + d]
                    });
                    let values = PackedB::activations(POSITIONS, HEAD, self.v.zero, |t, d| {
                        v[t * WIDTH + head * HEAD + d]
                    });
                    (keys, values)
                })
                .collect::<Vec<_>>()
        })
        .concat();
        let (keys, values): (Vec<PackedB>, Vec<PackedB>) = packed.into_iter().unzip();
        split(threads, POSITIONS, |rows| {
            let mut x = h[rows.start * WIDTH..rows.end * WIDTH].to_vec();
            let merged = self.attend(
                kernel,
                &q[rows.start * WIDTH..rows.end * WIDTH],
                &keys,
                &values,
            );
            let attention = self.out.values(kernel, &merged, self.merged.zero);
            x.iter_mut().zip(&attention).for_each(|(x, a)| *x += a);
            let normed = norm_codes(&self.norm2, self.norm2_out, &x);
            let hidden_values = self.fc1.values(kernel, &normed, self.norm2_out.zero);
            let mut hidden = vec![0u8; hidden_values.len()];
            vector::gelu_quantize(
                &hidden_values,
                self.gelu.scale,
                f32::from(self.gelu.zero),
                &mut hidden,
            );
            let mlp = self.fc2.values(kernel, &hidden, self.gelu.zero);
            x.iter_mut().zip(&mlp).for_each(|(x, m)| *x += m);
            x
        })
        .concat()
    }

    /// Self-attention for the query rows `q` (codes, `WIDTH` wide) over every position's
    /// keys and values (packed per head): the heads' outputs side by side, as codes.
    fn attend(&self, kernel: Kernel, q: &[u8], keys: &[PackedB], values: &[PackedB]) -> Vec<u8> {
        let rows = q.len() / WIDTH;
        let mut merged = vec![0u8; q.len()];
        let mut query = vec![0u8; rows * HEAD];
        let mut scores = vec![0i32; rows * POSITIONS];
        let mut codes = vec![0u8; POSITIONS];
        let mut probs = vec![0u8; rows * POSITIONS];
        let mut attended = vec![0i32; rows * HEAD];
        let score_multiplier = self.q.scale * self.k.scale / self.scores.scale;
        let score_zero = f32::from(self.scores.zero);
        let attended_out = Requant::new(self.probs.scale, self.v.scale, self.attended);
        for (head, (keys, values)) in keys.iter().zip(values).enumerate() {
            for (row, out) in q.chunks_exact(WIDTH).zip(query.chunks_exact_mut(HEAD)) {
                out.copy_from_slice(&row[head * HEAD..(head + 1) * HEAD]);
            }
            gemm(kernel, &query, self.q.zero, keys, &mut scores);
            let rows = scores
                .chunks_exact(POSITIONS)
                .zip(probs.chunks_exact_mut(POSITIONS));
            for (sums, probs) in rows {
                vector::requantize_codes(sums, score_multiplier, score_zero, &mut codes);
                self.softmax.run(&codes, probs);
            }
            gemm(kernel, &probs, self.probs.zero, values, &mut attended);
            for (sums, out) in attended
                .chunks_exact(HEAD)
                .zip(merged.chunks_exact_mut(WIDTH))
            {
                for (o, &s) in out[head * HEAD..(head + 1) * HEAD].iter_mut().zip(sums) {
                    *o = self.merged.code(attended_out.value(s));
                }
            }
        }
        merged
    }
}

/// Rows of `x` (`WIDTH` wide) layer-normed and quantised.
fn norm_codes(norm: &Norm, quant: Quant, x: &[f32]) -> Vec<u8> {
    let mut codes = vec![0u8; x.len()];
    for (x, out) in x.chunks_exact(WIDTH).zip(codes.chunks_exact_mut(WIDTH)) {
        let zero = f32::from(quant.zero);
        vector::norm_quantize(
            x,
            &norm.weight,
            &norm.bias,
            NORM_EPSILON,
            quant.scale,
            zero,
            out,
        );
    }
    codes
}

/// The attention's softmax from score codes to probability codes, computed as ONNX Runtime's
/// `QLinearSoftmax` does (which is how the model has been run and judged): a table of
/// `exp` over the 256 codes, and the output scale's inverse rounded down to an integer.
/// Exact arithmetic differs from it in a few codes in 10⁴, which the model amplifies.
struct Softmax {
    /// `exp((i - 255 + shift) · scale)` for codes `i`, the shift keeping sums finite.
    table: [f32; 256],
    /// ⌊1 / output scale⌋.
    inverse: f32,
    zero: u8,
}

impl Softmax {
    fn new(scores: Quant, probs: Quant) -> Self {
        let scale = f64::from(scores.scale);
        let shift = ((f32::MAX / POSITIONS as f32).ln() as f64 - 5.0).max(0.0) / scale;
        Self {
            table: std::array::from_fn(|i| ((i as f64 - 255.0 + shift) * scale).exp() as f32),
            inverse: (1.0 / probs.scale).floor(),
            zero: probs.zero,
        }
    }

    /// One row: `codes` in, `probs` out.
    fn run(&self, codes: &[u8], probs: &mut [u8]) {
        vector::softmax(
            codes,
            &self.table,
            self.inverse,
            f32::from(self.zero),
            probs,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_loads_from_the_model_file_and_judges_features() {
        if cfg!(debug_assertions) && !vectorised() {
            // voxide runs its engine only where the CPU has VNNI (`SmartTurnEngine::best`);
            // unoptimised, the plain-Rust products take minutes an inference. `gemm`'s tests
            // check them exact.
            eprintln!("skipped: no AVX-512 VNNI here, and an unoptimised build");
            return;
        }
        let Ok(path) = crate::models::model_path("smart-turn-v3.2", "smart-turn-v3.2-cpu.onnx")
        else {
            panic!("the Smart Turn model is missing; run scripts/setup.sh");
        };
        let bytes = std::fs::read(path).expect("readable model");
        let network = Network::load(&bytes).expect("the network loads");
        // Features with structure in both time and frequency, in Whisper's range. (Each
        // kernel's products are checked exact in `gemm`; the rest is shared code.)
        let features: Vec<f32> = (0..MELS * FRAMES)
            .map(|i| ((i % FRAMES) as f32 * 0.05 + (i / FRAMES) as f32 * 0.3).sin() * 0.8)
            .collect();
        let p = network.probability(&features, 2).expect("inference");
        assert!((0.0..=1.0).contains(&p), "{p}");
        // The same on one thread: rows are independent.
        assert_eq!(network.probability(&features, 1).expect("inference"), p);
        assert!(network.probability(&features[1..], 1).is_err());
    }

    #[test]
    fn a_file_that_is_not_smart_turn_is_an_error() {
        assert!(Network::load(b"not a model").is_err());
        // A well-formed graph without Smart Turn's parts.
        assert!(Network::load(&[0x3a, 0x00]).is_err());
    }
}
