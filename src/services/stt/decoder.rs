//! Whisper's text decoder with a key/value cache for its self-attention.
//!
//! candle's decoder caches only the cross-attention, so each new token re-runs every token before
//! it: a transcript of n tokens costs n²/2 token passes. This one keeps each layer's keys and
//! values, so a step runs only the new token. It reads the same weights as candle's model.

use candle_core::{D, IndexOp, Module, Result, Tensor};
use candle_nn::{LayerNorm, Linear, VarBuilder};
use candle_transformers::models::whisper::Config;

/// One attention layer's projections.
struct Attention {
    query: Linear,
    key: Linear,
    value: Linear,
    out: Linear,
}

impl Attention {
    fn load(size: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            query: candle_nn::linear(size, size, vb.pp("q_proj"))?,
            key: candle_nn::linear_no_bias(size, size, vb.pp("k_proj"))?,
            value: candle_nn::linear(size, size, vb.pp("v_proj"))?,
            out: candle_nn::linear(size, size, vb.pp("out_proj"))?,
        })
    }
}

struct Block {
    attn: Attention,
    attn_ln: LayerNorm,
    cross: Attention,
    cross_ln: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    mlp_ln: LayerNorm,
}

fn layer_norm(size: usize, vb: VarBuilder) -> Result<LayerNorm> {
    Ok(LayerNorm::new(
        vb.get(size, "weight")?,
        vb.get(size, "bias")?,
        1e-5,
    ))
}

/// The decoder's weights; the per-transcript state is a [`DecoderState`].
pub(crate) struct CachedDecoder {
    token_embedding: Tensor,
    positions: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
    heads: usize,
}

/// One transcript's cache: per layer, the self-attention keys and values so far and the
/// cross-attention keys and values of the audio.
pub(crate) struct DecoderState {
    past: Vec<Option<(Tensor, Tensor)>>,
    audio: Vec<(Tensor, Tensor)>,
    /// Tokens decoded so far.
    len: usize,
}

impl CachedDecoder {
    /// Loads the decoder from `vb` (candle's names under `model.decoder`).
    pub(crate) fn load(vb: VarBuilder, config: &Config) -> Result<Self> {
        let size = config.d_model;
        let blocks = (0..config.decoder_layers)
            .map(|i| {
                let vb = vb.pp(format!("layers.{i}"));
                Ok(Block {
                    attn: Attention::load(size, vb.pp("self_attn"))?,
                    attn_ln: layer_norm(size, vb.pp("self_attn_layer_norm"))?,
                    cross: Attention::load(size, vb.pp("encoder_attn"))?,
                    cross_ln: layer_norm(size, vb.pp("encoder_attn_layer_norm"))?,
                    fc1: candle_nn::linear(size, size * 4, vb.pp("fc1"))?,
                    fc2: candle_nn::linear(size * 4, size, vb.pp("fc2"))?,
                    mlp_ln: layer_norm(size, vb.pp("final_layer_norm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            token_embedding: vb.get((config.vocab_size, size), "embed_tokens.weight")?,
            positions: vb.get(
                (config.max_target_positions, size),
                "embed_positions.weight",
            )?,
            blocks,
            ln: layer_norm(size, vb.pp("layer_norm"))?,
            heads: config.decoder_attention_heads,
        })
    }

    /// Tokens the model knows.
    pub(crate) fn vocab(&self) -> usize {
        self.token_embedding.dim(0).unwrap_or(0)
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
                let k = self.heads_of(&b.cross.key.forward(audio)?)?;
                let v = self.heads_of(&b.cross.value.forward(audio)?)?;
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
    pub(crate) fn step(&self, state: &mut DecoderState, tokens: &[u32]) -> Result<Tensor> {
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
            let q = self.heads_of(&block.attn.query.forward(&h)?)?;
            let k = self.heads_of(&block.attn.key.forward(&h)?)?;
            let v = self.heads_of(&block.attn.value.forward(&h)?)?;
            let (k, v) = match &state.past[i] {
                Some((pk, pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
                None => (k, v),
            };
            let attended = self.attend(&q, &k, &v, mask.as_ref())?;
            state.past[i] = Some((k, v));
            x = (x + block.attn.out.forward(&attended)?)?;

            let h = block.cross_ln.forward(&x)?;
            let q = self.heads_of(&block.cross.query.forward(&h)?)?;
            let (ak, av) = &state.audio[i];
            let attended = self.attend(&q, ak, av, None)?;
            x = (x + block.cross.out.forward(&attended)?)?;

            let h = block.mlp_ln.forward(&x)?;
            x = (&x + block.fc2.forward(&block.fc1.forward(&h)?.gelu()?)?)?;
        }
        state.len += n;
        let last = self.ln.forward(&x.i((.., n - 1..))?)?;
        last.i((0, 0))?
            .unsqueeze(0)?
            .matmul(&self.token_embedding.t()?)?
            .squeeze(0)
    }

    /// (1, n, size) → (1, heads, n, size / heads).
    fn heads_of(&self, x: &Tensor) -> Result<Tensor> {
        let (b, n, size) = x.dims3()?;
        x.reshape((b, n, self.heads, size / self.heads))?
            .transpose(1, 2)?
            .contiguous()
    }

    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let head = q.dim(D::Minus1)?;
        let scale = 1.0 / (head as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?)? * scale)?;
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask)?;
        }
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        let (b, heads, n, head) = q.dims4()?;
        weights
            .matmul(v)?
            .transpose(1, 2)?
            .reshape((b, n, heads * head))
    }
}

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
