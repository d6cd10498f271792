//! The llama forward pass of the local model, laid out for this CPU's fast kernels.
//!
//! candle's own quantized llama keeps each projection at the model's width (576 for
//! SmolLM2-135M). That is not a multiple of the 256-value blocks candle's AVX-512 VNNI kernels
//! take, so every projection fell back to one dot product per row and a prompt went through at
//! about 90 tokens/s. Here every matrix that reads the hidden state is stored with its columns
//! zero-padded to the next multiple of 256 (the zeros add nothing to any dot product), q/k/v and
//! gate/up are fused into one matrix each, and the KV cache is a plain value the caller owns, so
//! the tool router can branch it cheaply.
//!
//! On a CPU without VNNI (8-bit dot products in one instruction), candle multiplies Q8_0
//! matrices one dot product at a time: a prompt ran at about 90 tokens/s on a Zen 3, as slow as
//! generating. There, each layer's matrices are also kept in f32 for prompts
//! ([`Prefill::Dense`]): several tokens at once go through a dense matrix product instead, about
//! 2.5 times as fast, for about 390 MB more memory (f16 copies, half that, ran at 1.5 times).
//! One token at a time stays on the Q8_0 weights, which are faster to read.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::{D, DType, Device, Module, Result, Tensor};

/// The block width of the fast kernels: reading dimensions are padded to a multiple of it.
const BLOCK: usize = 256;

/// The keys and values of every position seen so far, per layer.
#[derive(Clone, Default)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    len: usize,
}

impl KvCache {
    /// Positions in the cache.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.layers.clear();
        self.len = 0;
    }

    /// Keeps the first `len` positions and forgets the rest, so a prompt that departs from
    /// the cached one only part-way (an interrupted answer cut to its spoken words) reuses the
    /// part they share.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        if len == 0 {
            self.clear();
            return Ok(());
        }
        for (k, v) in &mut self.layers {
            *k = k.narrow(2, 0, len)?;
            *v = v.narrow(2, 0, len)?;
        }
        self.len = len;
        Ok(())
    }
}

/// How several tokens at once go through the layers' matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefill {
    /// On the quantized weights, like one token.
    Quantized,
    /// Through f32 copies of the weights, with a dense matrix product.
    Dense,
}

impl Prefill {
    /// Dense where this CPU has no 8-bit dot-product instructions for candle's tiled kernels.
    pub fn for_this_cpu() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let vnni = std::arch::is_x86_feature_detected!("avx512vnni")
                || std::arch::is_x86_feature_detected!("avxvnni");
            if !vnni {
                return Prefill::Dense;
            }
        }
        Prefill::Quantized
    }
}

/// One weight matrix that reads a hidden state of `input` values.
struct Projection {
    /// The rows, columns zero-padded to the kernels' block.
    quantized: QMatMul,
    /// The rows unpadded in f32, for several tokens at once ([`Prefill::Dense`]).
    dense: Option<Tensor>,
    input: usize,
}

impl Projection {
    /// `x` (tokens × `input`) times the matrix's transpose.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(dense) = self
            .dense
            .as_ref()
            .filter(|_| x.dim(0).is_ok_and(|m| m > 1))
        {
            return x.matmul(&dense.t()?);
        }
        let padded = self.input.div_ceil(BLOCK) * BLOCK;
        if padded == self.input {
            return self.quantized.forward(x);
        }
        self.quantized
            .forward(&x.pad_with_zeros(D::Minus1, 0, padded - self.input)?)
    }
}

struct Layer {
    attn_norm: Tensor,
    qkv: Projection,
    out: Projection,
    ffn_norm: Tensor,
    gate_up: Projection,
    down: Projection,
}

/// The weights of a llama-architecture model, shared by every conversation.
pub struct Llama {
    embeddings: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    output: Projection,
    feed_forward: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f32,
    cos: Tensor,
    sin: Tensor,
}

/// RoPE's rotation angles: one row per position, one column per pair of dimensions.
fn rope_angles(head_dim: usize, context: usize, base: f32, device: &Device) -> Result<Tensor> {
    let inverse: Vec<f32> = (0..head_dim)
        .step_by(2)
        .map(|i| 1.0 / base.powf(i as f32 / head_dim as f32))
        .collect();
    let inverse = Tensor::new(inverse.as_slice(), device)?.unsqueeze(0)?;
    let positions = Tensor::arange(0, context as u32, device)?
        .to_dtype(DType::F32)?
        .unsqueeze(1)?;
    positions.matmul(&inverse)
}

