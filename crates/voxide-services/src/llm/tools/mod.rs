//! Tool calls, out of the inference code: the [`ToolRunner`] holds the function registry and the
//! calls under way (shared by the text LLM service and the realtime ones); a [`ToolBatch`] runs
//! the calls of one response (in parallel or in order, with timeouts, async results and
//! cancellation); [`frames`] writes what they report.

mod batch;
mod frames;

pub(crate) use batch::ToolBatch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tokio::task::JoinHandle;

use super::LlmServiceOptions;
use super::functions::FunctionRegistry;
use voxide_core::context::{ContextHandle, FunctionSchema, ToolsSchema};
use voxide_core::frames::{CancelReason, Frame};
use voxide_core::pipeline::{AppResources, Direction, FramePusher};

/// A call that has started and not settled.
struct Running {
    function_name: String,
    arguments: Value,
    cancel_on_interruption: bool,
    group_id: u64,
    task: Option<JoinHandle<()>>,
}

impl Running {
    fn abort(&self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

type Calls = Arc<Mutex<HashMap<String, Running>>>;

fn lock(calls: &Calls) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
    calls.lock().unwrap_or_else(|p| p.into_inner())
}

/// The function registry and the calls it runs, shared by the text LLM service and the realtime
/// ones. Clones share the calls; the service that owns them aborts them when it goes, so none
/// outlives the session.
#[derive(Clone)]
pub(crate) struct ToolRunner {
    registry: Arc<FunctionRegistry>,
    options: LlmServiceOptions,
    calls: Calls,
    groups: Arc<AtomicU64>,
    resources: AppResources,
}

impl ToolRunner {
    /// The prices the service's responses are accounted at.
    pub(crate) fn prices(&self) -> &crate::pricing::PriceTable {
        &self.options.prices
    }

    pub(crate) fn new(options: LlmServiceOptions) -> Self {
        Self {
            registry: Arc::new(FunctionRegistry::default()),
            options,
            calls: Arc::default(),
            groups: Arc::default(),
            resources: AppResources::default(),
        }
    }

    pub(crate) fn functions(&mut self) -> &mut FunctionRegistry {
        Arc::make_mut(&mut self.registry)
    }

    pub(crate) fn set_resources(&mut self, resources: AppResources) {
        self.resources = resources;
    }

    /// True when an async function is registered (the model then needs the async instructions).
    pub(crate) fn has_async(&self) -> bool {
        self.registry.has_async()
    }

    /// The context's tools plus the registry's direct functions and `cancel_<name>` tools.
    pub(crate) fn tools(&self, mut tools: ToolsSchema) -> ToolsSchema {
        for schema in self.registry.direct_schemas() {
            if !tools.standard_tools.iter().any(|t| t.name == schema.name) {
                tools.standard_tools.push(schema.clone());
            }
        }
        for name in self.registry.cancellable() {
            tools.standard_tools.push(cancel_tool_schema(name));
        }
        tools
    }

    /// A new batch of calls from one response.
    pub(crate) fn batch(&self, handle: ContextHandle, pusher: FramePusher) -> ToolBatch {
        ToolBatch {
            registry: self.registry.clone(),
            options: self.options.clone(),
            calls: self.calls.clone(),
            group_id: self.groups.fetch_add(1, Ordering::Relaxed) + 1,
            resources: self.resources.clone(),
            handle,
            pusher,
        }
    }

    /// Aborts every running call.
    pub(crate) fn abort_all(&self) {
        lock(&self.calls).values().for_each(Running::abort);
    }

    /// Names of the async functions.
    pub(crate) fn async_functions(&self) -> Vec<String> {
        self.registry.async_names()
    }

    /// Cancels the calls with these ids (the provider withdrew them); returns the frames that
    /// report it.
    pub(crate) fn cancel_ids(&self, ids: &[String]) -> Vec<(Frame, Direction)> {
        self.cancel_where(|id, _| ids.iter().any(|i| i == id), CancelReason::Llm)
    }

    /// Cancels the calls an interruption cancels (async calls keep running); returns the frames
    /// that report it.
    pub(crate) fn cancel_for_interruption(&self) -> Vec<(Frame, Direction)> {
        self.cancel_where(
            |_, call| call.cancel_on_interruption,
            CancelReason::Interruption,
        )
    }

    fn cancel_where(
        &self,
        wanted: impl Fn(&str, &Running) -> bool,
        reason: CancelReason,
    ) -> Vec<(Frame, Direction)> {
        let cancelled: Vec<(String, Running)> = {
            let mut calls = lock(&self.calls);
            let ids: Vec<String> = calls
                .iter()
                .filter(|(id, call)| wanted(id, call))
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| calls.remove(&id).map(|call| (id, call)))
                .collect()
        };
        let mut frames = Vec::new();
        for (id, call) in cancelled {
            call.abort();
            tracing::debug!(tool_call_id = %id, function = %call.function_name, ?reason, "call cancelled");
            frames.extend(frames::cancelled(&id, &call, reason, Some(false)));
        }
        frames
    }
}

/// The schema of the `cancel_<name>` tool offered for a cancellable async function.
pub fn cancel_tool_schema(name: &str) -> FunctionSchema {
    FunctionSchema::new(
        format!("cancel_{name}"),
        format!("Cancels a running {name} call. Give tool_call_id when more than one is running."),
    )
    .property(
        "tool_call_id",
        serde_json::json!({"type": "string", "description": "The id of the call to cancel."}),
        false,
    )
}

/// Arguments as the model wrote them, as an object; anything unparsable becomes `{}`.
pub(crate) fn parse_arguments(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ if arguments.trim().is_empty() => Value::Object(Map::new()),
        _ => {
            tracing::warn!(
                arguments,
                "the model wrote arguments that are not a JSON object"
            );
            Value::Object(Map::new())
        }
    }
}
