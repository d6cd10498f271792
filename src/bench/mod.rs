//! Benchmarks users can run on their own hardware (`voxide bench ...`).

pub mod conversation;
pub mod engines;
pub mod interruptions;
pub mod pipeline;
pub mod providers;
pub mod sessions;
pub mod tools;
pub mod wer;
