//! voxide's embedded engines: every model that runs inside the process, offline.
//!
//! - [`vad`]: Silero VAD, run by voxide's own kernel and batched across sessions;
//! - [`speaker`]: the GE2E speaker encoder, which tells the user's voice from a café's talk;
//! - [`turn`]: Smart Turn, the end-of-turn model, on voxide's own int8 engine;
//! - [`stt`]: Whisper (candle, or CTranslate2 weights) with its decoder;
//! - [`tts`]: Piper (VITS on ONNX Runtime) and espeak-ng (through libespeak-ng);
//! - [`llm`]: SmolLM2 from its GGUF file, and the grammar that makes its tool calls;
//! - what they share: the model files ([`models`]), the ONNX runtime ([`onnx`]), byte-level BPE
//!   ([`bpe`]) and audio helpers ([`audio`]).
//!
//! Every `unsafe` block and every SIMD kernel of voxide lives in this crate, each with its
//! reason; the processors that put these engines in a pipeline live in `voxide`.

pub mod audio;
pub mod bpe;
mod kernel;
pub mod llm;
pub mod models;
pub mod onnx;
pub mod speaker;
pub mod stt;
pub mod tts;
pub mod turn;
pub mod vad;
