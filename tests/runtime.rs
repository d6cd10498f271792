//! Behaviour of the frame runtime through its public API.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Notify, mpsc};

use voxide::events::EndReason;
use voxide::frames::{
    ControlFrame, DataFrame, EndFrame, Frame, FrameBody, FrameId, FunctionCallInProgress,
    FunctionCallResult, FunctionCallResultProperties, ResultKind, SystemFrame,
};
use voxide::pipeline::testing::run_processor;
use voxide::pipeline::{
    Direction, FrameContext, FrameProcessor, FramePushed, Observer, ParallelPipeline, Pipeline,
    ProcessorError, Session, SessionHandle,
};

fn text(s: &str) -> Frame {
    Frame::new(DataFrame::Text(s.to_owned()))
}

fn text_of(frame: &Frame) -> Option<&str> {
    match &frame.body {
        FrameBody::Data(DataFrame::Text(t)) => Some(t),
        _ => None,
    }
}

/// Records what passes through it (name, text, direction) and passes it on.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(String, Direction)>>>);

impl Recorder {
    fn seen(&self) -> Vec<String> {
        self.0
            .lock()
            .expect("lock")
            .iter()
            .map(|(s, _)| s.clone())
            .collect()
    }
}

impl FrameProcessor for Recorder {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let label = text_of(&frame).map_or_else(|| frame.name().to_owned(), str::to_owned);
        self.0.lock().expect("lock").push((label, direction));
        cx.push(frame, direction);
        Ok(())
    }
}

/// Appends a suffix to text frames (as a new frame) and passes everything else on.
struct Append(&'static str);

impl FrameProcessor for Append {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match text_of(&frame) {
            Some(t) => cx.push(text(&format!("{t}{}", self.0)), direction),
            None => cx.push(frame, direction),
        }
        Ok(())
    }
}

/// Turns the text frame "slow" into a job that waits for `open`, then pushes it on. Reports
/// when the job started and whether it was dropped before finishing.
#[derive(Clone)]
struct Gate {
    open: Arc<Notify>,
    started: mpsc::UnboundedSender<()>,
    aborted: Arc<AtomicBool>,
}

/// Sets its flag when dropped before `finished` was called.
struct AbortFlag {
    flag: Arc<AtomicBool>,
    finished: bool,
}

impl AbortFlag {
    fn finished(&mut self) {
        self.finished = true;
    }
}

impl Drop for AbortFlag {
    fn drop(&mut self) {
        if !self.finished {
            self.flag.store(true, Ordering::SeqCst);
        }
    }
}

impl FrameProcessor for Gate {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if text_of(&frame) != Some("slow") {
            cx.push(frame, direction);
            return Ok(());
        }
        let open = self.open.clone();
        let started = self.started.clone();
        let mut flag = AbortFlag {
            flag: self.aborted.clone(),
            finished: false,
        };
        let pusher = cx.pusher();
        cx.run(async move {
            let _ = started.send(());
            open.notified().await;
            flag.finished();
            let _ = pusher.push(frame, direction).await;
            Ok(())
        });
        Ok(())
    }
}

fn gate() -> (
    Gate,
    Arc<Notify>,
    mpsc::UnboundedReceiver<()>,
    Arc<AtomicBool>,
) {
    let open = Arc::new(Notify::new());
    let (tx, rx) = mpsc::unbounded_channel();
    let aborted = Arc::new(AtomicBool::new(false));
    let g = Gate {
        open: open.clone(),
        started: tx,
        aborted: aborted.clone(),
    };
    (g, open, rx, aborted)
}

/// A session of gate → recorder whose gate is busy with the frame "slow".
struct Busy {
    session: Session,
    handle: SessionHandle,
    recorder: Recorder,
    open: Arc<Notify>,
    aborted: Arc<AtomicBool>,
}

async fn busy_gate_session() -> Busy {
    let (gate, open, mut started, aborted) = gate();
    let recorder = Recorder::default();
    let session = Session::builder(Pipeline::new().then(gate).then(recorder.clone()))
        .idle_timeout(None)
        .spawn();
    let handle = session.handle();
    handle.queue_frame(text("slow")).await.expect("queued");
    started.recv().await.expect("job started");
    Busy {
        session,
        handle,
        recorder,
        open,
        aborted,
    }
}

fn in_progress() -> Frame {
    Frame::new(ControlFrame::FunctionCallInProgress(Box::new(
        FunctionCallInProgress {
            function_name: "f".into(),
            tool_call_id: "call_1".into(),
            arguments: Value::Null,
            cancel_on_interruption: true,
            group_id: 1,
        },
    )))
}

