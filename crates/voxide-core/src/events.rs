//! The session's typed event stream, for UIs, logs and tests.
//!
//! Events are a rendering of what happens in a session: lifecycle, errors, the voice events
//! derived from frames, and (from the LLM service) tool executions. Subscribers get them through a
//! broadcast channel; one that falls behind by more than [`EVENT_CAPACITY`] events loses the
//! oldest ones and is told so by the channel, while producers never wait.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use serde_json::Value;

use crate::frames::{CancelReason, MetricsData};

/// Events a subscriber may fall behind by before it loses the oldest.
pub const EVENT_CAPACITY: usize = 1024;

/// One event with the time it happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionEvent {
    /// Time since the session started.
    #[serde(rename = "t_ms", serialize_with = "as_millis")]
    pub elapsed: Duration,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The session sent its start frame.
    SessionStarted,
    /// The session finished.
    SessionEnded {
        /// Why.
        reason: EndReason,
    },
    /// A stage reported an error.
    Error {
        /// What went wrong.
        message: String,
        /// Whether it ends the session.
        fatal: bool,
        /// The stage that reported it.
        processor: Option<String>,
    },
    /// Nobody spoke for the idle timeout.
    IdleTimeout,
    /// The user muted their microphone: their audio is not listened to until they unmute.
    UserMuteStarted,
    /// The user unmuted their microphone.
    UserMuteStopped,
    /// The user's turn started.
    UserStartedSpeaking,
    /// The user's turn ended.
    UserStoppedSpeaking,
    /// The bot started playing audio.
    BotStartedSpeaking,
    /// The bot stopped playing audio.
    BotStoppedSpeaking,
    /// The user interrupted the bot.
    Interruption,
    /// The bot paused: the user may be speaking over it (an onset the VAD has not confirmed, or
    /// a barge-in waiting for words).
    BotPaused,
    /// The paused bot plays on: the onset faded or no words came (a false interruption).
    BotResumed,
    /// A transcript of the user's speech.
    UserTranscription {
        /// The words.
        text: String,
        /// False for interim transcripts.
        #[serde(rename = "final")]
        is_final: bool,
    },
    /// The LLM started a response.
    LlmStarted,
    /// A piece of the LLM's response, as it streams.
    LlmText {
        /// The piece.
        text: String,
    },
    /// The LLM's response is complete.
    LlmStopped,
    /// What the bot says, a sentence at a time, as it goes to the voice.
    BotText {
        /// The words.
        text: String,
    },
    /// Measurements.
    Metrics {
        /// The measurements.
        data: Vec<MetricsData>,
    },
    /// A function call started running.
    ToolCallStarted {
        /// The function.
        name: String,
        /// The provider's id for the call.
        tool_call_id: String,
        /// The arguments the model gave.
        arguments: Value,
    },
    /// An async function call reported progress.
    ToolCallIntermediate {
        /// The function.
        name: String,
        /// The provider's id for the call.
        tool_call_id: String,
        /// What it reported; `null` for nothing.
        result: Option<Value>,
    },
    /// A function call settled with a result.
    ToolCallResult {
        /// The function.
        name: String,
        /// The provider's id for the call.
        tool_call_id: String,
        /// What it returned; `null` for nothing.
        result: Option<Value>,
    },
    /// A function call was cancelled.
    ToolCallCancelled {
        /// The function.
        name: String,
        /// The provider's id for the call.
        tool_call_id: String,
        /// Why.
        reason: CancelReason,
    },
    /// The LLM gave no answer within the service's completion timeout.
    LlmCompletionTimeout {
        /// The timeout.
        seconds: f64,
    },
    /// The LLM failed before it answered, its retries spent, and the next one in the list
    /// answers instead (`--llm openai,local`).
    LlmFallback {
        /// The provider that failed.
        from: String,
        /// The provider that answers now.
        to: String,
        /// What went wrong.
        reason: String,
    },
    /// The conversation's oldest turns were folded into a summary the LLM wrote (a long call
    /// past the bot's budget), in the background.
    ContextSummarized {
        /// Messages the summary stands for.
        messages: usize,
        /// The conversation's estimated tokens before and after.
        tokens_before: usize,
        /// After.
        tokens_after: usize,
        /// The summary.
        summary: String,
    },
    /// A flow moved the conversation to a node.
    FlowNode {
        /// The node now.
        node: String,
    },
    /// The STT gave up for good and the next one in the list listens instead
    /// (`--stt deepgram,whisper`).
    SttFallback {
        /// The engine that failed.
        from: String,
        /// The engine that listens now.
        to: String,
        /// What went wrong.
        reason: String,
    },
    /// The voice gave up for good and the next one in the list speaks instead
    /// (`--tts cartesia,piper`).
    TtsFallback {
        /// The voice that failed.
        from: String,
        /// The voice that speaks now.
        to: String,
        /// What went wrong.
        reason: String,
    },
    /// A realtime LLM lost its connection and is about to try again.
    LlmReconnecting {
        /// Which attempt comes next (1 for the first).
        attempt: u32,
        /// How long it waits before that attempt.
        delay_ms: u64,
        /// Why the connection was lost or refused.
        reason: String,
    },
    /// A realtime LLM is connected again; a response it was giving is restarted.
    LlmReconnected {
        /// Attempts it took.
        attempts: u32,
        /// Whether a response was restarted.
        restarted_response: bool,
    },
    /// Who answered a call the bot placed, told from its first seconds.
    CallAnswered {
        /// A person, a machine, a menu, or not told.
        by: AnsweredBy,
        /// What told it.
        because: AnsweredBecause,
    },
    /// The answering machine records: the bot leaves its message now.
    VoicemailRecording {
        /// Whether a beep said so (else the silence after the greeting did).
        beep: bool,
    },
}

