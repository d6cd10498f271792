//! Frames: the typed units that flow through a session.
//!
//! Every frame has an id, an optional presentation timestamp and a body. The body is one of three
//! kinds, which decide how the frame travels (see `ARCHITECTURE.md`):
//! - [`SystemFrame`]s jump every queue and are never dropped;
//! - [`ControlFrame`]s keep their order with data;
//! - [`DataFrame`]s are the payload.
//!
//! An interruption discards queued control and data frames except the uninterruptible ones
//! ([`Frame::is_uninterruptible`]).

mod audio;
mod frame;
mod metrics;
mod resources;

pub use audio::AudioFrame;
pub use frame::{
    CancelReason, ControlFrame, DataFrame, EndFrame, ErrorFrame, Frame, FrameBody, FrameCategory,
    FrameId, FunctionCallCancel, FunctionCallInProgress, FunctionCallRequest, FunctionCallResult,
    FunctionCallResultProperties, LlmResponseSummary, OnContextUpdated, PhoneAction, ResultKind,
    StartFrame, StartParams, SystemFrame, Transcription, TtsText, WordTiming,
};
pub use metrics::{MetricsData, WastedGuess};
pub use resources::AppResources;
// Carried by usage metrics; it belongs to the context, where each call's cost is kept.
pub use crate::context::TokenUsage;

/// Which way a frame travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Towards the output transport.
    Downstream,
    /// Back towards the input transport.
    Upstream,
}
