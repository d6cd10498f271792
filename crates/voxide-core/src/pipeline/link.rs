//! The queues between stages and the handle that pushes frames into them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::observer::{FramePushed, Observers};
use crate::events::{Event, EventSink};
use crate::frames::Direction;
use crate::frames::{ErrorFrame, Frame, FrameBody, SystemFrame};

/// Capacity of each stage's data/control queue. When it is full, the stage pushing into it waits
/// (backpressure towards the source) while it keeps handling system frames; transports that cannot
/// wait drop audio and count the drop instead.
pub const DATA_QUEUE_CAPACITY: usize = 512;

/// User audio frames a session may have waiting in its stages' system queues (10 s of 20 ms
/// frames). Past this, a stage drops the frame it takes (it would be heard late) and past twice
/// this a new one is not queued at all; both are counted (`input_audio_backlog` in
/// `voxide_repeated_warnings_total`). A pipeline slower than real time loses audio, not memory.
pub const AUDIO_BACKLOG: usize = 500;

/// A frame with the direction it travels in.
pub(crate) type Item = (Frame, Direction);

/// The sending side of one stage's queues.
///
/// System frames get their own queue: they must never wait behind data, and a bounded queue
/// here could deadlock two stages pushing at each other. The one system frame that is not rare,
/// the user's audio, is held to [`AUDIO_BACKLOG`] by a count beside it.
#[derive(Clone)]
pub(crate) struct Mailbox {
    pub(crate) name: Arc<str>,
    system: mpsc::UnboundedSender<Item>,
    data: mpsc::Sender<Item>,
    audio: Arc<AtomicUsize>,
    order: Arc<Order>,
}

/// One order across a stage's two queues: how many data frames were queued, and for each
/// interruption in the system queue, how many of them were queued before it. An interruption
/// discards what was queued before it, never what its sender pushed after it (a typed message
/// that interrupts the bot comes right behind its interruption).
#[derive(Debug, Default)]
struct Order {
    queued: AtomicU64,
    /// For each interruption queued and not yet taken, `queued` when it was sent.
    interruptions: Mutex<VecDeque<u64>>,
    /// For the interruption taken last, the data frames queued before it.
    boundary: AtomicU64,
}

impl Order {
    fn interruptions(&self) -> std::sync::MutexGuard<'_, VecDeque<u64>> {
        self.interruptions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Mailbox {
    /// Completes once the stage behind this mailbox has stopped.
    pub(crate) async fn closed(&self) {
        self.data.closed().await;
    }
}

/// The receiving side of one stage's queues.
pub(crate) struct Inbox {
    pub(crate) system: SystemInbox,
    pub(crate) data: DataInbox,
}

/// A stage's system queue, with its count of user audio.
pub(crate) struct SystemInbox {
    queue: mpsc::UnboundedReceiver<Item>,
    audio: Arc<AtomicUsize>,
    order: Arc<Order>,
}

/// A stage's data queue, counting what it took.
pub(crate) struct DataInbox {
    queue: mpsc::Receiver<Item>,
    order: Arc<Order>,
    taken: u64,
}

impl DataInbox {
    /// The next data frame. Cancel safe.
    pub(crate) async fn recv(&mut self) -> Option<Item> {
        let item = self.queue.recv().await?;
        self.taken += 1;
        Some(item)
    }

    /// The next data frame, if one is queued.
    pub(crate) fn try_recv(&mut self) -> Option<Item> {
        let item = self.queue.try_recv().ok()?;
        self.taken += 1;
        Some(item)
    }

    fn close(&mut self) {
        self.queue.close();
    }

