//! Speech to text: the streaming engine interface, Whisper (tiny.en by default, with candle, read
//! from a CTranslate2 model) behind it as a segment decoder, and the stage that transcribes the
//! user's turns.

pub mod assemblyai;
pub mod deepgram;
mod fallback;
mod kept;
pub mod openai;
mod preroll;
mod segmented;
mod service;
pub mod socket;
mod stream;

pub use fallback::SttFallback;
pub use segmented::{Segmented, Transcriber};
pub use service::SttService;
pub use stream::{EVENT_QUEUE, INPUT_QUEUE, SttEngine, SttEvent, SttInput, SttStream};
pub use voxide_engines::stt::{
    PromptedWhisper, Reader, Reading, SttError, Whisper, WindowPolicy, ct2, whisper,
};
