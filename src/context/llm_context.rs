//! The conversation state shared by the aggregator pair and the LLM services.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::{Message, ToolsSchema};
use crate::frames::TokenUsage;

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

    /// Tokens and dollars per user turn and in total, from the assistant messages' metadata.
    pub fn usage_report(&self) -> UsageReport {
        let mut report = UsageReport::default();
        // Responses before the first user message (a greeting) form a turn of their own.
        let mut current = TurnUsage::default();
        for message in &self.messages {
            match message {
                Message::User(_) => {
                    if current.responses > 0 || current.opened_by_user {
                        report.turns.push(std::mem::take(&mut current));
                    }
                    current.opened_by_user = true;
                }
                Message::Assistant(a) => {
                    if let Some(meta) = &a.meta {
                        current.add(meta.usage, meta.cost_usd);
                        report.total.add(meta.usage, meta.cost_usd);
                    }
                }
                _ => {}
            }
        }
        if current.responses > 0 || current.opened_by_user {
            report.turns.push(current);
        }
        report
    }
}

/// Usage of a whole conversation, by turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsageReport {
    /// One entry per user turn (plus a first one for responses before the user spoke).
    pub turns: Vec<TurnUsage>,
    /// Everything together.
    pub total: TurnUsage,
}

/// Tokens and dollars of some responses.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TurnUsage {
    /// True when a user message opened the turn.
    pub opened_by_user: bool,
    /// LLM responses counted.
    pub responses: usize,
    /// Tokens used.
    pub usage: TokenUsage,
    /// Dollars of the responses whose model has a known price.
    pub cost_usd: f64,
    /// Responses whose model has no known price (their dollars are not in `cost_usd`).
    pub unpriced: usize,
}

impl TurnUsage {
    fn add(&mut self, usage: TokenUsage, cost_usd: Option<f64>) {
        self.responses += 1;
        self.usage += usage;
        match cost_usd {
            Some(cost) => self.cost_usd += cost,
            None => self.unpriced += 1,
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
