//! OpenAI's realtime transcription messages (`/v1/realtime?intent=transcription`), as its API
//! documents them.

use serde::{Deserialize, Serialize};

/// A message from the client.
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub enum ClientEvent<'a> {
    /// Configures the session once it is created.
    #[serde(rename = "session.update")]
    SessionUpdate { session: Session<'a> },
    /// Base64 16-bit PCM at 24 kHz.
    #[serde(rename = "input_audio_buffer.append")]
    Append { audio: String },
    /// Ends a segment: it is transcribed.
    #[serde(rename = "input_audio_buffer.commit")]
    Commit,
}

#[derive(Debug, Serialize)]
pub struct Session<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub audio: Audio<'a>,
}

#[derive(Debug, Serialize)]
pub struct Audio<'a> {
    pub input: Input<'a>,
}

#[derive(Debug, Serialize)]
pub struct Input<'a> {
    pub format: Format,
    pub transcription: Transcription<'a>,
    /// `null`: the client commits each segment (at the VAD's stop).
    pub turn_detection: Option<()>,
}

#[derive(Debug, Serialize)]
pub struct Format {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub rate: u32,
}

#[derive(Debug, Serialize)]
pub struct Transcription<'a> {
    pub model: &'a str,
    pub language: &'a str,
}

/// A message from the server.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
pub enum ServerEvent {
    #[serde(rename = "session.created")]
    SessionCreated,
    /// The session is configured: audio may go.
    #[serde(rename = "session.updated")]
    SessionUpdated,
    /// A commit made an item, in order.
    #[serde(rename = "input_audio_buffer.committed")]
    Committed { item_id: String },
    /// More of an item's words: append them.
    #[serde(rename = "conversation.item.input_audio_transcription.delta")]
    Delta {
        item_id: String,
        #[serde(default)]
        delta: String,
    },
    /// An item's whole transcript.
    #[serde(rename = "conversation.item.input_audio_transcription.completed")]
    Completed {
        item_id: String,
        #[serde(default)]
        transcript: String,
    },
    /// An item could not be transcribed.
    #[serde(rename = "conversation.item.input_audio_transcription.failed")]
    Failed {
        item_id: String,
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    #[serde(rename = "error")]
    Error { error: ErrorBody },
    /// Messages voxide does not use.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
pub struct ErrorBody {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: String,
}
