//! voxide: a realtime voice-agent server.
//!
//! Audio comes in through a transport, flows as typed [`frames`] through the processors of a
//! [`pipeline`] (speech detection, transcription, an LLM with tools, speech synthesis) and goes
//! back out as speech. `ARCHITECTURE.md` describes the design and its vocabulary.

pub use voxide_bench as bench;
pub use voxide_bot as bot;
pub use voxide_bot::{config, flows, turns};
pub use voxide_core::{
    aggregators, context, events, frames, ids, pipeline, secret, text, warnings,
};
pub use voxide_engines::{bpe, models, onnx, stt};
pub use voxide_loadtest as loadtest;
pub use voxide_media::{audio, transports};
pub use voxide_services as services;

pub mod fuzz;
pub mod observe;
pub mod server;