impl Llama {
    /// Reads a llama GGUF file, re-quantizing every matrix to `dtype`; `prefill` says how
    /// prompts run.
    pub fn from_gguf<R: std::io::Read + std::io::Seek>(
        content: &gguf_file::Content,
        reader: &mut R,
        dtype: GgmlDType,
        prefill: Prefill,
    ) -> Result<Self> {
        let device = Device::Cpu;
        let meta = |key: &str| {
            content
                .metadata
                .get(key)
                .ok_or_else(|| candle_core::Error::Msg(format!("no {key} in the metadata")))
        };
        let count = |key: &str| -> Result<usize> { Ok(meta(key)?.to_u32()? as usize) };
        let heads = count("llama.attention.head_count")?;
        let kv_heads = count("llama.attention.head_count_kv")?;
        let blocks = count("llama.block_count")?;
        let hidden = count("llama.embedding_length")?;
        let feed_forward = count("llama.feed_forward_length")?;
        let context = count("llama.context_length").unwrap_or(4096);
        let eps = meta("llama.attention.layer_norm_rms_epsilon")?.to_f32()?;
        let rope_base = meta("llama.rope.freq_base")
            .and_then(|v| v.to_f32())
            .unwrap_or(10_000.0);
        let head_dim = hidden / heads;

        let mut dense = |name: &str| -> Result<Tensor> {
            content.tensor(reader, name, &device)?.dequantize(&device)
        };
        // Rows stacked, columns padded to the kernels' block, then quantized; kept in f32 too
        // where prompts run dense (the output head reads one token only).
        let projection = |parts: &[Tensor], dense: bool| -> Result<Projection> {
            let stacked = Tensor::cat(parts, 0)?;
            let input = stacked.dim(1)?;
            let padded = stacked.pad_with_zeros(1, 0, input.div_ceil(BLOCK) * BLOCK - input)?;
            Ok(Projection {
                quantized: QMatMul::from_qtensor(QTensor::quantize(&padded, dtype)?)?,
                dense: dense.then(|| stacked.to_dtype(DType::F32)).transpose()?,
                input,
            })
        };
        let prompts_dense = prefill == Prefill::Dense;
        let matrix = |parts: &[Tensor]| projection(parts, prompts_dense);

        let embeddings = dense("token_embd.weight")?;
        let output = match dense("output.weight") {
            Ok(output) => projection(&[output], false)?,
            // Tied embeddings: the output head is the embedding table.
            Err(_) => projection(std::slice::from_ref(&embeddings), false)?,
        };
        let norm = dense("output_norm.weight")?;
        let mut layers = Vec::with_capacity(blocks);
        for i in 0..blocks {
            let mut w = |part: &str| dense(&format!("blk.{i}.{part}.weight"));
            layers.push(Layer {
                attn_norm: w("attn_norm")?,
                qkv: matrix(&[w("attn_q")?, w("attn_k")?, w("attn_v")?])?,
                out: matrix(&[w("attn_output")?])?,
                ffn_norm: w("ffn_norm")?,
                gate_up: matrix(&[w("ffn_gate")?, w("ffn_up")?])?,
                down: matrix(&[w("ffn_down")?])?,
            });
        }

        let angles = rope_angles(head_dim, context, rope_base, &device)?;
        Ok(Self {
            embeddings,
            layers,
            norm,
            output,
            feed_forward,
            heads,
            kv_heads,
            head_dim,
            eps,
            cos: angles.cos()?,
            sin: angles.sin()?,
        })
    }

    /// Positions the model can attend over.
    pub fn context_length(&self) -> usize {
        self.cos.dim(0).unwrap_or(0)
    }

