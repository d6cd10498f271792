//! OpenAI chat completions: the context's own shape, plus tools in `{type: function}` wrappers.
//!
//! The request is checked before it goes: "messages with role 'tool' must be a response to a
//! preceeding message with 'tool_calls'" (sic, the API's 400), and each call has its result
//! before the conversation goes on.

use serde_json::{Map, Value, json};

use super::{ContextError, provider_specific};
use crate::context::{AdapterKind, FunctionSchema, Message, ToolChoice, ToolsSchema};

/// The `messages`, `tools` and `tool_choice` of a chat completions request, or why the context
/// cannot be one.
pub fn request(
    messages: &[Message],
    tools: &ToolsSchema,
    tool_choice: Option<&ToolChoice>,
) -> Result<Value, ContextError> {
    let messages = self::messages(messages);
    check(&messages)?;
    let mut body = Map::new();
    body.insert("messages".into(), Value::Array(messages));
    let tools = self::tools(tools);
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = tool_choice {
            body.insert("tool_choice".into(), self::tool_choice(choice));
        }
    }
    Ok(Value::Object(body))
}

/// Each run of tool messages answers the calls of the assistant message right before it, all
/// of them.
fn check(messages: &[Value]) -> Result<(), ContextError> {
    let ids = |m: &Value| -> Vec<String> {
        m["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .filter_map(|c| c["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut asked: Vec<String> = Vec::new();
    let mut answered: Vec<String> = Vec::new();
    for message in messages {
        if message["role"] == "tool" {
            let id = message["tool_call_id"].as_str().unwrap_or_default();
            if !asked.iter().any(|a| a == id) {
                return Err(ContextError::ResultWithoutCall { id: id.to_owned() });
            }
            answered.push(id.to_owned());
            continue;
        }
        if let Some(id) = asked.iter().find(|id| !answered.contains(id)) {
            return Err(ContextError::CallWithoutResult { id: id.clone() });
        }
        asked = ids(message);
        answered.clear();
    }
    match asked.iter().find(|id| !answered.contains(id)) {
        Some(id) => Err(ContextError::CallWithoutResult { id: id.clone() }),
        None => Ok(()),
    }
}

/// The messages as OpenAI JSON; other providers' messages are left out.
pub fn messages(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .filter_map(|m| match provider_specific(m, AdapterKind::OpenAi) {
            Some(own) => own.cloned(),
            None => serde_json::to_value(m).ok(),
        })
        .collect()
}

/// Standard tools as `{type: function, function: {...}}`, then OpenAI's own tools.
pub fn tools(tools: &ToolsSchema) -> Vec<Value> {
    tools
        .standard_tools
        .iter()
        .map(function)
        .chain(tools.custom(AdapterKind::OpenAi).iter().cloned())
        .collect()
}

fn function(schema: &FunctionSchema) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": schema.name,
            "description": schema.description,
            "parameters": schema.parameters(),
        }
    })
}

/// `auto`, `none`, `required` or a named function.
pub fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Function(name) => json!({"type": "function", "function": {"name": name}}),
    }
}
