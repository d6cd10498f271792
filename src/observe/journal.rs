//! A session's events folded into turns: who spoke when, what each service did for the turn
//! and how long it took. The journal is what a transcript file holds, what a trace is made
//! of and what a report draws; it is built from [`SessionEvent`]s alone, so it sees a
//! session exactly as its event stream tells it, on the session's clock.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::TokenUsage;
use crate::events::{Event, ReportLevel, SessionEvent};
use crate::frames::MetricsData;

/// Turns a session may hold before the oldest lose their detail: a call of hours is bounded.
pub const MAX_TURNS: usize = 2_000;
/// Pieces of text (transcripts, sentences) kept per turn.
const MAX_TEXTS: usize = 64;
/// Tool calls kept per turn.
const MAX_TOOLS: usize = 32;
/// Characters of a tool's arguments or result kept.
const MAX_VALUE_CHARS: usize = 2_000;
/// Errors kept per session.
const MAX_ERRORS: usize = 64;

/// Milliseconds on the session's clock.
pub type Millis = u64;

/// One interval on the session's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interval {
    /// Its start.
    pub start_ms: Millis,
    /// Its end, once it has one.
    pub end_ms: Option<Millis>,
}

impl Interval {
    fn at(t: Millis) -> Self {
        Self {
            start_ms: t,
            end_ms: None,
        }
    }

    fn is_open(&self) -> bool {
        self.end_ms.is_none()
    }
}

/// The whole session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    /// The session's id.
    pub session: String,
    /// The bot it ran, where the client named one.
    pub bot: Option<String>,
    /// How the client reached it: `websocket`, `twilio`, `webrtc`, `file`.
    pub transport: String,
    /// Wall-clock start, Unix milliseconds (the session's clock counts from here).
    pub started_unix_ms: u64,
    /// When and why it ended.
    pub ended: Option<Ended>,
    /// Its turns, in order; the first may be the bot's greeting, with no user in it.
    pub turns: Vec<Turn>,
    /// Turns left out past [`MAX_TURNS`] (the oldest lose their place first).
    pub turns_dropped: u64,
    /// Errors the session reported.
    pub errors: Vec<Noted>,
    /// The stereo recording beside this file, where there is one (user left, bot right).
    pub audio: Option<String>,
    /// The session's trace id (32 hex digits), where it was traced.
    pub trace_id: Option<String>,
}

/// How the session ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ended {
    /// When.
    pub at_ms: Millis,
    /// Why (`completed`, `client_gone`, ...).
    pub reason: String,
}

/// A message at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Noted {
    /// When.
    pub at_ms: Millis,
    /// What.
    pub message: String,
}

/// One exchange: the user speaks (unless the bot opens), the bot thinks and answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Its place in the session, from 0.
    pub index: usize,
    /// The user's turn, start to end (after turn detection); `None` for the bot's greeting.
    pub user: Option<Interval>,
    /// What the user said: the final transcripts, in order.
    pub user_text: Vec<String>,
    /// The transcription: from the end of the user's speech to its final transcript.
    pub stt: Option<Step>,
    /// How long the turn's end waited after the user's speech ended, ms.
    pub turn_wait_ms: Option<f64>,
    /// The LLM's responses for this turn (one, or more with tools; a preemptive guess too).
    pub llm: Vec<LlmStep>,
    /// The function calls the LLM made.
    pub tools: Vec<ToolCall>,
    /// The voice: its time to first audio and what it spoke.
    pub tts: Vec<Step>,
    /// The bot's audio, first sound to last.
    pub bot: Option<Interval>,
    /// What the bot said, sentence by sentence.
    pub bot_text: Vec<String>,
    /// When the user cut the bot off.
    pub interrupted_ms: Option<Millis>,
    /// End of the user's speech to the bot's first sound, ms.
    pub voice_to_voice_ms: Option<f64>,
}

/// A service's work for a turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// When it was measured (its result, or its first output).
    pub at_ms: Millis,
    /// The processor.
    pub processor: String,
    /// The model, where known.
    pub model: Option<String>,
    /// Time to its first output, ms.
    pub ttfb_ms: Option<f64>,
    /// Characters (TTS) or seconds of audio (STT) it was paid for.
    pub amount: Option<f64>,
    /// Dollars, where the price is known.
    pub cost_usd: Option<f64>,
}

