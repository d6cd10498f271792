//! Audio stages and helpers: WAV files, resampling, voice activity detection, echo
//! cancellation and the echo guard.

pub mod aec;
pub mod echo;
pub mod mel;
pub mod mulaw;
pub mod resample;
pub mod turn;
pub mod vad;
pub mod wav;