    /// Runs `tokens` after what `cache` holds, adds them to it, and returns the logits that
    /// follow the last one.
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<Vec<f32>> {
        let m = tokens.len();
        let start = cache.len;
        if m == 0 {
            candle_core::bail!("no tokens to run");
        }
        if start + m > self.context_length() {
            candle_core::bail!(
                "{} positions exceed the model's context of {}",
                start + m,
                self.context_length()
            );
        }
        let ids = Tensor::new(tokens, &Device::Cpu)?;
        let mut x = self.embeddings.index_select(&ids, 0)?;
        let mask = (m > 1).then(|| causal_mask(m, start)).transpose()?;
        let cos = self.cos.narrow(0, start, m)?;
        let sin = self.sin.narrow(0, start, m)?;
        let mut cached = std::mem::take(&mut cache.layers).into_iter();
        let mut updated = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, self.eps)?;
            let qkv = layer.qkv.forward(&h)?;
            let (q_width, kv_width) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
            let heads = |from: usize, width: usize, count: usize| -> Result<Tensor> {
                qkv.narrow(1, from, width)?
                    .reshape((m, count, self.head_dim))?
                    .transpose(0, 1)?
                    .contiguous()?
                    .unsqueeze(0)
            };
            let q = candle_nn::rotary_emb::rope_i(&heads(0, q_width, self.heads)?, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope_i(
                &heads(q_width, kv_width, self.kv_heads)?,
                &cos,
                &sin,
            )?;
            let v = heads(q_width + kv_width, kv_width, self.kv_heads)?;
            let (k, v) = match cached.next() {
                Some((k_past, v_past)) => (
                    Tensor::cat(&[&k_past, &k], 2)?,
                    Tensor::cat(&[&v_past, &v], 2)?,
                ),
                None => (k, v),
            };
            let attended = self.attend(&q, &k, &v, mask.as_ref(), m)?;
            updated.push((k, v));
            x = (x + layer.out.forward(&attended)?)?;

            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, self.eps)?;
            let gate_up = layer.gate_up.forward(&h)?;
            let gate = gate_up.narrow(1, 0, self.feed_forward)?;
            let up = gate_up.narrow(1, self.feed_forward, self.feed_forward)?;
            x = (x + layer.down.forward(&(candle_nn::ops::silu(&gate)? * up)?)?)?;
        }
        cache.layers = updated;
        cache.len = start + m;
        let last = x.narrow(0, m - 1, 1)?;
        let last = candle_nn::ops::rms_norm(&last, &self.norm, self.eps)?;
        self.output.forward(&last)?.squeeze(0)?.to_vec1()
    }

    /// Grouped-query attention without copying the shared keys: the query heads that share a
    /// key head are stacked as extra rows of it.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        m: usize,
    ) -> Result<Tensor> {
        let group = self.heads / self.kv_heads;
        let total = k.dim(2)?;
        let q = q.reshape((self.kv_heads, group * m, self.head_dim))?;
        let k = k.squeeze(0)?;
        let v = v.squeeze(0)?;
        let scores = (q.matmul(&k.t()?)? * (1.0 / (self.head_dim as f64).sqrt()))?;
        let scores = match mask {
            Some(mask) => scores
                .reshape((self.kv_heads, group, m, total))?
                .broadcast_add(mask)?
                .reshape((self.kv_heads, group * m, total))?,
            None => scores,
        };
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        weights
            .matmul(&v.contiguous()?)?
            .reshape((self.heads, m, self.head_dim))?
            .transpose(0, 1)?
            .reshape((m, self.heads * self.head_dim))
    }
}