/// One LLM response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmStep {
    /// From its start to its end.
    pub span: Option<Interval>,
    /// The processor.
    pub processor: Option<String>,
    /// The model.
    pub model: Option<String>,
    /// Time to its first token, ms.
    pub ttfb_ms: Option<f64>,
    /// Tokens.
    pub usage: Option<TokenUsage>,
    /// Dollars, where the price is known.
    pub cost_usd: Option<f64>,
    /// Its text.
    pub text: String,
    /// A preemptive guess: whether it was used.
    pub preemption_used: Option<bool>,
}

/// One function call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id.
    pub id: String,
    /// The function (empty below the `name` report level).
    pub name: String,
    /// From its start to its result (an async tool's final one) or cancellation.
    pub span: Interval,
    /// Its arguments, at the `full` report level.
    pub arguments: Option<Value>,
    /// Its result, at the `full` report level.
    pub result: Option<Value>,
    /// An async tool's progress reports.
    pub intermediate_ms: Vec<Millis>,
    /// Why it was cancelled, if it was.
    pub cancelled: Option<String>,
}

/// Folds a session's events into a [`Journal`], one at a time.
#[derive(Debug)]
pub struct JournalBuilder {
    journal: Journal,
    level: ReportLevel,
}

impl JournalBuilder {
    /// A journal for `session`, keeping tool calls as a client at `level` would see them.
    pub fn new(session: &str, transport: &str, level: ReportLevel) -> Self {
        let started_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or_default();
        Self {
            journal: Journal {
                session: session.to_owned(),
                transport: transport.to_owned(),
                started_unix_ms,
                ..Journal::default()
            },
            level,
        }
    }

    /// Names the bot.
    pub fn bot(mut self, bot: Option<&str>) -> Self {
        self.journal.bot = bot.map(str::to_owned);
        self
    }

    /// Keeps tool calls from now on as a client at `level` would see them.
    pub fn report_level(&mut self, level: ReportLevel) {
        self.level = level;
    }

    /// Names the stereo recording beside the journal's file.
    pub fn set_audio(&mut self, file: &str) {
        self.journal.audio = Some(file.to_owned());
    }

    /// Names the session's trace.
    pub fn set_trace(&mut self, trace_id: &str) {
        self.journal.trace_id = Some(trace_id.to_owned());
    }

    /// The journal so far.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The journal, finished.
    pub fn finish(self) -> Journal {
        self.journal
    }

