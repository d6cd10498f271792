//! Voice activity detection: the Silero engine and the speech state machine on it (in
//! `voxide-engines`), and the pipeline stage.

mod stage;

pub use stage::VadStage;
pub use voxide_engines::vad::*;
