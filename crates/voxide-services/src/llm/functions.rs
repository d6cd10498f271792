//! The function registry and what a handler gets.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::Value;
use tokio::sync::mpsc;

use voxide_core::context::{ContextHandle, FunctionSchema};
use voxide_core::frames::OnContextUpdated;
use voxide_core::pipeline::AppResources;

/// How a registered function runs.
#[derive(Debug, Clone)]
pub struct FunctionOptions {
    /// True (default): an interruption cancels the call. False: the call is asynchronous; the
    /// conversation goes on and its results arrive later.
    pub cancel_on_interruption: bool,
    /// Overrides the service-wide timeout.
    pub timeout: Option<Duration>,
    /// For async calls: offer the model a `cancel_<name>` tool.
    pub cancellable_by_llm: bool,
}

impl Default for FunctionOptions {
    fn default() -> Self {
        Self {
            cancel_on_interruption: true,
            timeout: None,
            cancellable_by_llm: false,
        }
    }
}

impl FunctionOptions {
    /// Options of an asynchronous call (`cancel_on_interruption = false`).
    pub fn asynchronous() -> Self {
        Self {
            cancel_on_interruption: false,
            ..Self::default()
        }
    }
}

/// What happens after a result is delivered.
#[derive(Debug, Default)]
pub struct ResultProperties {
    /// Run the LLM now (`Some(true)`), not at all (`Some(false)`), or when the batch has
    /// settled (`None`).
    pub run_llm: Option<bool>,
    /// Called once the result has been written to the context.
    pub on_context_updated: Option<OnContextUpdated>,
    /// False for an intermediate result of an async call (more will follow).
    pub is_final: bool,
}

impl ResultProperties {
    /// A final result with the default run policy.
    pub fn final_result() -> Self {
        Self {
            is_final: true,
            ..Self::default()
        }
    }

    /// An intermediate result of an async call.
    pub fn intermediate() -> Self {
        Self::default()
    }
}

/// A result or progress update from a handler.
pub struct Delivered {
    /// What the handler gave.
    pub result: Option<Value>,
    /// Whether it is final, and what the LLM does with it.
    pub properties: ResultProperties,
}

/// Delivers a function's result. Clone it to deliver from elsewhere after the handler returned;
/// the call settles with the first final result, or with no result once every clone is gone.
#[derive(Clone)]
pub struct ResultCallback(pub(crate) mpsc::UnboundedSender<Delivered>);

impl ResultCallback {
    /// A callback and the end that receives what is delivered through it: for running a handler
    /// inside another one (a flow's function that runs the bot's tool of its name).
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<Delivered>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self(tx), rx)
    }

    /// Delivers the final result.
    pub fn done(&self, result: impl Into<Option<Value>>) {
        self.deliver(result, ResultProperties::final_result());
    }

    /// Delivers a result with explicit properties (intermediate results, run policy).
    pub fn deliver(&self, result: impl Into<Option<Value>>, properties: ResultProperties) {
        let delivered = Delivered {
            result: result.into(),
            properties,
        };
        if self.0.send(delivered).is_err() {
            tracing::warn!("a function result arrived after its call settled; dropped");
        }
    }
}

/// What a handler gets for one call.
pub struct FunctionCallParams {
    /// The tool's name.
    pub function_name: String,
    /// The provider's id for this call.
    pub tool_call_id: String,
    /// The arguments the model gave (an object; `{}` when it gave none or invalid JSON).
    pub arguments: Value,
    /// The conversation.
    pub context: ContextHandle,
    /// The app's resources.
    pub app_resources: AppResources,
    /// Where the result goes.
    pub result_callback: ResultCallback,
}

/// A function the model may call.
pub type FunctionHandler = Arc<dyn Fn(FunctionCallParams) -> BoxFuture<'static, ()> + Send + Sync>;

/// A registered function: its handler and how it runs.
#[derive(Clone)]
pub struct Registered {
    /// What runs it.
    pub handler: FunctionHandler,
    /// How it runs.
    pub options: FunctionOptions,
}

/// Named handlers plus an optional catch-all.
#[derive(Default, Clone)]
pub struct FunctionRegistry {
    named: HashMap<String, Registered>,
    catch_all: Option<Registered>,
    direct: Vec<FunctionSchema>,
}

