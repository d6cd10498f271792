//! Audio stages and helpers: WAV files, resampling, voice activity detection, the echo guard.

pub mod echo;
pub mod mel;
pub mod mulaw;
pub mod resample;
pub mod turn;
pub mod vad;
pub mod wav;
