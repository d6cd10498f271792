//! The task that runs one processor: its queues, its jobs, interruption and shutdown.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::task::Poll;

use tokio::task::JoinSet;

use super::link::{DataInbox, FramePusher, Inbox, Item, TryPush};
use super::processor::{FrameContext, FrameProcessor, Job, ProcessorError};
use crate::frames::Direction;
use crate::frames::{ErrorFrame, Frame, FrameBody, SystemFrame};

/// Data frames a stage handles in one go before it checks its other queues and yields.
const DRAIN_BATCH: usize = 64;

/// What the loop does after a system frame.
enum After {
    Continue,
    Stop,
}

/// Runs `processor` until an end frame has drained through it or a cancel arrives.
pub(crate) async fn run_processor<P: FrameProcessor>(
    processor: P,
    inbox: Inbox,
    pusher: FramePusher,
) {
    let mut node = Node {
        processor,
        inbox,
        pusher,
        kept: VecDeque::new(),
        unsent: VecDeque::new(),
        job: None,
        job_interruptible: false,
        held_end: None,
        ending: false,
        ended: false,
        tasks: JoinSet::new(),
        out: Vec::new(),
        new_tasks: Vec::new(),
    };
    node.run().await;
}

struct Node<P> {
    processor: P,
    inbox: Inbox,
    pusher: FramePusher,
    /// Frames that survived an interruption; served before the queue.
    kept: VecDeque<Item>,
    /// Data frames pushed while the neighbour's queue was full, in order.
    unsent: VecDeque<Item>,
    /// The slow part of the frame being processed.
    job: Option<Job>,
    job_interruptible: bool,
    /// The end frame, held until the job that was running when it came has finished.
    held_end: Option<Item>,
    /// An end frame was processed: finish the job, flush, then pass the end on.
    ending: bool,
    /// The end frame has gone on: stop once the next stage has.
    ended: bool,
    tasks: JoinSet<Result<(), ProcessorError>>,
    out: Vec<Item>,
    new_tasks: Vec<Job>,
}

