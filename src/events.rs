//! The session's typed event stream, for UIs, logs and tests.
//!
//! Events are a rendering of what happens in a session: lifecycle, errors, the voice events
//! derived from frames, and (from the LLM service) tool executions. Subscribers get them through a
//! broadcast channel; one that falls behind by more than [`EVENT_CAPACITY`] events loses the
//! oldest ones and is told so by the channel, while producers never wait.

use std::time::Duration;

use serde::Serialize;
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
