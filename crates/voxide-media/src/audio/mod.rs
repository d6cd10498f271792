//! Audio stages and helpers: WAV files, resampling, voice activity detection, echo
//! cancellation and the echo guard.

/// Chunks an audio queue between two tasks holds at most (about 5 s of 20 ms chunks). A consumer
/// that falls that far behind loses the newest chunks, counted by
/// [`crate::warnings::audio_dropped`], rather than let the queue grow without end.
pub const AUDIO_QUEUE: usize = 256;

pub mod aec;
pub mod alaw;
pub mod beep;
pub mod denoise;
pub mod echo;
pub mod g722;
pub mod mulaw;
mod sink;
pub mod turn;
pub mod vad;

pub use sink::AudioSink;
pub use voxide_engines::audio::{mel, onnx_file, resample, wav};
pub use voxide_services::{pcm_from_base64, pcm_to_base64};
