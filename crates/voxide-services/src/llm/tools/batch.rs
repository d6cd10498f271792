//! One response's calls: announced together, run in parallel or in order, each to its settled
//! result (or its timeout), async calls' intermediate results passed on as they come.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::{Calls, Running, frames, lock};
use crate::llm::LlmServiceOptions;
use crate::llm::functions::{
    Delivered, FunctionCallParams, FunctionOptions, FunctionRegistry, ResultCallback,
    ResultProperties,
};
use voxide_core::context::ContextHandle;
use voxide_core::frames::{
    CancelReason, ControlFrame, FunctionCallInProgress, FunctionCallRequest,
    FunctionCallResultProperties, ResultKind, SystemFrame,
};
use voxide_core::pipeline::{AppResources, Direction, FramePusher, panic_text};

/// What the model is told when it calls a tool nobody registered.
fn unavailable(name: &str) -> Value {
    Value::String(format!(
        "The function {name} is not available. Do not call it again."
    ))
}

/// What the model is told when a handler failed; the error itself goes to the logs only.
const FAILED: &str = "The function failed and returned no result.";

/// The calls of one response: announced together, run in parallel or in order, sharing a group id.
pub(crate) struct ToolBatch {
    pub(super) registry: Arc<FunctionRegistry>,
    pub(crate) options: LlmServiceOptions,
    pub(super) calls: Calls,
    pub(super) group_id: u64,
    pub(super) resources: AppResources,
    pub(super) handle: ContextHandle,
    pub(crate) pusher: FramePusher,
}

/// How a call ended.
enum Outcome {
    Result(Delivered),
    Failed(String),
    TimedOut,
}

impl ToolBatch {
    /// Announces the batch, then starts every call.
    pub(crate) async fn start(&self, requested: Vec<FunctionCallRequest>) {
        let batch: Arc<[FunctionCallRequest]> = requested.clone().into();
        for dir in [Direction::Downstream, Direction::Upstream] {
            let frame = SystemFrame::FunctionCallsStarted(batch.clone());
            let _ = self.pusher.push(frame.into(), dir).await;
        }
        // In sequential mode each call waits for the one before it to settle (or be cancelled).
        let mut previous: Option<oneshot::Receiver<()>> = None;
        for call in requested {
            let wait = if self.options.run_in_parallel {
                None
            } else {
                previous.take()
            };
            let (settled, settled_rx) = oneshot::channel::<()>();
            previous = Some(settled_rx);
            self.spawn(call, wait, settled).await;
        }
    }

    /// Announces one call, notes it as running and starts it once `wait` is over.
    async fn spawn(
        &self,
        call: FunctionCallRequest,
        wait: Option<oneshot::Receiver<()>>,
        settled: oneshot::Sender<()>,
    ) {
        let options = self
            .registry
            .get(&call.function_name)
            .map(|r| r.options.clone());
        let cancel_on_interruption = options.as_ref().is_none_or(|o| o.cancel_on_interruption);
        let in_progress = FunctionCallInProgress {
            function_name: call.function_name.clone(),
            tool_call_id: call.tool_call_id.clone(),
            arguments: call.arguments.clone(),
            cancel_on_interruption,
            group_id: self.group_id,
        };
        for dir in [Direction::Downstream, Direction::Upstream] {
            let frame = ControlFrame::FunctionCallInProgress(Box::new(in_progress.clone()));
            let _ = self.pusher.push(frame.into(), dir).await;
        }
        let id = call.tool_call_id.clone();
        let running = Running {
            function_name: call.function_name.clone(),
            arguments: call.arguments.clone(),
            cancel_on_interruption,
            group_id: self.group_id,
            task: None,
        };
        lock(&self.calls).insert(id.clone(), running);
        let work = self.call_work(call, options);
        let task = tokio::spawn(async move {
            if let Some(wait) = wait {
                let _ = wait.await;
            }
            work.await;
            drop(settled);
        });
        // The call may already have settled and left the table; then its handle goes.
        if let Some(running) = lock(&self.calls).get_mut(&id) {
            running.task = Some(task);
        }
    }

