//! The Gemini Live server messages voxide reads (`BidiGenerateContentServerMessage`), as serde
//! types. A message carries any of its parts; parts voxide does not use are ignored, and one
//! whose fields break the format is an error.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

/// One server message.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ServerMessage {
    /// The set-up was taken.
    #[serde(default)]
    pub setup_complete: Option<IgnoredAny>,
    #[serde(default)]
    pub server_content: Option<ServerContent>,
    #[serde(default)]
    pub tool_call: Option<ToolCall>,
    #[serde(default)]
    pub tool_call_cancellation: Option<ToolCallCancellation>,
    #[serde(default)]
    pub usage_metadata: Option<UsageMetadata>,
    /// The server will close the connection soon.
    #[serde(default)]
    pub go_away: Option<GoAway>,
}

/// What the model heard and said.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ServerContent {
    #[serde(default)]
    pub input_transcription: Option<Transcription>,
    /// The user cut the model off.
    #[serde(default)]
    pub interrupted: bool,
    #[serde(default)]
    pub model_turn: Option<ModelTurn>,
    #[serde(default)]
    pub output_transcription: Option<Transcription>,
    #[serde(default)]
    pub turn_complete: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Transcription {
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct ModelTurn {
    #[serde(default)]
    pub parts: Vec<Part>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Part {
    #[serde(default)]
    pub inline_data: Option<InlineData>,
}

/// Base64 PCM16 at the output rate.
#[derive(Debug, Deserialize)]
pub(super) struct InlineData {
    pub data: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ToolCall {
    pub function_calls: Vec<FunctionCall>,
}

#[derive(Debug, Deserialize)]
pub(super) struct FunctionCall {
    pub name: String,
    pub id: String,
    /// An object; anything else reads as no arguments.
    #[serde(default)]
    pub args: Value,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct ToolCallCancellation {
    #[serde(default)]
    pub ids: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct UsageMetadata {
    #[serde(default)]
    pub prompt_token_count: u64,
    #[serde(default)]
    pub response_token_count: u64,
    #[serde(default)]
    pub cached_content_token_count: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct GoAway {
    #[serde(default)]
    pub time_left: Option<String>,
}
