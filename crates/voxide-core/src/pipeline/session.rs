//! Sessions: one pipeline running one conversation (pipecat's PipelineTask).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::link::{AUDIO_BACKLOG, FramePusher, Inbox, Item, Shared, mailbox};
use super::observer::{FramePushed, Observer, Observers};
use super::stage::{Pipeline, Stage, spawn_line};
use crate::events::{EndReason, Event, EventSink, SessionEvent};
use crate::frames::AppResources;
use crate::frames::Direction;
use crate::frames::{
    AudioFrame, ControlFrame, DataFrame, EndFrame, ErrorFrame, Frame, FrameBody, FrameId,
    ResultKind, StartFrame, StartParams, SystemFrame,
};

/// Default time without user or bot activity before the idle timeout fires.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The name the session's own pusher goes by: what it queues (the user's audio, a client's
/// frames) is pushed from `source`, as observers see it.
pub const SOURCE: &str = "source";

/// How long stages get to stop after a cancel before their tasks are aborted.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(2);

/// Why a frame could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The session has finished.
    #[error("the session has finished")]
    Finished,
}

type Handler<T> = Box<dyn Fn(&T) + Send + Sync>;

/// Configures and starts a [`Session`].
pub struct SessionBuilder {
    pipeline: Pipeline,
    params: StartParams,
    resources: AppResources,
    observers: Vec<Arc<dyn Observer>>,
    idle_timeout: Option<Duration>,
    cancel_on_idle_timeout: bool,
    cancel_grace: Duration,
    events: EventSink,
    on_started: Vec<Handler<()>>,
    on_finished: Vec<Handler<EndReason>>,
    on_error: Vec<Handler<ErrorFrame>>,
    on_idle_timeout: Vec<Handler<()>>,
}

impl SessionBuilder {
    /// Parameters sent to every stage in the start frame.
    pub fn params(mut self, params: StartParams) -> Self {
        self.params = params;
        self
    }

    /// Turns TTFB/processing and usage metrics on or off.
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.params.enable_metrics = enabled;
        self.params.enable_usage_metrics = enabled;
        self
    }

    /// Resources handed by reference to every tool handler.
    pub fn resources(mut self, resources: AppResources) -> Self {
        self.resources = resources;
        self
    }

    /// Adds an observer that sees every push.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Time without user or bot activity before the idle timeout fires; `None` turns it off.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Whether the idle timeout cancels the session (default true).
    pub fn cancel_on_idle_timeout(mut self, cancel: bool) -> Self {
        self.cancel_on_idle_timeout = cancel;
        self
    }

    /// How long stages get to stop after a cancel before they are aborted.
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// Called once the start frame is sent.
    pub fn on_started(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_started.push(Box::new(move |()| f()));
        self
    }

    /// Called once the session has finished.
    pub fn on_finished(mut self, f: impl Fn(&EndReason) + Send + Sync + 'static) -> Self {
        self.on_finished.push(Box::new(f));
        self
    }

    /// Called for every error a stage reports.
    pub fn on_error(mut self, f: impl Fn(&ErrorFrame) + Send + Sync + 'static) -> Self {
        self.on_error.push(Box::new(f));
        self
    }

    /// Called when the idle timeout fires.
    pub fn on_idle_timeout(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_idle_timeout.push(Box::new(move |()| f()));
        self
    }

    /// A subscriber to the session's events, from its very first one.
    pub fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.events.subscribe()
    }

    /// Spawns every stage and starts the session. Must be called within a tokio runtime.
    pub fn spawn(self) -> Session {
        let mut observers = self.observers;
        let activity = self.idle_timeout.map(|timeout| {
            let (tx, rx) = watch::channel(Instant::now());
            observers.push(Arc::new(ActivityObserver(tx)));
            (timeout, rx)
        });
        observers.push(Arc::new(EventObserver {
            events: self.events.clone(),
            recent: Mutex::new(VecDeque::new()),
        }));
        let observers: Observers = observers.into();
        let shared = Shared::new(observers, self.events.clone());

        let (source_mailbox, source_inbox) = mailbox(Arc::from(SOURCE), &shared.audio);
        let (sink_mailbox, sink_inbox) = mailbox(Arc::from("sink"), &shared.audio);
        let mut tasks = JoinSet::new();
        let entries = spawn_line(
            self.pipeline.into_node_list(),
            Some(source_mailbox),
            Some(sink_mailbox),
            &shared,
            &mut tasks,
            "",
        );
        let source = FramePusher {
            name: Arc::from(SOURCE),
            prev: None,
            next: entries.downstream,
            shared: shared.clone(),
        };
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let handle = SessionHandle {
            source: source.clone(),
            control: control_tx,
            events: self.events.clone(),
        };
        // The start frame goes in before `spawn` returns, so nothing the app queues can pass it.
        let start = Frame::new(SystemFrame::Start(Arc::new(StartFrame {
            params: self.params,
            resources: self.resources,
        })));
        let _ = source.try_push((start, Direction::Downstream));
        self.events
            .emit(shared.started.elapsed(), Event::SessionStarted);
        let driver = Driver {
            source,
            source_inbox,
            sink_inbox,
            control: control_rx,
            tasks,
            shared,
            activity,
            cancel_on_idle_timeout: self.cancel_on_idle_timeout,
            cancel_grace: self.cancel_grace,
            cancel_deadline: None,
            reason: None,
            on_started: self.on_started,
            on_finished: self.on_finished,
            on_error: self.on_error,
            on_idle_timeout: self.on_idle_timeout,
        };
        let driver = tokio::spawn(driver.run());
        Session { handle, driver }
    }
}

