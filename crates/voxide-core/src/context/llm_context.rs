//! The conversation state shared by the aggregator pair and the LLM services.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::TokenUsage;
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

/// Tokens a conversation holds by default (estimated) before its oldest turns leave: a long
/// call's context stays well inside every supported model's window, and its cost per answer
/// stops growing.
pub const DEFAULT_MAX_CONTEXT_TOKENS: usize = 24_000;

/// A message's tokens, estimated from its JSON: four characters a token.
/// How a summary of the conversation's oldest turns begins ([`LlmContext::fold`]).
pub const SUMMARY_PREFIX: &str = "Earlier in this conversation, in summary: ";

fn is_summary(message: &Message) -> bool {
    matches!(message, Message::System(_))
        && message
            .text()
            .is_some_and(|t| t.starts_with(SUMMARY_PREFIX))
}

fn estimated_tokens(message: &Message) -> usize {
    serde_json::to_string(message).map_or(0, |json| json.len() / 4 + 1)
}

/// The tool calls a message is about: those it makes, answers, reports on or bookmarks.
fn calls_named(message: &Message) -> Vec<&str> {
    match message {
        Message::Assistant(a) => a
            .tool_calls
            .iter()
            .flatten()
            .map(|call| call.id.as_str())
            .collect(),
        Message::Tool(t) => vec![t.tool_call_id.as_str()],
        Message::ProviderSpecific(p) => p.message["bookmark"]["function_call"]
            .as_str()
            .into_iter()
            .collect(),
        Message::System(_) | Message::Developer(_) | Message::User(_) => Vec::new(),
    }
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

    /// Drops the oldest turns (a user message and everything up to the next) while the
    /// conversation holds more than `max_tokens` (estimated); returns how many messages left.
    ///
    /// The instructions before the conversation stay, and so does the latest turn. A tool call
    /// never leaves without what is about it: its results and async updates leave with it,
    /// wherever they sit, and a turn whose async call still runs stays, with all after it (its
    /// result is still to come).
    pub fn trim(&mut self, max_tokens: usize) -> usize {
        let dropped = self.trim_plan(max_tokens);
        let mut index = 0;
        self.messages.retain(|_| {
            index += 1;
            !dropped[index - 1]
        });
        dropped.iter().filter(|d| **d).count()
    }

    /// The conversation's size, in estimated tokens.
    pub fn estimated_tokens(&self) -> usize {
        self.messages.iter().map(estimated_tokens).sum()
    }

    /// The messages [`trim`](Self::trim) would drop to bring the conversation within
    /// `max_tokens`, in order: what a summary of the oldest turns would stand for.
    pub fn oldest_turns(&self, max_tokens: usize) -> Vec<Message> {
        self.messages
            .iter()
            .zip(self.trim_plan(max_tokens))
            .filter(|(_, dropped)| *dropped)
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Replaces `folded` (what [`oldest_turns`](Self::oldest_turns) gave) with `summary`, a
    /// system message starting with [`SUMMARY_PREFIX`], at the end of the instructions; an
    /// earlier summary leaves (the new one covers it). False, and nothing changed, when the
    /// folded messages are no longer all there (the conversation was reset meanwhile).
    pub fn fold(&mut self, folded: &[Message], summary: String) -> bool {
        let mut dropped = vec![false; self.messages.len()];
        let mut next = 0;
        for (i, message) in self.messages.iter().enumerate() {
            if next < folded.len() && *message == folded[next] {
                dropped[i] = true;
                next += 1;
            } else if is_summary(message) {
                dropped[i] = true;
            }
        }
        if next < folded.len() || folded.is_empty() {
            return false;
        }
        let mut index = 0;
        self.messages.retain(|_| {
            index += 1;
            !dropped[index - 1]
        });
        self.set_summary(summary);
        true
    }

    /// Puts `summary` of earlier turns at the end of the instructions, as a system message
    /// starting with [`SUMMARY_PREFIX`], in place of any summary before it.
    pub fn set_summary(&mut self, summary: String) {
        self.messages.retain(|m| !is_summary(m));
        let head = self
            .messages
            .iter()
            .take_while(|m| matches!(m, Message::System(_) | Message::Developer(_)))
            .count();
        self.messages
            .insert(head, Message::system(format!("{SUMMARY_PREFIX}{summary}")));
    }

    /// The summary of earlier turns the conversation holds, if any.
    pub fn summary(&self) -> Option<&str> {
        self.messages
            .iter()
            .find(|m| is_summary(m))
            .and_then(|m| m.text()?.strip_prefix(SUMMARY_PREFIX))
    }

    fn trim_plan(&self, max_tokens: usize) -> Vec<bool> {
        let tokens: Vec<usize> = self.messages.iter().map(estimated_tokens).collect();
        let mut total: usize = tokens.iter().sum();
        if total <= max_tokens {
            return vec![false; self.messages.len()];
        }
        let head = self
            .messages
            .iter()
            .take_while(|m| matches!(m, Message::System(_) | Message::Developer(_)))
            .count();
        let starts: Vec<usize> = std::iter::once(head)
            .chain(
                (head + 1..self.messages.len())
                    .filter(|&i| matches!(self.messages[i], Message::User(_))),
            )
            .collect();
        let finished: std::collections::HashSet<String> = self
            .messages
            .iter()
            .filter_map(super::async_tool_messages::parse_message)
            .filter(|p| p.kind == super::async_tool_messages::AsyncToolMessageKind::Final)
            .map(|p| p.tool_call_id)
            .collect();
        let running = |id: &str| {
            self.messages.iter().any(|m| {
                super::async_tool_messages::parse_message(m).is_some_and(|p| {
                    p.kind == super::async_tool_messages::AsyncToolMessageKind::Started
                        && p.tool_call_id == id
                })
            }) && !finished.contains(id)
        };
        let mut dropped = vec![false; self.messages.len()];
        // Every turn but the latest may go, oldest first.
        for turn in starts.windows(2) {
            if total <= max_tokens {
                break;
            }
            let range = turn[0]..turn[1];
            let calls: std::collections::HashSet<&str> = range
                .clone()
                .flat_map(|i| calls_named(&self.messages[i]))
                .collect();
            if calls.iter().any(|id| running(id)) {
                break;
            }
            for (i, message) in self.messages.iter().enumerate() {
                let about_a_dropped_call = || {
                    calls_named(message).iter().any(|id| calls.contains(id))
                        || super::async_tool_messages::parse_message(message)
                            .is_some_and(|p| calls.contains(p.tool_call_id.as_str()))
                };
                if i >= head && !dropped[i] && (range.contains(&i) || about_a_dropped_call()) {
                    dropped[i] = true;
                    total -= tokens[i];
                }
            }
        }
        dropped
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::async_tool_messages::{build_final_result_message, build_started_message};
    use crate::context::{AssistantMessage, ToolCall};

    fn call(id: &str) -> Message {
        Message::Assistant(AssistantMessage {
            tool_calls: Some(vec![ToolCall::function(
                id,
                "lookup",
                &serde_json::json!({}),
            )]),
            ..AssistantMessage::default()
        })
    }

    fn roles(context: &LlmContext) -> Vec<String> {
        context
            .messages
            .iter()
            .map(|m| format!("{}:{}", m.role(), m.text().unwrap_or("-")))
            .collect()
    }

    fn said(n: usize) -> String {
        format!("{n} {}", "words ".repeat(40))
    }

    #[test]
    fn the_oldest_turns_leave_past_the_budget_and_the_instructions_and_latest_turn_stay() {
        let mut context = LlmContext::new(vec![Message::system("Be brief.")]);
        for n in 0..10 {
            context.messages.push(Message::user(said(n)));
            context.messages.push(Message::assistant(said(n)));
        }
        let before = context.messages.len();
        let total: usize = context.messages.iter().map(estimated_tokens).sum();
        assert_eq!(context.trim(total), 0, "within the budget: nothing leaves");
        let dropped = context.trim(total / 2);
        assert_eq!(context.messages.len(), before - dropped);
        assert!(
            dropped >= 8 && dropped.is_multiple_of(2),
            "whole turns: {dropped}"
        );
        assert!(context.messages.iter().map(estimated_tokens).sum::<usize>() <= total / 2);
        let kept = roles(&context);
        assert_eq!(kept[0], "system:Be brief.");
        assert!(kept[1].starts_with("user:"), "{kept:?}");
        assert!(kept.last().is_some_and(|m| m.starts_with("assistant:9 ")));
        context.trim(1);
        assert_eq!(
            context.messages.len(),
            3,
            "the instruction and the latest turn"
        );
    }

    #[test]
    fn a_tool_call_leaves_with_its_results_and_a_running_async_call_keeps_its_turn() {
        let mut context = LlmContext::new(vec![Message::system("Be brief.")]);
        // Turn 1: an async call that finished two turns later.
        context.messages.push(Message::user(said(1)));
        context.messages.push(call("a1"));
        context.messages.push(build_started_message("a1"));
        context.messages.push(Message::assistant(said(1)));
        context.messages.push(Message::user(said(2)));
        context.messages.push(Message::assistant(said(2)));
        context.messages.push(Message::user(said(3)));
        context.messages.push(build_final_result_message(
            "a1",
            Some(&serde_json::json!("done")),
        ));
        context.messages.push(Message::assistant(said(3)));
        let dropped = context.trim(1);
        assert_eq!(
            dropped, 7,
            "turns 1 and 2, and turn 1's result sitting in turn 3"
        );
        assert!(roles(&context)[1].starts_with("user:3"));
        assert!(
            context
                .messages
                .iter()
                .all(|m| !matches!(m, Message::Developer(_)))
        );

        // A call still running: its turn and all after it stay.
        let mut context = LlmContext::new(vec![Message::system("Be brief.")]);
        context.messages.push(Message::user(said(1)));
        context.messages.push(Message::assistant(said(1)));
        context.messages.push(Message::user(said(2)));
        context.messages.push(call("a2"));
        context.messages.push(build_started_message("a2"));
        context.messages.push(Message::user(said(3)));
        assert_eq!(context.trim(1), 2, "only turn 1");
        assert!(roles(&context)[1].starts_with("user:2"));
    }
}
