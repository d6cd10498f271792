//! Services: processors that talk to an engine (STT, LLM, TTS). Every kind has an embedded local
//! engine and network providers behind the same trait.

pub mod llm;
pub mod stt;
pub mod tts;
pub mod ws;