    /// Takes one event.
    pub fn observe(&mut self, event: &SessionEvent) {
        let t = millis(event.elapsed);
        // Tool calls as the report level shows them; the rest (errors with their detail
        // included) as they are: the journal is the operator's.
        let event = match &event.event {
            Event::ToolCallStarted { .. }
            | Event::ToolCallIntermediate { .. }
            | Event::ToolCallResult { .. }
            | Event::ToolCallCancelled { .. } => match event.event.for_client(self.level) {
                Some(event) => event,
                None => return,
            },
            other => other.clone(),
        };
        match event {
            Event::UserStartedSpeaking => {
                let turn = self.open_turn();
                turn.user = Some(Interval::at(t));
            }
            Event::UserStoppedSpeaking => {
                if let Some(user) = self.current().and_then(|turn| turn.user.as_mut()) {
                    user.end_ms = Some(t);
                }
            }
            Event::UserTranscription {
                text,
                is_final: true,
            } => push_bounded(&mut self.user_turn().user_text, text),
            Event::LlmStarted => self.bot_turn().llm.push(LlmStep {
                span: Some(Interval::at(t)),
                ..LlmStep::default()
            }),
            Event::LlmText { text } => {
                if let Some(step) = self.open_llm()
                    && step.text.len() < MAX_VALUE_CHARS
                {
                    step.text.push_str(&text);
                }
            }
            Event::LlmStopped => {
                if let Some(span) = self.open_llm().and_then(|step| step.span.as_mut()) {
                    span.end_ms = Some(t);
                }
            }
            Event::BotStartedSpeaking => {
                let turn = self.bot_turn();
                match &mut turn.bot {
                    // Speech resumed after a tool call or a pause: one interval for the turn.
                    Some(bot) => bot.end_ms = None,
                    None => turn.bot = Some(Interval::at(t)),
                }
            }
            Event::BotStoppedSpeaking => {
                if let Some(bot) = self
                    .journal
                    .turns
                    .iter_mut()
                    .rev()
                    .find_map(|turn| turn.bot.as_mut().filter(|bot| bot.is_open()))
                {
                    bot.end_ms = Some(t);
                }
            }
            Event::BotText { text } => push_bounded(&mut self.bot_turn().bot_text, text),
            Event::Interruption => {
                // The turn being answered: the last one the bot had started on.
                if let Some(turn) = self.journal.turns.iter_mut().rev().find(|turn| {
                    turn.bot.is_some_and(|bot| bot.is_open())
                        || turn
                            .llm
                            .iter()
                            .any(|step| step.span.is_some_and(|s| s.is_open()))
                }) {
                    turn.interrupted_ms.get_or_insert(t);
                }
            }
            Event::Metrics { data } => {
                for data in data {
                    self.metric(t, data);
                }
            }
            Event::ToolCallStarted {
                name,
                tool_call_id,
                arguments,
            } => {
                let turn = self.bot_turn();
                if turn.tools.len() < MAX_TOOLS {
                    turn.tools.push(ToolCall {
                        id: tool_call_id,
                        name,
                        span: Interval::at(t),
                        arguments: bounded_value(arguments),
                        result: None,
                        intermediate_ms: Vec::new(),
                        cancelled: None,
                    });
                }
            }
            Event::ToolCallIntermediate { tool_call_id, .. } => {
                if let Some(call) = self.tool(&tool_call_id)
                    && call.intermediate_ms.len() < MAX_TEXTS
                {
                    call.intermediate_ms.push(t);
                }
            }
            Event::ToolCallResult {
                tool_call_id,
                result,
                ..
            } => {
                if let Some(call) = self.tool(&tool_call_id) {
                    call.span.end_ms = Some(t);
                    call.result = result.and_then(bounded_value);
                }
            }
            Event::ToolCallCancelled {
                tool_call_id,
                reason,
                ..
            } => {
                if let Some(call) = self.tool(&tool_call_id) {
                    call.span.end_ms = Some(t);
                    call.cancelled = Some(
                        serde_json::to_value(reason)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default(),
                    );
                }
            }
            Event::Error { message, .. } if self.journal.errors.len() < MAX_ERRORS => {
                self.journal.errors.push(Noted { at_ms: t, message });
            }
            Event::SessionEnded { reason } => {
                self.journal.ended = Some(Ended {
                    at_ms: t,
                    reason: reason.kind().to_owned(),
                });
                self.close_all(t);
            }
            _ => {}
        }
    }

