//! The LLM service: runs an [`LlmEngine`] on the conversation context, streams its text, and runs
//! the tool calls it makes through a [`FunctionRegistry`] (sync and async calls, timeouts,
//! cancellation by interruption or by the model itself).

pub mod anthropic;
mod engine;
mod fallback;
mod functions;
pub mod gemini;
pub mod gemini_live;
pub mod http;
pub mod local;
pub mod openai;
pub mod openai_realtime;
pub mod realtime;
mod service;
pub mod sse;
mod summary;
mod tools;

pub use crate::pricing::{
    PRICES_AS_OF, Price, PriceTable, SpeechPrice, speech_price, stt_cost, tts_cost,
};
pub use engine::{LlmEngine, LlmError, LlmEvent, LlmRequest};
pub use fallback::{FallbackLlm, RETRY_PRIMARY_AFTER};
pub use functions::Registered;
pub use functions::{
    FunctionCallParams, FunctionHandler, FunctionOptions, FunctionRegistry, ResultCallback,
    ResultProperties,
};
pub use http::Timing;
pub use realtime::{RealtimeOptions, RealtimeService, ReconnectPolicy};
pub use service::{LlmService, LlmServiceOptions};
pub use summary::{ContextSummarizer, INSTRUCTION as SUMMARY_INSTRUCTION, write_summary};
pub use tools::cancel_tool_schema;
pub use voxide_core::context::IN_PROGRESS;