    /// For `cancel_<name>` of a cancellable async function: the name it cancels.
    fn builtin_cancel(&self, name: &str) -> Option<String> {
        let target = name.strip_prefix("cancel_")?;
        self.registry
            .cancellable()
            .any(|n| n == target)
            .then(|| target.to_owned())
    }

    /// The future that runs one call to its settled result and reports it.
    fn call_work(
        &self,
        call: FunctionCallRequest,
        options: Option<FunctionOptions>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let builtin = self.builtin_cancel(&call.function_name);
        let call_run = CallRun {
            pusher: self.pusher.clone(),
            calls: self.calls.clone(),
            registry: self.registry.clone(),
            context: self.handle.clone(),
            resources: self.resources.clone(),
            timeout: options
                .as_ref()
                .and_then(|o| o.timeout)
                .unwrap_or(self.options.function_call_timeout),
        };
        let group_all = self.options.group_parallel_tools;
        async move {
            let id = call.tool_call_id.clone();
            let outcome = match builtin {
                Some(target) => call_run.cancel(&target, &call.arguments).await,
                None => call_run.run(call).await,
            };
            call_run.settle(&id, outcome, group_all).await;
        }
    }
}

/// What one call needs while it runs.
struct CallRun {
    pusher: FramePusher,
    calls: Calls,
    registry: Arc<FunctionRegistry>,
    context: ContextHandle,
    resources: AppResources,
    timeout: Duration,
}

impl CallRun {
    /// `cancel_<target>`: cancels the running call it names and tells the model what it did.
    async fn cancel(&self, target: &str, arguments: &Value) -> Outcome {
        let (result, cancelled) = cancel_running(&self.calls, target, arguments);
        for (id, running) in cancelled {
            for (frame, dir) in frames::cancelled(&id, &running, CancelReason::Llm, Some(false)) {
                let _ = self.pusher.push(frame, dir).await;
            }
        }
        Outcome::Result(Delivered {
            result: Some(Value::String(result)),
            properties: ResultProperties::final_result(),
        })
    }

    /// Runs the registered handler to its final result, or tells the model there is none.
    async fn run(&self, call: FunctionCallRequest) -> Outcome {
        let Some(registered) = self.registry.get(&call.function_name) else {
            tracing::warn!(function = %call.function_name, "the model called an unknown function");
            return Outcome::Result(Delivered {
                result: Some(unavailable(&call.function_name)),
                properties: ResultProperties::final_result(),
            });
        };
        let is_async = !registered.options.cancel_on_interruption;
        let (tx, rx) = mpsc::unbounded_channel();
        let id = call.tool_call_id.clone();
        let params = FunctionCallParams {
            function_name: call.function_name,
            tool_call_id: call.tool_call_id,
            arguments: call.arguments,
            context: self.context.clone(),
            app_resources: self.resources.clone(),
            result_callback: ResultCallback(tx),
        };
        let work = self.drive_handler((registered.handler)(params), rx, is_async, &id);
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or(Outcome::TimedOut)
    }

    /// Runs a handler until its final result, passing on intermediate results of async calls.
    async fn drive_handler(
        &self,
        handler: BoxFuture<'static, ()>,
        mut results: mpsc::UnboundedReceiver<Delivered>,
        is_async: bool,
        id: &str,
    ) -> Outcome {
        let handler = AssertUnwindSafe(handler).catch_unwind();
        tokio::pin!(handler);
        let (mut handler_done, mut callbacks_gone) = (false, false);
        loop {
            if handler_done && callbacks_gone {
                // The handler finished and nobody can deliver any more: it returned nothing.
                return Outcome::Result(Delivered {
                    result: None,
                    properties: ResultProperties::final_result(),
                });
            }
            tokio::select! {
                finished = &mut handler, if !handler_done => {
                    handler_done = true;
                    if let Err(panic) = finished {
                        return Outcome::Failed(panic_text(panic));
                    }
                }
                delivered = results.recv(), if !callbacks_gone => match delivered {
                    Some(d) if d.properties.is_final => return Outcome::Result(d),
                    Some(d) if is_async => self.intermediate(id, d).await,
                    Some(_) => tracing::warn!(tool_call_id = %id, "intermediate results are for async calls only; ignored"),
                    // Every callback is gone; the call settles once the handler has finished too.
                    None => callbacks_gone = true,
                },
            }
        }
    }

