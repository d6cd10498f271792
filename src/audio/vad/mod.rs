//! Voice activity detection: the Silero model and the speech state machine built on it.

pub mod silero;

pub use silero::{SileroState, SileroVad};