    /// Takes the data frames queued before the interruption taken last from the system queue:
    /// those it may discard. What came after it stays queued.
    pub(crate) fn before_interruption(&mut self) -> Vec<Item> {
        let boundary = self.order.boundary.load(Ordering::SeqCst);
        let mut before = Vec::new();
        while self.taken < boundary {
            match self.try_recv() {
                Some(item) => before.push(item),
                None => break,
            }
        }
        before
    }
}

fn is_input_audio(frame: &Frame) -> bool {
    matches!(frame.body, FrameBody::System(SystemFrame::InputAudio(_)))
}

impl Mailbox {
    /// Queues a system frame; user audio past twice [`AUDIO_BACKLOG`] is dropped and counted.
    fn send_system(&self, item: Item) -> Result<(), PushError> {
        if item.0.is_interruption() {
            // Noted and sent under one lock, so the notes keep the interruptions' order.
            let mut interruptions = self.order.interruptions();
            interruptions.push_back(self.order.queued.load(Ordering::SeqCst));
            return self.system.send(item).map_err(|_| {
                interruptions.pop_back();
                PushError::Closed
            });
        }
        let audio = is_input_audio(&item.0);
        if audio && self.audio.fetch_add(1, Ordering::Relaxed) >= 2 * AUDIO_BACKLOG {
            self.audio.fetch_sub(1, Ordering::Relaxed);
            crate::warnings::audio_dropped("input_audio_backlog");
            return Ok(());
        }
        self.system.send(item).map_err(|_| {
            if audio {
                self.audio.fetch_sub(1, Ordering::Relaxed);
            }
            PushError::Closed
        })
    }
}

impl SystemInbox {
    /// The next system frame; user audio waiting behind more than [`AUDIO_BACKLOG`] others is
    /// dropped (and counted) as it is taken. Cancel safe.
    pub(crate) async fn recv(&mut self) -> Option<Item> {
        loop {
            let item = self.queue.recv().await?;
            if item.0.is_interruption() {
                let before = self.order.interruptions().pop_front().unwrap_or(0);
                self.order.boundary.store(before, Ordering::SeqCst);
            }
            if is_input_audio(&item.0) {
                let behind = self.audio.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
                if behind >= AUDIO_BACKLOG {
                    crate::warnings::audio_dropped("input_audio_backlog");
                    continue;
                }
            }
            return Some(item);
        }
    }

    /// Whether no system frame waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn close(&mut self) {
        self.queue.close();
    }
}

impl Inbox {
    /// Stops taking frames; stages pushing here see it as stopped.
    pub(crate) fn close(&mut self) {
        self.system.close();
        self.data.close();
    }
}

/// A stage's queues.
/// `audio` counts the session's user audio in flight, across all its stages.
pub(crate) fn mailbox(name: Arc<str>, audio: &Arc<AtomicUsize>) -> (Mailbox, Inbox) {
    let (system_tx, system_rx) = mpsc::unbounded_channel();
    let (data_tx, data_rx) = mpsc::channel(DATA_QUEUE_CAPACITY);
    let order = Arc::new(Order::default());
    (
        Mailbox {
            name,
            system: system_tx,
            data: data_tx,
            audio: audio.clone(),
            order: order.clone(),
        },
        Inbox {
            system: SystemInbox {
                queue: system_rx,
                audio: audio.clone(),
                order: order.clone(),
            },
            data: DataInbox {
                queue: data_rx,
                order,
                taken: 0,
            },
        },
    )
}

/// Room in a neighbour's data queue for one frame.
pub(crate) struct Reserved<'a> {
    permit: mpsc::Permit<'a, Item>,
    order: &'a Order,
}

impl Reserved<'_> {
    /// Queues the frame.
    pub(crate) fn send(self, item: Item) {
        self.permit.send(item);
        self.order.queued.fetch_add(1, Ordering::SeqCst);
    }
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
    /// User audio frames in the stages' queues ([`AUDIO_BACKLOG`]).
    pub(crate) audio: Arc<AtomicUsize>,
}

