//! A realtime session's state across its connections, sans-IO: it runs on the shared WebSocket
//! driver ([`crate::ws`]) and answers each thing that happens (a connection opened or
//! lost, a command from the service, a provider's message, the time) with messages to send and
//! [`Action`]s for the service's pump: frames, events, tool calls.
//!
//! It owns what lives across reconnects: the ledger of items delivered (each exactly once), the
//! response being received (asked for again when a loss cut it off), the bot audio being played
//! (to truncate it where the user cut in), and the set-up of each connection, which is not ready
//! until the provider confirms it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{
    DeliveryKind, PlayedAudio, RealtimeEvent, RealtimeOptions, RealtimeProtocol, SessionSetup,
};
use crate::pricing::account_response;
use crate::ws::{ConnectRequest, Message as WsMessage, Step, Tick, WsCore, WsError};
use voxide_core::context::{ContextHandle, Message, StopReason};
use voxide_core::events::Event;
use voxide_core::frames::{
    AudioFrame, ControlFrame, DataFrame, ErrorFrame, Frame, FunctionCallRequest,
    LlmResponseSummary, MetricsData, StartParams, SystemFrame, TokenUsage, Transcription, TtsText,
};
use voxide_core::pipeline::Direction;

/// What the service tells its connection.
#[derive(Debug)]
pub(super) enum Command {
    Audio(Vec<i16>),
    Deliver,
    Interrupt,
    UserStarted,
    UserStopped,
}

/// What the core asks of the service's pump, in order.
pub(super) enum Action {
    /// A frame into the pipeline.
    Push(Frame, Direction),
    /// An event for the session's observers.
    Emit(Event),
    /// The model calls these functions.
    RunTools(Vec<FunctionCallRequest>),
    /// The provider withdrew these calls.
    CancelTools(Vec<String>),
    /// The user cut in: the calls that end with an interruption are cancelled.
    CancelToolsForInterruption,
    /// The connection is given up for good.
    Fatal(String),
}

/// The response being received.
#[derive(Default)]
struct Response {
    /// A response start went downstream and its end has not.
    open: bool,
    /// When the provider was asked to respond and has not started yet.
    requested_at: Option<Instant>,
    /// When the provider last said something about the open response.
    last_event_at: Option<Instant>,
    /// Another response is wanted once this one ends.
    respond_after: bool,
    /// The rest of the current response was cut off by the user: drop it.
    discarding: bool,
    /// Where the response's first message will go in the context (for a late user transcript).
    context_index: usize,
    /// Transcript of the bot's words not yet reported as a spoken sentence.
    sentence: String,
    usage: TokenUsage,
}

/// Audio of the item being played.
struct Playing {
    item_id: Option<String>,
    first_at: Instant,
    received_ms: u64,
}

/// Where the current connection stands.
enum Link {
    /// No socket.
    Down,
    /// The set-up went; the provider has not confirmed it by `due`. Commands wait in order.
    SettingUp { due: Instant, waiting: Vec<Command> },
    /// The conversation runs.
    Ready,
}

/// One realtime session's protocol state, sans-IO.
pub(super) struct RealtimeCore<P: RealtimeProtocol> {
    protocol: P,
    options: RealtimeOptions,
    output_rate: u32,
    context: ContextHandle,
    params: StartParams,
    /// The session's tools and async functions, for each set-up.
    setup: Box<dyn Fn() -> SessionSetup + Send>,
    link: Link,
    /// Keys of every item delivered so far, across reconnects.
    delivered: HashSet<String>,
    /// True once a connection has been set up (later ones are reconnects).
    set_up: bool,
    /// The instructions and tools the session was last given, as the provider's update.
    configured: Option<String>,
    /// Failed attempts since the last connection was ready.
    attempts: u32,
    response: Response,
    played: Option<Playing>,
    /// What the event being handled sends and asks for.
    send: Vec<WsMessage>,
    actions: Vec<Action>,
}

impl<P: RealtimeProtocol> RealtimeCore<P> {
    pub(super) fn new(
        protocol: P,
        options: RealtimeOptions,
        context: ContextHandle,
        params: StartParams,
        setup: Box<dyn Fn() -> SessionSetup + Send>,
    ) -> Self {
        Self {
            output_rate: protocol.output_rate(),
            protocol,
            options,
            context,
            params,
            setup,
            link: Link::Down,
            delivered: HashSet::new(),
            set_up: false,
            configured: None,
            attempts: 0,
            response: Response::default(),
            played: None,
            send: Vec::new(),
            actions: Vec::new(),
        }
    }

