//! Parallel pipelines: branches that see the same frames, with their output merged.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tokio::task::JoinSet;

use super::link::{FramePusher, Inbox, Item, mailbox};
use super::stage::{Node, Pipeline, Spawn, Stage, Wiring, spawn_line};
use crate::frames::{ControlFrame, FrameBody, FrameId};

/// How many fanned-out frames the merge remembers to de-duplicate. A frame a branch swallowed
/// never completes its count; the oldest entries make room for new ones.
const DEDUP_WINDOW: usize = 4096;

/// Branches that each see every frame; what comes out of them is merged. A frame that several
/// branches pass on leaves once; an end frame leaves once every branch has drained it.
#[derive(Default)]
pub struct ParallelPipeline {
    branches: Vec<Pipeline>,
}

impl ParallelPipeline {
    /// No branches yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a branch: a processor or a pipeline.
    pub fn branch(mut self, branch: impl Stage) -> Self {
        self.branches.push(Pipeline::new().then(branch));
        self
    }
}

impl Stage for ParallelPipeline {
    fn into_nodes(self, nodes: &mut Vec<Node>) {
        nodes.push(Node::custom(self));
    }
}

impl Spawn for ParallelPipeline {
    fn name(&self) -> String {
        "Parallel".to_owned()
    }

    fn spawn(self: Box<Self>, wiring: Wiring, tasks: &mut JoinSet<()>) {
        let outer = wiring.pusher;
        let merge_name: Arc<str> = Arc::from(format!("{}/merge", outer.name));
        let (merge_mailbox, merge_inbox) = mailbox(merge_name, &outer.shared.audio);
        let mut branches = Vec::with_capacity(self.branches.len());
        for (b, branch) in self.branches.into_iter().enumerate() {
            let entries = spawn_line(
                branch.into_node_list(),
                Some(merge_mailbox.clone()),
                Some(merge_mailbox.clone()),
                &outer.shared,
                tasks,
                &format!("{}/{b}/", outer.name),
            );
            branches.push(FramePusher {
                name: outer.name.clone(),
                prev: entries.upstream,
                next: entries.downstream,
                shared: outer.shared.clone(),
            });
        }
        drop(merge_mailbox);
        let router = Router {
            outer,
            outer_inbox: wiring.inbox,
            merge_inbox,
            branches,
            arrivals: HashMap::new(),
            order: VecDeque::new(),
        };
        tasks.spawn(router.run());
    }
}

/// A lifecycle frame that left the router.
enum Left {
    Nothing,
    End,
    Cancel,
}

async fn next_stopped(pusher: &FramePusher) {
    if let Some(next) = pusher.target(crate::frames::Direction::Downstream) {
        next.closed().await;
    }
}

struct Router {
    outer: FramePusher,
    outer_inbox: Inbox,
    merge_inbox: Inbox,
    branches: Vec<FramePusher>,
    /// Fanned-out frames and how many branches have passed each on.
    arrivals: HashMap<FrameId, usize>,
    order: VecDeque<FrameId>,
}

impl Router {
    async fn run(mut self) {
        let mut ended = false;
        loop {
            let left = tokio::select! {
                biased;
                Some(item) = self.outer_inbox.system.recv() => self.fan_out(item).await,
                Some(item) = self.merge_inbox.system.recv() => self.merge(item).await,
                Some(item) = self.merge_inbox.data.recv() => self.merge(item).await,
                Some(item) = self.outer_inbox.data.recv() => self.fan_out(item).await,
                // After the end has gone on, upstream frames may still come until the next stage stops.
                () = next_stopped(&self.outer), if ended => break,
                else => break,
            };
            match left {
                Left::Nothing => {}
                Left::End => ended = true,
                Left::Cancel => break,
            }
        }
    }

    /// Sends a frame from outside into every branch.
    async fn fan_out(&mut self, item: Item) -> Left {
        let mut items = vec![item];
        if items[0].0.is_interruption() {
            // The interruption goes first; queued frames that survive it follow.
            let survivors = self.outer_inbox.data.before_interruption();
            items.extend(survivors.into_iter().filter(|q| q.0.is_uninterruptible()));
        }
        for (frame, direction) in items {
            if self.branches.is_empty() {
                // No branch: the frame passes straight through.
                match self.merge((frame, direction)).await {
                    Left::Nothing => continue,
                    left => return left,
                }
            }
            self.remember(frame.id);
            for branch in &self.branches {
                // A branch that stopped drops its copy; the others still get theirs.
                let _ = branch.push(frame.clone(), direction).await;
            }
        }
        Left::Nothing
    }

    /// Passes on a frame coming out of a branch, once.
    async fn merge(&mut self, (frame, direction): Item) -> Left {
        let n = self.branches.len().max(1);
        let waits_for_all = matches!(
            frame.body,
            FrameBody::Control(ControlFrame::End(_) | ControlFrame::Stop)
        );
        let pass = match self.arrivals.get_mut(&frame.id) {
            None => true,
            Some(count) => {
                *count += 1;
                let count = *count;
                if count >= n {
                    self.arrivals.remove(&frame.id);
                }
                if waits_for_all {
                    count >= n
                } else {
                    count == 1
                }
            }
        };
        if !pass {
            return Left::Nothing;
        }
        let left = if waits_for_all {
            Left::End
        } else if frame.is_cancel() {
            Left::Cancel
        } else {
            Left::Nothing
        };
        let _ = self.outer.push(frame, direction).await;
        left
    }

    fn remember(&mut self, id: FrameId) {
        self.arrivals.insert(id, 0);
        self.order.push_back(id);
        while self.order.len() > DEDUP_WINDOW {
            if let Some(old) = self.order.pop_front() {
                self.arrivals.remove(&old);
            }
        }
    }
}
