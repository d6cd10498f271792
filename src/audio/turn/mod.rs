//! End-of-turn detection: the Smart Turn model.

pub mod smart_turn;

pub use smart_turn::{SmartTurn, SmartTurnStats, TurnPrediction};
