//! What a telephone call's session is, whatever brought the call (SIP, AudioSocket): the bot
//! built for it, its recording and trace, its keypad, and its end.

use std::sync::Arc;

use tokio::sync::broadcast;

use super::rtvi::RtviInput;
use super::{Admission, App};
use crate::bot::{BotError, SessionInfo};
use crate::context::Message;
use crate::events::{ReportLevel, SessionEvent};
use crate::frames::DataFrame;
use crate::observe::Watched;
use crate::pipeline::{Session, SessionHandle};
use crate::transports::output::AudioSink;

/// A call's running session.
pub(crate) struct CallSession {
    /// Steers the session.
    pub(crate) handle: SessionHandle,
    /// Keys pressed, gathered into entries.
    pub(crate) input: RtviInput,
    /// The session's events.
    pub(crate) events: broadcast::Receiver<SessionEvent>,
    session: Session,
    watching: tokio::task::JoinHandle<crate::observe::journal::Journal>,
    admission: Admission,
}

impl CallSession {
    /// Builds the bot `info` asks for, speaking at `out_rate` into `sink`, and starts it.
    pub(crate) fn start(
        app: &Arc<App>,
        info: &SessionInfo,
        transport: &'static str,
        (out_rate, sink): (u32, Box<dyn AudioSink>),
        admission: Admission,
    ) -> Result<Self, BotError> {
        let mut observing = app.watchers.watch(&Watched {
            id: &info.id,
            bot: info.bot(),
            transport,
            level: ReportLevel::default(),
            consent: info.consents_to_recording(),
            traceparent: None,
            bot_allows: app.bots.observed(info.bot()),
        });
        let bot = app.bots.build(info, out_rate, observing.sink(sink))?;
        let input = RtviInput::new(
            bot.context.clone(),
            bot.params.skip_tts,
            false,
            bot.report_level,
        );
        observing.report_level(bot.report_level);
        let mut builder = Session::builder(bot.pipeline)
            .params(bot.params)
            .resources(bot.resources);
        if let Some(observer) = observing.observer() {
            builder = builder.observer(observer);
        }
        let events = builder.subscribe();
        let watched = builder.subscribe();
        let session = builder.spawn();
        let handle = session.handle();
        admission.attach(handle.clone());
        let watching = tokio::spawn(observing.follow(watched, handle.clone()));
        Ok(Self {
            handle,
            input,
            events,
            session,
            watching,
            admission,
        })
    }

    /// Ends the session (the call is over) and waits for its recording; its slot is free after.
    pub(crate) async fn end(self) {
        self.handle.cancel();
        let _ = self.session.join().await;
        let _ = self.watching.await;
        drop(self.admission);
    }
}

/// A transfer the bot asked for did not happen: the caller is still on the line, so the bot
/// is told, says so, and carries on.
pub(crate) async fn transfer_failed(handle: &SessionHandle, why: &str) {
    tracing::info!(%why, "a transfer failed");
    let note = Message::system(format!(
        "The transfer did not happen ({why}). Tell the caller, and carry on."
    ));
    let _ = handle
        .queue_frame(DataFrame::LlmMessagesAppend {
            messages: vec![note],
            run_llm: true,
        })
        .await;
}
