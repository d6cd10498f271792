//! Google Gemini: `contents` of `user` and `model` turns made of parts, tool calls as
//! `functionCall` parts, results as `functionResponse` parts, instructions in `systemInstruction`.
//!
//! The request is checked before it goes: turns alternate, every `functionCall` is answered by
//! a `functionResponse` in the next turn ("the number of function response parts must equal the
//! number of function call parts of the function call turn"), and the conversation ends on a
//! user turn, as Anthropic's does: a model turn last would be answered as a continuation of the
//! bot's own words.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::{
    ContextError, arguments_object, check_turns, data_url, grouped_calls,
    instructions_and_conversation, provider_specific, push_merged,
};
use crate::context::{
    AdapterKind, Content, ContentPart, FunctionSchema, KnownPart, Message, ToolChoice, ToolsSchema,
};

/// The `systemInstruction`, `contents`, `tools` and `toolConfig` of a generateContent request,
/// or why the context cannot be one.
pub fn request(
    messages: &[Message],
    tools: &ToolsSchema,
    tool_choice: Option<&ToolChoice>,
) -> Result<Value, ContextError> {
    let (system, skip) = instructions_and_conversation(messages);
    let contents = contents(&messages[skip..]);
    check(&contents)?;
    let mut body = Map::new();
    if let Some(system) = system {
        body.insert(
            "systemInstruction".into(),
            json!({"parts": [{"text": system}]}),
        );
    }
    body.insert("contents".into(), Value::Array(contents));
    let tools = self::tools(tools);
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = tool_choice {
            body.insert("toolConfig".into(), tool_config(choice));
        }
    }
    Ok(Value::Object(body))
}

/// The rules of `generateContent` that a request breaks (see the module's notes).
fn check(contents: &[Value]) -> Result<(), ContextError> {
    check_turns(
        "Gemini",
        contents,
        "parts",
        "model",
        |p| p.pointer("/functionCall/id").and_then(Value::as_str),
        |p| p.pointer("/functionResponse/id").and_then(Value::as_str),
    )
}

/// The conversation as `{role, parts}` turns, consecutive turns of one role merged.
pub fn contents(messages: &[Message]) -> Vec<Value> {
    let messages = &grouped_calls(messages)[..];
    // A function response names its function; the context only keeps the call's id.
    let names: HashMap<&str, &str> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Assistant(a) => a.tool_calls.as_ref(),
            _ => None,
        })
        .flatten()
        .map(|c| (c.id.as_str(), c.function.name.as_str()))
        .collect();
    let signatures = thought_signatures(messages);
    let mut merged: Vec<(String, Vec<Value>)> = Vec::new();
    for message in messages {
        if let Some(own) = provider_specific(message, AdapterKind::Gemini) {
            if let Some(own) = own.filter(|own| !is_thought_signature(own)) {
                let role = own.get("role").and_then(Value::as_str).unwrap_or("user");
                let parts = own
                    .get("parts")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                push_merged(&mut merged, role, parts);
            }
            continue;
        }
        let (role, parts) = match message {
            Message::System(m) | Message::Developer(m) => ("user", parts(&m.content)),
            Message::User(m) => ("user", parts(&m.content)),
            Message::Assistant(m) => {
                let mut out = m
                    .content
                    .as_ref()
                    .and_then(Option::as_ref)
                    .map(parts)
                    .unwrap_or_default();
                for call in m.tool_calls.iter().flatten() {
                    let mut part = json!({"functionCall": {
                        "id": call.id,
                        "name": call.function.name,
                        "args": arguments_object(&call.function.arguments),
                    }});
                    if let Some(signature) = signatures.get(call.id.as_str()) {
                        part["thoughtSignature"] = json!(signature);
                    }
                    out.push(part);
                }
                ("model", out)
            }
            Message::Tool(m) => {
                let name = names
                    .get(m.tool_call_id.as_str())
                    .copied()
                    .unwrap_or("unknown");
                let part = json!({"functionResponse": {
                    "id": m.tool_call_id,
                    "name": name,
                    "response": response_object(&m.content.joined_text()),
                }});
                ("user", vec![part])
            }
            Message::ProviderSpecific(_) => continue,
        };
        push_merged(&mut merged, role, parts);
    }
    merged
        .into_iter()
        .map(|(role, parts)| json!({"role": role, "parts": parts}))
        .collect()
}