fn result() -> Frame {
    Frame::new(DataFrame::FunctionCallResult(Box::new(
        FunctionCallResult {
            function_name: "f".into(),
            tool_call_id: "call_1".into(),
            arguments: Value::Null,
            result: Some(Value::from(42)),
            kind: ResultKind::Final,
            cancel_on_interruption: true,
            group_id: 1,
            properties: FunctionCallResultProperties::default(),
        },
    )))
}

#[tokio::test]
async fn order_is_kept_in_each_direction() {
    let frames: Vec<(Frame, Direction)> = (0..200)
        .map(|i| {
            let dir = if i % 3 == 0 {
                Direction::Upstream
            } else {
                Direction::Downstream
            };
            (text(&i.to_string()), dir)
        })
        .collect();
    let out = run_processor(Pipeline::new().then(Append("")).then(Append("")), frames).await;
    let down: Vec<u32> = out
        .down
        .iter()
        .filter_map(text_of)
        .map(|t| t.parse().expect("number"))
        .collect();
    let up: Vec<u32> = out
        .up
        .iter()
        .filter_map(text_of)
        .map(|t| t.parse().expect("number"))
        .collect();
    assert_eq!(down, (0..200).filter(|i| i % 3 != 0).collect::<Vec<_>>());
    assert_eq!(up, (0..200).filter(|i| i % 3 == 0).collect::<Vec<_>>());
    assert!(out.down.first().is_some_and(|f| f.name() == "start"));
    assert!(out.down.last().is_some_and(Frame::is_end));
}

#[tokio::test]
async fn a_system_frame_overtakes_a_backlog_of_ten_thousand_data_frames() {
    let Busy {
        session,
        handle,
        recorder,
        open,
        ..
    } = busy_gate_session().await;
    let feeder = {
        let handle = handle.clone();
        tokio::spawn(async move {
            for i in 0..10_000 {
                handle
                    .queue_frame(text(&i.to_string()))
                    .await
                    .expect("queued");
            }
        })
    };
    handle
        .queue_frame(SystemFrame::UserIdle)
        .await
        .expect("queued");
    // The gate is still busy with "slow" and its queue is full: only the system frame gets by.
    while !recorder.seen().iter().any(|s| s == "user_idle") {
        tokio::task::yield_now().await;
    }
    let seen = recorder.seen();
    assert_eq!(seen, vec!["start", "user_idle"]);
    open.notify_one();
    feeder.await.expect("feeder");
    handle.stop_when_done().await.expect("queued");
    assert_eq!(session.join().await, EndReason::Completed);
    let seen = recorder.seen();
    assert_eq!(seen.len(), 2 + 1 + 10_000 + 1);
    assert_eq!(seen[2], "slow");
    assert_eq!(seen[3], "0");
    assert_eq!(seen[10_002], "9999");
}

#[tokio::test]
async fn interruption_aborts_the_slow_frame_and_drops_queued_data_but_keeps_end_and_function_frames()
 {
    let Busy {
        session,
        handle,
        recorder,
        aborted,
        ..
    } = busy_gate_session().await;
    for frame in [text("a"), in_progress(), text("b"), result(), text("c")] {
        handle.queue_frame(frame).await.expect("queued");
    }
    handle.stop_when_done().await.expect("queued");
    handle
        .queue_frame(SystemFrame::Interruption)
        .await
        .expect("queued");
    assert_eq!(session.join().await, EndReason::Completed);
    assert!(
        aborted.load(Ordering::SeqCst),
        "the slow frame's job was not aborted"
    );
    assert_eq!(
        recorder.seen(),
        vec![
            "start",
            "interruption",
            "function_call_in_progress",
            "function_call_result",
            "end"
        ]
    );
}

#[tokio::test]
async fn cancel_aborts_the_slow_frame_and_stops_every_stage() {
    let Busy {
        session,
        handle,
        recorder,
        aborted,
        ..
    } = busy_gate_session().await;
    handle.queue_frame(text("queued")).await.expect("queued");
    handle.cancel();
    assert_eq!(session.join().await, EndReason::Cancelled);
    assert!(aborted.load(Ordering::SeqCst));
    assert_eq!(recorder.seen(), vec!["start", "cancel"]);
    assert!(
        handle.queue_frame(text("late")).await.is_err(),
        "a finished session takes no frames"
    );
}

