//! Speech to text: Whisper (tiny.en by default) with candle, read from a CTranslate2 model, and
//! the stage that transcribes the user's turns.

pub mod ct2;
mod decoder;
mod service;
pub mod whisper;

pub use service::{SttEngine, SttService};
pub use whisper::{SttError, Whisper, WindowPolicy};
