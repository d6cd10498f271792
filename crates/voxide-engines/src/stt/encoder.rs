//! Whisper's audio encoder: two convolutions over the log-mel spectrum (the second halves the
//! frame rate to 50 a second), fixed sinusoidal positions, then pre-norm self-attention blocks.
//! It reads any window up to 30 s; a shorter one costs less.

use candle_core::{Device, Module, Result, Tensor};
use candle_nn::{Conv1d, Conv1dConfig, LayerNorm, VarBuilder};

use super::layers::{Attention, Dims, FeedForward, attend, layer_norm, split_heads};

struct Block {
    attn: Attention,
    attn_ln: LayerNorm,
    feed_forward: FeedForward,
}

/// The encoder's weights. It keeps no state between calls, so sessions encode side by side.
pub(super) struct AudioEncoder {
    conv1: Conv1d,
    conv2: Conv1d,
    /// (audio positions, size).
    positions: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
    heads: usize,
}

impl AudioEncoder {
    /// Loads the encoder from `vb` (the names under `model.encoder`).
    pub(super) fn load(vb: VarBuilder, dims: &Dims) -> Result<Self> {
        let size = dims.size;
        let conv = |stride| Conv1dConfig {
            padding: 1,
            stride,
            ..Default::default()
        };
        let blocks = (0..dims.encoder_layers)
            .map(|i| {
                let vb = vb.pp(format!("layers.{i}"));
                Ok(Block {
                    attn: Attention::load(size, vb.pp("self_attn"))?,
                    attn_ln: layer_norm(size, vb.pp("self_attn_layer_norm"))?,
                    feed_forward: FeedForward::load(size, &vb)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            conv1: candle_nn::conv1d(dims.mels, size, 3, conv(1), vb.pp("conv1"))?,
            conv2: candle_nn::conv1d(size, size, 3, conv(2), vb.pp("conv2"))?,
            positions: sinusoids(dims.audio_positions, size, vb.device())?,
            blocks,
            ln: layer_norm(size, vb.pp("layer_norm"))?,
            heads: dims.encoder_heads,
        })
    }

    /// The audio features of `mel`, (1, mels, frames): (1, frames / 2, size).
    pub(super) fn forward(&self, mel: &Tensor) -> Result<Tensor> {
        let x = self.conv1.forward(mel)?.gelu()?;
        let x = self.conv2.forward(&x)?.gelu()?.transpose(1, 2)?;
        let frames = x.dim(1)?;
        let mut x = x.broadcast_add(&self.positions.narrow(0, 0, frames)?)?;
        for block in &self.blocks {
            let h = block.attn_ln.forward(&x)?;
            let q = split_heads(&block.attn.query.forward(&h)?, self.heads)?;
            let k = split_heads(&block.attn.key.forward(&h)?, self.heads)?;
            let v = split_heads(&block.attn.value.forward(&h)?, self.heads)?;
            x = (&x + block.attn.out.forward(&attend(&q, &k, &v, None)?)?)?;
            x = block.feed_forward.forward(&x)?;
        }
        self.ln.forward(&x)
    }
}

/// Whisper's positions: for position p and channel i < size / 2, sin(p·rᵢ) then cos(p·rᵢ),
/// with the rates rᵢ falling geometrically from 1 to 1/10,000.
fn sinusoids(positions: usize, size: usize, device: &Device) -> Result<Tensor> {
    let half = size / 2;
    let step = 10_000f32.ln() / (half - 1) as f32;
    let rates: Vec<f32> = (0..half).map(|i| (-step * i as f32).exp()).collect();
    let mut table = Vec::with_capacity(positions * size);
    for p in 0..positions {
        let p = p as f32;
        table.extend(rates.iter().map(|r| (p * r).sin()));
        table.extend(rates.iter().map(|r| (p * r).cos()));
    }
    Tensor::from_vec(table, (positions, size), device)
}