/// A running session. Dropping it does not stop it; call [`SessionHandle::cancel`] for that.
pub struct Session {
    handle: SessionHandle,
    driver: tokio::task::JoinHandle<EndReason>,
}

impl Session {
    /// Starts configuring a session around `pipeline`.
    pub fn builder(pipeline: impl Stage) -> SessionBuilder {
        SessionBuilder {
            pipeline: Pipeline::new().then(pipeline),
            params: StartParams::default(),
            resources: AppResources::default(),
            observers: Vec::new(),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            cancel_on_idle_timeout: true,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            events: EventSink::new(),
            on_started: Vec::new(),
            on_finished: Vec::new(),
            on_error: Vec::new(),
            on_idle_timeout: Vec::new(),
        }
    }

    /// A handle to queue frames into the session and stop it.
    pub fn handle(&self) -> SessionHandle {
        self.handle.clone()
    }

    /// Waits for the session to finish and says why it did.
    pub async fn join(self) -> EndReason {
        self.driver
            .await
            .unwrap_or_else(|e| EndReason::FatalError(format!("session driver failed: {e}")))
    }
}

/// Queues frames into a session and stops it. Cheap to clone.
#[derive(Clone)]
pub struct SessionHandle {
    source: FramePusher,
    control: mpsc::UnboundedSender<Control>,
    events: EventSink,
}

enum Control {
    Cancel(EndReason, Option<String>),
}

impl SessionHandle {
    /// Queues `frame` at the start of the pipeline, waiting while its first queue is full, or
    /// (for user audio) while more than half of [`AUDIO_BACKLOG`] frames of it are in flight: a
    /// source faster than real time (a file, a test) loses nothing. A live source queues its
    /// audio with [`SessionHandle::queue_live_audio`] instead.
    pub async fn queue_frame(&self, frame: impl Into<Frame>) -> Result<(), SessionError> {
        let frame = frame.into();
        if matches!(frame.body, FrameBody::System(SystemFrame::InputAudio(_))) {
            while self.audio_in_flight() > AUDIO_BACKLOG / 2 {
                tokio::task::yield_now().await;
            }
        }
        self.source
            .push(frame, Direction::Downstream)
            .await
            .map_err(|_| SessionError::Finished)
    }

