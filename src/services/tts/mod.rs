//! Text to speech: the streaming voice interface, the embedded voices behind it as sentence
//! synthesizers (Piper: VITS through ONNX Runtime with espeak-ng phonemes; espeak-ng itself), and
//! the service that turns streamed LLM text into audio.

pub mod cartesia;
pub mod deepgram;
pub mod espeak;
mod fallback;
pub mod openai;
pub mod piper;
mod sentences;
mod service;
mod socket;
mod stream;

pub use espeak::EspeakVoice;
pub use fallback::TtsFallback;
pub use piper::PiperVoice;
pub use sentences::{Sentences, Synthesizer};
pub use service::TtsService;
pub use stream::{EVENT_QUEUE, INPUT_QUEUE, TextUnit, TtsContext, TtsEngine, TtsEvent, TtsInput};

/// Synthesised speech for one piece of text.
#[derive(Debug, Clone, PartialEq)]
pub struct Speech {
    /// Mono 16-bit samples.
    pub samples: Vec<i16>,
    /// Their rate.
    pub sample_rate: u32,
    /// When each word is spoken, from the start of `samples`.
    pub words: Vec<WordTiming>,
}

pub use crate::frames::WordTiming;

/// Why synthesis failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TtsError {
    /// The engine failed.
    #[error("speech synthesis failed: {0}")]
    Engine(String),
}
