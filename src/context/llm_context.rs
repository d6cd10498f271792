//! The conversation state shared by the aggregator pair and the LLM services.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::{Message, ToolsSchema};

/// How the model may use tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
    /// This function.
    Function(String),
}

/// Messages, tools and tool choice of one conversation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LlmContext {
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// The tools offered.
    pub tools: ToolsSchema,
    /// How the model may use them.
    pub tool_choice: Option<ToolChoice>,
}

impl LlmContext {
    /// A context that starts with `messages`.
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            ..Self::default()
        }
    }
}

/// A context shared between the stages of one session.
///
/// The lock is never held across an `.await`: take what you need, then let go.
#[derive(Debug, Clone, Default)]
pub struct ContextHandle(Arc<Mutex<LlmContext>>);

impl ContextHandle {
    /// Shares `context`.
    pub fn new(context: LlmContext) -> Self {
        Self(Arc::new(Mutex::new(context)))
    }

    /// Locks the context. A panic elsewhere while it was held does not poison it for the rest of
    /// the session: the context is plain data and stays usable.
    pub fn lock(&self) -> MutexGuard<'_, LlmContext> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A copy of the messages.
    pub fn messages(&self) -> Vec<Message> {
        self.lock().messages.clone()
    }

    /// True when both handles share one context.
    pub fn same(&self, other: &ContextHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