    /// Queues the user's audio from a live source (a call, a microphone) without waiting: a
    /// pipeline that falls [`AUDIO_BACKLOG`] frames behind drops the oldest, and counts them.
    pub async fn queue_live_audio(&self, audio: AudioFrame) -> Result<(), SessionError> {
        self.source
            .push(SystemFrame::InputAudio(audio).into(), Direction::Downstream)
            .await
            .map_err(|_| SessionError::Finished)
    }

    fn audio_in_flight(&self) -> usize {
        self.source
            .shared
            .audio
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queues several frames in order.
    pub async fn queue_frames(
        &self,
        frames: impl IntoIterator<Item = Frame>,
    ) -> Result<(), SessionError> {
        for frame in frames {
            self.queue_frame(frame).await?;
        }
        Ok(())
    }

    /// Queues an end frame: the session finishes once everything queued before it has drained.
    pub async fn stop_when_done(&self) -> Result<(), SessionError> {
        self.queue_frame(ControlFrame::End(EndFrame::default()))
            .await
    }

    /// Stops the session at once, discarding whatever is queued.
    pub fn cancel(&self) {
        let _ = self
            .control
            .send(Control::Cancel(EndReason::Cancelled, None));
    }

    /// Stops the session at once for `reason` (the session ends with it, unless it was already
    /// ending for another).
    pub fn cancel_because(&self, reason: EndReason) {
        let why = format!("{reason:?}");
        let _ = self.control.send(Control::Cancel(reason, Some(why)));
    }

    /// Publishes an event the app observed itself (the transport's, say) on the session's
    /// stream, timed like the session's own.
    pub fn emit(&self, event: Event) {
        self.events
            .emit(self.source.shared.started.elapsed(), event);
    }

    /// A new subscriber to the session's events, from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.events.subscribe()
    }
}

/// The session's own task: it sits at both ends of the pipeline.
struct Driver {
    source: FramePusher,
    /// Frames pushed upstream out of the first stage.
    source_inbox: Inbox,
    /// Frames pushed downstream out of the last stage.
    sink_inbox: Inbox,
    control: mpsc::UnboundedReceiver<Control>,
    tasks: JoinSet<()>,
    shared: Arc<Shared>,
    activity: Option<(Duration, watch::Receiver<Instant>)>,
    cancel_on_idle_timeout: bool,
    cancel_grace: Duration,
    cancel_deadline: Option<Instant>,
    /// Why the session is finishing, once it is.
    reason: Option<EndReason>,
    on_started: Vec<Handler<()>>,
    on_finished: Vec<Handler<EndReason>>,
    on_error: Vec<Handler<ErrorFrame>>,
    on_idle_timeout: Vec<Handler<()>>,
}

impl Driver {
    async fn run(mut self) -> EndReason {
        for f in &self.on_started {
            f(&());
        }
        let far_future = Instant::now() + Duration::from_secs(86_400 * 365);
        let mut idle_deadline = self.activity.as_ref().map(|(t, rx)| *rx.borrow() + *t);
        let reason = loop {
            let cancel_at = self.cancel_deadline.unwrap_or(far_future);
            let idle_at = idle_deadline.unwrap_or(far_future);
            tokio::select! {
                biased;
                Some(control) = self.control.recv() => match control {
                    Control::Cancel(reason, why) => self.begin_cancel(reason, why),
                },
                Some(item) = self.sink_inbox.system.recv() => {
                    if let Some(reason) = self.at_edge(item) {
                        break reason;
                    }
                }
                Some(item) = self.source_inbox.system.recv() => {
                    if let Some(reason) = self.at_edge(item) {
                        break reason;
                    }
                }
                Some(item) = self.sink_inbox.data.recv() => {
                    if let Some(reason) = self.at_edge(item) {
                        break reason;
                    }
                }
                Some(item) = self.source_inbox.data.recv() => {
                    if let Some(reason) = self.at_edge(item) {
                        break reason;
                    }
                }
                Some(joined) = self.tasks.join_next() => {
                    if let Err(e) = joined
                        && e.is_panic()
                    {
                        self.error(ErrorFrame::fatal(format!("a stage's task panicked: {e}")));
                    }
                }
                () = sleep_until(idle_at), if idle_deadline.is_some() => {
                    idle_deadline = self.check_idle();
                }
                () = sleep_until(cancel_at), if self.cancel_deadline.is_some() => {
                    tracing::warn!("stages did not stop within the cancel grace; aborting them");
                    self.tasks.abort_all();
                    break self.reason.clone().unwrap_or(EndReason::Cancelled);
                }
                else => break self.reason.clone().unwrap_or(EndReason::Completed),
            }
        };
        self.finish(reason).await
    }

