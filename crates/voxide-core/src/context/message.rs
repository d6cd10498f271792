//! Conversation messages in the OpenAI chat JSON shape that pipecat keeps in its contexts.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::TokenUsage;

/// One message of a conversation context.
///
/// Serialises to and from the OpenAI chat message JSON exactly: unknown keys are kept in `extra`,
/// and an explicit `"content": null` stays distinct from a missing `content`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// Instructions from the app.
    System(InstructionMessage),
    /// Instructions from the app, for models that tell developer from system.
    Developer(InstructionMessage),
    /// What the user said or sent.
    User(UserMessage),
    /// What the model said, or the tools it called.
    Assistant(AssistantMessage),
    /// A tool's result.
    Tool(ToolMessage),
    /// A message only one provider understands; every other provider skips it.
    #[serde(rename = "llm_specific")]
    ProviderSpecific(ProviderMessage),
}

impl Message {
    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Message::System(InstructionMessage::new(text))
    }

    /// A developer message.
    pub fn developer(text: impl Into<String>) -> Self {
        Message::Developer(InstructionMessage::new(text))
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Message::User(UserMessage {
            content: Content::Text(text.into()),
            name: None,
            extra: Map::new(),
        })
    }

    /// An assistant text message.
    pub fn assistant(text: impl Into<String>) -> Self {
        Message::Assistant(AssistantMessage {
            content: Some(Some(Content::Text(text.into()))),
            ..AssistantMessage::default()
        })
    }

    /// A tool result message.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message::Tool(ToolMessage {
            tool_call_id: tool_call_id.into(),
            content: Content::Text(content.into()),
            extra: Map::new(),
        })
    }

    /// The role as it appears on the wire.
    pub fn role(&self) -> &'static str {
        match self {
            Message::System(_) => "system",
            Message::Developer(_) => "developer",
            Message::User(_) => "user",
            Message::Assistant(_) => "assistant",
            Message::Tool(_) => "tool",
            Message::ProviderSpecific(_) => "llm_specific",
        }
    }

    /// The content when it is a plain string.
    pub fn text(&self) -> Option<&str> {
        let content = match self {
            Message::System(m) | Message::Developer(m) => &m.content,
            Message::User(m) => &m.content,
            Message::Assistant(m) => m.content.as_ref()?.as_ref()?,
            Message::Tool(m) => &m.content,
            Message::ProviderSpecific(_) => return None,
        };
        match content {
            Content::Text(t) => Some(t),
            Content::Parts(_) => None,
        }
    }
}

/// A system or developer message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstructionMessage {
    /// The instructions.
    pub content: Content,
    /// An optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Keys this type does not model, kept for a lossless round trip.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl InstructionMessage {
    /// Instructions as plain text.
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            content: Content::Text(text.into()),
            name: None,
            extra: Map::new(),
        }
    }
}

/// A user message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserMessage {
    /// Text, or parts (text, images, audio).
    pub content: Content,
    /// An optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Keys this type does not model, kept for a lossless round trip.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An assistant message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// `None`: no `content` key; `Some(None)`: `"content": null`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub content: Option<Option<Content>>,
    /// Tool calls the model made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// An optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Keys this type does not model, kept for a lossless round trip.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    /// What an agent keeps beside the wire JSON; never serialised.
    #[serde(skip)]
    pub meta: Option<Box<AssistantMeta>>,
}

/// A tool result message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolMessage {
    /// The call this answers.
    pub tool_call_id: String,
    /// The result.
    pub content: Content,
    /// Keys this type does not model, kept for a lossless round trip.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A provider-specific message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderMessage {
    /// The adapter that understands it (e.g. `anthropic`).
    pub llm: String,
    /// The provider's own message JSON.
    pub message: Value,
}

/// Message content: a string or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Typed parts.
    Parts(Vec<ContentPart>),
}

