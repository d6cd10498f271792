//! Gemini Live: the context as `clientContent` turns and `toolResponse` messages.
//!
//! Tool results go through `toolResponse.functionResponses`: a sync call's result plainly, an
//! async call's final result with `scheduling: WHEN_IDLE` (the model mentions it when it is not
//! talking), and its partial results with `willContinue: true` and `scheduling: SILENT`, the
//! channel Gemini has for a non-blocking call that is still running. The *started* message and
//! `IN_PROGRESS` placeholders are not sent.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::gemini::{declaration, response_object};
use super::{leading_instructions, provider_specific};
use crate::context::IN_PROGRESS;
use crate::context::async_tool_messages::{AsyncToolMessageKind, parse_message};
use crate::context::{AdapterKind, Message, ToolsSchema};

/// One client message and the key that identifies it across context updates.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveItem {
    /// `output:<call id>`, `partial:<call id>:<n>` or `message:<index>`.
    pub key: String,
    /// The message to send.
    pub message: Value,
}

/// The `systemInstruction` content: the context's leading system and developer messages.
pub fn system_instruction(messages: &[Message]) -> Option<Value> {
    leading_instructions(messages)
        .0
        .map(|text| json!({"parts": [{"text": text}]}))
}

/// Function declarations, async ones marked `NON_BLOCKING`, then Gemini's own tools.
pub fn tools(tools: &ToolsSchema, async_functions: &[String]) -> Vec<Value> {
    let declarations: Vec<Value> = tools
        .standard_tools
        .iter()
        .map(|schema| {
            let mut d = declaration(schema);
            if async_functions.contains(&schema.name) {
                d["behavior"] = json!("NON_BLOCKING");
            }
            d
        })
        .collect();
    let mut out = Vec::new();
    if !declarations.is_empty() {
        out.push(json!({"functionDeclarations": declarations}));
    }
    out.extend(tools.custom(AdapterKind::Gemini).iter().cloned());
    out
}

/// The conversation after the leading instructions: text turns as `clientContent` and tool
/// results as `toolResponse`.
pub fn items(messages: &[Message]) -> Vec<LiveItem> {
    let skip = leading_instructions(messages).1;
    let names: HashMap<&str, &str> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Assistant(a) => a.tool_calls.as_ref(),
            _ => None,
        })
        .flatten()
        .map(|c| (c.id.as_str(), c.function.name.as_str()))
        .collect();
    let name_of = |id: &str| names.get(id).copied().unwrap_or_default().to_owned();
    let mut partials: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (index, message) in messages.iter().enumerate().skip(skip) {
        let key = format!("message:{index}");
        if let Some(own) = provider_specific(message, AdapterKind::Gemini) {
            out.extend(own.cloned().map(|message| LiveItem {
                key: key.clone(),
                message,
            }));
            continue;
        }
        if let Some(payload) = parse_message(message) {
            let name = name_of(&payload.tool_call_id);
            out.extend(async_result(payload, &name, &mut partials));
            continue;
        }
        let turn = |role: &str, text: String| LiveItem {
            key: key.clone(),
            message: json!({"clientContent": {
                "turns": [{"role": role, "parts": [{"text": text}]}],
                "turnComplete": false,
            }}),
        };
        match message {
            Message::User(m) => out.push(turn("user", m.content.joined_text())),
            Message::System(m) | Message::Developer(m) => {
                out.push(turn("user", m.content.joined_text()))
            }
            Message::Assistant(m) => {
                if let Some(text) = m.content.as_ref().and_then(Option::as_ref) {
                    let text = text.joined_text();
                    if !text.is_empty() {
                        out.push(turn("model", text));
                    }
                }
            }
            Message::Tool(m) => {
                let text = m.content.joined_text();
                if text != IN_PROGRESS {
                    out.push(LiveItem {
                        key: format!("output:{}", m.tool_call_id),
                        message: tool_response(function_response(
                            &m.tool_call_id,
                            &name_of(&m.tool_call_id),
                            &text,
                        )),
                    });
                }
            }
            Message::ProviderSpecific(_) => {}
        }
    }
    out
}

/// An async tool's intermediate result (a silent partial response that says more follows) or
/// its final one (spoken when the model is idle); nothing for its start.
fn async_result(
    payload: crate::context::async_tool_messages::AsyncToolMessagePayload,
    name: &str,
    partials: &mut HashMap<String, usize>,
) -> Option<LiveItem> {
    let id = payload.tool_call_id;
    let result = payload.result.unwrap_or_default();
    let mut response = function_response(&id, name, &result);
    let key = match payload.kind {
        AsyncToolMessageKind::Started => return None,
        AsyncToolMessageKind::Intermediate => {
            let n = partials.entry(id.clone()).or_default();
            *n += 1;
            response["willContinue"] = json!(true);
            response["scheduling"] = json!("SILENT");
            format!("partial:{id}:{n}")
        }
        AsyncToolMessageKind::Final => {
            response["scheduling"] = json!("WHEN_IDLE");
            format!("output:{id}")
        }
    };
    Some(LiveItem {
        key,
        message: tool_response(response),
    })
}

fn function_response(id: &str, name: &str, result: &str) -> Value {
    json!({"id": id, "name": name, "response": response_object(result)})
}

fn tool_response(response: Value) -> Value {
    json!({"toolResponse": {"functionResponses": [response]}})
}
