//! voxide's core: what every bot is made of, and nothing it talks to.
//!
//! Typed [`frames`] flow through the processors of a [`pipeline`]; the conversation lives in a
//! [`context`] (messages, pipecat's async-tool messages, the adapters that write it for each
//! provider) which the [`aggregators`] keep; [`events`] and [`warnings`] report what happened.
//! No model, network, audio device or server is in this crate's tree: the engines, the
//! providers and the transports build on it.

pub mod aggregators;
pub mod calculator;
pub mod context;
pub mod events;
pub mod frames;
pub mod ids;
pub mod pipeline;
pub mod secret;
pub mod text;
pub mod warnings;
