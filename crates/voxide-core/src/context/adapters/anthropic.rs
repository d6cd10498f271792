//! Anthropic messages: instructions in `system`, tool calls as `tool_use` blocks, results as
//! `tool_result` blocks in user turns, and consecutive messages of one role merged into one.
//!
//! The request is checked before it goes: roles alternate, every `tool_use` is answered in the
//! next user turn, and the conversation ends on a user turn. Claude 4.6 and later refuse a
//! request that ends on the assistant ("This model does not support assistant message prefill.
//! The conversation must end with a user message."), so a context that does is an error here,
//! not a 400 there. A reply's thinking blocks go back verbatim, signature and all, before the
//! `tool_use` they led to ("Replay them unchanged when tools are used").

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::{
    ContextError, arguments_object, check_turns, data_url, grouped_calls,
    instructions_and_conversation, provider_specific, push_merged,
};
use crate::context::{
    AdapterKind, Content, ContentPart, KnownPart, Message, ToolChoice, ToolsSchema,
};

/// The `system`, `messages`, `tools` and `tool_choice` of a messages request, or why the
/// context cannot be one.
pub fn request(
    messages: &[Message],
    tools: &ToolsSchema,
    tool_choice: Option<&ToolChoice>,
) -> Result<Value, ContextError> {
    let (system, skip) = instructions_and_conversation(messages);
    let turns = self::messages(&messages[skip..]);
    check(&turns)?;
    let mut body = Map::new();
    if let Some(system) = system {
        body.insert("system".into(), Value::String(system));
    }
    body.insert("messages".into(), Value::Array(turns));
    let tools = self::tools(tools);
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = tool_choice {
            body.insert("tool_choice".into(), self::tool_choice(choice));
        }
    }
    Ok(Value::Object(body))
}

/// The rules of the Messages API that a request breaks with a 400 (see the module's notes).
fn check(turns: &[Value]) -> Result<(), ContextError> {
    fn call(block: &Value) -> Option<&str> {
        (block["type"] == "tool_use").then(|| block["id"].as_str())?
    }
    fn result(block: &Value) -> Option<&str> {
        (block["type"] == "tool_result").then(|| block["tool_use_id"].as_str())?
    }
    check_turns("Anthropic", turns, "content", "assistant", call, result)
}

/// The conversation as alternating user/assistant messages of content blocks. System and
/// developer messages inside the conversation become user text.
pub fn messages(messages: &[Message]) -> Vec<Value> {
    let messages = &grouped_calls(messages)[..];
    let thinking = thinking_blocks(messages);
    let mut merged: Vec<(String, Vec<Value>)> = Vec::new();
    for message in messages {
        if let Some(own) = provider_specific(message, AdapterKind::Anthropic) {
            if let Some(own) = own.filter(|own| !is_thinking(own)) {
                let role = own.get("role").and_then(Value::as_str).unwrap_or("user");
                push_merged(&mut merged, role, content_blocks(own.get("content")));
            }
            continue;
        }
        let (role, blocks) = match message {
            Message::System(m) | Message::Developer(m) => ("user", blocks(&m.content)),
            Message::User(m) => ("user", blocks(&m.content)),
            Message::Assistant(m) => {
                // The reasoning that led to the calls comes first, as the model wrote it.
                let mut out: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .flatten()
                    .filter_map(|c| thinking.get(c.id.as_str()))
                    .flat_map(|blocks| blocks.iter().cloned())
                    .collect();
                out.extend(
                    m.content
                        .as_ref()
                        .and_then(Option::as_ref)
                        .map(blocks)
                        .unwrap_or_default(),
                );
                for call in m.tool_calls.iter().flatten() {
                    out.push(json!({
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.function.name,
                        "input": arguments_object(&call.function.arguments),
                    }));
                }
                ("assistant", out)
            }
            Message::Tool(m) => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id,
                    "content": m.content.joined_text(),
                })],
            ),
            Message::ProviderSpecific(_) => continue,
        };
        push_merged(&mut merged, role, blocks);
    }
    merged
        .into_iter()
        .map(|(role, mut content)| {
            // Results must lead a user turn, before any text the user added.
            content.sort_by_key(|b| b.get("type").and_then(Value::as_str) != Some("tool_result"));
            json!({"role": role, "content": content})
        })
        .collect()
}

/// An Anthropic-only context message that carries a reply's thinking blocks, bookmarked by the
/// first call they led to: `{"type": "thinking", "blocks": [...], "bookmark": {"function_call":
/// ID}}`.
pub fn thinking_message(tool_call_id: &str, blocks: Vec<Value>) -> crate::context::ProviderMessage {
    crate::context::ProviderMessage {
        llm: AdapterKind::Anthropic.as_str().to_owned(),
        message: json!({
            "type": "thinking",
            "blocks": blocks,
            "bookmark": {"function_call": tool_call_id},
        }),
    }
}

fn is_thinking(message: &Value) -> bool {
    message.get("type").and_then(Value::as_str) == Some("thinking")
}

/// Each call's thinking blocks, by the id of the call they led to.
fn thinking_blocks(messages: &[Message]) -> HashMap<&str, &[Value]> {
    messages
        .iter()
        .filter_map(|m| provider_specific(m, AdapterKind::Anthropic).flatten())
        .filter(|own| is_thinking(own))
        .filter_map(|own| {
            let id = own.pointer("/bookmark/function_call")?.as_str()?;
            let blocks = own.get("blocks")?.as_array()?;
            Some((id, blocks.as_slice()))
        })
        .collect()
}

/// Content blocks of a provider-specific message: a string or a block list.
fn content_blocks(content: Option<&Value>) -> Vec<Value> {
    match content {
        Some(Value::String(text)) => text_block(text).into_iter().collect(),
        Some(Value::Array(blocks)) => blocks.clone(),
        _ => Vec::new(),
    }
}

fn text_block(text: &str) -> Option<Value> {
    // The API rejects empty text blocks.
    (!text.trim().is_empty()).then(|| json!({"type": "text", "text": text}))
}

fn blocks(content: &Content) -> Vec<Value> {
    match content {
        Content::Text(text) => text_block(text).into_iter().collect(),
        Content::Parts(parts) => parts.iter().filter_map(part).collect(),
    }
}

fn part(part: &ContentPart) -> Option<Value> {
    match part {
        ContentPart::Known(KnownPart::Text { text }) => text_block(text),
        ContentPart::Known(KnownPart::ImageUrl { image_url }) => {
            let url = image_url.get("url").and_then(Value::as_str)?;
            Some(match data_url(url) {
                Some((media_type, data)) => json!({
                    "type": "image",
                    "source": {"type": "base64", "media_type": media_type, "data": data},
                }),
                None => json!({"type": "image", "source": {"type": "url", "url": url}}),
            })
        }
        ContentPart::Known(KnownPart::InputAudio { .. }) => {
            tracing::debug!("Anthropic takes no audio input; the audio part is left out");
            None
        }
        // A block voxide does not model may be one of Anthropic's own: pass it on.
        ContentPart::Other(block) => Some(block.clone()),
    }
}

/// Standard tools as `{name, description, input_schema}`, then Anthropic's own tools.
pub fn tools(tools: &ToolsSchema) -> Vec<Value> {
    tools
        .standard_tools
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "input_schema": t.parameters(),
            })
        })
        .chain(tools.custom(AdapterKind::Anthropic).iter().cloned())
        .collect()
}

/// `auto`, `any` (for required), `none` or a named tool.
pub fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::Function(name) => json!({"type": "tool", "name": name}),
    }
}