    fn metric(&mut self, t: Millis, data: MetricsData) {
        let ms = |seconds: f64| seconds * 1e3;
        match data {
            MetricsData::Ttfb {
                processor,
                model,
                seconds,
            } => match service(&processor) {
                Service::Llm => {
                    if let Some(step) = self.llm_lacking(|s| s.ttfb_ms.is_none()) {
                        step.ttfb_ms = Some(ms(seconds));
                        step.model = model;
                        step.processor = Some(processor);
                    }
                }
                Service::Stt => {
                    let turn = self.user_turn();
                    let step = turn.stt.get_or_insert_with(Step::default);
                    step.at_ms = t;
                    step.processor = processor;
                    step.model = model;
                    step.ttfb_ms = Some(ms(seconds));
                }
                Service::Tts => self.bot_turn().tts.push(Step {
                    at_ms: t,
                    processor,
                    model,
                    ttfb_ms: Some(ms(seconds)),
                    ..Step::default()
                }),
                Service::Other => {}
            },
            MetricsData::LlmUsage {
                processor,
                model,
                usage,
                cost_usd,
            } => {
                if let Some(step) = self.llm_lacking(|s| s.usage.is_none()) {
                    step.usage = Some(usage);
                    step.cost_usd = cost_usd;
                    step.model = step.model.take().or(model);
                    step.processor.get_or_insert(processor);
                }
            }
            MetricsData::TtsUsage {
                characters,
                cost_usd,
                processor,
                model,
            } => {
                let turn = self.bot_turn();
                match turn.tts.iter_mut().rev().find(|s| s.amount.is_none()) {
                    Some(step) => {
                        step.amount = Some(characters as f64);
                        step.cost_usd = cost_usd;
                    }
                    None => turn.tts.push(Step {
                        at_ms: t,
                        processor,
                        model,
                        amount: Some(characters as f64),
                        cost_usd,
                        ..Step::default()
                    }),
                }
            }
            MetricsData::SttUsage {
                seconds,
                cost_usd,
                processor,
                model,
            } => {
                let step = self.user_turn().stt.get_or_insert_with(|| Step {
                    at_ms: t,
                    processor,
                    model,
                    ..Step::default()
                });
                step.amount = Some(seconds);
                step.cost_usd = cost_usd;
            }
            MetricsData::VoiceToVoice { seconds } => {
                self.user_turn().voice_to_voice_ms = Some(ms(seconds));
            }
            MetricsData::TurnWait { seconds } => {
                self.user_turn().turn_wait_ms = Some(ms(seconds));
            }
            MetricsData::Preemption { used, .. } => {
                if let Some(step) = self.llm_lacking(|s| s.preemption_used.is_none()) {
                    step.preemption_used = Some(used);
                }
            }
            _ => {}
        }
    }

    /// A new turn, the oldest dropped past [`MAX_TURNS`].
    fn open_turn(&mut self) -> &mut Turn {
        let turns = &mut self.journal.turns;
        if turns.len() >= MAX_TURNS {
            turns.remove(0);
            self.journal.turns_dropped += 1;
        }
        let index = turns.last().map_or(0, |turn| turn.index + 1);
        turns.push(Turn {
            index,
            ..Turn::default()
        });
        turns.last_mut().expect("just pushed")
    }

    fn current(&mut self) -> Option<&mut Turn> {
        self.journal.turns.last_mut()
    }

    /// The turn the user is in: the last one (a first one opened for words before any turn).
    fn user_turn(&mut self) -> &mut Turn {
        if self.journal.turns.is_empty() {
            self.open_turn();
        }
        self.journal.turns.last_mut().expect("one turn at least")
    }

    /// The turn the bot answers: the last one, or a greeting's turn before any.
    fn bot_turn(&mut self) -> &mut Turn {
        self.user_turn()
    }

    /// The LLM response still streaming, the latest first.
    fn open_llm(&mut self) -> Option<&mut LlmStep> {
        self.journal
            .turns
            .iter_mut()
            .rev()
            .flat_map(|turn| turn.llm.iter_mut().rev())
            .find(|step| step.span.is_some_and(|s| s.is_open()))
    }

    /// The oldest LLM response of the last turn with one that lacks what `lacks` checks: its
    /// metrics arrive after it started, in order.
    fn llm_lacking(&mut self, lacks: impl Fn(&LlmStep) -> bool) -> Option<&mut LlmStep> {
        let turn = self
            .journal
            .turns
            .iter_mut()
            .rev()
            .find(|turn| turn.llm.iter().any(&lacks))?;
        turn.llm.iter_mut().find(|step| lacks(step))
    }

    fn tool(&mut self, id: &str) -> Option<&mut ToolCall> {
        self.journal
            .turns
            .iter_mut()
            .rev()
            .flat_map(|turn| turn.tools.iter_mut())
            .find(|call| call.id == id)
    }

    /// Ends whatever is still open when the session ends.
    fn close_all(&mut self, t: Millis) {
        for turn in &mut self.journal.turns {
            let spans = turn
                .user
                .iter_mut()
                .chain(turn.bot.iter_mut())
                .chain(turn.llm.iter_mut().filter_map(|s| s.span.as_mut()))
                .chain(turn.tools.iter_mut().map(|c| &mut c.span));
            for span in spans {
                span.end_ms.get_or_insert(t);
            }
        }
    }
}

