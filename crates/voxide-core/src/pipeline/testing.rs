//! Helpers for testing processors through the real runtime.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::link::{FramePusher, Inbox, Shared, mailbox};
use super::stage::{Pipeline, Stage, spawn_line};
use crate::events::EventSink;
use crate::frames::Direction;
use crate::frames::{ControlFrame, EndFrame, Frame, StartFrame, SystemFrame};

/// What came out of a stage: frames pushed downstream and upstream, in order.
#[derive(Debug, Default)]
pub struct Output {
    /// Frames that left the stage downstream (start and end included).
    pub down: Vec<Frame>,
    /// Frames that left the stage upstream.
    pub up: Vec<Frame>,
}

/// Runs `stage` on `frames` (after a start frame, before an end frame) and returns everything it
/// pushed once the end frame has come out of it.
pub async fn run_processor(stage: impl Stage, frames: Vec<(Frame, Direction)>) -> Output {
    let shared = Shared::new(Arc::from(Vec::new()), EventSink::new());
    let (up_mailbox, up_inbox) = mailbox(Arc::from("test-source"), &shared.audio);
    let (down_mailbox, down_inbox) = mailbox(Arc::from("test-sink"), &shared.audio);
    let mut tasks = JoinSet::new();
    let entries = spawn_line(
        Pipeline::new().then(stage).into_node_list(),
        Some(up_mailbox),
        Some(down_mailbox),
        &shared,
        &mut tasks,
        "",
    );
    let source = FramePusher {
        name: Arc::from("test-source"),
        prev: entries.upstream,
        next: entries.downstream,
        shared,
    };
    let collect_down = tokio::spawn(collect(down_inbox, true));
    let collect_up = tokio::spawn(collect(up_inbox, false));
    let start = Frame::new(SystemFrame::Start(Arc::new(StartFrame::default())));
    let _ = source.push(start, Direction::Downstream).await;
    for (frame, direction) in frames {
        let _ = source.push(frame, direction).await;
    }
    let _ = source
        .push(
            Frame::new(ControlFrame::End(EndFrame::default())),
            Direction::Downstream,
        )
        .await;
    let down = collect_down.await.unwrap_or_default();
    // The upstream collector ends once every stage (and the source) has let go of its queue.
    drop(source);
    while tasks.join_next().await.is_some() {}
    let up = collect_up.await.unwrap_or_default();
    Output { down, up }
}

/// Collects frames until an end frame (when `until_end`) or until every sender is gone.
async fn collect(mut inbox: Inbox, until_end: bool) -> Vec<Frame> {
    let mut frames = Vec::new();
    loop {
        let item = tokio::select! {
            biased;
            Some(item) = inbox.system.recv() => item,
            Some(item) = inbox.data.recv() => item,
            else => break,
        };
        let end = item.0.is_end();
        frames.push(item.0);
        if until_end && end {
            break;
        }
    }
    frames
}