impl<P: FrameProcessor> Node<P> {
    async fn run(&mut self) {
        loop {
            if self.ending && self.job.is_none() && self.unsent.is_empty() {
                if let Some(end) = self.held_end.take() {
                    self.send(end);
                }
                if self.unsent.is_empty() {
                    self.ending = false;
                    self.ended = true;
                }
                continue;
            }
            let has_unsent = !self.unsent.is_empty();
            let take_data = self.job.is_none() && self.unsent.is_empty() && !self.ending;
            tokio::select! {
                biased;
                Some(item) = self.inbox.system.recv() => {
                    if let After::Stop = self.on_system(item) {
                        break;
                    }
                }
                result = poll_job(&mut self.job), if self.job.is_some() => {
                    self.job = None;
                    self.report(result);
                }
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    let result = joined.unwrap_or_else(|e| {
                        if e.is_panic() {
                            Err(ProcessorError::fatal(format!("background task panicked: {}", panic_text(e.into_panic()))))
                        } else {
                            Ok(())
                        }
                    });
                    self.report(result);
                }
                () = send_unsent(&self.pusher, &mut self.unsent), if has_unsent => {}
                // After the end has gone on, upstream frames may still come until the next stage stops.
                () = next_stopped(&self.pusher), if self.ended && !has_unsent => break,
                item = next_data(&mut self.kept, &mut self.inbox.data), if take_data => {
                    match item {
                        Some(item) => {
                            self.on_data(item);
                            self.drain_ready();
                        }
                        None => break,
                    }
                }
                else => break,
            }
        }
    }

    /// Processes data frames that are already queued without going back through `select!`, as
    /// long as nothing more urgent is waiting. Bounded so one busy stage cannot hog its thread.
    fn drain_ready(&mut self) {
        for _ in 0..DRAIN_BATCH {
            if self.job.is_some()
                || self.ending
                || !self.unsent.is_empty()
                || !self.inbox.system.is_empty()
            {
                return;
            }
            let item = match self.kept.pop_front() {
                Some(item) => item,
                None => match self.inbox.data.try_recv() {
                    Some(item) => item,
                    None => return,
                },
            };
            self.on_data(item);
        }
    }

    fn on_data(&mut self, (frame, direction): Item) {
        let is_end = frame.is_end()
            || matches!(
                frame.body,
                FrameBody::Control(crate::frames::ControlFrame::Stop)
            );
        self.job_interruptible = !frame.is_uninterruptible();
        let id = frame.id;
        let copy = is_end.then(|| frame.clone());
        self.process(frame, direction, false);
        if let Some(end) = copy {
            // Hold the end until the job it may have started has pushed everything.
            let pushed = self.out.iter().position(|(f, _)| f.id == id);
            let end = match pushed {
                Some(i) => self.out.remove(i),
                None => (end, direction),
            };
            self.held_end = Some(end);
            self.ending = true;
        }
        self.flush();
    }

    fn on_system(&mut self, (frame, direction): Item) -> After {
        match &frame.body {
            FrameBody::System(SystemFrame::Cancel { .. }) => {
                self.job = None;
                self.tasks.abort_all();
                self.unsent.clear();
                self.process_forwarding(frame, direction);
                After::Stop
            }
            FrameBody::System(SystemFrame::Interruption) => {
                // Going downstream it clears the bot's output ahead of it. Going upstream it
                // only informs: what waits here is input on its way in, which nothing discards.
                if direction == Direction::Downstream {
                    self.interrupt();
                }
                self.process(frame, direction, true);
                self.flush();
                After::Continue
            }
            FrameBody::System(SystemFrame::Start(_)) => {
                self.process_forwarding(frame, direction);
                After::Continue
            }
            _ => {
                self.process(frame, direction, true);
                self.flush();
                After::Continue
            }
        }
    }

    /// Discards what an interruption discards: the interruptible job, and queued or unsent
    /// frames that are not marked uninterruptible.
    fn interrupt(&mut self) {
        if self.job.is_some() && self.job_interruptible {
            self.job = None;
        }
        self.unsent.retain(|(f, _)| f.is_uninterruptible());
        self.kept.retain(|(f, _)| f.is_uninterruptible());
        for item in self.inbox.data.before_interruption() {
            if item.0.is_uninterruptible() {
                self.kept.push_back(item);
            } else {
                tracing::trace!(stage = %self.pusher.name, frame = item.0.name(), "discarded by interruption");
            }
        }
    }

    /// Processes a lifecycle frame and forwards it if the processor did not.
    fn process_forwarding(&mut self, frame: Frame, direction: Direction) {
        let id = frame.id;
        let copy = frame.clone();
        self.process(frame, direction, true);
        if !self.out.iter().any(|(f, _)| f.id == id) {
            self.out.push((copy, direction));
        }
        self.flush();
    }

    fn process(&mut self, frame: Frame, direction: Direction, system: bool) {
        let mut job = None;
        let mut cx = FrameContext {
            out: &mut self.out,
            job: &mut job,
            tasks: &mut self.new_tasks,
            pusher: &self.pusher,
            system,
        };
        let processor = &mut self.processor;
        let result = catch_unwind(AssertUnwindSafe(|| {
            processor.process(frame, direction, &mut cx)
        }))
        .unwrap_or_else(|panic| {
            Err(ProcessorError::fatal(format!(
                "panicked: {}",
                panic_text(panic)
            )))
        });
        if job.is_some() {
            self.job = job;
        }
        for task in self.new_tasks.drain(..) {
            self.tasks.spawn(task);
        }
        self.report(result);
    }

    /// Sends what `process` pushed, keeping per-direction order behind anything still unsent.
    fn flush(&mut self) {
        let mut out = std::mem::take(&mut self.out);
        for item in out.drain(..) {
            self.send(item);
        }
        self.out = out;
    }

    fn send(&mut self, item: Item) {
        if !self.unsent.is_empty() && !item.0.is_system() {
            self.unsent.push_back(item);
            return;
        }
        if let TryPush::Full(item) = self.pusher.try_push(item) {
            self.unsent.push_back(item);
        }
    }

    fn report(&mut self, result: Result<(), ProcessorError>) {
        let Err(error) = result else { return };
        let name = self.pusher.name.to_string();
        if error.fatal {
            tracing::error!(stage = %name, error = %error.message, "fatal processor error");
        } else {
            tracing::warn!(stage = %name, error = %error.message, "processor error");
        }
        let frame = ErrorFrame {
            message: error.message,
            fatal: error.fatal,
            processor: Some(name),
        };
        self.send((
            Frame::new(SystemFrame::Error(Box::new(frame))),
            Direction::Upstream,
        ));
    }
}

/// Completes when the job does; a panic inside it becomes a fatal error.
async fn poll_job(job: &mut Option<Job>) -> Result<(), ProcessorError> {
    poll_fn(|cx| match job.as_mut() {
        Some(job) => match catch_unwind(AssertUnwindSafe(|| job.as_mut().poll(cx))) {
            Ok(poll) => poll,
            Err(panic) => Poll::Ready(Err(ProcessorError::fatal(format!(
                "job panicked: {}",
                panic_text(panic)
            )))),
        },
        None => Poll::Pending,
    })
    .await
}

/// Completes once the next stage has stopped (or there is none).
async fn next_stopped(pusher: &FramePusher) {
    if let Some(next) = pusher.target(Direction::Downstream) {
        next.closed().await;
    }
}

/// Sends the oldest unsent frame once its neighbour has room; one that can never be delivered
/// (the neighbour stopped) is dropped.
///
/// # Cancel safety
/// Cancel safe: the frame leaves `unsent` only once it is sent.
async fn send_unsent(pusher: &FramePusher, unsent: &mut VecDeque<Item>) {
    let Some(direction) = unsent.front().map(|(_, d)| *d) else {
        return;
    };
    let permit = pusher.reserve(direction).await;
    if let (Some(permit), Some(item)) = (permit, unsent.pop_front()) {
        permit.send(item);
    }
}

async fn next_data(kept: &mut VecDeque<Item>, data: &mut DataInbox) -> Option<Item> {
    match kept.pop_front() {
        Some(item) => Some(item),
        None => data.recv().await,
    }
}

/// What a panic said, as text.
pub fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_owned()
    }
}
