//! A flow's plain types: the bot file's `[[node]]`s, and Pipecat Flows' JSON read into them.
//!
//! In a bot file:
//!
//! ```toml
//! initial_node = "greet"
//! context_strategy = "append"          # or "reset"; a node may say otherwise
//!
//! [[node]]
//! name = "greet"
//! role = "You are the booking line of Chez Voxide. Speak in short sentences."
//! task = "Greet the caller and ask for the date and the party size."
//! tools = ["get_current_time"]         # the bot's tools offered at this node
//!
//! [[node.function]]                    # a function whose call moves the talk on
//! name = "collect_booking"
//! description = "Records the date and party size."
//! parameters = { type = "object", properties = { date = { type = "string" }, party_size = { type = "integer" } }, required = ["date", "party_size"] }
//! transition_to = "confirm"
//!
//! [[node]]
//! name = "confirm"
//! task = "Read back the booking for {state.party_size} on {state.date} and ask to confirm."
//! pre_actions = [{ type = "tts_say", text = "Let me read that back." }]
//! ```
//!
//! Pipecat Flows' JSON comes in two shapes, both read here: a `FlowConfig` (`initial_node` and
//! `nodes` by name, each function `{"name", "transition_to"}` naming a tool, the older
//! `{"type": "function", "function": {…}}` dicts too) and the Flows editor's export (`meta` and
//! a list of `nodes` with their `data`, functions with `next_node_id`). What does not map is an
//! error that names it.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

/// `[[node]]`: one state of the conversation.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Its name, which transitions name.
    pub name: String,
    /// The bot's role: its system instruction from this node on, until a node sets another.
    pub role: Option<String>,
    /// What the bot does here, as one system message.
    pub task: Option<String>,
    /// Or as several messages (Pipecat's `task_messages`).
    #[serde(default)]
    pub task_messages: Vec<MessageConfig>,
    /// The bot's own tools offered here, by name (built-in, HTTP, MCP).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Functions of this node: `[[node.function]]`.
    #[serde(default, rename = "function")]
    pub functions: Vec<FunctionConfig>,
    /// Done on entering the node, before the bot answers.
    #[serde(default)]
    pub pre_actions: Vec<ActionConfig>,
    /// Done once the bot has answered at this node.
    #[serde(default)]
    pub post_actions: Vec<ActionConfig>,
    /// How the conversation changes on entering (default: the flow's).
    pub context_strategy: Option<StrategyConfig>,
    /// With `reset_with_summary`: what the summary is asked to be.
    pub summary_prompt: Option<String>,
    /// Whether the bot answers as soon as the node is entered (default: true).
    pub respond_immediately: Option<bool>,
}

/// A message of a node's task.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MessageConfig {
    /// `system`, `developer` or `user`.
    pub role: String,
    /// Its text; `{state.NAME}` is what the flow collected under `NAME`.
    pub content: String,
}

/// `[[node.function]]`: a function the model may call at a node.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FunctionConfig {
    /// The name the model calls it by; a bot tool of this name does the work.
    pub name: String,
    /// What it does, for the model (a function that is no tool of the bot's).
    pub description: Option<String>,
    /// The JSON Schema of its arguments, kept in the flow's state when called.
    pub parameters: Option<Value>,
    /// Where the conversation goes once it has answered (none: it stays).
    pub transition_to: Option<TransitionConfig>,
}

/// A node to move to, or one chosen by a field of the function's result.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum TransitionConfig {
    /// That node.
    Node(String),
    /// The node `cases` gives for the result's `field` (its value as text), else `default`.
    Branch {
        /// The result's key.
        field: String,
        /// Value to node.
        cases: BTreeMap<String, String>,
        /// Where an unmatched value goes (none: it stays).
        #[serde(default)]
        default: Option<String>,
    },
}