/// Who answered a call the bot placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnsweredBy {
    /// A person.
    Human,
    /// An answering machine or a voicemail box.
    Machine,
    /// An automated menu ("for sales, press one").
    Menu,
    /// Nothing told: silence, or speech that fits neither.
    Unknown,
}

/// What told who answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnsweredBecause {
    /// A short greeting, then a pause.
    ShortGreeting,
    /// A greeting longer than a person's.
    LongGreeting,
    /// More words than a person's greeting has.
    ManyWords,
    /// Words a machine or a menu says.
    Words,
    /// A beep.
    Beep,
    /// Nobody spoke.
    Silence,
    /// Listening ran out.
    Undecided,
    /// The bot's LLM read the greeting, where only the timing had spoken (`ask_llm`).
    Llm,
}

/// How much of a function call clients are told (pipecat's function-call report levels). What
/// a tool is asked and what it answers may be private to the deployment; `name` is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportLevel {
    /// No event for a function call.
    Disabled,
    /// The call's id only.
    None,
    /// Its id and the function's name.
    #[default]
    Name,
    /// Its name, its arguments and its result.
    Full,
}

/// What a client is told in place of an error's detail (which stays in the server's log).
const ERROR_IN_THE_LOG: &str = "see the server's log for the detail";

impl Event {
    /// This event as a client may see it: function calls at `level`; errors, fallbacks and
    /// fatal endings without their detail, which may carry a backend's error body or an
    /// internal URL. `None`: the client is told nothing.
    pub fn for_client(&self, level: ReportLevel) -> Option<Event> {
        let name = |name: &String| match level {
            ReportLevel::Name | ReportLevel::Full => name.clone(),
            ReportLevel::None | ReportLevel::Disabled => String::new(),
        };
        let full = level == ReportLevel::Full;
        let tool_call = matches!(
            self,
            Event::ToolCallStarted { .. }
                | Event::ToolCallIntermediate { .. }
                | Event::ToolCallResult { .. }
                | Event::ToolCallCancelled { .. }
        );
        if tool_call && level == ReportLevel::Disabled {
            return None;
        }
        let hidden = || ERROR_IN_THE_LOG.to_owned();
        Some(match self {
            Event::ToolCallStarted {
                name: n,
                tool_call_id,
                arguments,
            } => Event::ToolCallStarted {
                name: name(n),
                tool_call_id: tool_call_id.clone(),
                arguments: if full { arguments.clone() } else { Value::Null },
            },
            Event::ToolCallIntermediate {
                name: n,
                tool_call_id,
                result,
            } => Event::ToolCallIntermediate {
                name: name(n),
                tool_call_id: tool_call_id.clone(),
                result: result.clone().filter(|_| full),
            },
            Event::ToolCallResult {
                name: n,
                tool_call_id,
                result,
            } => Event::ToolCallResult {
                name: name(n),
                tool_call_id: tool_call_id.clone(),
                result: result.clone().filter(|_| full),
            },
            Event::ToolCallCancelled {
                name: n,
                tool_call_id,
                reason,
            } => Event::ToolCallCancelled {
                name: name(n),
                tool_call_id: tool_call_id.clone(),
                reason: *reason,
            },
            Event::Error {
                fatal, processor, ..
            } => Event::Error {
                message: match processor {
                    Some(processor) => format!("{processor} failed: {ERROR_IN_THE_LOG}"),
                    None => format!("an error: {ERROR_IN_THE_LOG}"),
                },
                fatal: *fatal,
                processor: processor.clone(),
            },
            Event::SessionEnded {
                reason: EndReason::FatalError(_),
            } => Event::SessionEnded {
                reason: EndReason::FatalError(hidden()),
            },
            Event::LlmFallback { from, to, .. } => Event::LlmFallback {
                from: from.clone(),
                to: to.clone(),
                reason: hidden(),
            },
            Event::SttFallback { from, to, .. } => Event::SttFallback {
                from: from.clone(),
                to: to.clone(),
                reason: hidden(),
            },
            Event::TtsFallback { from, to, .. } => Event::TtsFallback {
                from: from.clone(),
                to: to.clone(),
                reason: hidden(),
            },
            Event::LlmReconnecting {
                attempt, delay_ms, ..
            } => Event::LlmReconnecting {
                attempt: *attempt,
                delay_ms: *delay_ms,
                reason: hidden(),
            },
            other => other.clone(),
        })
    }
}

