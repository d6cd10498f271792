//! Voice activity detection: the Silero model and the speech state machine built on it.

pub mod analyzer;
pub mod silero;

pub use analyzer::{VadAnalyzer, VadError, VadEvent, VadParams, VadState};
pub use silero::{SileroState, SileroVad};
