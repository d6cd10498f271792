//! Whisper (tiny.en by default, with candle, read from a CTranslate2 model): a segment decoder
//! with a cached, vectorised decoder step.

pub mod ct2;
mod decoder;
mod encoder;
mod layers;
pub mod whisper;

pub use whisper::{PromptedWhisper, Reader, Reading, SttError, Whisper, WindowPolicy};