/// Why a session finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum EndReason {
    /// An end frame drained through the pipeline.
    Completed,
    /// A stop frame drained through the pipeline.
    Stopped,
    /// The app (or a hang-up) cancelled it.
    Cancelled,
    /// Nobody spoke for the idle timeout.
    IdleTimeout,
    /// A stage reported a fatal error.
    FatalError(String),
    /// The client went away without saying goodbye: its keepalive stopped, or its connection
    /// failed and was not restarted.
    ClientGone,
    /// An audio device the session used went away (`voxide local`).
    DeviceLost(String),
}

impl EndReason {
    /// The reason's name, as events and metrics spell it (`client_gone`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Stopped => "stopped",
            Self::Cancelled => "cancelled",
            Self::IdleTimeout => "idle_timeout",
            Self::FatalError(_) => "fatal_error",
            Self::ClientGone => "client_gone",
            Self::DeviceLost(_) => "device_lost",
        }
    }
}

/// Where a session's events go.
#[derive(Debug, Clone)]
pub struct EventSink(broadcast::Sender<SessionEvent>);

impl EventSink {
    /// A sink with no subscriber yet.
    pub fn new() -> Self {
        Self(broadcast::channel(EVENT_CAPACITY).0)
    }

    /// Publishes `event`; with no subscriber it is dropped.
    pub fn emit(&self, elapsed: Duration, event: Event) {
        let _ = self.0.send(SessionEvent { elapsed, event });
    }

    /// A new subscriber, seeing events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.0.subscribe()
    }
}

impl Default for EventSink {
    fn default() -> Self {
        Self::new()
    }
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_see_a_tool_calls_name_by_default_and_its_arguments_and_result_only_at_full() {
        let started = Event::ToolCallStarted {
            name: "lookup_order".into(),
            tool_call_id: "call_1".into(),
            arguments: serde_json::json!({"order": "1234"}),
        };
        let result = Event::ToolCallResult {
            name: "lookup_order".into(),
            tool_call_id: "call_1".into(),
            result: Some(serde_json::json!({"address": "12 Private Lane"})),
        };
        let seen = |event: &Event, level| event.for_client(level);
        assert_eq!(
            seen(&started, ReportLevel::default()),
            Some(Event::ToolCallStarted {
                name: "lookup_order".into(),
                tool_call_id: "call_1".into(),
                arguments: Value::Null
            })
        );
        assert_eq!(
            seen(&result, ReportLevel::None),
            Some(Event::ToolCallResult {
                name: String::new(),
                tool_call_id: "call_1".into(),
                result: None
            })
        );
        assert_eq!(seen(&result, ReportLevel::Full), Some(result.clone()));
        assert_eq!(seen(&started, ReportLevel::Disabled), None);
    }

    #[test]
    fn a_backends_error_body_and_urls_never_reach_a_client() {
        let detail = "LLM request failed: 500 from http://10.0.0.7:8080/v1/chat: {\"error\":\"db password wrong\"}";
        let error = Event::Error {
            message: detail.into(),
            fatal: true,
            processor: Some("LlmService".into()),
        };
        let ended = Event::SessionEnded {
            reason: EndReason::FatalError(detail.into()),
        };
        let fallback = Event::LlmFallback {
            from: "openai".into(),
            to: "local".into(),
            reason: detail.into(),
        };
        for event in [error, ended, fallback] {
            let seen = serde_json::to_string(&event.for_client(ReportLevel::Full)).expect("json");
            assert!(
                !seen.contains("10.0.0.7") && !seen.contains("password"),
                "{seen}"
            );
            assert!(seen.contains("server's log"), "{seen}");
        }
    }

    #[test]
    fn events_serialise_as_flat_json_lines() {
        let ev = SessionEvent {
            elapsed: Duration::from_millis(1520),
            event: Event::UserTranscription {
                text: "hello".into(),
                is_final: true,
            },
        };
        assert_eq!(
            serde_json::to_string(&ev).expect("serialises"),
            r#"{"t_ms":1520,"type":"user_transcription","text":"hello","final":true}"#
        );
    }
}
