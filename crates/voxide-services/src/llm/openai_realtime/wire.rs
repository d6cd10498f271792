//! The OpenAI Realtime server events voxide reads (GA names), as serde types: one enum tagged by
//! `type`; an event voxide does not use reads as [`ServerEvent::Other`], and one whose fields
//! break the format is an error.

use serde::Deserialize;

/// One server event.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
pub(super) enum ServerEvent {
    /// The session took its configuration.
    #[serde(rename = "session.updated")]
    SessionUpdated,
    /// The provider's VAD heard the user start.
    #[serde(rename = "input_audio_buffer.speech_started")]
    SpeechStarted,
    /// The provider's VAD heard the user stop.
    #[serde(rename = "input_audio_buffer.speech_stopped")]
    SpeechStopped,
    /// Words of the user's turn so far.
    #[serde(rename = "conversation.item.input_audio_transcription.delta")]
    TranscriptionDelta { delta: String },
    /// The user's turn transcribed.
    #[serde(rename = "conversation.item.input_audio_transcription.completed")]
    TranscriptionCompleted { transcript: String },
    /// A response began.
    #[serde(rename = "response.created")]
    ResponseCreated,
    /// Audio of the response, base64 PCM16.
    #[serde(rename = "response.output_audio.delta")]
    AudioDelta {
        delta: String,
        #[serde(default)]
        item_id: Option<String>,
    },
    /// Words of the response: what its audio says, or its text.
    #[serde(
        rename = "response.output_audio_transcript.delta",
        alias = "response.output_text.delta"
    )]
    TextDelta { delta: String },
    /// A function call's arguments, whole.
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        name: String,
        call_id: String,
        arguments: String,
    },
    /// The response ended: how, and what it cost.
    #[serde(rename = "response.done")]
    ResponseDone {
        #[serde(default)]
        response: Response,
    },
    /// The provider refused something.
    #[serde(rename = "error")]
    Error {
        #[serde(default)]
        error: ErrorBody,
    },
    /// An event voxide does not use.
    #[serde(other)]
    Other,
}

/// `response.done`'s response.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Response {
    /// `completed`, `cancelled`, `incomplete` or `failed`.
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub status_details: Option<StatusDetails>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct StatusDetails {
    #[serde(default)]
    pub error: Option<ErrorBody>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct ErrorBody {
    #[serde(default)]
    pub message: Option<String>,
}

/// A response's tokens.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub input_token_details: Option<InputTokenDetails>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct InputTokenDetails {
    #[serde(default)]
    pub cached_tokens: u64,
}