    /// What the event handled asked for.
    fn step(&mut self) -> Step<Action> {
        (
            std::mem::take(&mut self.send),
            std::mem::take(&mut self.actions),
        )
    }

    fn send(&mut self, message: &serde_json::Value) {
        self.send.push(WsMessage::Text(message.to_string().into()));
    }

    fn push(&mut self, frame: Frame, direction: Direction) {
        self.actions.push(Action::Push(frame, direction));
    }

    fn error(&mut self, message: String) {
        let mut error = ErrorFrame::new(message);
        error.processor = Some(super::PROCESSOR.to_owned());
        self.push(
            SystemFrame::Error(Box::new(error)).into(),
            Direction::Upstream,
        );
    }

    fn command(&mut self, command: Command, now: Instant) {
        match command {
            Command::Audio(samples) => {
                let message = self.protocol.audio(&samples);
                self.send(&message);
            }
            Command::Deliver => self.deliver(false, now),
            Command::Interrupt => self.interrupt(now),
            Command::UserStarted => {
                for message in self.protocol.user_started() {
                    self.send(&message);
                }
            }
            Command::UserStopped => {
                let messages = self.protocol.user_stopped();
                if !messages.is_empty() && !self.response.open {
                    self.response.requested_at = Some(now);
                }
                for message in messages {
                    self.send(&message);
                }
            }
        }
    }

    /// The provider confirmed the set-up: the history (first connection) or what is still owed
    /// (a reconnect), a response the loss cut off asked for again, then the commands that waited.
    fn ready(&mut self, waiting: Vec<Command>, now: Instant) {
        let reconnect = self.set_up;
        self.link = Link::Ready;
        self.deliver(!reconnect, now);
        self.set_up = true;
        let restart = std::mem::take(&mut self.response.respond_after);
        if restart {
            self.respond(now);
        }
        if reconnect {
            let attempts = std::mem::take(&mut self.attempts);
            self.actions.push(Action::Emit(Event::LlmReconnected {
                attempts,
                restarted_response: restart,
            }));
        }
        self.attempts = 0;
        for command in waiting {
            self.command(command, now);
        }
    }

    /// Sends every item not delivered yet: all of them on a fresh session, tool results and
    /// partial results afterwards. Asks for a response when a tool result went out.
    fn deliver(&mut self, history: bool, now: Instant) {
        if !history {
            self.reconfigure();
        }
        let messages = self.context.snapshot().messages;
        let mut answer = false;
        for delivery in self.protocol.deliveries(&messages) {
            if self.delivered.contains(&delivery.key) {
                continue;
            }
            if history || delivery.kind != DeliveryKind::History {
                for message in &delivery.messages {
                    self.send(message);
                }
                tracing::debug!(key = %delivery.key, "delivered to the realtime LLM");
                answer |= !history && delivery.kind == DeliveryKind::ToolResult;
            }
            self.delivered.insert(delivery.key);
        }
        if answer {
            self.respond(now);
        }
    }

    /// Gives the session the context's instructions and tools if they changed since it was last
    /// given them (a flow moved on), before what is delivered after.
    fn reconfigure(&mut self) {
        let setup = (self.setup)();
        let Some(update) = self.protocol.update(&setup) else {
            return;
        };
        let fingerprint = serde_json::Value::Array(update.clone()).to_string();
        if self.configured.as_deref() == Some(fingerprint.as_str()) {
            return;
        }
        tracing::debug!("the realtime session gets new instructions and tools");
        for message in &update {
            self.send(message);
        }
        self.configured = Some(fingerprint);
    }

    /// Asks for a response now, or once the current one has ended.
    fn respond(&mut self, now: Instant) {
        if self.response.open {
            self.response.respond_after = true;
            return;
        }
        if let Some(message) = self.protocol.respond() {
            self.send(&message);
            self.response.requested_at = Some(now);
        }
    }