/// A Gemini-only context message that carries a call's thought signature (pipecat's shape:
/// `{"type": "thought_signature", "signature", "bookmark": {"function_call": ID}}`).
fn is_thought_signature(message: &Value) -> bool {
    message.get("type").and_then(Value::as_str) == Some("thought_signature")
}

/// Each call's thought signature, by call id: Gemini wants it back with the call, verbatim.
fn thought_signatures(messages: &[Message]) -> HashMap<&str, &str> {
    messages
        .iter()
        .filter_map(|m| provider_specific(m, AdapterKind::Gemini).flatten())
        .filter(|own| is_thought_signature(own))
        .filter_map(|own| {
            let id = own.pointer("/bookmark/function_call")?.as_str()?;
            let signature = own.get("signature")?.as_str()?;
            Some((id, signature))
        })
        .collect()
}

/// A function response must be an object: a JSON object result is used as it is, anything else
/// is wrapped as `{"result": ...}`.
pub fn response_object(result: &str) -> Value {
    match serde_json::from_str::<Value>(result) {
        Ok(v @ Value::Object(_)) => v,
        Ok(other) => json!({"result": other}),
        Err(_) => json!({"result": result}),
    }
}

fn parts(content: &Content) -> Vec<Value> {
    match content {
        Content::Text(text) if text.is_empty() => Vec::new(),
        Content::Text(text) => vec![json!({"text": text})],
        Content::Parts(parts) => parts.iter().filter_map(part).collect(),
    }
}

fn part(part: &ContentPart) -> Option<Value> {
    match part {
        ContentPart::Known(KnownPart::Text { text }) => Some(json!({"text": text})),
        ContentPart::Known(KnownPart::ImageUrl { image_url }) => {
            let url = image_url.get("url").and_then(Value::as_str)?;
            Some(match data_url(url) {
                Some((mime, data)) => json!({"inlineData": {"mimeType": mime, "data": data}}),
                None => json!({"fileData": {"mimeType": image_mime(url), "fileUri": url}}),
            })
        }
        ContentPart::Known(KnownPart::InputAudio { input_audio }) => {
            let data = input_audio.get("data").and_then(Value::as_str)?;
            let format = input_audio
                .get("format")
                .and_then(Value::as_str)
                .unwrap_or("wav");
            Some(json!({"inlineData": {"mimeType": format!("audio/{format}"), "data": data}}))
        }
        ContentPart::Other(part) => Some(part.clone()),
    }
}

fn image_mime(url: &str) -> &'static str {
    let lower = url.to_ascii_lowercase();
    match lower.rsplit('.').next() {
        Some("png") => "image/png",
        Some("webp") => "image/webp",
        Some("gif") => "image/gif",
        _ => "image/jpeg",
    }
}

/// Standard tools as one `functionDeclarations` tool, then Gemini's own tools (e.g. search).
pub fn tools(tools: &ToolsSchema) -> Vec<Value> {
    let declarations: Vec<Value> = tools.standard_tools.iter().map(declaration).collect();
    let mut out = Vec::new();
    if !declarations.is_empty() {
        out.push(json!({"functionDeclarations": declarations}));
    }
    out.extend(tools.custom(AdapterKind::Gemini).iter().cloned());
    out
}

/// One function declaration; a function without arguments has no `parameters` (Gemini rejects
/// an object schema with no properties).
pub fn declaration(schema: &FunctionSchema) -> Value {
    let mut d = json!({"name": schema.name, "description": schema.description});
    if !schema.properties.is_empty() {
        d["parameters"] = schema.parameters();
    }
    d
}

fn tool_config(choice: &ToolChoice) -> Value {
    let config = match choice {
        ToolChoice::Auto => json!({"mode": "AUTO"}),
        ToolChoice::None => json!({"mode": "NONE"}),
        ToolChoice::Required => json!({"mode": "ANY"}),
        ToolChoice::Function(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
    };
    json!({"functionCallingConfig": config})
}
