//! The processor trait: one stage of a pipeline.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::link::{FramePusher, Item};
use crate::events::Event;
use crate::frames::{Direction, ErrorFrame, Frame, SystemFrame};

/// An error a processor reports; it becomes an error frame that travels upstream to the session.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ProcessorError {
    /// What went wrong.
    pub message: String,
    /// A fatal error ends the session.
    pub fatal: bool,
}

impl ProcessorError {
    /// A non-fatal error.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            fatal: false,
        }
    }

    /// A fatal error.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            fatal: true,
        }
    }
}

/// Work a processor hands to the runtime: it runs off the processor's `process` call and pushes
/// frames through a [`FramePusher`].
pub type Job = Pin<Box<dyn Future<Output = Result<(), ProcessorError>> + Send + 'static>>;

/// One stage of a pipeline.
///
/// `process` is synchronous and should return quickly: it looks at one frame, updates its state,
/// and pushes frames through `cx`. Slow work (a network call, model inference, paced playback) is
/// handed to the runtime with [`FrameContext::run`]; the runtime keeps the stage's data queue
/// waiting until that job is done (so order is kept), while system frames keep flowing through
/// `process`. An interruption aborts an interruptible job; a cancel aborts every job.
///
/// A processor that does not care about a frame pushes it on unchanged. Start, end and cancel
/// frames are forwarded by the runtime if the processor does not push them itself.
pub trait FrameProcessor: Send + 'static {
    /// The stage's name in logs and observer events.
    fn name(&self) -> &str {
        let full = std::any::type_name::<Self>();
        let base = full.split('<').next().unwrap_or(full);
        base.rsplit("::").next().unwrap_or(base)
    }

    /// Handles one frame travelling in `direction`.
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError>;
}

/// What a processor can do while it handles a frame.
pub struct FrameContext<'a> {
    pub(crate) out: &'a mut Vec<Item>,
    pub(crate) job: &'a mut Option<Job>,
    pub(crate) tasks: &'a mut Vec<Job>,
    pub(crate) pusher: &'a FramePusher,
    /// True while handling a system frame, whose work must not hold up the data queue.
    pub(crate) system: bool,
}

impl<'a> FrameContext<'a> {
    /// Queues `frame` to go `direction` once `process` returns.
    pub fn push(&mut self, frame: Frame, direction: Direction) {
        self.out.push((frame, direction));
    }

    /// Queues `frame` downstream.
    pub fn push_downstream(&mut self, frame: impl Into<Frame>) {
        self.push(frame.into(), Direction::Downstream);
    }

    /// Queues `frame` upstream.
    pub fn push_upstream(&mut self, frame: impl Into<Frame>) {
        self.push(frame.into(), Direction::Upstream);
    }

    /// Queues a copy of `frame` each way (two frames, each with its own id), as for an
    /// interruption, which the stages on both sides must hear of.
    pub fn push_both_ways(&mut self, frame: impl Into<Frame>) {
        let frame = frame.into();
        self.push(Frame::new(frame.body.clone()), Direction::Upstream);
        self.push(frame, Direction::Downstream);
    }

    /// Reports a non-fatal error upstream.
    pub fn push_error(&mut self, message: impl Into<String>) {
        let mut error = ErrorFrame::new(message);
        error.processor = Some(self.pusher.name().to_owned());
        self.push_upstream(SystemFrame::Error(Box::new(error)));
    }

    /// Runs `job` as the rest of this frame's processing: the stage takes no further data or
    /// control frame until it finishes. Started from a system frame, it runs in the background
    /// instead, since system frames never wait.
    pub fn run(&mut self, job: impl Future<Output = Result<(), ProcessorError>> + Send + 'static) {
        let job: Job = Box::pin(job);
        if self.system || self.job.is_some() {
            self.tasks.push(job);
        } else {
            *self.job = Some(job);
        }
    }

    /// Runs `task` in the background for as long as the stage lives; a cancel aborts it.
    pub fn spawn(
        &mut self,
        task: impl Future<Output = Result<(), ProcessorError>> + Send + 'static,
    ) {
        self.tasks.push(Box::pin(task));
    }

    /// A pusher for jobs and tasks to stream frames with.
    pub fn pusher(&self) -> FramePusher {
        self.pusher.clone()
    }

    /// Publishes a session event.
    pub fn emit(&self, event: Event) {
        self.pusher.emit(event);
    }

    /// Time since the session started.
    pub fn elapsed(&self) -> Duration {
        self.pusher.elapsed()
    }

    /// This stage's name.
    pub fn name(&self) -> &str {
        self.pusher.name()
    }
}