    /// The user cut in: stop the response where it was heard and drop the rest of it.
    fn interrupt(&mut self, now: Instant) {
        if !self.response.open && self.played.is_none() {
            return;
        }
        let played = self.played.take().map(|p| PlayedAudio {
            item_id: p.item_id,
            played_ms: (now.duration_since(p.first_at).as_millis() as u64).min(p.received_ms),
        });
        for message in self.protocol.interrupt(played.as_ref()) {
            self.send(&message);
        }
        if self.response.open {
            self.flush_sentence();
            self.response.open = false;
            self.response.discarding = true;
            self.response.usage = TokenUsage::default();
        }
    }

    /// The bot's voice: played on, and timed for a cut-in, unless the response is discarded.
    fn audio(&mut self, samples: Vec<i16>, item_id: Option<String>, now: Instant) {
        if self.response.discarding {
            return;
        }
        self.open_response(now);
        let rate = self.output_rate.max(1);
        let ms = samples.len() as u64 * 1000 / u64::from(rate);
        match &mut self.played {
            Some(p) if p.item_id == item_id => p.received_ms += ms,
            _ => {
                self.played = Some(Playing {
                    item_id,
                    first_at: now,
                    received_ms: ms,
                })
            }
        }
        let frame = AudioFrame::new(samples, rate, 1);
        self.push(DataFrame::OutputAudio(frame).into(), Direction::Downstream);
    }

    /// The bot's words, a sentence at a time into the context.
    fn bot_text(&mut self, text: String, now: Instant) {
        if self.response.discarding {
            return;
        }
        self.open_response(now);
        self.response.sentence.push_str(&text);
        self.push(DataFrame::LlmText(text).into(), Direction::Downstream);
        let sentence = self.response.sentence.trim_end();
        if sentence.ends_with(['.', '!', '?']) {
            self.flush_sentence();
        }
    }

    fn event(&mut self, event: RealtimeEvent, now: Instant) {
        let down = Direction::Downstream;
        match event {
            RealtimeEvent::Ready => {}
            RealtimeEvent::ResponseStarted => self.open_response(now),
            RealtimeEvent::Audio { samples, item_id } => self.audio(samples, item_id, now),
            RealtimeEvent::BotText(text) => self.bot_text(text, now),
            RealtimeEvent::UserTranscript { text, is_final } => {
                let transcription = Box::new(Transcription::new(text.trim(), "user"));
                if is_final {
                    if !text.trim().is_empty() {
                        self.record_user(text.trim());
                    }
                    self.push(DataFrame::Transcription(transcription).into(), down);
                } else {
                    self.push(DataFrame::InterimTranscription(transcription).into(), down);
                }
            }
            RealtimeEvent::UserStarted => {
                self.push(SystemFrame::UserStartedSpeaking.into(), down);
                if self.response.open || self.played.is_some() {
                    self.barge_in(now);
                }
            }
            RealtimeEvent::Interrupted => self.barge_in(now),
            RealtimeEvent::ToolCallsCancelled(ids) => {
                self.actions.push(Action::CancelTools(ids));
            }
            RealtimeEvent::UserStopped => {
                self.push(SystemFrame::UserStoppedSpeaking.into(), down);
                self.response.requested_at.get_or_insert(now);
            }
            RealtimeEvent::ToolCalls(calls) => {
                if !self.response.discarding && !calls.is_empty() {
                    self.open_response(now);
                    self.actions.push(Action::RunTools(calls));
                }
            }
            RealtimeEvent::Usage(usage) => self.response.usage += usage,
            RealtimeEvent::ResponseDone { cancelled } => {
                self.played = None;
                if self.response.discarding {
                    self.response.discarding = false;
                } else if self.response.open {
                    let reason = if cancelled {
                        StopReason::Aborted
                    } else {
                        StopReason::Stop
                    };
                    self.end_response(reason);
                }
                self.response.requested_at = None;
                if std::mem::take(&mut self.response.respond_after) {
                    self.respond(now);
                }
            }
            RealtimeEvent::Error(message) => {
                tracing::warn!(%message, "the realtime LLM reported an error");
                self.error(format!("realtime LLM error: {message}"));
            }
        }
    }

    /// The provider heard the user cut in: everything downstream stops, and so does the response.
    fn barge_in(&mut self, now: Instant) {
        self.push(SystemFrame::Interruption.into(), Direction::Upstream);
        self.push(SystemFrame::Interruption.into(), Direction::Downstream);
        self.actions.push(Action::CancelToolsForInterruption);
        self.interrupt(now);
    }

