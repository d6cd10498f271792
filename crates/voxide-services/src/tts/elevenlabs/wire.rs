//! ElevenLabs' multi-context TTS WebSocket messages (`/v1/text-to-speech/{voice}/multi-stream-input`),
//! as its API documents them.

use serde::{Deserialize, Serialize};

/// Opens a context: a single space, and the socket's voice settings if this is its first message.
#[derive(Debug, Serialize)]
pub struct Init<'a> {
    pub text: &'static str,
    pub context_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voice_settings: Option<VoiceSettings>,
}

/// How the voice sounds; sent once per socket (ElevenLabs closes the socket with 1008 when a
/// later message carries it).
#[derive(Debug, Serialize)]
pub struct VoiceSettings {
    pub stability: f32,
    pub similarity_boost: f32,
    pub speed: f32,
}

/// A context's text, ending in a space; an empty text keeps the context alive.
#[derive(Debug, Serialize)]
pub struct Text<'a> {
    pub text: &'a str,
    pub context_id: &'a str,
}

/// Speaks what the context has buffered now.
#[derive(Debug, Serialize)]
pub struct Flush<'a> {
    pub context_id: &'a str,
    pub flush: bool,
}

/// Ends a context: the server answers with its `isFinal`.
#[derive(Debug, Serialize)]
pub struct CloseContext<'a> {
    pub context_id: &'a str,
    pub close_context: bool,
}

/// Ends the socket.
#[derive(Debug, Serialize)]
pub struct CloseSocket {
    pub close_socket: bool,
}

/// A message from the server: audio with its alignment, a context's `isFinal`, or an error.
/// Servers have spelled the context's key both ways.
#[derive(Debug, Deserialize)]
pub struct ServerMessage {
    #[serde(default, rename = "contextId", alias = "context_id")]
    pub context_id: Option<String>,
    /// Base64 PCM.
    #[serde(default)]
    pub audio: Option<String>,
    #[serde(default, rename = "isFinal")]
    pub is_final: Option<bool>,
    /// The characters of the text sent and their times.
    #[serde(default)]
    pub alignment: Option<Alignment>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

/// Characters and their times in milliseconds from the start of this message's audio (not the
/// context's). Both spellings of the keys have been in use.
#[derive(Debug, Deserialize)]
pub struct Alignment {
    #[serde(default)]
    pub chars: Vec<String>,
    #[serde(default, rename = "charStartTimesMs", alias = "charsStartTimesMs")]
    pub starts_ms: Vec<f64>,
    #[serde(default, rename = "charDurationsMs", alias = "charsDurationsMs")]
    pub durations_ms: Vec<f64>,
}