    /// Passes on an async call's intermediate result, unless the call was cancelled meanwhile.
    async fn intermediate(&self, id: &str, delivered: Delivered) {
        let properties = frames::properties(delivered.properties);
        let reported = lock(&self.calls).get(id).map(|running| {
            frames::result(
                id,
                running,
                delivered.result,
                ResultKind::Intermediate,
                properties,
            )
        });
        for (frame, dir) in reported.unwrap_or_default() {
            let _ = self.pusher.push(frame, dir).await;
        }
    }

    /// Reports how the call ended, unless it was cancelled meanwhile.
    async fn settle(&self, id: &str, outcome: Outcome, group_all: bool) {
        let Some(running) = lock(&self.calls).remove(id) else {
            // Cancelled meanwhile: the cancel already reported it.
            return;
        };
        let reported = match outcome {
            Outcome::Result(delivered) => {
                let mut properties = frames::properties(delivered.properties);
                if properties.run_llm.is_none() && !group_all {
                    properties.run_llm = Some(true);
                }
                frames::result(
                    id,
                    &running,
                    delivered.result,
                    ResultKind::Final,
                    properties,
                )
            }
            Outcome::Failed(message) => {
                let function = &running.function_name;
                self.pusher
                    .push_error(format!("function {function} failed: {message}"))
                    .await;
                let failed = Some(Value::String(FAILED.to_owned()));
                let properties = FunctionCallResultProperties::default();
                frames::result(id, &running, failed, ResultKind::Final, properties)
            }
            Outcome::TimedOut => {
                tracing::warn!(function = %running.function_name, "function call timed out");
                frames::cancelled(id, &running, CancelReason::Timeout, Some(true))
            }
        };
        for (frame, dir) in reported {
            let _ = self.pusher.push(frame, dir).await;
        }
    }
}

/// Cancels running calls of `target` as `cancel_<target>` asked; returns what to tell the model.
fn cancel_running(
    calls: &Calls,
    target: &str,
    arguments: &Value,
) -> (String, Vec<(String, Running)>) {
    let mut calls = lock(calls);
    let running: Vec<String> = calls
        .iter()
        .filter(|(_, c)| c.function_name == target)
        .map(|(id, _)| id.clone())
        .collect();
    let wanted = arguments.get("tool_call_id").and_then(Value::as_str);
    let nothing = |text: String| (text, Vec::new());
    let id = match (wanted, running.as_slice()) {
        (Some(id), _) if running.iter().any(|r| r == id) => id.to_owned(),
        (Some(id), _) => {
            return nothing(format!(
                "There is no running {target} call with id {id}; nothing was cancelled."
            ));
        }
        (None, []) => {
            return nothing(format!(
                "No {target} call is running; nothing was cancelled."
            ));
        }
        (None, [only]) => only.clone(),
        (None, many) => {
            return nothing(format!(
                "Several {target} calls are running ({}); call cancel_{target} again with the tool_call_id of the one to cancel.",
                many.join(", ")
            ));
        }
    };
    let Some(call) = calls.remove(&id) else {
        return nothing(format!(
            "No {target} call is running; nothing was cancelled."
        ));
    };
    call.abort();
    (
        format!("Cancelled the {target} call {id}; it is no longer running."),
        vec![(id, call)],
    )
}