    /// Handles a frame that left the pipeline at either end. Returns the reason when the
    /// session is over.
    fn at_edge(&mut self, (frame, direction): Item) -> Option<EndReason> {
        match frame.body {
            FrameBody::System(SystemFrame::Error(error)) => {
                self.error(*error);
                None
            }
            FrameBody::System(SystemFrame::Cancel { .. }) if direction == Direction::Downstream => {
                Some(self.reason.clone().unwrap_or(EndReason::Cancelled))
            }
            FrameBody::Control(ControlFrame::End(_)) if direction == Direction::Downstream => {
                Some(self.reason.clone().unwrap_or(EndReason::Completed))
            }
            FrameBody::Control(ControlFrame::Stop) if direction == Direction::Downstream => {
                Some(self.reason.clone().unwrap_or(EndReason::Stopped))
            }
            _ => None,
        }
    }

    fn error(&mut self, error: ErrorFrame) {
        self.emit(Event::Error {
            message: error.message.clone(),
            fatal: error.fatal,
            processor: error.processor.clone(),
        });
        for f in &self.on_error {
            f(&error);
        }
        if error.fatal {
            let why = error.message.clone();
            self.begin_cancel(EndReason::FatalError(error.message), Some(why));
        }
    }

    /// Returns the next idle deadline, or `None` once the timeout has fired.
    fn check_idle(&mut self) -> Option<Instant> {
        let (timeout, rx) = self.activity.as_ref()?;
        let deadline = *rx.borrow() + *timeout;
        if deadline > Instant::now() {
            return Some(deadline);
        }
        tracing::info!("idle timeout: no user or bot activity");
        self.emit(Event::IdleTimeout);
        for f in &self.on_idle_timeout {
            f(&());
        }
        if self.cancel_on_idle_timeout {
            self.begin_cancel(EndReason::IdleTimeout, Some("idle timeout".to_owned()));
        }
        None
    }

    fn begin_cancel(&mut self, reason: EndReason, why: Option<String>) {
        if self.cancel_deadline.is_some() {
            return;
        }
        self.reason.get_or_insert(reason);
        self.cancel_deadline = Some(Instant::now() + self.cancel_grace);
        let cancel = Frame::new(SystemFrame::Cancel { reason: why });
        // System frames never wait, so this cannot come back full.
        let _ = self.source.try_push((cancel, Direction::Downstream));
    }

    async fn finish(mut self, reason: EndReason) -> EndReason {
        // Stages stop by themselves after an end or cancel, the last one once the session lets
        // go of its edges; give them the grace, then abort.
        self.source_inbox.close();
        self.sink_inbox.close();
        let drain = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(self.cancel_grace, drain)
            .await
            .is_err()
        {
            self.tasks.abort_all();
        }
        self.emit(Event::SessionEnded {
            reason: reason.clone(),
        });
        for f in &self.on_finished {
            f(&reason);
        }
        reason
    }

    fn emit(&self, event: Event) {
        self.shared
            .events
            .emit(self.shared.started.elapsed(), event);
    }
}

/// Notes the time of every user or bot activity frame, for the idle timeout.
struct ActivityObserver(watch::Sender<Instant>);

