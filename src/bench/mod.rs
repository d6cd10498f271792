//! Benchmarks users can run on their own hardware (`voxide bench ...`).

pub mod pipeline;
