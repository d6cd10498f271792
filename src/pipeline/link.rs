//! The queues between stages and the handle that pushes frames into them.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::observer::{FramePushed, Observers};
use super::processor::Direction;
use crate::events::{Event, EventSink};
use crate::frames::{ErrorFrame, Frame, SystemFrame};

/// Capacity of each stage's data/control queue. When it is full, the stage pushing into it waits
/// (backpressure towards the source) while it keeps handling system frames; transports that cannot
/// wait drop audio and count the drop instead.
pub const DATA_QUEUE_CAPACITY: usize = 512;

/// A frame with the direction it travels in.
pub(crate) type Item = (Frame, Direction);

/// The sending side of one stage's queues.
///
/// System frames get their own unbounded queue: they are rare, must never wait behind data, and a
/// bounded queue here could deadlock two stages pushing at each other.
#[derive(Clone)]
pub(crate) struct Mailbox {
    pub(crate) name: Arc<str>,
    system: mpsc::UnboundedSender<Item>,
    data: mpsc::Sender<Item>,
}

impl Mailbox {
    /// Completes once the stage behind this mailbox has stopped.
    pub(crate) async fn closed(&self) {
        self.data.closed().await;
    }
}

/// The receiving side of one stage's queues.
pub(crate) struct Inbox {
    pub(crate) system: mpsc::UnboundedReceiver<Item>,
    pub(crate) data: mpsc::Receiver<Item>,
}

impl Inbox {
    /// Stops taking frames; stages pushing here see it as stopped.
    pub(crate) fn close(&mut self) {
        self.system.close();
        self.data.close();
    }
}

/// A stage's queues.
pub(crate) fn mailbox(name: Arc<str>) -> (Mailbox, Inbox) {
    let (system_tx, system_rx) = mpsc::unbounded_channel();
    let (data_tx, data_rx) = mpsc::channel(DATA_QUEUE_CAPACITY);
    (
        Mailbox {
            name,
            system: system_tx,
            data: data_tx,
        },
        Inbox {
            system: system_rx,
            data: data_rx,
        },
    )
}

/// Why a push did not arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// The neighbour has stopped (after an end or cancel).
    #[error("the next stage has stopped")]
    Closed,
    /// There is no stage in that direction (the session's own edges).
    #[error("no stage in that direction")]
    NoPeer,
}

/// The outcome of a non-waiting push.
pub(crate) enum TryPush {
    Sent,
    /// The neighbour's data queue is full; here is the item back.
    Full(Item),
}

/// State every stage of one session shares.
pub(crate) struct Shared {
    pub(crate) started: Instant,
    pub(crate) observers: Observers,
    pub(crate) events: EventSink,
}

impl Shared {
    pub(crate) fn new(observers: Observers, events: EventSink) -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            observers,
            events,
        })
    }
}

/// Pushes frames from one stage to its neighbours. Cheap to clone: hand it to background work
/// that streams frames (an LLM response, synthesised audio).
#[derive(Clone)]
pub struct FramePusher {
    pub(crate) name: Arc<str>,
    pub(crate) prev: Option<Mailbox>,
    pub(crate) next: Option<Mailbox>,
    pub(crate) shared: Arc<Shared>,
}

impl FramePusher {
    /// The stage's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Time since the session started, on the session's clock.
    pub fn elapsed(&self) -> std::time::Duration {
        self.shared.started.elapsed()
    }

    /// Publishes a session event.
    pub fn emit(&self, event: Event) {
        self.shared.events.emit(self.elapsed(), event);
    }

    /// Pushes `frame` towards `direction`, waiting while the neighbour's data queue is full.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes drops the frame.
    pub async fn push(&self, frame: Frame, direction: Direction) -> Result<(), PushError> {
        let target = self.target(direction).ok_or(PushError::NoPeer)?;
        self.observe(&frame, direction, target);
        let item = (frame, direction);
        if item.0.is_system() {
            return target.system.send(item).map_err(|_| PushError::Closed);
        }
        target.data.send(item).await.map_err(|_| PushError::Closed)
    }

    /// Reports a non-fatal error upstream, as this stage's.
    pub async fn push_error(&self, message: impl Into<String>) {
        let mut error = ErrorFrame::new(message);
        error.processor = Some(self.name().to_owned());
        let _ = self
            .push(
                SystemFrame::Error(Box::new(error)).into(),
                Direction::Upstream,
            )
            .await;
    }

    /// Pushes without waiting: system frames always go; data frames come back when the queue is
    /// full. A closed or missing neighbour drops the frame (it has stopped; nothing will read it).
    pub(crate) fn try_push(&self, item: Item) -> TryPush {
        let Some(target) = self.target(item.1) else {
            tracing::trace!(stage = %self.name, frame = item.0.name(), "no stage that way; dropped");
            return TryPush::Sent;
        };
        self.observe(&item.0, item.1, target);
        if item.0.is_system() {
            if target.system.send(item).is_err() {
                tracing::trace!(stage = %self.name, "neighbour stopped; system frame dropped");
            }
            return TryPush::Sent;
        }
        match target.data.try_send(item) {
            Ok(()) => TryPush::Sent,
            Err(mpsc::error::TrySendError::Full(item)) => TryPush::Full(item),
            Err(mpsc::error::TrySendError::Closed(item)) => {
                tracing::trace!(stage = %self.name, frame = item.0.name(), "neighbour stopped; dropped");
                TryPush::Sent
            }
        }
    }

    /// Waits for room in the data queue that `item` goes to, then sends it (already observed).
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped while waiting, the item was not sent and the caller still has it
    /// (the future only borrows the direction).
    pub(crate) async fn reserve(&self, direction: Direction) -> Option<mpsc::Permit<'_, Item>> {
        let target = self.target(direction)?;
        target.data.reserve().await.ok()
    }

    pub(crate) fn target(&self, direction: Direction) -> Option<&Mailbox> {
        match direction {
            Direction::Downstream => self.next.as_ref(),
            Direction::Upstream => self.prev.as_ref(),
        }
    }

    fn observe(&self, frame: &Frame, direction: Direction, target: &Mailbox) {
        if self.shared.observers.is_empty() {
            return;
        }
        let event = FramePushed {
            source: &self.name,
            destination: &target.name,
            frame,
            direction,
            started: self.shared.started,
        };
        for observer in self.shared.observers.iter() {
            observer.on_push(&event);
        }
    }
}