impl Observer for ActivityObserver {
    fn on_push(&self, event: &FramePushed<'_>) {
        if let FrameBody::System(
            SystemFrame::UserStartedSpeaking
            | SystemFrame::UserStoppedSpeaking
            | SystemFrame::UserSpeaking
            | SystemFrame::BotStartedSpeaking
            | SystemFrame::BotStoppedSpeaking
            | SystemFrame::BotSpeaking,
        ) = event.frame.body
        {
            self.0.send_replace(Instant::now());
        }
    }
}

/// Frames seen by the session's event stream; a frame is reported once however many hops it makes.
const EVENT_DEDUP: usize = 64;

/// Renders voice frames as session events.
struct EventObserver {
    events: EventSink,
    recent: Mutex<VecDeque<FrameId>>,
}

impl Observer for EventObserver {
    fn on_push(&self, pushed: &FramePushed<'_>) {
        let event = match &pushed.frame.body {
            FrameBody::System(s) => match s {
                SystemFrame::UserStartedSpeaking => Event::UserStartedSpeaking,
                SystemFrame::UserStoppedSpeaking => Event::UserStoppedSpeaking,
                // The output pushes these both ways as two frames: report the downstream one.
                SystemFrame::BotStartedSpeaking if pushed.direction == Direction::Downstream => {
                    Event::BotStartedSpeaking
                }
                SystemFrame::BotStoppedSpeaking if pushed.direction == Direction::Downstream => {
                    Event::BotStoppedSpeaking
                }
                // Interruptions go both ways as two frames: report the downstream one.
                SystemFrame::Interruption if pushed.direction == Direction::Downstream => {
                    Event::Interruption
                }
                SystemFrame::PausePlayback => Event::BotPaused,
                SystemFrame::ResumePlayback => Event::BotResumed,
                SystemFrame::Metrics(data) => Event::Metrics { data: data.clone() },
                // Function-call frames go both ways as separate frames: report the downstream ones.
                SystemFrame::FunctionCallCancel(cancel)
                    if pushed.direction == Direction::Downstream =>
                {
                    Event::ToolCallCancelled {
                        name: cancel.function_name.clone(),
                        tool_call_id: cancel.tool_call_id.clone(),
                        reason: cancel.reason,
                    }
                }
                _ => return,
            },
            FrameBody::Data(DataFrame::Transcription(t)) => Event::UserTranscription {
                text: t.text.clone(),
                is_final: true,
            },
            FrameBody::Data(DataFrame::InterimTranscription(t)) => Event::UserTranscription {
                text: t.text.clone(),
                is_final: false,
            },
            _ if pushed.direction == Direction::Upstream => return,
            FrameBody::Data(DataFrame::TtsText(t)) if t.spoken => Event::BotText {
                text: t.text.clone(),
            },
            FrameBody::Control(ControlFrame::LlmFullResponseStart) => Event::LlmStarted,
            FrameBody::Data(DataFrame::LlmText(text)) => Event::LlmText { text: text.clone() },
            FrameBody::Control(ControlFrame::LlmFullResponseEnd) => Event::LlmStopped,
            FrameBody::Control(ControlFrame::FunctionCallInProgress(call)) => {
                Event::ToolCallStarted {
                    name: call.function_name.clone(),
                    tool_call_id: call.tool_call_id.clone(),
                    arguments: call.arguments.clone(),
                }
            }
            FrameBody::Data(DataFrame::FunctionCallResult(r)) if r.kind == ResultKind::Final => {
                Event::ToolCallResult {
                    name: r.function_name.clone(),
                    tool_call_id: r.tool_call_id.clone(),
                    result: r.result.clone(),
                }
            }
            FrameBody::Data(DataFrame::FunctionCallResult(r)) => Event::ToolCallIntermediate {
                name: r.function_name.clone(),
                tool_call_id: r.tool_call_id.clone(),
                result: r.result.clone(),
            },
            _ => return,
        };
        {
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            if recent.contains(&pushed.frame.id) {
                return;
            }
            if recent.len() == EVENT_DEDUP {
                recent.pop_front();
            }
            recent.push_back(pushed.frame.id);
        }
        self.events.emit(pushed.timestamp(), event);
    }
}