    /// Writes a final user transcript into the context, before the response it led to.
    fn record_user(&self, text: &str) {
        let mut context = self.context.lock();
        let at = if self.response.open {
            self.response.context_index.min(context.messages.len())
        } else {
            context.messages.len()
        };
        context.messages.insert(at, Message::user(text));
    }

    fn open_response(&mut self, now: Instant) {
        if self.response.open {
            return;
        }
        if let Some(asked) = self.response.requested_at.take()
            && self.params.enable_metrics
        {
            let ttfb = MetricsData::Ttfb {
                processor: super::PROCESSOR.to_owned(),
                model: Some(self.protocol.model().to_owned()),
                seconds: now.duration_since(asked).as_secs_f64(),
            };
            self.push(
                SystemFrame::Metrics(vec![ttfb]).into(),
                Direction::Downstream,
            );
        }
        self.response.open = true;
        self.response.discarding = false;
        self.response.last_event_at = Some(now);
        self.response.usage = TokenUsage::default();
        self.response.context_index = self.context.lock().messages.len();
        self.push(
            ControlFrame::LlmFullResponseStart.into(),
            Direction::Downstream,
        );
    }

    /// Reports the bot's words so far as a spoken sentence (the provider speaks them itself).
    fn flush_sentence(&mut self) {
        let sentence = std::mem::take(&mut self.response.sentence);
        let text = sentence.trim();
        if !text.is_empty() {
            let spoken = TtsText::spoken(text);
            self.push(DataFrame::TtsText(spoken).into(), Direction::Downstream);
        }
    }

    fn end_response(&mut self, stop_reason: StopReason) {
        let down = Direction::Downstream;
        self.flush_sentence();
        self.response.open = false;
        let summary = LlmResponseSummary {
            provider: self.protocol.provider().to_owned(),
            model: self.protocol.model().to_owned(),
            usage: std::mem::take(&mut self.response.usage),
            cost_usd: None,
            stop_reason,
            thinking: String::new(),
            provider_messages: Vec::new(),
        };
        let prices = &self.options.functions.prices;
        let usage_metrics = self.params.enable_usage_metrics;
        for frame in account_response(summary, prices, usage_metrics, super::PROCESSOR) {
            self.push(frame, down);
        }
    }

    /// When the response asked for, or under way, is overdue.
    fn response_due(&self) -> Option<Instant> {
        let since = self.response.requested_at.or(if self.response.open {
            self.response.last_event_at
        } else {
            None
        })?;
        Some(since + self.options.response_timeout)
    }

    fn timed_out(&mut self) {
        let seconds = self.options.response_timeout.as_secs_f64();
        tracing::warn!(seconds, "the realtime LLM gave no answer");
        self.actions
            .push(Action::Emit(Event::LlmCompletionTimeout { seconds }));
        self.error(format!("the realtime LLM gave no answer for {seconds} s"));
        self.response.requested_at = None;
        if self.response.open {
            self.end_response(StopReason::Error);
            // Whatever still comes for it is late: drop it.
            self.response.discarding = true;
        }
    }

    /// The text of a provider's message (some, like Gemini Live, send JSON in binary frames).
    fn text(message: WsMessage) -> Option<String> {
        match message {
            WsMessage::Text(text) => Some(text.to_string()),
            WsMessage::Binary(bytes) => match String::from_utf8(bytes.to_vec()) {
                Ok(text) => Some(text),
                Err(_) => {
                    voxide_core::warnings::warn(
                        "realtime_binary_not_utf8",
                        "a binary realtime message that is not UTF-8 was ignored",
                    );
                    None
                }
            },
            _ => None,
        }
    }
}

impl<P: RealtimeProtocol> WsCore for RealtimeCore<P> {
    type Input = Command;
    type Output = Action;

    fn request(&self) -> Result<ConnectRequest, WsError> {
        self.protocol
            .request()
            .map_err(|e| WsError::Permanent(e.to_string()))
    }

    fn opened(&mut self, now: Instant) -> Vec<WsMessage> {
        let setup = (self.setup)();
        for message in self.protocol.setup(&setup) {
            self.send(&message);
        }
        self.configured = self
            .protocol
            .update(&setup)
            .map(|u| serde_json::Value::Array(u).to_string());
        self.link = Link::SettingUp {
            due: now + self.options.reconnect.setup_timeout,
            waiting: Vec::new(),
        };
        std::mem::take(&mut self.send)
    }

