//! Voice activity detection: the Silero model (run by voxide itself, batched across sessions on
//! one thread) and the speech state machine built on it.

pub mod analyzer;
pub mod batcher;
mod engine;
pub mod silero;

pub use analyzer::{
    QuickChange, RoomFloor, SPEAKING_TICK_SECS, VadAnalyzer, VadError, VadEvent, VadParams,
    VadState,
};
pub use batcher::VadBatcher;
pub use silero::{SileroState, SileroVad};
