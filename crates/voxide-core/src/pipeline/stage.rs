//! Stages and pipelines: what can stand in a pipeline, and how a line of them is wired.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::link::{FramePusher, Inbox, Mailbox, Shared, mailbox};
use super::node::run_processor;
use super::processor::FrameProcessor;

/// Something that can stand in a pipeline: a processor, a pipeline, a parallel pipeline.
pub trait Stage: Send + 'static {
    /// Appends this stage's runnable parts to `nodes`, in order.
    fn into_nodes(self, nodes: &mut Vec<Node>);
}

impl<P: FrameProcessor> Stage for P {
    fn into_nodes(self, nodes: &mut Vec<Node>) {
        nodes.push(Node::processor(self));
    }
}

/// One runnable part of a pipeline, ready to be wired to its neighbours.
pub struct Node(Box<dyn Spawn>);

impl Node {
    fn processor<P: FrameProcessor>(processor: P) -> Self {
        Node(Box::new(ProcessorSpawn(processor)))
    }

    pub(crate) fn custom(spawn: impl Spawn) -> Self {
        Node(Box::new(spawn))
    }

    pub(crate) fn name(&self) -> String {
        self.0.name()
    }
}

/// The wiring a node gets when it starts.
pub(crate) struct Wiring {
    pub(crate) inbox: Inbox,
    pub(crate) pusher: FramePusher,
}

pub(crate) trait Spawn: Send + 'static {
    fn name(&self) -> String;
    fn spawn(self: Box<Self>, wiring: Wiring, tasks: &mut JoinSet<()>);
}

struct ProcessorSpawn<P>(P);

impl<P: FrameProcessor> Spawn for ProcessorSpawn<P> {
    fn name(&self) -> String {
        self.0.name().to_owned()
    }

    fn spawn(self: Box<Self>, wiring: Wiring, tasks: &mut JoinSet<()>) {
        tasks.spawn(run_processor(self.0, wiring.inbox, wiring.pusher));
    }
}

/// Processors in a line. A pipeline is itself a stage, so pipelines nest.
#[derive(Default)]
pub struct Pipeline {
    nodes: Vec<Node>,
}

impl Pipeline {
    /// An empty pipeline (frames pass straight through).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `stage`.
    #[allow(clippy::should_implement_trait)]
    pub fn then(mut self, stage: impl Stage) -> Self {
        stage.into_nodes(&mut self.nodes);
        self
    }

    /// Number of runnable parts after flattening nested pipelines.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when the pipeline has no stage.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub(crate) fn into_node_list(self) -> Vec<Node> {
        self.nodes
    }
}

impl Stage for Pipeline {
    fn into_nodes(self, nodes: &mut Vec<Node>) {
        nodes.extend(self.nodes);
    }
}

/// Where frames enter a spawned line: downstream frames go to its first node, upstream frames to
/// its last. An empty line hands them straight to its ends.
pub(crate) struct LineEntries {
    pub(crate) downstream: Option<Mailbox>,
    pub(crate) upstream: Option<Mailbox>,
}

/// Wires `nodes` in a line between `prev` and `next` and spawns them.
pub(crate) fn spawn_line(
    nodes: Vec<Node>,
    prev: Option<Mailbox>,
    next: Option<Mailbox>,
    shared: &Arc<Shared>,
    tasks: &mut JoinSet<()>,
    name_prefix: &str,
) -> LineEntries {
    let names: Vec<Arc<str>> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| Arc::from(format!("{name_prefix}{}#{i}", n.name())))
        .collect();
    let (mailboxes, inboxes): (Vec<Mailbox>, Vec<Inbox>) = names
        .iter()
        .map(|n| mailbox(n.clone(), &shared.audio))
        .unzip();
    for (i, ((node, inbox), name)) in nodes.into_iter().zip(inboxes).zip(names).enumerate() {
        let pusher = FramePusher {
            name,
            prev: if i == 0 {
                prev.clone()
            } else {
                Some(mailboxes[i - 1].clone())
            },
            next: mailboxes.get(i + 1).cloned().or_else(|| next.clone()),
            shared: shared.clone(),
        };
        node.0.spawn(Wiring { inbox, pusher }, tasks);
    }
    LineEntries {
        downstream: mailboxes.first().cloned().or(next),
        upstream: mailboxes.last().cloned().or(prev),
    }
}
