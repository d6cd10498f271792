//! Benchmarks users can run on their own hardware (`voxide bench ...`), and the providers'
//! stand-ins they and the tests run against (`providers::stand_ins`).

use voxide_bot as bot;
use voxide_bot::turns;
use voxide_core::{aggregators, context, frames};
use voxide_engines::models;
use voxide_loadtest as loadtest;
use voxide_media::audio;
use voxide_services as services;

pub mod conversation;
pub mod engines;
pub mod interruptions;
pub mod pipeline;
pub mod providers;
pub mod sessions;
pub mod tools;
pub mod turn_ends;
pub mod wer;