/// A pre- or post-action: `{ type = "tts_say", text = "…" }`, `{ type = "end_conversation" }`
/// or `{ type = "transfer", destination = "sales" }` (a name of the bot's `[transfer]`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ActionConfig {
    /// The action.
    #[serde(rename = "type")]
    pub kind: String,
    /// What `tts_say` says.
    pub text: Option<String>,
    /// Where `transfer` hands the call: a name of the bot's `[transfer]`.
    pub destination: Option<String>,
    /// Anything else the action carried (an error names an action voxide cannot do).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// How the conversation changes on entering a node.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StrategyConfig {
    /// The node's task joins the conversation so far.
    #[serde(alias = "APPEND")]
    Append,
    /// The conversation starts over from the node's role and task.
    #[serde(alias = "RESET")]
    Reset,
    /// It starts over as with `reset`, and a summary of what came before, which the LLM writes
    /// in the background, joins it once written.
    #[serde(alias = "RESET_WITH_SUMMARY")]
    ResetWithSummary,
}

/// A flow as the bot file holds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowConfig {
    /// Where it starts.
    pub initial_node: Option<String>,
    /// The default strategy.
    pub context_strategy: Option<StrategyConfig>,
    /// Functions offered at every node.
    pub global_functions: Vec<FunctionConfig>,
    /// Its nodes.
    pub nodes: Vec<NodeConfig>,
}

/// Pipecat Flows' JSON, in either shape, as a flow; an error names what does not map.
pub fn from_pipecat_json(json: &Value) -> Result<FlowConfig, String> {
    let Some(object) = json.as_object() else {
        return Err("a flow is a JSON object".into());
    };
    match object.get("nodes") {
        Some(Value::Object(nodes)) => flow_config(object, nodes),
        Some(Value::Array(nodes)) => editor_export(nodes),
        _ => Err(
            "a flow's \"nodes\" is an object of nodes by name (a FlowConfig) or a list \
                  (the Flows editor's export)"
                .into(),
        ),
    }
}

/// `{"initial_node", "nodes": {NAME: NODE}, "global_functions"}`.
fn flow_config(
    object: &Map<String, Value>,
    nodes: &Map<String, Value>,
) -> Result<FlowConfig, String> {
    known_keys(
        object,
        &[
            "initial_node",
            "nodes",
            "global_functions",
            "$schema",
            "$id",
        ],
        "the flow",
    )?;
    let initial = object
        .get("initial_node")
        .and_then(Value::as_str)
        .ok_or("a FlowConfig names its \"initial_node\"")?;
    let global_functions = match object.get("global_functions") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|f| function(f, "global_functions"))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("\"global_functions\" is a list".into()),
    };
    let nodes = nodes
        .iter()
        .map(|(name, node)| self::node(name, node))
        .collect::<Result<_, _>>()?;
    Ok(FlowConfig {
        initial_node: Some(initial.to_owned()),
        context_strategy: None,
        global_functions,
        nodes,
    })
}

/// `{"meta", "nodes": [{"id", "type", "data"}], "edges"}`: the node typed `initial` or `start`
/// begins, else the first.
fn editor_export(nodes: &[Value]) -> Result<FlowConfig, String> {
    let mut out = Vec::new();
    let mut initial = None;
    for node in nodes {
        let id = node["id"]
            .as_str()
            .ok_or("every node of the editor's export has an \"id\"")?;
        if matches!(node["type"].as_str(), Some("initial" | "start")) && initial.is_none() {
            initial = Some(id.to_owned());
        }
        let mut data = node["data"].as_object().cloned().unwrap_or_default();
        // The canvas's own keys.
        data.remove("label");
        out.push(self::node(id, &Value::Object(data))?);
    }
    let initial = initial.or_else(|| out.first().map(|n| n.name.clone()));
    Ok(FlowConfig {
        initial_node: initial,
        context_strategy: None,
        global_functions: Vec::new(),
        nodes: out,
    })
}

fn known_keys(object: &Map<String, Value>, keys: &[&str], what: &str) -> Result<(), String> {
    match object.keys().find(|k| !keys.contains(&k.as_str())) {
        Some(key) => Err(format!("{what}: voxide does not know the key {key:?}")),
        None => Ok(()),
    }
}

