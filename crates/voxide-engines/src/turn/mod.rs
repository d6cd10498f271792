//! End-of-turn detection: the Smart Turn model.

pub mod engine;
pub mod smart_turn;

pub use smart_turn::{SmartTurn, SmartTurnEngine, SmartTurnStats, TurnPrediction};
