//! Whisper's text decoder with a key/value cache for its self-attention.
//!
//! A decoder without a cache re-runs every token before the new one: a transcript of n tokens
//! costs n²/2 token passes. This one keeps each layer's keys and values, so a step runs only the
//! new token.
//!
//! The last step of every token, scoring the whole vocabulary against the token embedding, is
//! most of a step's time: tiny.en's 51,864 × 384 embedding is 80 MB in f32, read once per
//! token. The [`Projection`] keeps it in float16 (40 MB), the precision the model file stores,
//! and converts eight weights at a time as it reads them.

use candle_core::{D, IndexOp, Module, Result, Tensor};
use candle_nn::{LayerNorm, VarBuilder};
use half::f16;

use super::layers::{Attention, Dims, FeedForward, attend, layer_norm, split_heads};

struct Block {
    attn: Attention,
    attn_ln: LayerNorm,
    cross: Attention,
    cross_ln: LayerNorm,
    feed_forward: FeedForward,
}

/// The decoder's weights; the per-transcript state is a [`DecoderState`].
pub(crate) struct CachedDecoder {
    token_embedding: Tensor,
    projection: Projection,
    positions: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
    heads: usize,
}

/// The cache of one transcript or of several of the same length (a beam search's hypotheses,
/// one row each): per layer, the self-attention keys and values so far, (rows, heads, tokens,
/// head size), and the cross-attention keys and values of the audio, shared by every row.
#[derive(Clone)]
pub(crate) struct DecoderState {
    past: Vec<Option<(Tensor, Tensor)>>,
    audio: Vec<(Tensor, Tensor)>,
    /// Tokens decoded so far.
    len: usize,
}

