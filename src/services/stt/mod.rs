//! Speech to text: Whisper (tiny.en by default) with candle, read from a CTranslate2 model.

pub mod ct2;
pub mod whisper;

pub use whisper::{SttError, Whisper, WindowPolicy};
