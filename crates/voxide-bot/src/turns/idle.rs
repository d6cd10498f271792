//! Users who go quiet: after the bot has spoken and nobody has said anything for a while, the
//! bot checks in ("Are you still there?"), up to a few times, then says goodbye and ends the
//! session (pipecat's user-idle controller, LiveKit's `user_away_timeout`).
//!
//! [`IdleClock`] is the sans-IO rule: who is speaking and the time go in, what to say comes out.
//! [`UserIdle`] drives it as a stage between the LLM and the voice: it watches the user's and
//! the bot's speech pass by and, at the clock's deadline, speaks as a response of its own (the
//! voice says it, the assistant aggregator writes it into the conversation).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::frames::{ControlFrame, EndFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

/// What the bot does when the user goes quiet.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleParams {
    /// Quiet, after the bot or the user last spoke, before the bot speaks up.
    pub after: Duration,
    /// What it says each time, in turn; the user speaking starts the list again.
    pub check_ins: Vec<String>,
    /// What it says once the check-ins are spent, before it ends the session.
    pub goodbye: String,
}

/// What the clock asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Idle {
    /// Say this, and keep waiting.
    CheckIn(String),
    /// Say this, and end the session once it is said.
    Goodbye(String),
}

/// Who holds the floor, and since when nobody has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Floor {
    /// Nobody has spoken yet: the user is not kept waiting for.
    Unopened,
    /// The user or the bot is speaking.
    Taken,
    /// Nobody speaks, since then.
    Quiet(Instant),
    /// The goodbye was said: nothing more.
    Closed,
}

/// The idle rule, sans-IO.
#[derive(Debug, Clone)]
pub struct IdleClock {
    params: IdleParams,
    floor: Floor,
    user_speaking: bool,
    bot_speaking: bool,
    /// Check-ins said since the user last spoke.
    said: usize,
}

impl IdleClock {
    /// A clock that starts once someone has spoken.
    pub fn new(params: IdleParams) -> Self {
        Self {
            params,
            floor: Floor::Unopened,
            user_speaking: false,
            bot_speaking: false,
            said: 0,
        }
    }

    /// The user started (`true`) or stopped speaking at `now`.
    pub fn user(&mut self, speaking: bool, now: Instant) {
        self.user_speaking = speaking;
        if speaking {
            self.said = 0;
        }
        self.settle(now);
    }

    /// The bot started (`true`) or stopped speaking at `now`.
    pub fn bot(&mut self, speaking: bool, now: Instant) {
        self.bot_speaking = speaking;
        self.settle(now);
    }

    fn settle(&mut self, now: Instant) {
        if self.floor == Floor::Closed {
            return;
        }
        self.floor = if self.user_speaking || self.bot_speaking {
            Floor::Taken
        } else {
            Floor::Quiet(now)
        };
    }

    /// When the bot speaks up, if nobody speaks before.
    pub fn deadline(&self) -> Option<Instant> {
        match self.floor {
            Floor::Quiet(since) => Some(since + self.params.after),
            Floor::Unopened | Floor::Taken | Floor::Closed => None,
        }
    }

    /// What to say at `now`, if the quiet has lasted.
    pub fn tick(&mut self, now: Instant) -> Option<Idle> {
        if self.deadline().is_none_or(|at| now < at) {
            return None;
        }
        // Quiet again from now: the bot's own words will take the floor when they play.
        self.floor = Floor::Quiet(now);
        match self.params.check_ins.get(self.said) {
            Some(line) => {
                self.said += 1;
                Some(Idle::CheckIn(line.clone()))
            }
            None => {
                self.floor = Floor::Closed;
                Some(Idle::Goodbye(self.params.goodbye.clone()))
            }
        }
    }
}

/// The stage: speaks up when the user goes quiet.
pub struct UserIdle {
    shared: Arc<Shared>,
}