impl CachedDecoder {
    /// Loads the decoder from `vb` (the names under `model.decoder`).
    pub(crate) fn load(vb: VarBuilder, dims: &Dims) -> Result<Self> {
        let size = dims.size;
        let blocks = (0..dims.decoder_layers)
            .map(|i| {
                let vb = vb.pp(format!("layers.{i}"));
                Ok(Block {
                    attn: Attention::load(size, vb.pp("self_attn"))?,
                    attn_ln: layer_norm(size, vb.pp("self_attn_layer_norm"))?,
                    cross: Attention::load(size, vb.pp("encoder_attn"))?,
                    cross_ln: layer_norm(size, vb.pp("encoder_attn_layer_norm"))?,
                    feed_forward: FeedForward::load(size, &vb)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let token_embedding = vb.get((dims.vocab, size), "embed_tokens.weight")?;
        Ok(Self {
            projection: Projection::new(&token_embedding)?,
            token_embedding,
            positions: vb.get((dims.text_positions, size), "embed_positions.weight")?,
            blocks,
            ln: layer_norm(size, vb.pp("layer_norm"))?,
            heads: dims.decoder_heads,
        })
    }

    /// Tokens the model knows.
    pub(crate) fn vocab(&self) -> usize {
        self.projection.tokens
    }

    /// The most tokens a transcript can have.
    pub(crate) fn max_tokens(&self) -> usize {
        self.positions.dim(0).unwrap_or(0)
    }

    /// A fresh state for the encoder's output `audio` (1, frames, size).
    pub(crate) fn start(&self, audio: &Tensor) -> Result<DecoderState> {
        let audio = self
            .blocks
            .iter()
            .map(|b| {
                let k = self.split(&b.cross.key.forward(audio)?)?;
                let v = self.split(&b.cross.value.forward(audio)?)?;
                Ok((k, v))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DecoderState {
            past: vec![None; self.blocks.len()],
            audio,
            len: 0,
        })
    }

    /// Runs `tokens` (the next ones after those already in `state`) and returns the logits for
    /// the token after the last of them.
    pub(crate) fn step(&self, state: &mut DecoderState, tokens: &[u32]) -> Result<Vec<f32>> {
        let n = tokens.len();
        let ids = Tensor::new(tokens, self.token_embedding.device())?;
        let mut x = self
            .token_embedding
            .index_select(&ids, 0)?
            .broadcast_add(&self.positions.narrow(0, state.len, n)?)?
            .unsqueeze(0)?;
        // New tokens see every earlier token and, among themselves, only those before them.
        let mask = (n > 1)
            .then(|| causal_mask(n, state.len + n, x.device()))
            .transpose()?;
        for (i, block) in self.blocks.iter().enumerate() {
            let h = block.attn_ln.forward(&x)?;
            let q = self.split(&block.attn.query.forward(&h)?)?;
            let k = self.split(&block.attn.key.forward(&h)?)?;
            let v = self.split(&block.attn.value.forward(&h)?)?;
            let (k, v) = match &state.past[i] {
                Some((pk, pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
                None => (k, v),
            };
            let attended = attend(&q, &k, &v, mask.as_ref())?;
            state.past[i] = Some((k, v));
            x = (x + block.attn.out.forward(&attended)?)?;

            let h = block.cross_ln.forward(&x)?;
            let q = self.split(&block.cross.query.forward(&h)?)?;
            let (ak, av) = &state.audio[i];
            let attended = attend(&q, ak, av, None)?;
            x = (x + block.cross.out.forward(&attended)?)?;

            x = block.feed_forward.forward(&x)?;
        }
        state.len += n;
        let last = self
            .ln
            .forward(&x.i((.., n - 1..))?)?
            .i((0, 0))?
            .to_vec1()?;
        Ok(self.projection.logits(&last))
    }

    /// The rows of `state` that `rows` names, in that order (a row may come more than once): the
    /// caches of a beam search's next hypotheses, from their parents'.
    pub(crate) fn select(&self, state: &DecoderState, rows: &[u32]) -> Result<DecoderState> {
        let ids = Tensor::new(rows, self.token_embedding.device())?;
        let past = state
            .past
            .iter()
            .map(|kv| {
                kv.as_ref()
                    .map(|(k, v)| Ok((k.index_select(&ids, 0)?, v.index_select(&ids, 0)?)))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DecoderState {
            past,
            audio: state.audio.clone(),
            len: state.len,
        })
    }

    /// Runs one next token per row of `state` and returns each row's logits for the token after
    /// it: every hypothesis of a beam search in one pass, which reads the weights once.
    pub(crate) fn step_rows(
        &self,
        state: &mut DecoderState,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        let rows = tokens.len();
        let ids = Tensor::new(tokens, self.token_embedding.device())?;
        let mut x = self
            .token_embedding
            .index_select(&ids, 0)?
            .broadcast_add(&self.positions.narrow(0, state.len, 1)?)?
            .unsqueeze(1)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let h = block.attn_ln.forward(&x)?;
            let q = self.split(&block.attn.query.forward(&h)?)?;
            let k = self.split(&block.attn.key.forward(&h)?)?;
            let v = self.split(&block.attn.value.forward(&h)?)?;
            let (k, v) = match &state.past[i] {
                Some((pk, pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
                None => (k, v),
            };
            let attended = attend(&q, &k, &v, None)?;
            state.past[i] = Some((k, v));
            x = (x + block.attn.out.forward(&attended)?)?;

            // The audio is the same for every row: the rows' queries go in as one sequence of
            // `rows` positions, (1, heads, rows, head), rather than copying the audio per row.
            let h = block.cross_ln.forward(&x)?;
            let q = self
                .split(&block.cross.query.forward(&h)?)?
                .transpose(0, 2)?
                .contiguous()?;
            let (ak, av) = &state.audio[i];
            let attended = attend(&q, ak, av, None)?.reshape((rows, 1, x.dim(D::Minus1)?))?;
            x = (x + block.cross.out.forward(&attended)?)?;

            x = block.feed_forward.forward(&x)?;
        }
        state.len += 1;
        let last = self.ln.forward(&x)?.squeeze(1)?.to_vec2()?;
        Ok(self.projection.logits_rows(&last))
    }

    /// (rows, n, size) → (rows, heads, n, size / heads).
    fn split(&self, x: &Tensor) -> Result<Tensor> {
        split_heads(x, self.heads)
    }
}

/// The token embedding as the output projection reads it, in float16: the precision the
/// model file stores, half the bytes to read per token.
struct Projection {
    rows: Vec<f16>,
    tokens: usize,
    size: usize,
}

impl Projection {
    fn new(embedding: &Tensor) -> Result<Self> {
        let (tokens, size) = embedding.dims2()?;
        let rows = embedding
            .flatten_all()?
            .to_vec1::<f32>()?
            .into_iter()
            .map(f16::from_f32)
            .collect();
        Ok(Self { rows, tokens, size })
    }

    /// Every token's logit for the hidden state `x`.
    fn logits(&self, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; self.tokens];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && self.size.is_multiple_of(8)
        {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2, FMA and F16C, checked just above.
            unsafe {
                self.logits_avx2(x, &mut out)
            };
            return out;
        }
        self.logits_plain(x, &mut out);
        out
    }

    /// Every token's logit for each of the hidden states `xs`, each weight read once for all of
    /// them (a beam search's hypotheses).
    fn logits_rows(&self, xs: &[Vec<f32>]) -> Vec<Vec<f32>> {
        let mut out = vec![vec![0f32; self.tokens]; xs.len()];
        for (xs, out) in xs.chunks(ROWS_AT_ONCE).zip(out.chunks_mut(ROWS_AT_ONCE)) {
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
                && self.size.is_multiple_of(8)
            {
                #[allow(unsafe_code)]
                // SAFETY: the CPU has AVX2, FMA and F16C, checked just above.
                unsafe {
                    self.logits_rows_avx2(xs, out)
                };
                continue;
            }
            for (x, out) in xs.iter().zip(out.iter_mut()) {
                self.logits_plain(x, out);
            }
        }
        out
    }

    fn logits_plain(&self, x: &[f32], out: &mut [f32]) {
        for (row, logit) in self.rows.chunks_exact(self.size).zip(out.iter_mut()) {
            *logit = row.iter().zip(x).map(|(w, x)| w.to_f32() * x).sum();
        }
    }

    /// Eight weights at a time: converted from float16 in one instruction and multiplied into
    /// one register of sums.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(unsafe_code)]
    fn logits_avx2(&self, x: &[f32], out: &mut [f32]) {
        use std::arch::x86_64::{
            __m128i, _mm_add_ps, _mm_cvtss_f32, _mm_hadd_ps, _mm_loadu_si128,
            _mm256_castps256_ps128, _mm256_cvtph_ps, _mm256_extractf128_ps, _mm256_fmadd_ps,
            _mm256_loadu_ps, _mm256_setzero_ps,
        };
        for (row, logit) in self.rows.chunks_exact(self.size).zip(out.iter_mut()) {
            let mut sums = _mm256_setzero_ps();
            for (w, x) in row.chunks_exact(8).zip(x.chunks_exact(8)) {
                // SAFETY: `w` holds eight float16 (16 bytes) and `x` eight f32 (32 bytes); both
                // loads are unaligned ones.
                let (w, x) = unsafe {
                    (
                        _mm_loadu_si128(w.as_ptr().cast::<__m128i>()),
                        _mm256_loadu_ps(x.as_ptr()),
                    )
                };
                sums = _mm256_fmadd_ps(_mm256_cvtph_ps(w), x, sums);
            }
            let half = _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1));
            let pair = _mm_hadd_ps(half, half);
            *logit = _mm_cvtss_f32(_mm_hadd_ps(pair, pair));
        }
    }

    /// [`Projection::logits_avx2`] for up to [`ROWS_AT_ONCE`] states: each eight weights are
    /// converted once and multiplied into every state's sums.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(unsafe_code)]
    fn logits_rows_avx2(&self, xs: &[Vec<f32>], out: &mut [Vec<f32>]) {
        use std::arch::x86_64::{
            __m128i, __m256, _mm_add_ps, _mm_cvtss_f32, _mm_hadd_ps, _mm_loadu_si128,
            _mm256_castps256_ps128, _mm256_cvtph_ps, _mm256_extractf128_ps, _mm256_fmadd_ps,
            _mm256_loadu_ps, _mm256_setzero_ps,
        };
        let rows = xs.len().min(ROWS_AT_ONCE);
        for (token, row) in self.rows.chunks_exact(self.size).enumerate() {
            let mut sums: [__m256; ROWS_AT_ONCE] = [_mm256_setzero_ps(); ROWS_AT_ONCE];
            for (at, w) in row.chunks_exact(8).enumerate() {
                // SAFETY: `w` holds eight float16 (16 bytes); an unaligned load.
                let w = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(w.as_ptr().cast::<__m128i>()) });
                for (sum, x) in sums.iter_mut().zip(xs).take(rows) {
                    let x = &x[at * 8..at * 8 + 8];
                    // SAFETY: `x` holds eight f32 (32 bytes); an unaligned load.
                    *sum = _mm256_fmadd_ps(w, unsafe { _mm256_loadu_ps(x.as_ptr()) }, *sum);
                }
            }
            for (sum, out) in sums.iter().zip(out.iter_mut()).take(rows) {
                let half = _mm_add_ps(_mm256_castps256_ps128(*sum), _mm256_extractf128_ps(*sum, 1));
                let pair = _mm_hadd_ps(half, half);
                out[token] = _mm_cvtss_f32(_mm_hadd_ps(pair, pair));
            }
        }
    }
}

/// States [`Projection::logits_rows`] scores in one read of the weights.
const ROWS_AT_ONCE: usize = 8;

/// (new, total): new token i may see positions up to total - new + i.
fn causal_mask(new: usize, total: usize, device: &candle_core::Device) -> Result<Tensor> {
    let earlier = total - new;
    let mask: Vec<f32> = (0..new)
        .flat_map(|i| {
            (0..total).map(move |j| {
                if j > earlier + i {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (new, total), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_projection_scores_each_token_as_its_embedding_dotted_with_the_state() {
        let (tokens, size) = (37, 24);
        let weights: Vec<f32> = (0..tokens * size)
            .map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0)
            .collect();
        let embedding =
            Tensor::from_vec(weights.clone(), (tokens, size), &Device::Cpu).expect("embedding");
        let projection = Projection::new(&embedding).expect("projection");
        let x: Vec<f32> = (0..size).map(|i| (i as f32 - 12.0) / 5.0).collect();
        let mut plain = vec![0f32; tokens];
        projection.logits_plain(&x, &mut plain);
        for (token, (fast, plain)) in projection.logits(&x).iter().zip(&plain).enumerate() {
            let row = &weights[token * size..][..size];
            let exact: f32 = row
                .iter()
                .zip(&x)
                .map(|(w, x)| f16::from_f32(*w).to_f32() * x)
                .sum();
            assert!(
                (fast - exact).abs() < 1e-3,
                "token {token}: {fast} vs {exact}"
            );
            assert!(
                (plain - exact).abs() < 1e-3,
                "token {token}: {plain} vs {exact}"
            );
        }
        // Several states at once, more than one read of the weights takes: each its own logits.
        let xs: Vec<Vec<f32>> = (0..ROWS_AT_ONCE + 3)
            .map(|r| {
                (0..size)
                    .map(|i| ((i * 31 + r * 17) % 13) as f32 / 6.0 - 1.0)
                    .collect()
            })
            .collect();
        for (x, rows) in xs.iter().zip(projection.logits_rows(&xs)) {
            for (one, row) in projection.logits(x).iter().zip(&rows) {
                assert!((one - row).abs() < 1e-4, "{one} vs {row}");
            }
        }
    }
}
