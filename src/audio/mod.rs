//! Audio stages and helpers: WAV files, resampling, voice activity detection, echo
//! cancellation and the echo guard.

/// Chunks an audio queue between two tasks holds at most (about 5 s of 20 ms chunks). A consumer
/// that falls that far behind loses the newest chunks, counted by
/// [`crate::warnings::audio_dropped`], rather than let the queue grow without end.
pub const AUDIO_QUEUE: usize = 256;

pub mod aec;
pub mod alaw;
pub mod denoise;
pub mod echo;
pub mod mulaw;
mod sink;
pub mod turn;
pub mod vad;

pub use sink::AudioSink;
pub use voxide_engines::audio::{mel, onnx_file, resample, wav};

/// Base64 16-bit little-endian PCM back to samples (a trailing odd byte is dropped).
pub fn pcm_from_base64(data: &str) -> Result<Vec<i16>, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("audio is not base64: {e}"))?;
    Ok(bytes
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect())
}

/// 16-bit little-endian PCM as base64, as both providers carry audio in JSON.
pub fn pcm_to_base64(samples: &[i16]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