    fn lost(&mut self, _now: Instant) -> Vec<Action> {
        self.link = Link::Down;
        // A response cut off by the loss ends here; it is asked for again once reconnected.
        if self.response.open {
            self.end_response(StopReason::Error);
            self.response.respond_after = true;
        }
        if self.response.requested_at.take().is_some() {
            self.response.respond_after = true;
        }
        self.played = None;
        self.step().1
    }

    fn input(&mut self, command: Command, now: Instant) -> Step<Action> {
        match &mut self.link {
            // Audio and commands that come while disconnected are stale by the time a
            // connection is back; what is owed is delivered from the ledger then.
            Link::Down => {}
            Link::SettingUp { waiting, .. } => waiting.push(command),
            Link::Ready => self.command(command, now),
        }
        self.step()
    }

    fn message(&mut self, message: WsMessage, now: Instant) -> Result<Step<Action>, WsError> {
        let Some(text) = Self::text(message) else {
            return Ok((Vec::new(), Vec::new()));
        };
        let events = match self.protocol.parse(&text) {
            Ok(events) => events,
            Err(e) => {
                voxide_core::warnings::warn(
                    "realtime_unreadable_event",
                    format_args!("unreadable realtime event ignored: {e}"),
                );
                return Ok((Vec::new(), Vec::new()));
            }
        };
        if let Link::SettingUp { .. } = self.link {
            // Only the set-up's answer matters until the provider confirms it.
            for event in events {
                match event {
                    RealtimeEvent::Ready => {
                        let Link::SettingUp { waiting, .. } =
                            std::mem::replace(&mut self.link, Link::Ready)
                        else {
                            break;
                        };
                        self.ready(waiting, now);
                        break;
                    }
                    RealtimeEvent::Error(e) => return Err(WsError::Passing(e)),
                    _ => {}
                }
            }
            return Ok(self.step());
        }
        if self.response.open {
            self.response.last_event_at = Some(now);
        }
        for event in events {
            self.event(event, now);
        }
        Ok(self.step())
    }

    fn tick(&mut self, now: Instant) -> (Tick, Vec<Action>) {
        let mut tick = Tick::default();
        match &self.link {
            Link::SettingUp { due, .. } if now >= *due => {
                tick.reconnect = Some("the provider did not confirm the session set-up".into());
            }
            Link::Ready if self.response_due().is_some_and(|due| now >= due) => self.timed_out(),
            _ => {}
        }
        let (send, actions) = self.step();
        tick.send = send;
        (tick, actions)
    }

    fn next_deadline(&self) -> Option<Instant> {
        match &self.link {
            Link::SettingUp { due, .. } => Some(*due),
            Link::Ready => self.response_due(),
            Link::Down => None,
        }
    }

    fn closing(&mut self) -> Vec<WsMessage> {
        Vec::new()
    }

    /// A connection counts once the provider confirmed its set-up.
    fn established(&self) -> bool {
        matches!(self.link, Link::Ready)
    }

    fn failed(&mut self, error: &WsError) -> Vec<Action> {
        let message = format!(
            "the realtime LLM ({}) could not be reached after {} attempts: {error}",
            self.protocol.provider(),
            self.attempts.max(1)
        );
        tracing::error!("{message}");
        vec![Action::Fatal(message)]
    }

