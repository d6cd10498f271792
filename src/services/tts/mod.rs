//! Text to speech: the engine trait, the Piper voice (VITS through ONNX Runtime with espeak-ng
//! phonemes), and the service that turns streamed LLM text into audio sentence by sentence.

pub mod espeak;
pub mod piper;
mod service;

pub use espeak::EspeakVoice;
pub use piper::PiperVoice;
pub use service::TtsService;

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

/// Something that turns text into speech. Blocking: the service calls it off the async runtime.
pub trait TtsEngine: Send + Sync + 'static {
    /// The engine's name, for metrics.
    fn name(&self) -> &str;

    /// The rate of the audio it makes.
    fn sample_rate(&self) -> u32;

    /// Speech for `text` (a sentence or so).
    fn synthesize(&self, text: &str) -> Result<Speech, TtsError>;
}