impl FunctionRegistry {
    /// Registers `handler` under `name` (`None`: for every name without its own handler).
    pub fn register_function<F, Fut>(
        &mut self,
        name: Option<&str>,
        handler: F,
        options: FunctionOptions,
    ) where
        F: Fn(FunctionCallParams) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let handler: FunctionHandler = Arc::new(move |params| Box::pin(handler(params)));
        let registered = Registered { handler, options };
        match name {
            Some(name) => {
                self.named.insert(name.to_owned(), registered);
            }
            None => self.catch_all = Some(registered),
        }
    }

    /// Registers a function whose schema is derived from its typed arguments, so the schema the
    /// model sees cannot drift from the code. The handler gets the arguments parsed; invalid
    /// arguments are answered with an error result without calling it.
    pub fn register_direct_function<A, F, Fut>(
        &mut self,
        name: &str,
        description: &str,
        handler: F,
        options: FunctionOptions,
    ) where
        A: schemars::JsonSchema + serde::de::DeserializeOwned + Send + 'static,
        F: Fn(A, FunctionCallParams) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.direct.retain(|s| s.name != name);
        self.direct.push(schema_of::<A>(name, description));
        let handler = Arc::new(handler);
        self.register_function(
            Some(name),
            move |params: FunctionCallParams| {
                let handler = handler.clone();
                async move {
                    match serde_json::from_value::<A>(params.arguments.clone()) {
                        Ok(args) => handler(args, params).await,
                        Err(e) => params.result_callback.done(Value::String(format!(
                            "Invalid arguments for {}: {e}",
                            params.function_name
                        ))),
                    }
                }
            },
            options,
        );
    }

    /// Registers `handler` for the function `schema` describes, offering the model that schema:
    /// for tools whose arguments are described at run time (HTTP tools, MCP tools).
    pub fn register_with_schema<F, Fut>(
        &mut self,
        schema: FunctionSchema,
        handler: F,
        options: FunctionOptions,
    ) where
        F: Fn(FunctionCallParams) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let name = schema.name.clone();
        self.direct.retain(|s| s.name != name);
        self.direct.push(schema);
        self.register_function(Some(&name), handler, options);
    }

    /// Removes the handler for `name` (`None`: the catch-all).
    pub fn unregister_function(&mut self, name: Option<&str>) {
        match name {
            Some(name) => {
                self.named.remove(name);
                self.direct.retain(|s| s.name != name);
            }
            None => self.catch_all = None,
        }
    }

    /// Takes the direct functions' schemas off every request and returns them; their handlers
    /// still answer calls. For a caller that offers tools through the context instead (a flow
    /// offers each node its own).
    pub fn withhold_schemas(&mut self) -> Vec<FunctionSchema> {
        std::mem::take(&mut self.direct)
    }

    /// True when a call to `name` has a handler (its own or the catch-all).
    pub fn has_function(&self, name: &str) -> bool {
        self.named.contains_key(name) || self.catch_all.is_some()
    }

    /// Schemas of the direct functions, to offer the model.
    pub fn direct_schemas(&self) -> &[FunctionSchema] {
        &self.direct
    }

    /// The function registered under `name`.
    pub fn get(&self, name: &str) -> Option<&Registered> {
        self.named.get(name).or(self.catch_all.as_ref())
    }

    /// Names of async functions the model may cancel.
    pub(crate) fn cancellable(&self) -> impl Iterator<Item = &str> {
        self.named
            .iter()
            .filter(|(_, r)| !r.options.cancel_on_interruption && r.options.cancellable_by_llm)
            .map(|(n, _)| n.as_str())
    }

    /// True when any async function is registered.
    pub(crate) fn async_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .named
            .iter()
            .filter(|(_, r)| !r.options.cancel_on_interruption)
            .map(|(n, _)| n.clone())
            .collect();
        names.sort();
        names
    }

    pub(crate) fn has_async(&self) -> bool {
        self.named
            .values()
            .chain(self.catch_all.iter())
            .any(|r| !r.options.cancel_on_interruption)
    }
}

/// A function schema from the JSON schema of `A`.
fn schema_of<A: schemars::JsonSchema>(name: &str, description: &str) -> FunctionSchema {
    let schema = serde_json::to_value(schemars::schema_for!(A)).unwrap_or(Value::Null);
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    FunctionSchema {
        name: name.to_owned(),
        description: description.to_owned(),
        properties,
        required,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(schemars::JsonSchema, serde::Deserialize)]
    #[allow(dead_code)]
    struct TimerArgs {
        /// Seconds until it rings.
        seconds: u32,
        /// What it is for.
        label: Option<String>,
    }

    #[test]
    fn direct_function_schemas_come_from_the_argument_type() {
        let mut registry = FunctionRegistry::default();
        registry.register_direct_function(
            "set_timer",
            "Sets a timer.",
            |_: TimerArgs, _| async {},
            FunctionOptions::default(),
        );
        let schema = &registry.direct_schemas()[0];
        assert_eq!(schema.name, "set_timer");
        assert_eq!(schema.required, vec!["seconds".to_owned()]);
        assert_eq!(schema.properties["seconds"]["type"], "integer");
        assert!(schema.properties.contains_key("label"));
        assert!(registry.has_function("set_timer"));
        registry.unregister_function(Some("set_timer"));
        assert!(!registry.has_function("set_timer"));
        assert!(registry.direct_schemas().is_empty());
    }
}
