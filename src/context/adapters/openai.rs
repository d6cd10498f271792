//! OpenAI chat completions: the context's own shape, plus tools in `{type: function}` wrappers.

use serde_json::{Map, Value, json};

use super::provider_specific;
use crate::context::{AdapterKind, FunctionSchema, Message, ToolChoice, ToolsSchema};

/// The `messages`, `tools` and `tool_choice` of a chat completions request.
pub fn request(
    messages: &[Message],
    tools: &ToolsSchema,
    tool_choice: Option<&ToolChoice>,
) -> Value {
    let mut body = Map::new();
    body.insert("messages".into(), Value::Array(self::messages(messages)));
    let tools = self::tools(tools);
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = tool_choice {
            body.insert("tool_choice".into(), self::tool_choice(choice));
        }
    }
    Value::Object(body)
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
