//! The conversation state shared by the aggregator pair and the LLM services.

use std::sync::atomic::{AtomicU64, Ordering};
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
/// The lock is never held across an `.await`: take what you need, then let go. Every mutable
/// lock bumps a revision, so a service can tell a context it already answered from a changed one.
#[derive(Debug, Clone, Default)]
pub struct ContextHandle(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    context: Mutex<LlmContext>,
    revision: AtomicU64,
}

impl ContextHandle {
    /// Shares `context`.
    pub fn new(context: LlmContext) -> Self {
        Self(Arc::new(Shared {
            context: Mutex::new(context),
            revision: AtomicU64::new(0),
        }))
    }

    /// Locks the context to change it. A panic elsewhere while it was held does not poison it:
    /// the context is plain data and stays usable.
    pub fn lock(&self) -> MutexGuard<'_, LlmContext> {
        self.0.revision.fetch_add(1, Ordering::Relaxed);
        self.0
            .context
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A copy of the context as it is now.
    pub fn snapshot(&self) -> LlmContext {
        self.0
            .context
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// A copy of the messages.
    pub fn messages(&self) -> Vec<Message> {
        self.snapshot().messages
    }

    /// Counts changes: it moves whenever the context was locked to change it.
    pub fn revision(&self) -> u64 {
        self.0.revision.load(Ordering::Relaxed)
    }

    /// True when both handles share one context.
    pub fn same(&self, other: &ContextHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