/// One node of either shape.
fn node(name: &str, node: &Value) -> Result<NodeConfig, String> {
    let what = format!("node {name:?}");
    let Some(object) = node.as_object() else {
        return Err(format!("{what} is not an object"));
    };
    known_keys(
        object,
        &[
            "name",
            "task_messages",
            "role_message",
            "role_messages",
            "functions",
            "pre_actions",
            "post_actions",
            "context_strategy",
            "summary_prompt",
            "respond_immediately",
        ],
        &what,
    )?;
    let messages = |key: &str| -> Result<Vec<MessageConfig>, String> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(list) => {
                serde_json::from_value(list.clone()).map_err(|e| format!("{what}: {key}: {e}"))
            }
        }
    };
    let role_messages = messages("role_messages")?;
    let role = match object.get("role_message") {
        Some(Value::String(role)) => Some(role.clone()),
        None | Some(Value::Null) => {
            let texts: Vec<&str> = role_messages.iter().map(|m| m.content.as_str()).collect();
            (!texts.is_empty()).then(|| texts.join("\n\n"))
        }
        Some(_) => return Err(format!("{what}: role_message is text")),
    };
    let functions = match object.get("functions") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|f| function(f, &what))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(format!("{what}: functions is a list")),
    };
    let actions = |key: &str| -> Result<Vec<ActionConfig>, String> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(list) => {
                serde_json::from_value(list.clone()).map_err(|e| format!("{what}: {key}: {e}"))
            }
        }
    };
    let mut summary_prompt = object
        .get("summary_prompt")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let context_strategy = match object.get("context_strategy") {
        None | Some(Value::Null) => None,
        // The older form: {"strategy": "RESET_WITH_SUMMARY", "summary_prompt": …}.
        Some(Value::Object(spec)) => {
            if let Some(prompt) = spec.get("summary_prompt").and_then(Value::as_str) {
                summary_prompt = Some(prompt.to_owned());
            }
            Some(strategy(
                spec.get("strategy").unwrap_or(&Value::Null),
                &what,
            )?)
        }
        Some(value) => Some(strategy(value, &what)?),
    };
    Ok(NodeConfig {
        name: name.to_owned(),
        role,
        task: None,
        task_messages: messages("task_messages")?,
        tools: Vec::new(),
        functions,
        pre_actions: actions("pre_actions")?,
        post_actions: actions("post_actions")?,
        context_strategy,
        summary_prompt,
        respond_immediately: object.get("respond_immediately").and_then(Value::as_bool),
    })
}

fn strategy(value: &Value, what: &str) -> Result<StrategyConfig, String> {
    match value.as_str().map(str::to_ascii_lowercase).as_deref() {
        Some("append") => Ok(StrategyConfig::Append),
        Some("reset") => Ok(StrategyConfig::Reset),
        Some("reset_with_summary") => Ok(StrategyConfig::ResetWithSummary),
        _ => Err(format!(
            "{what}: context_strategy {value}: voxide does append, reset and reset_with_summary"
        )),
    }
}

