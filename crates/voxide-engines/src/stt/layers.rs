//! What Whisper's encoder and decoder share: the model's sizes, multi-head attention and layer
//! norms, under the tensor names [`whisper`](super::whisper) gives them when it loads a file.

use candle_core::{D, Module, Result, Tensor};
use candle_nn::{LayerNorm, Linear, VarBuilder};

/// A Whisper model's sizes, read from its file.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    /// Mel bands the encoder reads.
    pub mels: usize,
    /// Width of every hidden state.
    pub size: usize,
    /// Encoder positions: 1,500, the 30 s window after the second convolution halves it.
    pub audio_positions: usize,
    pub encoder_heads: usize,
    pub encoder_layers: usize,
    /// Tokens the model knows.
    pub vocab: usize,
    /// The most tokens a transcript can have.
    pub text_positions: usize,
    pub decoder_heads: usize,
    pub decoder_layers: usize,
}

/// One attention layer's projections. Whisper's keys have no bias.
pub(super) struct Attention {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub out: Linear,
}

impl Attention {
    pub(super) fn load(size: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            query: candle_nn::linear(size, size, vb.pp("q_proj"))?,
            key: candle_nn::linear_no_bias(size, size, vb.pp("k_proj"))?,
            value: candle_nn::linear(size, size, vb.pp("v_proj"))?,
            out: candle_nn::linear(size, size, vb.pp("out_proj"))?,
        })
    }
}

/// A layer's feed-forward half: norm, widen four times, GELU, narrow, added to its input.
pub(super) struct FeedForward {
    ln: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl FeedForward {
    pub(super) fn load(size: usize, vb: &VarBuilder) -> Result<Self> {
        Ok(Self {
            ln: layer_norm(size, vb.pp("final_layer_norm"))?,
            fc1: candle_nn::linear(size, size * 4, vb.pp("fc1"))?,
            fc2: candle_nn::linear(size * 4, size, vb.pp("fc2"))?,
        })
    }

    /// `x` with the feed-forward's output added.
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.ln.forward(x)?;
        x + self.fc2.forward(&self.fc1.forward(&h)?.gelu()?)?
    }
}

pub(super) fn layer_norm(size: usize, vb: VarBuilder) -> Result<LayerNorm> {
    Ok(LayerNorm::new(
        vb.get(size, "weight")?,
        vb.get(size, "bias")?,
        1e-5,
    ))
}

/// (b, n, size) → (b, heads, n, size / heads).
pub(super) fn split_heads(x: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, n, size) = x.dims3()?;
    x.reshape((b, n, heads, size / heads))?
        .transpose(1, 2)?
        .contiguous()
}

/// Scaled dot-product attention of `q` over `k` and `v`, (b, heads, n, head) each, with an
/// additive `mask`; the heads joined again, (b, n, heads × head).
pub(super) fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
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
