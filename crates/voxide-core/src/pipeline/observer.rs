//! Observers see every push between stages, without taking part in the pipeline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::frames::Direction;
use crate::frames::Frame;

/// One push from one stage to its neighbour.
#[derive(Debug)]
pub struct FramePushed<'a> {
    /// The pushing stage.
    pub source: &'a str,
    /// The receiving stage.
    pub destination: &'a str,
    /// The frame.
    pub frame: &'a Frame,
    /// Which way it goes.
    pub direction: Direction,
    pub(crate) started: Instant,
}

impl FramePushed<'_> {
    /// Time since the session started. Read the clock only when you need it: most observers
    /// look at a few kinds of frame and let the rest pass.
    pub fn timestamp(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Sees every push of a session. Called inline on the pushing stage's task, so it must be quick:
/// hand anything slow to a channel.
pub trait Observer: Send + Sync + 'static {
    /// Called once per push.
    fn on_push(&self, event: &FramePushed<'_>);
}

pub(crate) type Observers = Arc<[Arc<dyn Observer>]>;
