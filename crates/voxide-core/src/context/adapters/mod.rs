//! Adapters: the one context, rewritten into each provider's request shape.
//!
//! The context keeps OpenAI chat messages; each adapter maps them (and the tools and tool choice)
//! to what its provider expects, skipping provider-specific messages meant for another provider.

pub mod anthropic;
pub mod gemini;
pub mod gemini_live;
pub mod openai;
pub mod openai_realtime;

use serde_json::{Map, Value};

use super::{AdapterKind, Message};

/// The provider's own message, when `message` is a provider-specific one for `kind`.
/// `None` for ordinary messages; `Some(None)` for another provider's message (skip it).
fn provider_specific(message: &Message, kind: AdapterKind) -> Option<Option<&Value>> {
    match message {
        Message::ProviderSpecific(m) => Some((m.llm == kind.as_str()).then_some(&m.message)),
        _ => None,
    }
}

/// The calls of one reply together, then their results: the providers that take each reply as
/// one turn (Anthropic, Gemini) want parallel calls in one assistant turn and their results in
/// the one user turn after it. The context keeps each call as its own message with its result
/// right after (pipecat's layout), so a run of `assistant(calls)` and `tool` messages is
/// regrouped here. A reply ends at the message that carries its metadata: calls of a later
/// reply (sequential calls) stay apart. A context loaded from JSON has no metadata, and its
/// consecutive calls are taken as one reply.
fn grouped_calls(messages: &[Message]) -> Vec<Message> {
    let mut out = Vec::with_capacity(messages.len());
    let mut i = 0;
    while i < messages.len() {
        let Message::Assistant(head) = &messages[i] else {
            out.push(messages[i].clone());
            i += 1;
            continue;
        };
        if head.tool_calls.is_none() {
            out.push(messages[i].clone());
            i += 1;
            continue;
        }
        let mut head = head.clone();
        let mut results = Vec::new();
        let mut open = head.meta.is_none();
        i += 1;
        while let Some(next) = messages.get(i) {
            match next {
                Message::Tool(_) => results.push(next.clone()),
                Message::Assistant(more)
                    if open && more.tool_calls.is_some() && !has_text(more) =>
                {
                    head.tool_calls
                        .get_or_insert_with(Vec::new)
                        .extend(more.tool_calls.iter().flatten().cloned());
                    if more.meta.is_some() {
                        head.meta.clone_from(&more.meta);
                        open = false;
                    }
                }
                _ => break,
            }
            i += 1;
        }
        out.push(Message::Assistant(head));
        out.extend(results);
    }
    out
}

fn has_text(message: &super::AssistantMessage) -> bool {
    message
        .content
        .as_ref()
        .and_then(Option::as_ref)
        .is_some_and(|c| !c.joined_text().trim().is_empty())
}

/// A tool call's arguments as an object: providers other than OpenAI want JSON, not a string.
fn arguments_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::Object(Map::new()),
    }
}

/// The instructions and where the conversation starts, for the providers that take instructions
/// apart and need a user turn to answer: a context of instructions alone (a bot that speaks
/// first) keeps its last one in the conversation, as the user turn.
fn instructions_and_conversation(messages: &[Message]) -> (Option<String>, usize) {
    let (system, skip) = leading_instructions(messages);
    if skip == messages.len() && skip > 0 {
        (leading_instructions(&messages[..skip - 1]).0, skip - 1)
    } else {
        (system, skip)
    }
}

/// The leading system and developer messages, joined: the providers that take instructions apart
/// from the conversation get these; later ones stay in the conversation.
fn leading_instructions(messages: &[Message]) -> (Option<String>, usize) {
    let mut texts = Vec::new();
    for message in messages {
        match message {
            Message::System(m) | Message::Developer(m) => texts.push(m.content.joined_text()),
            _ => break,
        }
    }
    let count = texts.len();
    let joined = texts.join("\n\n");
    ((!joined.is_empty()).then_some(joined), count)
}

/// `data:image/png;base64,AAAA` → (`image/png`, `AAAA`).
fn data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (mime, data) = rest.split_once(";base64,")?;
    Some((mime, data))
}

/// Appends `message` to `out`, merging it into the last one when both have the same role:
/// providers that require alternating roles get one message per run of a role.
fn push_merged(out: &mut Vec<(String, Vec<Value>)>, role: &str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    match out.last_mut() {
        Some((last, existing)) if last == role => existing.extend(blocks),
        _ => out.push((role.to_owned(), blocks)),
    }
}

/// Why a context cannot go to a provider as it is: found before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// The conversation has nothing in it to answer.
    #[error("the conversation is empty: {provider} needs at least one user turn")]
    Empty {
        /// The provider the request was for.
        provider: &'static str,
    },
    /// The last turn is the bot's own: a prefill, which Claude 4.6 and later refuse (400
    /// "This model does not support assistant message prefill").
    #[error(
        "the conversation ends on the bot's own words: {provider} answers a user turn \
         (tool results count as one), not an assistant prefill"
    )]
    EndsOnAssistant {
        /// The provider the request was for.
        provider: &'static str,
    },
    /// A tool result whose call is not in the assistant turn right before it.
    #[error("the result of tool call {id} does not follow the turn that made the call")]
    ResultWithoutCall {
        /// The call's id.
        id: String,
    },
    /// A tool call with no result in the turn right after it.
    #[error("tool call {id} has no result in the turn after it")]
    CallWithoutResult {
        /// The call's id.
        id: String,
    },
}

/// Checks alternating `(role, blocks)` turns of the providers that take the conversation as
/// user and assistant turns (Anthropic: "roles must alternate", every `tool_use` answered by a
/// `tool_result` in the next user turn, which must end the request on Claude 4.6 and later;
/// Gemini: `functionCall` parts answered by `functionResponse` parts in the next turn).
/// `assistant` names the bot's role, `calls` and `results` read a turn's call and result ids.
/// `turns` are the request's turns, each a `role` and its pieces under `pieces`.
fn check_turns(
    provider: &'static str,
    turns: &[Value],
    pieces: &str,
    assistant: &str,
    calls: fn(&Value) -> Option<&str>,
    results: fn(&Value) -> Option<&str>,
) -> Result<(), ContextError> {
    let turns: Vec<(&str, &[Value])> = turns
        .iter()
        .map(|t| {
            let role = t["role"].as_str().unwrap_or_default();
            (role, t[pieces].as_array().map_or(&[][..], Vec::as_slice))
        })
        .collect();
    let Some((last, _)) = turns.last() else {
        return Err(ContextError::Empty { provider });
    };
    if *last == assistant {
        return Err(ContextError::EndsOnAssistant { provider });
    }
    let ids = |blocks: &[Value], read: fn(&Value) -> Option<&str>| -> Vec<String> {
        blocks
            .iter()
            .filter_map(|b| read(b).map(str::to_owned))
            .collect()
    };
    let mut asked: Vec<String> = Vec::new();
    for (role, blocks) in turns {
        let answered = ids(blocks, results);
        if let Some(id) = answered.iter().find(|id| !asked.contains(id)) {
            return Err(ContextError::ResultWithoutCall { id: id.clone() });
        }
        if let Some(id) = asked.iter().find(|id| !answered.contains(id)) {
            return Err(ContextError::CallWithoutResult { id: id.clone() });
        }
        asked = if role == assistant {
            ids(blocks, calls)
        } else {
            Vec::new()
        };
    }
    Ok(())
}
