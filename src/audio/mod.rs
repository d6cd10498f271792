//! Audio stages and helpers: WAV files, resampling, voice activity detection.

pub mod vad;
pub mod wav;