#[tokio::test]
async fn end_drains_everything_queued_before_it() {
    let recorder = Recorder::default();
    let session = Session::builder(Pipeline::new().then(Append("!")).then(recorder.clone()))
        .idle_timeout(None)
        .spawn();
    let handle = session.handle();
    for i in 0..1_000 {
        handle
            .queue_frame(text(&i.to_string()))
            .await
            .expect("queued");
    }
    handle.stop_when_done().await.expect("queued");
    assert_eq!(session.join().await, EndReason::Completed);
    let seen = recorder.seen();
    assert_eq!(seen.len(), 1_002);
    assert_eq!(seen[1], "0!");
    assert_eq!(seen[1_000], "999!");
    assert_eq!(seen[1_001], "end");
}

#[tokio::test]
async fn pipelines_nest() {
    let inner = Pipeline::new()
        .then(Append("b"))
        .then(Pipeline::new().then(Append("c")));
    let out = run_processor(
        Pipeline::new().then(Append("a")).then(inner),
        vec![(text("x"), Direction::Downstream)],
    )
    .await;
    let texts: Vec<&str> = out.down.iter().filter_map(text_of).collect();
    assert_eq!(texts, vec!["xabc"]);
}

#[tokio::test]
async fn parallel_branches_see_every_frame_and_merge_without_duplicates() {
    let parallel = ParallelPipeline::new()
        .branch(Append("-1"))
        .branch(Pipeline::new().then(Recorder::default()));
    let out = run_processor(
        parallel,
        vec![
            (text("a"), Direction::Downstream),
            (text("b"), Direction::Downstream),
        ],
    )
    .await;
    let mut texts: Vec<&str> = out.down.iter().filter_map(text_of).collect();
    texts.sort();
    assert_eq!(texts, vec!["a", "a-1", "b", "b-1"]);
    assert_eq!(out.down.iter().filter(|f| f.name() == "start").count(), 1);
    assert_eq!(out.down.iter().filter(|f| f.is_end()).count(), 1);
    assert!(
        out.down.last().is_some_and(Frame::is_end),
        "end leaves after every branch drained"
    );
}

#[tokio::test]
async fn parallel_end_waits_for_the_slowest_branch() {
    let (gate, open, mut started, _) = gate();
    let parallel = ParallelPipeline::new().branch(gate).branch(Append("-fast"));
    let task = tokio::spawn(run_processor(
        parallel,
        vec![(text("slow"), Direction::Downstream)],
    ));
    started.recv().await.expect("job started");
    open.notify_one();
    let out = task.await.expect("ran");
    let texts: Vec<&str> = out.down.iter().filter_map(text_of).collect();
    assert!(
        texts.contains(&"slow") && texts.contains(&"slow-fast"),
        "{texts:?}"
    );
    assert!(out.down.last().is_some_and(Frame::is_end));
}

#[derive(Default)]
struct PushLog(Mutex<Vec<(String, String, FrameId, Direction)>>);

impl Observer for PushLog {
    fn on_push(&self, e: &FramePushed<'_>) {
        self.0.lock().expect("lock").push((
            e.source.to_owned(),
            e.destination.to_owned(),
            e.frame.id,
            e.direction,
        ));
    }
}

#[tokio::test]
async fn observers_see_every_push() {
    let log = Arc::new(PushLog::default());
    let session = Session::builder(
        Pipeline::new()
            .then(Recorder::default())
            .then(Recorder::default()),
    )
    .idle_timeout(None)
    .observer(log.clone())
    .spawn();
    let frame = text("x");
    let id = frame.id;
    session.handle().queue_frame(frame).await.expect("queued");
    session.handle().stop_when_done().await.expect("queued");
    session.join().await;
    let hops: Vec<(String, String)> = log
        .0
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, _, i, _)| *i == id)
        .map(|(s, d, _, _)| (s.clone(), d.clone()))
        .collect();
    assert_eq!(
        hops,
        vec![
            ("source".to_owned(), "Recorder#0".to_owned()),
            ("Recorder#0".to_owned(), "Recorder#1".to_owned()),
            ("Recorder#1".to_owned(), "sink".to_owned()),
        ]
    );
}

/// Fails on "bad", panics on "boom", passes everything else on.
struct Faulty;

impl FrameProcessor for Faulty {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match text_of(&frame) {
            Some("bad") => Err(ProcessorError::new("cannot handle bad")),
            Some("boom") => panic!("exploded"),
            _ => {
                cx.push(frame, direction);
                Ok(())
            }
        }
    }
}