/// Query `i` (at position `start + i`) may look at positions up to its own.
fn causal_mask(m: usize, start: usize) -> Result<Tensor> {
    let total = start + m;
    let mask: Vec<f32> = (0..m)
        .flat_map(|i| {
            (0..total).map(move |j| {
                if j <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (m, total), &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::model_path;

    /// A cache cut back to a shared prefix continues exactly as a fresh one would: what the
    /// local LLM relies on after an interrupted answer. Needs the model (scripts/setup.sh).
    #[test]
    fn a_truncated_cache_continues_like_a_fresh_one() {
        let path = model_path(super::super::NAME, super::super::FILE).expect("the local LLM");
        let mut file = std::fs::File::open(&path).expect("open");
        let content = gguf_file::Content::read(&mut file).expect("gguf");
        let model = Llama::from_gguf(
            &content,
            &mut file,
            GgmlDType::Q8_0,
            Prefill::for_this_cpu(),
        )
        .expect("model");
        let shared: &[u32] = &[1, 9690, 198, 2683, 359, 253, 1789, 30, 2, 198];
        let (old_tail, new_tail): (&[u32], &[u32]) = (&[42, 7, 19, 88], &[300, 301]);

        let mut cache = KvCache::default();
        model
            .forward(&mut cache, &[shared, old_tail].concat())
            .expect("first prompt");
        cache.truncate(shared.len()).expect("truncate");
        assert_eq!(cache.len(), shared.len());
        let reused = model.forward(&mut cache, new_tail).expect("continuation");

        let mut fresh = KvCache::default();
        model.forward(&mut fresh, shared).expect("shared part");
        let expected = model
            .forward(&mut fresh, new_tail)
            .expect("fresh continuation");
        assert_eq!(cache.len(), fresh.len());
        let worst = reused
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "the logits differ by {worst}");
        // Cutting to nothing starts over.
        cache.truncate(0).expect("truncate");
        assert!(cache.is_empty());
    }

    /// A prompt through the f32 copies is at least as close to the unquantized model as the
    /// same prompt through the Q8_0 weights, and picks the same next token; the next step then
    /// runs on the Q8_0 weights over that cache. Needs the model (scripts/setup.sh).
    #[test]
    fn a_dense_prefill_is_as_faithful_as_the_quantized_one() {
        let path = model_path(super::super::NAME, super::super::FILE).expect("the local LLM");
        let load = |dtype, prefill| {
            let mut file = std::fs::File::open(&path).expect("open");
            let content = gguf_file::Content::read(&mut file).expect("gguf");
            Llama::from_gguf(&content, &mut file, dtype, prefill).expect("model")
        };
        let exact = load(GgmlDType::F32, Prefill::Quantized);
        let dense = load(GgmlDType::Q8_0, Prefill::Dense);
        let quantized = load(GgmlDType::Q8_0, Prefill::Quantized);
        let prompt: &[u32] = &[
            1, 9690, 198, 2683, 359, 253, 1789, 30, 2, 198, 42, 7, 19, 88,
        ];
        let argmax = |l: &[f32]| {
            l.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
        };

        let mut caches = [KvCache::default(), KvCache::default(), KvCache::default()];
        let [e, d, q] = &mut caches;
        let truth = exact.forward(e, prompt).expect("exact");
        let from_dense = dense.forward(d, prompt).expect("dense");
        let from_quantized = quantized.forward(q, prompt).expect("quantized");
        let off = |logits: &[f32]| {
            logits
                .iter()
                .zip(&truth)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
        };
        assert!(
            off(&from_dense) <= off(&from_quantized),
            "dense {} vs quantized {}",
            off(&from_dense),
            off(&from_quantized)
        );
        assert_eq!(argmax(&from_dense), argmax(&truth));

        let truth = exact.forward(e, &[300]).expect("exact step");
        let step = dense.forward(d, &[300]).expect("dense step");
        assert_eq!(argmax(&step), argmax(&truth));
    }

    /// With unquantized weights this forward pass gives the logits candle's reference llama
    /// (candle-transformers 0.11, `quantized_llama`, over the same weights dequantized to f32)
    /// gave, recorded here, for a prompt, a continuation of it and single steps: the six
    /// likeliest tokens after each and some fixed ones. Needs the model (scripts/setup.sh).
    #[test]
    fn the_forward_pass_gives_the_logits_of_the_reference_llama() {
        type Logits = &'static [(usize, f32)];
        let path = model_path(super::super::NAME, super::super::FILE).expect("the local LLM");
        let mut file = std::fs::File::open(&path).expect("open");
        let content = gguf_file::Content::read(&mut file).expect("gguf");
        let ours = Llama::from_gguf(&content, &mut file, GgmlDType::F32, Prefill::Quantized)
            .expect("ours");
        let steps: [(&[u32], Logits); 4] = [
            (
                &[1, 9690, 198, 2683, 359, 253],
                &[
                    (7952, 13.95452),
                    (33011, 13.809664),
                    (5356, 13.361536),
                    (3269, 13.200691),
                    (12833, 13.012229),
                    (10632, 12.862796),
                    (0, 4.111085),
                    (1, -7.0483255),
                    (100, 1.3306522),
                    (10000, -0.43318653),
                    (40000, 1.0991359),
                ],
            ),
            (
                &[1789, 30, 2, 198],
                &[
                    (1, 22.542627),
                    (2, 18.332783),
                    (4, 14.295656),
                    (4093, 14.254534),
                    (37468, 13.813184),
                    (198, 13.496293),
                    (0, 3.278578),
                    (100, 9.883018),
                    (10000, 2.7586641),
                    (40000, 0.5683625),
                ],
            ),
            (
                &[42],
                &[
                    (198, 26.872185),
                    (2, 26.148355),
                    (216, 26.123259),
                    (52, 26.102049),
                    (25, 26.070251),
                    (49, 25.765005),
                    (0, 14.8058605),
                    (100, 24.672827),
                    (10000, 15.911888),
                    (40000, 8.776048),
                ],
            ),
            (
                &[7],
                &[
                    (520, 26.137321),
                    (198, 24.679647),
                    (4093, 23.572134),
                    (1, 22.351274),
                    (48, 20.212208),
                    (376, 19.584267),
                    (0, 15.87416),
                    (100, 15.636652),
                    (10000, 6.363258),
                    (40000, 5.4411755),
                ],
            ),
        ];
        let mut cache = KvCache::default();
        let mut position = 0;
        for (chunk, expected) in steps {
            let mine = ours.forward(&mut cache, chunk).expect("our step");
            position += chunk.len();
            assert_eq!(cache.len(), position);
            assert_eq!(mine.len(), 49152, "one logit per token of the vocabulary");
            assert!(mine.iter().all(|v| v.is_finite()), "non-finite logits");
            for &(token, logit) in expected {
                let off = (mine[token] - logit).abs();
                assert!(
                    off < 1e-3,
                    "after {position} tokens token {token}'s logit is {} (expected {logit})",
                    mine[token]
                );
            }
            let best = mine
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i);
            assert_eq!(best, Some(expected[0].0), "after {position} tokens");
        }
    }
}