impl Content {
    /// All the text of the content, parts joined by spaces.
    pub fn joined_text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Known(KnownPart::Text { text }) => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// One part of a content list; parts this crate does not model are kept as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ContentPart {
    /// A part voxide understands.
    Known(KnownPart),
    /// Any other part, kept as it came.
    Other(Value),
}

/// The content parts voxide understands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum KnownPart {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image by URL (or data URL).
    ImageUrl {
        /// `{url, detail?}`.
        image_url: Value,
    },
    /// Base64 audio.
    InputAudio {
        /// `{data, format}`.
        input_audio: Value,
    },
}

/// One tool call in an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for this call.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function and its JSON-encoded arguments.
    pub function: FunctionCall,
}

impl ToolCall {
    /// A function tool call with `arguments` JSON-encoded.
    pub fn function(id: impl Into<String>, name: impl Into<String>, arguments: &Value) -> Self {
        Self {
            id: id.into(),
            kind: "function".into(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.to_string(),
            },
        }
    }
}

/// The function part of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The tool's name.
    pub name: String,
    /// Arguments as a JSON string, as the provider sent them.
    pub arguments: String,
}

/// What a pi-style agent keeps with an assistant message, outside the wire JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct AssistantMeta {
    /// The response as typed blocks.
    pub blocks: Vec<ContentBlock>,
    /// Which provider answered.
    pub provider: String,
    /// Which model answered.
    pub model: String,
    /// Tokens used.
    pub usage: TokenUsage,
    /// Dollars spent, from the price table; `None` when the model has no known price.
    pub cost_usd: Option<f64>,
    /// Why the response ended.
    pub stop_reason: StopReason,
    /// When the response ended.
    pub timestamp: std::time::SystemTime,
}

/// A typed block of an assistant response.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentBlock {
    /// Visible text.
    Text(String),
    /// Reasoning the model showed.
    Thinking(String),
    /// A tool call.
    ToolCall(ToolCall),
}

/// Why an assistant response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished.
    Stop,
    /// The token limit cut it.
    Length,
    /// The model called tools.
    ToolUse,
    /// The provider failed.
    Error,
    /// An interruption cut it.
    Aborted,
}

/// Tells a present `null` (`Some(None)`) from a missing key (`None`, via `default`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<Content>>, D::Error> {
    Option::<Content>::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip(v: Value) {
        let m: Message = serde_json::from_value(v.clone()).expect("parses");
        assert_eq!(serde_json::to_value(&m).expect("serialises"), v);
    }

    #[test]
    fn every_openai_shape_round_trips_exactly() {
        round_trip(json!({"role": "system", "content": "be brief"}));
        round_trip(json!({"role": "developer", "content": "be brief", "name": "ops"}));
        round_trip(json!({"role": "user", "content": "hi"}));
        round_trip(json!({"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}},
            {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
            {"type": "file", "file": {"file_id": "f1"}}
        ]}));
        round_trip(json!({"role": "assistant", "content": "sure"}));
        round_trip(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}
        ]}));
        round_trip(json!({"role": "assistant", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]}));
        round_trip(
            json!({"role": "assistant", "content": "x", "refusal": null, "audio": {"id": "a"}}),
        );
        round_trip(json!({"role": "tool", "tool_call_id": "call_1", "content": "42"}));
        round_trip(
            json!({"role": "llm_specific", "llm": "anthropic", "message": {"role": "user", "content": []}}),
        );
    }

    #[test]
    fn unknown_roles_are_an_error() {
        let err = serde_json::from_value::<Message>(json!({"role": "wizard", "content": "x"}));
        assert!(err.is_err());
    }

    #[test]
    fn text_reads_plain_content_only() {
        assert_eq!(Message::user("hi").text(), Some("hi"));
        let parts: Message = serde_json::from_value(
            json!({"role": "user", "content": [{"type": "text", "text": "a"}]}),
        )
        .expect("parses");
        assert_eq!(parts.text(), None);
    }
}