#[tokio::test]
async fn a_stage_error_reaches_the_session_error_handler_and_the_session_goes_on() {
    let (tx, mut errors) = mpsc::unbounded_channel();
    let recorder = Recorder::default();
    let session = Session::builder(Pipeline::new().then(Faulty).then(recorder.clone()))
        .idle_timeout(None)
        .on_error(move |e| {
            let _ = tx.send(e.clone());
        })
        .spawn();
    let handle = session.handle();
    handle
        .queue_frames([text("bad"), text("good")])
        .await
        .expect("queued");
    handle.stop_when_done().await.expect("queued");
    assert_eq!(session.join().await, EndReason::Completed);
    let error = errors.recv().await.expect("an error");
    assert_eq!(error.message, "cannot handle bad");
    assert_eq!(error.processor.as_deref(), Some("Faulty#0"));
    assert!(!error.fatal);
    assert!(recorder.seen().contains(&"good".to_owned()));
}

#[tokio::test]
async fn a_panicking_stage_ends_the_session_with_a_fatal_error_not_a_panic() {
    let session = Session::builder(Faulty).idle_timeout(None).spawn();
    session
        .handle()
        .queue_frame(text("boom"))
        .await
        .expect("queued");
    match session.join().await {
        EndReason::FatalError(message) => assert!(message.contains("exploded"), "{message}"),
        other => panic!("expected a fatal error, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_idle_timeout_fires_after_the_last_activity() {
    let fired = Arc::new(AtomicBool::new(false));
    let flag = fired.clone();
    let started = tokio::time::Instant::now();
    let session = Session::builder(Recorder::default())
        .idle_timeout(Some(Duration::from_secs(5)))
        .on_idle_timeout(move || flag.store(true, Ordering::SeqCst))
        .spawn();
    tokio::time::sleep(Duration::from_secs(4)).await;
    session
        .handle()
        .queue_frame(SystemFrame::BotSpeaking)
        .await
        .expect("queued");
    assert_eq!(session.join().await, EndReason::IdleTimeout);
    assert!(fired.load(Ordering::SeqCst));
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(9),
        "fired at {elapsed:?}, before 5 s after the activity"
    );
    assert!(elapsed < Duration::from_secs(11), "fired late: {elapsed:?}");
}

#[tokio::test]
async fn session_events_report_start_voice_frames_and_end() {
    let session = Session::builder(Recorder::default()).idle_timeout(None);
    let mut events = session.subscribe();
    let session = session.spawn();
    let handle = session.handle();
    handle
        .queue_frame(SystemFrame::UserStartedSpeaking)
        .await
        .expect("queued");
    handle
        .queue_frame(ControlFrame::End(EndFrame::default()))
        .await
        .expect("queued");
    session.join().await;
    let mut types = Vec::new();
    while let Ok(e) = events.try_recv() {
        types.push(
            serde_json::to_value(&e).expect("json")["type"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        );
    }
    assert_eq!(
        types,
        vec!["session_started", "user_started_speaking", "session_ended"]
    );
}

/// Sends an interruption upstream when a user-idle frame passes, as the turn stage does.
struct InterruptsUpstream;

impl FrameProcessor for InterruptsUpstream {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if matches!(frame.body, FrameBody::System(SystemFrame::UserIdle)) {
            cx.push_upstream(SystemFrame::Interruption);
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Signals an interruption that comes back up past it.
struct HeardUpstream(mpsc::UnboundedSender<()>);

impl FrameProcessor for HeardUpstream {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if direction == Direction::Upstream && frame.is_interruption() {
            let _ = self.0.send(());
        }
        cx.push(frame, direction);
        Ok(())
    }
}

#[tokio::test]
async fn an_interruption_going_upstream_informs_and_discards_nothing() {
    let (gate, open, mut started, aborted) = gate();
    let recorder = Recorder::default();
    let (heard_tx, mut heard) = mpsc::unbounded_channel();
    let session = Session::builder(
        Pipeline::new()
            .then(HeardUpstream(heard_tx))
            .then(gate)
            .then(InterruptsUpstream)
            .then(recorder.clone()),
    )
    .idle_timeout(None)
    .spawn();
    let handle = session.handle();
    handle.queue_frame(text("slow")).await.expect("queued");
    started.recv().await.expect("job started");
    for frame in [text("a"), text("b")] {
        handle.queue_frame(frame).await.expect("queued");
    }
    handle
        .queue_frame(SystemFrame::UserIdle)
        .await
        .expect("queued");
    // The gate passed the interruption on while its job and queue waited.
    heard.recv().await.expect("the interruption came up");
    open.notify_one();
    handle.stop_when_done().await.expect("queued");
    assert_eq!(session.join().await, EndReason::Completed);
    assert!(!aborted.load(Ordering::SeqCst), "the slow job was aborted");
    assert_eq!(
        recorder.seen(),
        vec!["start", "user_idle", "slow", "a", "b", "end"]
    );
}
