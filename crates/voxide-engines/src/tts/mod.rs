//! The embedded voices as sentence synthesizers: Piper (VITS through ONNX Runtime with espeak-ng
//! phonemes) and espeak-ng itself.

pub mod espeak;
pub mod piper;

pub use espeak::EspeakVoice;
pub use piper::PiperVoice;
pub use voxide_core::frames::WordTiming;

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

/// Why synthesis failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TtsError {
    /// The engine failed.
    #[error("speech synthesis failed: {0}")]
    Engine(String),
}

/// Something that turns a sentence or so into speech. Blocking: the context calls it off the
/// async workers.
pub trait Synthesizer: Send + Sync + 'static {
    /// The voice's name, for metrics.
    fn name(&self) -> &str;

    /// The rate of the audio it makes.
    fn sample_rate(&self) -> u32;

    /// Speech for `text` (a sentence or so).
    fn synthesize(&self, text: &str) -> Result<Speech, TtsError>;
}