    fn reconnecting(&mut self, attempt: u32, delay: Duration, error: &WsError) -> Vec<Action> {
        self.attempts = attempt;
        vec![Action::Emit(Event::LlmReconnecting {
            attempt,
            delay_ms: delay.as_millis() as u64,
            reason: error.to_string(),
        })]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::openai_realtime::{OpenAiRealtime, OpenAiRealtimeSettings, TurnDetection};
    use crate::ws::WsCore;
    use voxide_core::context::LlmContext;

    fn core(turns: TurnDetection) -> (RealtimeCore<OpenAiRealtime>, Instant) {
        let protocol = OpenAiRealtime::new(OpenAiRealtimeSettings {
            turn_detection: turns,
            ..OpenAiRealtimeSettings::new("k")
        });
        let context = ContextHandle::new(LlmContext::new(vec![
            Message::system("Be brief."),
            Message::user("Hi."),
        ]));
        let setup = Box::new(|| SessionSetup {
            messages: Vec::new(),
            tools: Default::default(),
            tool_choice: None,
            async_functions: Vec::new(),
        });
        let core = RealtimeCore::new(
            protocol,
            RealtimeOptions::default(),
            context,
            StartParams::default(),
            setup,
        );
        (core, Instant::now())
    }

    fn server(json: serde_json::Value) -> WsMessage {
        WsMessage::Text(json.to_string().into())
    }

    fn kinds(sent: &[WsMessage]) -> Vec<String> {
        sent.iter()
            .filter_map(|m| match m {
                WsMessage::Text(t) => serde_json::from_str::<serde_json::Value>(t).ok(),
                _ => None,
            })
            .map(|v| v["type"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    fn updated() -> WsMessage {
        server(serde_json::json!({"type": "session.updated", "session": {}}))
    }

    #[test]
    fn commands_wait_for_the_confirmed_set_up_and_history_goes_first() {
        let (mut core, now) = core(TurnDetection::ServerVad);
        assert_eq!(kinds(&core.opened(now)), ["session.update"]);
        assert!(!core.established());
        let (sent, _) = core.input(Command::Audio(vec![0; 480]), now);
        assert!(sent.is_empty(), "audio waits for the set-up");
        let (sent, _) = core.message(updated(), now).expect("valid");
        assert!(core.established());
        assert_eq!(
            kinds(&sent),
            ["conversation.item.create", "input_audio_buffer.append"]
        );
        // The history is delivered once: a context update sends nothing new.
        let (sent, _) = core.input(Command::Deliver, now);
        assert!(sent.is_empty());
    }

    #[test]
    fn an_unconfirmed_set_up_asks_for_a_reconnect() {
        let (mut core, now) = core(TurnDetection::ServerVad);
        core.opened(now);
        let due = core.next_deadline().expect("a set-up deadline");
        let (tick, _) = core.tick(due);
        assert!(tick.reconnect.is_some());
        // Audio while no socket is open is stale, and dropped.
        core.lost(due);
        assert!(core.input(Command::Audio(vec![0; 480]), due).0.is_empty());
        assert_eq!(core.next_deadline(), None);
    }

    #[test]
    fn a_response_cut_off_by_a_lost_socket_ends_and_is_asked_for_again() {
        let (mut core, now) = core(TurnDetection::Local);
        core.opened(now);
        core.message(updated(), now).expect("valid");
        let (sent, _) = core.input(Command::UserStopped, now);
        assert_eq!(
            kinds(&sent),
            ["input_audio_buffer.commit", "response.create"]
        );
        let created =
            server(serde_json::json!({"type": "response.created", "response": {"id": "r1"}}));
        core.message(created, now).expect("valid");
        let ended = core.lost(now);
        assert!(
            ended.iter().any(|a| matches!(
                a,
                Action::Push(f, _) if matches!(f.body, voxide_core::frames::FrameBody::Control(ControlFrame::LlmFullResponseEnd))
            )),
            "the cut response ends"
        );
        let said = core.reconnecting(
            1,
            Duration::from_millis(500),
            &WsError::Passing("gone".into()),
        );
        assert!(matches!(
            &said[0],
            Action::Emit(Event::LlmReconnecting { attempt: 1, .. })
        ));
        core.opened(now);
        let (sent, said) = core.message(updated(), now).expect("valid");
        assert_eq!(
            kinds(&sent),
            ["response.create"],
            "history is not sent again"
        );
        assert!(said.iter().any(|a| matches!(
            a,
            Action::Emit(Event::LlmReconnected {
                attempts: 1,
                restarted_response: true
            })
        )));
    }

    #[test]
    fn an_overdue_response_times_out_with_an_error_not_a_fatal_one() {
        let (mut core, now) = core(TurnDetection::Local);
        core.opened(now);
        core.message(updated(), now).expect("valid");
        core.input(Command::UserStopped, now);
        let due = core.next_deadline().expect("a response deadline");
        let (tick, said) = core.tick(due);
        assert_eq!(tick.reconnect, None);
        assert!(
            said.iter()
                .any(|a| matches!(a, Action::Emit(Event::LlmCompletionTimeout { .. })))
        );
        assert!(!said.iter().any(|a| matches!(a, Action::Fatal(_))));
        assert_eq!(core.next_deadline(), None);
    }
}