impl Shared {
    pub(crate) fn new(observers: Observers, events: EventSink) -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            observers,
            events,
            audio: Arc::default(),
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
            return target.send_system(item);
        }
        target
            .data
            .send(item)
            .await
            .map_err(|_| PushError::Closed)?;
        target.order.queued.fetch_add(1, Ordering::SeqCst);
        Ok(())
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
            if target.send_system(item).is_err() {
                tracing::trace!(stage = %self.name, "neighbour stopped; system frame dropped");
            }
            return TryPush::Sent;
        }
        match target.data.try_send(item) {
            Ok(()) => {
                target.order.queued.fetch_add(1, Ordering::SeqCst);
                TryPush::Sent
            }
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
    pub(crate) async fn reserve(&self, direction: Direction) -> Option<Reserved<'_>> {
        let target = self.target(direction)?;
        let permit = target.data.reserve().await.ok()?;
        Some(Reserved {
            permit,
            order: &target.order,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::{AudioFrame, DataFrame};

    fn audio(n: i16) -> Item {
        let frame = SystemFrame::InputAudio(AudioFrame::new(vec![n; 320], 16_000, 1));
        (Frame::new(frame), Direction::Downstream)
    }

    #[tokio::test]
    async fn a_stage_far_behind_hears_the_newest_audio_and_memory_stays_bounded() {
        let count = Arc::new(AtomicUsize::new(0));
        let (mailbox, mut inbox) = mailbox(Arc::from("slow"), &count);
        for n in 0..(3 * AUDIO_BACKLOG) as i16 {
            mailbox.send_system(audio(n)).expect("open");
        }
        assert_eq!(
            count.load(Ordering::Relaxed),
            2 * AUDIO_BACKLOG,
            "the rest never queued"
        );
        mailbox
            .send_system((Frame::new(SystemFrame::Interruption), Direction::Downstream))
            .expect("open");
        drop(mailbox);
        let mut heard = Vec::new();
        let mut others = 0;
        while let Some((frame, _)) = inbox.system.recv().await {
            match frame.body {
                FrameBody::System(SystemFrame::InputAudio(a)) => heard.push(a.samples[0]),
                _ => others += 1,
            }
        }
        assert_eq!(others, 1, "other system frames are never dropped");
        let newest = (2 * AUDIO_BACKLOG - AUDIO_BACKLOG) as i16..(2 * AUDIO_BACKLOG) as i16;
        assert_eq!(heard, newest.collect::<Vec<_>>(), "the oldest went");
        assert_eq!(count.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn an_interruption_discards_what_was_queued_before_it_not_what_came_after() {
        let count = Arc::new(AtomicUsize::new(0));
        let (mailbox, mut inbox) = mailbox(Arc::from("stage"), &count);
        let text = |t: &str| {
            (
                Frame::new(DataFrame::LlmText(t.into())),
                Direction::Downstream,
            )
        };
        let send = |item: Item| {
            mailbox.data.try_send(item).expect("room");
            mailbox.order.queued.fetch_add(1, Ordering::SeqCst);
        };
        send(text("stale"));
        mailbox
            .send_system((Frame::new(SystemFrame::Interruption), Direction::Downstream))
            .expect("open");
        // What the interrupting stage pushed right after it: queued before the stage behind
        // takes the interruption.
        send(text("fresh"));
        let (taken, _) = inbox.system.recv().await.expect("the interruption");
        assert!(taken.is_interruption());
        let before: Vec<String> = inbox
            .data
            .before_interruption()
            .into_iter()
            .map(|(f, _)| format!("{:?}", f.body))
            .collect();
        assert_eq!(before.len(), 1);
        assert!(before[0].contains("stale"), "{before:?}");
        let (after, _) = inbox.data.try_recv().expect("still queued");
        assert!(format!("{:?}", after.body).contains("fresh"));
        // A second interruption with nothing before it takes nothing.
        mailbox
            .send_system((Frame::new(SystemFrame::Interruption), Direction::Downstream))
            .expect("open");
        inbox.system.recv().await.expect("the second");
        assert!(inbox.data.before_interruption().is_empty());
    }
}
