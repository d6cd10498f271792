//! Tool descriptions, written once and converted per provider by the adapters.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// One function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionSchema {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON-schema properties of the arguments object.
    pub properties: Map<String, Value>,
    /// Names of the required properties.
    pub required: Vec<String>,
}

impl FunctionSchema {
    /// A function with no arguments.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            properties: Map::new(),
            required: Vec::new(),
        }
    }

    /// Adds a property; `required` marks it required.
    pub fn property(mut self, name: impl Into<String>, schema: Value, required: bool) -> Self {
        let name = name.into();
        if required {
            self.required.push(name.clone());
        }
        self.properties.insert(name, schema);
        self
    }

    /// Whether `name` may name a function: letters, digits, `_` and `-`, at least one.
    pub fn is_valid_name(name: &str) -> bool {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
    }

    /// A function whose arguments `parameters` describes: a JSON Schema of an object (its
    /// `properties` and `required` are kept), or null for none.
    pub fn from_parameters(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: &Value,
    ) -> Result<Self, String> {
        let name = name.into();
        let mut schema = Self::new(name.clone(), description);
        if parameters.is_null() {
            return Ok(schema);
        }
        let Some(object) = parameters.as_object() else {
            return Err(format!(
                "the parameters of {name} are not a JSON Schema object"
            ));
        };
        if let Some(kind) = object.get("type")
            && kind != "object"
        {
            return Err(format!(
                "the parameters of {name} must be of type \"object\", not {kind}"
            ));
        }
        match object.get("properties") {
            None => {}
            Some(Value::Object(properties)) => schema.properties = properties.clone(),
            Some(_) => return Err(format!("the properties of {name} are not an object")),
        }
        match object.get("required") {
            None => {}
            Some(Value::Array(names)) => {
                for n in names {
                    let Some(n) = n.as_str() else {
                        return Err(format!("{name}'s required list holds a non-string"));
                    };
                    if !schema.properties.contains_key(n) {
                        return Err(format!("{name} requires {n:?}, which it does not describe"));
                    }
                    schema.required.push(n.to_owned());
                }
            }
            Some(_) => return Err(format!("the required list of {name} is not an array")),
        }
        Ok(schema)
    }

    /// The JSON schema of the arguments object.
    pub fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": self.properties,
            "required": self.required,
        })
    }
}

/// Which provider adapter a custom tool or a provider-specific message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AdapterKind {
    /// OpenAI chat completions.
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic messages.
    #[serde(rename = "anthropic")]
    Anthropic,
    /// Google Gemini (and Gemini Live).
    #[serde(rename = "gemini")]
    Gemini,
    /// OpenAI Realtime.
    #[serde(rename = "openai_realtime")]
    OpenAiRealtime,
}

impl AdapterKind {
    /// The name used in `llm_specific` messages and configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            AdapterKind::OpenAi => "openai",
            AdapterKind::Anthropic => "anthropic",
            AdapterKind::Gemini => "gemini",
            AdapterKind::OpenAiRealtime => "openai_realtime",
        }
    }
}

/// The tools offered to the model: standard functions plus provider-specific tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolsSchema {
    /// Functions every provider gets, converted by its adapter.
    pub standard_tools: Vec<FunctionSchema>,
    /// Tools in one provider's own format (e.g. a built-in search tool), passed as they are.
    pub custom_tools: BTreeMap<AdapterKind, Vec<Value>>,
}

impl ToolsSchema {
    /// Standard functions only.
    pub fn new(standard_tools: Vec<FunctionSchema>) -> Self {
        Self {
            standard_tools,
            custom_tools: BTreeMap::new(),
        }
    }

    /// The provider-specific tools for `kind`.
    pub fn custom(&self, kind: AdapterKind) -> &[Value] {
        self.custom_tools.get(&kind).map_or(&[], Vec::as_slice)
    }

    /// True when no tool at all is offered.
    pub fn is_empty(&self) -> bool {
        self.standard_tools.is_empty() && self.custom_tools.values().all(Vec::is_empty)
    }
}