/// A function of either shape: `{"name", "transition_to"}`; `{"type": "function", "function":
/// {"name", "description", "parameters", "transition_to"}}`; or the editor's `{"name",
/// "description", "properties", "required", "next_node_id"}`.
fn function(value: &Value, what: &str) -> Result<FunctionConfig, String> {
    let Some(object) = value.as_object() else {
        return Err(format!("{what}: a function is an object"));
    };
    let object = match (object.get("type"), object.get("function")) {
        (Some(kind), Some(Value::Object(inner))) if kind == "function" => inner,
        _ => object,
    };
    let name = object["name"]
        .as_str()
        .ok_or_else(|| format!("{what}: a function without a name"))?;
    let what = format!("{what}, function {name:?}");
    known_keys(
        object,
        &[
            "name",
            "description",
            "parameters",
            "properties",
            "required",
            "transition_to",
            "next_node_id",
        ],
        &what,
    )?;
    let parameters = match (object.get("parameters"), object.get("properties")) {
        (Some(parameters), _) => Some(parameters.clone()),
        (None, Some(properties)) => Some(serde_json::json!({
            "type": "object",
            "properties": properties,
            "required": object.get("required").cloned().unwrap_or(Value::Array(Vec::new())),
        })),
        (None, None) => None,
    };
    let transition = object
        .get("transition_to")
        .or_else(|| object.get("next_node_id"))
        .filter(|v| !v.is_null())
        .map(|v| {
            serde_json::from_value(v.clone()).map_err(|e| format!("{what}: transition_to: {e}"))
        })
        .transpose()?;
    Ok(FunctionConfig {
        name: name.to_owned(),
        description: object
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned),
        parameters,
        transition_to: transition,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_flow_config_reads_with_its_functions_branches_and_older_strategy() {
        let flow = from_pipecat_json(&json!({
            "initial_node": "start",
            "global_functions": [{"name": "get_current_time"}],
            "nodes": {
                "start": {
                    "role_message": "You are a host.",
                    "task_messages": [{"role": "developer", "content": "Greet."}],
                    "functions": [
                        {"name": "check", "transition_to": {"field": "ok", "cases": {"true": "end"}}},
                        {"type": "function", "function": {"name": "go", "description": "Go on.",
                            "parameters": {"type": "object", "properties": {}}, "transition_to": "end"}}
                    ],
                    "context_strategy": {"strategy": "RESET"}
                },
                "end": {"task_messages": [], "post_actions": [{"type": "end_conversation"}]}
            }
        }))
        .expect("maps");
        assert_eq!(flow.initial_node.as_deref(), Some("start"));
        assert_eq!(flow.global_functions[0].name, "get_current_time");
        let start = flow
            .nodes
            .iter()
            .find(|n| n.name == "start")
            .expect("start");
        assert_eq!(start.role.as_deref(), Some("You are a host."));
        assert_eq!(start.context_strategy, Some(StrategyConfig::Reset));
        assert!(matches!(
            &start.functions[0].transition_to,
            Some(TransitionConfig::Branch { field, .. }) if field == "ok"
        ));
        assert_eq!(start.functions[1].description.as_deref(), Some("Go on."));
        assert_eq!(
            start.functions[1].transition_to,
            Some(TransitionConfig::Node("end".into()))
        );
    }

    #[test]
    fn the_editors_export_starts_at_its_initial_node_with_inline_parameters() {
        let flow = from_pipecat_json(&json!({
            "meta": {"name": "x"},
            "nodes": [
                {"id": "other", "type": "llm_task", "position": {"x": 0, "y": 0},
                 "data": {"label": "Other", "task_messages": []}},
                {"id": "hello", "type": "initial", "position": {"x": 0, "y": 0},
                 "data": {"task_messages": [], "functions": [
                    {"name": "pick", "description": "Picks.", "properties": {"size": {"type": "string"}},
                     "required": ["size"], "next_node_id": "other"}]}}
            ],
            "edges": []
        }))
        .expect("maps");
        assert_eq!(flow.initial_node.as_deref(), Some("hello"));
        let pick = &flow.nodes[1].functions[0];
        assert_eq!(
            pick.parameters.as_ref().expect("params")["required"],
            json!(["size"])
        );
        assert_eq!(
            pick.transition_to,
            Some(TransitionConfig::Node("other".into()))
        );
    }

    #[test]
    fn what_does_not_map_is_named() {
        let flow = from_pipecat_json(&json!({"initial_node": "a", "nodes": {"a": {
            "task_messages": [], "context_strategy": {"strategy": "RESET_WITH_SUMMARY",
            "summary_prompt": "Key facts only."}}}}))
        .expect("summaries map");
        let node = &flow.nodes[0];
        assert_eq!(
            node.context_strategy,
            Some(StrategyConfig::ResetWithSummary)
        );
        assert_eq!(node.summary_prompt.as_deref(), Some("Key facts only."));
        let e = from_pipecat_json(&json!({"initial_node": "a", "nodes": {"a": {
            "task_messages": [], "context_strategy": "FORGET"}}}))
        .expect_err("no such strategy");
        assert!(e.contains("node \"a\"") && e.contains("FORGET"), "{e}");
        let e = from_pipecat_json(&json!({"initial_node": "a", "nodes": {"a": {
            "task_messages": [], "functions": [{"name": "f", "handler": "x"}]}}}))
        .expect_err("handlers are Python");
        assert!(e.contains("\"handler\""), "{e}");
        assert!(from_pipecat_json(&json!([1])).is_err());
    }
}