struct Shared {
    clock: Mutex<IdleClock>,
    /// The deadline moved: the timer task looks again.
    wake: Notify,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl UserIdle {
    /// The stage for `params`.
    pub fn new(params: IdleParams) -> Self {
        Self {
            shared: Arc::new(Shared {
                clock: Mutex::new(IdleClock::new(params)),
                wake: Notify::new(),
            }),
        }
    }
}

impl FrameProcessor for UserIdle {
    fn name(&self) -> &str {
        "UserIdle"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let now = Instant::now();
        // Who starts or stops speaking: (the user?, speaking?).
        let turn = match &frame.body {
            FrameBody::System(SystemFrame::Start(_)) => {
                cx.spawn(drive(self.shared.clone(), cx.pusher()));
                None
            }
            FrameBody::System(SystemFrame::UserStartedSpeaking) => Some((true, true)),
            FrameBody::System(SystemFrame::UserStoppedSpeaking) => Some((true, false)),
            FrameBody::System(SystemFrame::BotStartedSpeaking) => Some((false, true)),
            FrameBody::System(SystemFrame::BotStoppedSpeaking) => Some((false, false)),
            _ => None,
        };
        if let Some((user, speaking)) = turn {
            let mut clock = lock(&self.shared.clock);
            if user {
                clock.user(speaking, now);
            } else {
                clock.bot(speaking, now);
            }
        }
        let moved = turn.is_some();
        cx.push(frame, direction);
        if moved {
            self.shared.wake.notify_one();
        }
        Ok(())
    }
}

/// The timer task: at the clock's deadline, the bot speaks up.
async fn drive(shared: Arc<Shared>, pusher: FramePusher) -> Result<(), ProcessorError> {
    loop {
        let deadline = lock(&shared.clock).deadline();
        tokio::select! {
            () = shared.wake.notified() => continue,
            () = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        let idle = lock(&shared.clock).tick(Instant::now());
        let (line, ending) = match idle {
            Some(Idle::CheckIn(line)) => (line, false),
            Some(Idle::Goodbye(line)) => (line, true),
            None => continue,
        };
        tracing::info!(ending, "the user went quiet: the bot speaks up");
        for frame in Frame::response(line) {
            let _ = pusher.push(frame, Direction::Downstream).await;
        }
        if ending {
            let end = EndFrame {
                reason: Some("the user went quiet".into()),
            };
            let _ = pusher
                .push(ControlFrame::End(end).into(), Direction::Downstream)
                .await;
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EndReason;
    use crate::pipeline::{Pipeline, Session};

    /// Keeps what the bot would say.
    struct Said(tokio::sync::mpsc::UnboundedSender<String>);

    impl FrameProcessor for Said {
        fn name(&self) -> &str {
            "Said"
        }

        fn process(
            &mut self,
            frame: Frame,
            direction: Direction,
            cx: &mut FrameContext<'_>,
        ) -> Result<(), ProcessorError> {
            if let FrameBody::Data(crate::frames::DataFrame::LlmText(text)) = &frame.body {
                let _ = self.0.send(text.clone());
            }
            cx.push(frame, direction);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_user_is_asked_twice_then_told_goodbye_and_the_session_ends() {
        let (tx, mut said) = tokio::sync::mpsc::unbounded_channel();
        let pipeline = Pipeline::new().then(UserIdle::new(params())).then(Said(tx));
        let session = Session::builder(pipeline).idle_timeout(None).spawn();
        let handle = session.handle();
        let started = Instant::now();
        for frame in [
            SystemFrame::BotStartedSpeaking,
            SystemFrame::BotStoppedSpeaking,
        ] {
            handle.queue_frame(frame).await.expect("queued");
        }
        let first = said.recv().await.expect("a check-in");
        assert_eq!(first, "Are you still there?");
        assert_eq!(started.elapsed(), Duration::from_secs(8));
        // The user answers, then goes quiet again: the check-ins start over.
        for frame in [
            SystemFrame::UserStartedSpeaking,
            SystemFrame::UserStoppedSpeaking,
        ] {
            handle.queue_frame(frame).await.expect("queued");
        }
        assert_eq!(said.recv().await.as_deref(), Some("Are you still there?"));
        assert_eq!(
            said.recv().await.as_deref(),
            Some("Still here if you need me.")
        );
        assert_eq!(said.recv().await.as_deref(), Some("Goodbye!"));
        assert_eq!(started.elapsed(), Duration::from_secs(32));
        assert_eq!(session.join().await, EndReason::Completed);
    }

    fn params() -> IdleParams {
        IdleParams {
            after: Duration::from_secs(8),
            check_ins: vec![
                "Are you still there?".into(),
                "Still here if you need me.".into(),
            ],
            goodbye: "Goodbye!".into(),
        }
    }

    #[test]
    fn nobody_is_kept_waiting_for_before_anyone_has_spoken() {
        let clock = IdleClock::new(params());
        assert_eq!(clock.deadline(), None);
    }

    #[test]
    fn the_bot_checks_in_after_the_quiet_then_says_goodbye_and_the_user_speaking_starts_over() {
        let t0 = Instant::now();
        let secs = |s: u64| t0 + Duration::from_secs(s);
        let mut clock = IdleClock::new(params());
        clock.bot(true, t0);
        assert_eq!(clock.deadline(), None, "not while the bot speaks");
        clock.bot(false, secs(2));
        assert_eq!(clock.deadline(), Some(secs(10)));
        assert_eq!(clock.tick(secs(9)), None);
        assert_eq!(
            clock.tick(secs(10)),
            Some(Idle::CheckIn("Are you still there?".into()))
        );
        // The check-in plays, and the quiet starts again after it.
        clock.bot(true, secs(10));
        clock.bot(false, secs(12));
        // The user answers: the list starts over.
        clock.user(true, secs(15));
        assert_eq!(clock.deadline(), None, "not while the user speaks");
        clock.user(false, secs(16));
        assert_eq!(
            clock.tick(secs(24)),
            Some(Idle::CheckIn("Are you still there?".into()))
        );
        assert_eq!(
            clock.tick(secs(32)),
            Some(Idle::CheckIn("Still here if you need me.".into()))
        );
        assert_eq!(clock.tick(secs(40)), Some(Idle::Goodbye("Goodbye!".into())));
        assert_eq!(clock.deadline(), None, "nothing after the goodbye");
        clock.user(true, secs(41));
        clock.user(false, secs(42));
        assert_eq!(clock.deadline(), None);
    }
}
