//! OpenAI Realtime: session instructions and tools, and the context as conversation items.
//!
//! Async-tool messages map onto the provider's channels: a final (or cancelled) result is the
//! call's `function_call_output`; a partial result, for which the protocol has no channel, is a
//! system message saying so; the *started* message and `IN_PROGRESS` placeholders are not sent,
//! since the model already knows its call is pending.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::{leading_instructions, provider_specific};
use crate::context::IN_PROGRESS;
use crate::context::async_tool_messages::{AsyncToolMessageKind, parse_message};
use crate::context::{
    AdapterKind, Content, ContentPart, KnownPart, Message, ToolChoice, ToolsSchema,
};

/// One conversation item and the key that identifies it across context updates, so a caller can
/// send each exactly once.
#[derive(Debug, Clone, PartialEq)]
pub struct RealtimeItem {
    /// Stable identity: `output:<call id>`, `partial:<call id>:<n>`, `call:<call id>` or
    /// `message:<index>`.
    pub key: String,
    /// The item for `conversation.item.create`.
    pub item: Value,
}

impl RealtimeItem {
    /// True for a tool result (`function_call_output`).
    pub fn is_function_output(&self) -> bool {
        self.item.get("type").and_then(Value::as_str) == Some("function_call_output")
    }
}

/// The session's `instructions`: the context's leading system and developer messages.
pub fn instructions(messages: &[Message]) -> Option<String> {
    leading_instructions(messages).0
}

/// Session tools: `{type: function, name, description, parameters}`, then Realtime's own.
pub fn tools(tools: &ToolsSchema) -> Vec<Value> {
    tools
        .standard_tools
        .iter()
        .map(|t| {
            json!({
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters(),
            })
        })
        .chain(tools.custom(AdapterKind::OpenAiRealtime).iter().cloned())
        .collect()
}

/// The session's `tool_choice`.
pub fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Function(name) => json!({"type": "function", "name": name}),
    }
}

/// The conversation after the leading instructions, as conversation items.
pub fn items(messages: &[Message]) -> Vec<RealtimeItem> {
    let skip = leading_instructions(messages).1;
    let mut partials: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (index, message) in messages.iter().enumerate().skip(skip) {
        let keyed = |item: Value| RealtimeItem {
            key: format!("message:{index}"),
            item,
        };
        if let Some(own) = provider_specific(message, AdapterKind::OpenAiRealtime) {
            out.extend(own.cloned().map(keyed));
            continue;
        }
        if let Some(payload) = parse_message(message) {
            let id = payload.tool_call_id.clone();
            match payload.kind {
                AsyncToolMessageKind::Started => {}
                AsyncToolMessageKind::Intermediate => {
                    let n = partials.entry(id.clone()).or_default();
                    *n += 1;
                    let text = format!(
                        "A partial result of the running tool call {id} arrived (the call is still \
                         running; its final result will follow): {}",
                        payload.result.unwrap_or_default()
                    );
                    out.push(RealtimeItem {
                        key: format!("partial:{id}:{n}"),
                        item: text_message("system", "input_text", &text),
                    });
                }
                AsyncToolMessageKind::Final => {
                    out.push(output(&id, &payload.result.unwrap_or_default()))
                }
            }
            continue;
        }
        match message {
            Message::System(m) | Message::Developer(m) => out.push(keyed(text_message(
                "system",
                "input_text",
                &m.content.joined_text(),
            ))),
            Message::User(m) => out.push(keyed(json!({
                "type": "message",
                "role": "user",
                "content": user_content(&m.content),
            }))),
            Message::Assistant(m) => {
                if let Some(text) = m.content.as_ref().and_then(Option::as_ref) {
                    let text = text.joined_text();
                    if !text.is_empty() {
                        out.push(keyed(text_message("assistant", "output_text", &text)));
                    }
                }
                for call in m.tool_calls.iter().flatten() {
                    out.push(RealtimeItem {
                        key: format!("call:{}", call.id),
                        item: json!({
                            "type": "function_call",
                            "call_id": call.id,
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        }),
                    });
                }
            }
            Message::Tool(m) => {
                let text = m.content.joined_text();
                if text != IN_PROGRESS {
                    out.push(output(&m.tool_call_id, &text));
                }
            }
            Message::ProviderSpecific(_) => {}
        }
    }
    out
}

fn output(call_id: &str, output: &str) -> RealtimeItem {
    RealtimeItem {
        key: format!("output:{call_id}"),
        item: json!({"type": "function_call_output", "call_id": call_id, "output": output}),
    }
}

fn text_message(role: &str, kind: &str, text: &str) -> Value {
    json!({"type": "message", "role": role, "content": [{"type": kind, "text": text}]})
}

fn user_content(content: &Content) -> Vec<Value> {
    match content {
        Content::Text(text) => vec![json!({"type": "input_text", "text": text})],
        Content::Parts(parts) => parts
            .iter()
            .filter_map(|p| match p {
                ContentPart::Known(KnownPart::Text { text }) => {
                    Some(json!({"type": "input_text", "text": text}))
                }
                ContentPart::Known(KnownPart::ImageUrl { image_url }) => {
                    let url = image_url.get("url")?;
                    Some(json!({"type": "input_image", "image_url": url}))
                }
                ContentPart::Known(KnownPart::InputAudio { input_audio }) => {
                    let data = input_audio.get("data")?;
                    Some(json!({"type": "input_audio", "audio": data}))
                }
                ContentPart::Other(_) => None,
            })
            .collect(),
    }
}