enum Service {
    Llm,
    Stt,
    Tts,
    Other,
}

/// Which service a processor is, by its name (`LlmService#4`, `SttService#2`).
fn service(processor: &str) -> Service {
    let name = processor.to_ascii_lowercase();
    if name.contains("llm") || name.contains("realtime") {
        Service::Llm
    } else if name.contains("stt") {
        Service::Stt
    } else if name.contains("tts") {
        Service::Tts
    } else {
        Service::Other
    }
}

fn millis(d: Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn push_bounded(texts: &mut Vec<String>, text: String) {
    if texts.len() < MAX_TEXTS {
        texts.push(text.chars().take(MAX_VALUE_CHARS).collect());
    }
}

/// A tool's arguments or result as kept: `null` is nothing, and a long one is cut to a string.
fn bounded_value(value: Value) -> Option<Value> {
    if value.is_null() {
        return None;
    }
    let text = value.to_string();
    if text.len() <= MAX_VALUE_CHARS {
        return Some(value);
    }
    let cut: String = text.chars().take(MAX_VALUE_CHARS).collect();
    Some(Value::String(format!("{cut}…")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EndReason;
    use crate::frames::CancelReason;

    fn at(ms: u64, event: Event) -> SessionEvent {
        SessionEvent {
            elapsed: Duration::from_millis(ms),
            event,
        }
    }

    fn metric(ms: u64, data: MetricsData) -> SessionEvent {
        at(ms, Event::Metrics { data: vec![data] })
    }

    fn ttfb(ms: u64, processor: &str, seconds: f64) -> SessionEvent {
        metric(
            ms,
            MetricsData::Ttfb {
                processor: processor.into(),
                model: Some("m".into()),
                seconds,
            },
        )
    }

    /// A greeting, a turn with an async tool whose result lands in the next turn, and an
    /// interruption.
    fn session() -> Vec<SessionEvent> {
        vec![
            at(0, Event::SessionStarted),
            at(10, Event::LlmStarted),
            ttfb(300, "LlmService#4", 0.29),
            at(
                310,
                Event::LlmText {
                    text: "Hello.".into(),
                },
            ),
            at(320, Event::LlmStopped),
            at(400, Event::BotStartedSpeaking),
            at(
                400,
                Event::BotText {
                    text: "Hello.".into(),
                },
            ),
            at(900, Event::BotStoppedSpeaking),
            // Turn 1: the user asks; an async tool starts.
            at(2_000, Event::UserStartedSpeaking),
            at(3_000, Event::UserStoppedSpeaking),
            ttfb(3_100, "SttService#2", 0.35),
            at(
                3_100,
                Event::UserTranscription {
                    text: "Book a table.".into(),
                    is_final: true,
                },
            ),
            metric(3_100, MetricsData::TurnWait { seconds: 0.25 }),
            at(3_110, Event::LlmStarted),
            ttfb(3_400, "LlmService#4", 0.29),
            at(
                3_410,
                Event::ToolCallStarted {
                    name: "book".into(),
                    tool_call_id: "call_1".into(),
                    arguments: serde_json::json!({"people": 2}),
                },
            ),
            at(3_420, Event::LlmStopped),
            at(3_500, Event::LlmStarted),
            at(
                3_600,
                Event::LlmText {
                    text: "Booking it.".into(),
                },
            ),
            at(3_650, Event::LlmStopped),
            ttfb(3_700, "TtsService#5", 0.05),
            at(3_750, Event::BotStartedSpeaking),
            metric(3_750, MetricsData::VoiceToVoice { seconds: 0.95 }),
            // Turn 2: the user cuts in; the tool's result comes in that turn.
            at(4_000, Event::UserStartedSpeaking),
            at(4_050, Event::Interruption),
            at(4_060, Event::BotStoppedSpeaking),
            at(
                5_000,
                Event::ToolCallResult {
                    name: "book".into(),
                    tool_call_id: "call_1".into(),
                    result: Some(serde_json::json!({"ok": true})),
                },
            ),
            at(5_500, Event::UserStoppedSpeaking),
            at(
                6_000,
                Event::ToolCallCancelled {
                    name: "other".into(),
                    tool_call_id: "missing".into(),
                    reason: CancelReason::Interruption,
                },
            ),
            at(
                7_000,
                Event::SessionEnded {
                    reason: EndReason::ClientGone,
                },
            ),
        ]
    }

    fn journal(level: ReportLevel) -> Journal {
        let mut builder = JournalBuilder::new("s1", "websocket", level);
        for event in session() {
            builder.observe(&event);
        }
        builder.finish()
    }

    #[test]
    fn a_greeting_turns_and_an_interruption_fold_into_three_turns() {
        let journal = journal(ReportLevel::Full);
        assert_eq!(journal.turns.len(), 3);
        let [greeting, asked, cut] = &journal.turns[..] else {
            unreachable!()
        };
        assert_eq!(greeting.user, None);
        assert_eq!(greeting.llm[0].ttfb_ms, Some(290.0));
        assert_eq!(greeting.llm[0].text, "Hello.");
        assert_eq!(
            greeting.bot,
            Some(Interval {
                start_ms: 400,
                end_ms: Some(900)
            })
        );

        assert_eq!(
            asked.user,
            Some(Interval {
                start_ms: 2_000,
                end_ms: Some(3_000)
            })
        );
        assert_eq!(asked.user_text, ["Book a table."]);
        assert_eq!(asked.stt.as_ref().and_then(|s| s.ttfb_ms), Some(350.0));
        assert_eq!(asked.turn_wait_ms, Some(250.0));
        assert_eq!(
            asked.llm.len(),
            2,
            "the tool call's response and the answer"
        );
        assert_eq!(asked.llm[0].ttfb_ms, Some(290.0));
        assert_eq!(asked.llm[1].text, "Booking it.");
        assert_eq!(asked.tts[0].ttfb_ms, Some(50.0));
        assert_eq!(asked.voice_to_voice_ms, Some(950.0));
        assert_eq!(
            asked.interrupted_ms,
            Some(4_050),
            "cut off by turn 2's user"
        );
        assert_eq!(asked.bot.and_then(|b| b.end_ms), Some(4_060));

        // The async tool ends at its result, in the turn that started it.
        let call = &asked.tools[0];
        assert_eq!(call.span.end_ms, Some(5_000));
        assert_eq!(call.result, Some(serde_json::json!({"ok": true})));
        assert_eq!(call.arguments, Some(serde_json::json!({"people": 2})));

        assert_eq!(cut.interrupted_ms, None);
        assert_eq!(cut.user.and_then(|u| u.end_ms), Some(5_500));
        assert_eq!(
            journal.ended,
            Some(Ended {
                at_ms: 7_000,
                reason: "client_gone".into()
            })
        );
    }

    #[test]
    fn a_tools_arguments_and_result_are_kept_only_at_the_full_report_level() {
        let journal = journal(ReportLevel::Name);
        let call = &journal.turns[1].tools[0];
        assert_eq!(call.name, "book");
        assert_eq!((&call.arguments, &call.result), (&None, &None));
        let hidden = self::journal(ReportLevel::Disabled);
        assert!(hidden.turns[1].tools.is_empty());
    }

    #[test]
    fn a_journal_reads_back_as_it_was_written() {
        let journal = journal(ReportLevel::Full);
        let text = serde_json::to_string(&journal).expect("json");
        let back: Journal = serde_json::from_str(&text).expect("reads back");
        assert_eq!(back, journal);
    }

    #[test]
    fn a_long_call_keeps_its_latest_turns_and_counts_the_rest() {
        let mut builder = JournalBuilder::new("s", "websocket", ReportLevel::Name);
        for i in 0..(MAX_TURNS as u64 + 5) {
            builder.observe(&at(i * 10, Event::UserStartedSpeaking));
        }
        let journal = builder.finish();
        assert_eq!(journal.turns.len(), MAX_TURNS);
        assert_eq!(journal.turns_dropped, 5);
        assert_eq!(
            journal.turns.last().map(|t| t.index),
            Some(MAX_TURNS + 4),
            "indices stay the session's own"
        );
    }
}
