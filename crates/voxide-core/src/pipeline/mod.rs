//! The frame runtime: processors, pipelines and sessions.
//!
//! A [`FrameProcessor`] owns one stage. Each runs on its own task with two queues: system frames
//! overtake everything, data and control frames keep their order. A [`Pipeline`] is a line of
//! stages and is itself a stage, so pipelines nest; a [`ParallelPipeline`] feeds the same frames to
//! several branches and merges what comes out. A [`Session`] runs one pipeline for one
//! conversation: it sends the start frame, takes frames from the app, publishes events, watches
//! the idle timeout, and ends with an end frame (drain) or a cancel (at once).

mod link;
mod node;
mod observer;
mod parallel;
mod processor;
mod session;
mod stage;
pub mod testing;

pub use link::{AUDIO_BACKLOG, DATA_QUEUE_CAPACITY, FramePusher, PushError};
pub use node::panic_text;
pub use observer::{FramePushed, Observer};
pub use parallel::ParallelPipeline;
pub use processor::{FrameContext, FrameProcessor, Job, ProcessorError};
// Carried by the start frame; defined with the frames.
pub use crate::frames::{AppResources, Direction};
pub use session::{
    DEFAULT_CANCEL_GRACE, DEFAULT_IDLE_TIMEOUT, SOURCE, Session, SessionBuilder, SessionError,
    SessionHandle,
};
pub use stage::{Node, Pipeline, Stage};
