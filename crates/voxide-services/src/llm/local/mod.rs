//! The embedded LLM: SmolLM2-135M-Instruct from its GGUF file, run with candle.
//!
//! The file's Q4_1 weights are re-quantized to Q8_0 once at load time: candle has no fast Q4_1
//! path on this CPU, while its Q8_0 kernels generate 3x faster than f32 (decoding is bound by
//! memory bandwidth, and Q8_0 reads a quarter of the bytes). The weights are shared by every
//! session; each engine instance keeps its own KV cache, so a turn only processes the messages
//! added since the last one.

mod grammar;
mod tool_call;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::quantized::{GgmlDType, gguf_file};
use futures_util::stream::BoxStream;
use tokio::sync::mpsc;

pub use grammar::{ArgumentsGrammar, Field, ValueKind, Verdict};
pub use tool_call::{Decision, Outcome, ToolExample, ToolSet, ToolWords};
use voxide_engines::bpe::Digits;
pub use voxide_engines::bpe::Tokenizer;
pub use voxide_engines::llm::llama;
use voxide_engines::llm::llama::{KvCache, Llama, Prefill};
use voxide_engines::llm::{FILE, NAME};

use super::{LlmEngine, LlmError, LlmEvent, LlmRequest};
use crate::llm::IN_PROGRESS;
use voxide_core::context::async_tool_messages::{
    ASYNC_TOOL_INSTRUCTIONS, AsyncToolMessageKind, AsyncToolMessagePayload, CANCELLED,
    parse_message,
};
use voxide_core::context::{Content, Message, StopReason};
use voxide_core::frames::TokenUsage;
use voxide_engines::models::{ModelError, model_path};

/// The model name reported in metrics and the price table.
pub const MODEL: &str = "SmolLM2-135M-Instruct";

/// How the local model generates.
#[derive(Debug, Clone)]
pub struct LocalLlmOptions {
    /// Tokens one reply may have at most.
    pub max_tokens: usize,
    /// Penalty on tokens generated recently (1.0: none); a model this small loops without one.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_window: usize,
    /// Earlier exchanges (user turn and answer) the model sees besides the current one. A model
    /// this small follows the last exchange more than the new question: given it, it often
    /// says its last answer again, word for word.
    pub history_turns: usize,
    /// Worked examples of tool calls for the side prompt that decides them.
    pub tool_examples: Vec<ToolExample>,
    /// Tools read from the words and spoken from templates rather than by the model.
    pub tool_words: Vec<ToolWords>,
}

impl Default for LocalLlmOptions {
    fn default() -> Self {
        Self {
            max_tokens: 120,
            repeat_penalty: 1.2,
            repeat_window: 64,
            history_turns: 0,
            tool_examples: Vec::new(),
            tool_words: Vec::new(),
        }
    }
}

/// Weights and tokenizer, loaded once per process.
pub struct LocalModel {
    llama: Llama,
    tokenizer: Tokenizer,
    /// Each token's text, for the argument grammar.
    pieces: Vec<String>,
    prefixes: Mutex<tool_call::PrefixCache>,
    im_start: u32,
    im_end: u32,
    eos: u32,
}

static SHARED: OnceLock<Arc<LocalModel>> = OnceLock::new();

fn invalid(path: &Path, reason: impl ToString) -> ModelError {
    ModelError::Invalid {
        name: NAME.into(),
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

impl LocalModel {
    /// The process-wide model, loaded on first use.
    pub fn shared() -> Result<Arc<Self>, ModelError> {
        if let Some(model) = SHARED.get() {
            return Ok(model.clone());
        }
        let model = Arc::new(Self::load(&model_path(NAME, FILE)?)?);
        Ok(SHARED.get_or_init(|| model).clone())
    }

    /// Loads a llama-architecture GGUF file with a GPT-2 style tokenizer.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let mut file = std::fs::File::open(path).map_err(|e| invalid(path, e))?;
        let content = gguf_file::Content::read(&mut file).map_err(|e| invalid(path, e))?;
        let strings = |key: &str| -> Result<Vec<String>, ModelError> {
            content
                .metadata
                .get(key)
                .ok_or_else(|| invalid(path, format!("no {key} in the metadata")))?
                .to_vec()
                .map_err(|e| invalid(path, e))?
                .iter()
                .map(|v| v.to_string().cloned().map_err(|e| invalid(path, e)))
                .collect()
        };
        let pieces = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let tokenizer =
            Tokenizer::new(pieces, &merges, Digits::Single).map_err(|e| invalid(path, e))?;
        let token = |piece: &str| {
            tokenizer
                .token(piece)
                .ok_or_else(|| invalid(path, format!("the vocabulary lacks {piece}")))
        };
        let (im_start, im_end, eos) = (
            token("<|im_start|>")?,
            token("<|im_end|>")?,
            token("<|endoftext|>")?,
        );

        let llama = Llama::from_gguf(
            &content,
            &mut file,
            GgmlDType::Q8_0,
            Prefill::for_this_cpu(),
        )
        .map_err(|e| invalid(path, e))?;
        // candle lays the weights out for its kernels on first use; do it now, not in the
        // first user's turn.
        llama
            .forward(&mut KvCache::default(), &[im_start])
            .map_err(|e| invalid(path, e))?;
        let pieces = (0..tokenizer.len() as u32)
            .map(|id| String::from_utf8_lossy(&tokenizer.bytes(id)).into_owned())
            .collect();
        Ok(Self {
            llama,
            tokenizer,
            pieces,
            prefixes: Mutex::default(),
            im_start,
            im_end,
            eos,
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The ChatML prompt for `messages`, ending with the assistant's turn opened.
    pub fn prompt(&self, messages: &[Message]) -> Vec<u32> {
        self.chatml(render(messages))
    }

    /// `turns` in ChatML, ending with the assistant's turn opened.
    fn chatml(&self, turns: Vec<(&str, String)>) -> Vec<u32> {
        let mut ids = Vec::new();
        for (role, text) in turns {
            ids.extend(self.chat_turn(role, &text));
        }
        ids.push(self.im_start);
        ids.extend(self.tokenizer.encode("assistant\n"));
        ids
    }
}

/// The conversation as ChatML roles and texts a 135M model can follow: it knows system, user and
/// assistant only, so tool calls are left out and their results become short system notes, and
/// the async-tool protocol text (meant for models that call tools themselves) is dropped.
fn render(messages: &[Message]) -> Vec<(&'static str, String)> {
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut out = Vec::new();
    for message in messages {
        let note = |id: &str, what: &str| {
            let name = names.get(id).map_or("a tool".to_owned(), |n| {
                format!("the {} tool", n.replace('_', " "))
            });
            format!("Note: {name} {what}")
        };
        if let Some(payload) = parse_message(message) {
            let result = payload.result.as_deref().unwrap_or_default();
            let text = match payload.kind {
                AsyncToolMessageKind::Started => {
                    attach_to_user(&mut out, note(&payload.tool_call_id, "is now running."));
                    continue;
                }
                AsyncToolMessageKind::Intermediate => {
                    note(&payload.tool_call_id, &format!("update: {}", plain(result)))
                }
                AsyncToolMessageKind::Final => {
                    let text = note(
                        &payload.tool_call_id,
                        &format!("finished: {}.", plain(result)),
                    );
                    attach_to_user(&mut out, text);
                    continue;
                }
            };
            out.push(("system", text));
            continue;
        }
        match message {
            Message::System(m) | Message::Developer(m) => {
                let text = m.content.joined_text().replace(ASYNC_TOOL_INSTRUCTIONS, "");
                if !text.trim().is_empty() {
                    out.push(("system", text.trim().to_owned()));
                }
            }
            Message::User(m) => match out.last_mut() {
                // A turn the user went on with before the bot said anything (its answer cut
                // unspoken, at most tool calls between) is one question.
                Some(("user", text)) => {
                    text.push(' ');
                    text.push_str(&m.content.joined_text());
                }
                _ => out.push(("user", m.content.joined_text())),
            },
            Message::Assistant(m) => {
                for call in m.tool_calls.iter().flatten() {
                    names.insert(&call.id, &call.function.name);
                }
                let text = m
                    .content
                    .as_ref()
                    .and_then(Option::as_ref)
                    .map(Content::joined_text)
                    .unwrap_or_default();
                if !text.is_empty() {
                    out.push(("assistant", text));
                }
            }
            Message::Tool(m) => {
                let result = m.content.joined_text();
                if result != IN_PROGRESS {
                    let text = note(&m.tool_call_id, &format!("says {}.", plain(&result)));
                    attach_to_user(&mut out, text);
                }
            }
            Message::ProviderSpecific(_) => {}
        }
    }
    out
}

/// The instructions before the conversation, and its last `history` exchanges before the
/// current one (which starts at the last user turn, its tool notes attached to it).
fn recent(turns: Vec<(&'static str, String)>, history: usize) -> Vec<(&'static str, String)> {
    let users: Vec<usize> = (0..turns.len()).filter(|&i| turns[i].0 == "user").collect();
    let (Some(&first), Some(&from)) = (
        users.first(),
        users.iter().rev().nth(history).or(users.first()),
    ) else {
        return turns;
    };
    turns
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i < first || *i >= from)
        .map(|(_, turn)| turn)
        .collect()
}

/// Adds a tool's result to the latest user turn: a model this small answers the user's words
/// and ignores later system notes, so the result is put where it looks.
fn attach_to_user(out: &mut Vec<(&'static str, String)>, note: String) {
    match out.iter_mut().rev().find(|(role, _)| *role == "user") {
        Some((_, text)) => {
            text.push_str("\n(");
            text.push_str(&note);
            text.push(')');
        }
        None => out.push(("user", format!("({note})"))),
    }
}

/// A tool result as plain words: JSON objects become `key value` pairs, which a small model
/// repeats far more faithfully than braces and quotes.
fn plain(result: &str) -> String {
    fn words(value: &serde_json::Value) -> String {
        match value {
            serde_json::Value::Object(map) => map
                .iter()
                .map(|(k, v)| format!("{} {}", k.replace('_', " "), words(v)))
                .collect::<Vec<_>>()
                .join(", "),
            serde_json::Value::Array(items) => {
                items.iter().map(words).collect::<Vec<_>>().join(", ")
            }
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
    match serde_json::from_str::<serde_json::Value>(result) {
        Ok(value) => words(&value),
        Err(_) => result.to_owned(),
    }
}

/// The answer to the tool outcomes that end the conversation, when every one of them is said
/// from its tool's template: the model is not asked to restate results it could get wrong.
fn said_by_rule(messages: &[Message], rules: &[ToolWords]) -> Option<String> {
    if rules.is_empty() {
        return None;
    }
    let mut calls: HashMap<&str, (&str, serde_json::Value)> = HashMap::new();
    for call in messages.iter().filter_map(|m| match m {
        Message::Assistant(m) => m.tool_calls.as_ref(),
        _ => None,
    }) {
        for call in call {
            let arguments = crate::llm::tools::parse_arguments(&call.function.arguments);
            calls.insert(&call.id, (&call.function.name, arguments));
        }
    }
    let mut said = Vec::new();
    for message in messages.iter().rev() {
        let payload = parse_message(message);
        let text = match message {
            Message::Tool(m) if payload.is_none() => m.content.joined_text(),
            _ => String::new(),
        };
        let (id, outcome) = match (&payload, message) {
            (Some(payload), _) => (payload.tool_call_id.as_str(), async_outcome(payload)),
            (None, Message::Tool(m)) => match text.as_str() {
                IN_PROGRESS => continue,
                CANCELLED => (m.tool_call_id.as_str(), Outcome::Cancelled),
                _ => (m.tool_call_id.as_str(), Outcome::Result(&text)),
            },
            (None, Message::Assistant(m)) if m.content.as_ref().is_none_or(|c| c.is_none()) => {
                continue;
            }
            _ => break,
        };
        let (name, arguments) = calls.get(id)?;
        let rule = rules.iter().find(|r| r.name == *name)?;
        match (rule.say)(arguments, outcome) {
            // Nothing to add to what the other outcomes say.
            Some(sentence) if sentence.is_empty() => {}
            Some(sentence) => said.push(sentence),
            // A progress report the template leaves unsaid is no news.
            None if matches!(outcome, Outcome::Update(_)) => {}
            None => return None,
        }
    }
    said.reverse();
    (!said.is_empty()).then(|| said.join(" "))
}

/// An async-tool message's news.
fn async_outcome(payload: &AsyncToolMessagePayload) -> Outcome<'_> {
    let result = payload.result.as_deref().unwrap_or_default();
    match payload.kind {
        _ if payload.is_cancelled() => Outcome::Cancelled,
        AsyncToolMessageKind::Started => Outcome::Started,
        AsyncToolMessageKind::Intermediate => Outcome::Update(result),
        AsyncToolMessageKind::Final => Outcome::Result(result),
    }
}

/// The text of the last message when it is the user's: a new request, which may call a tool.
fn pending_user_text(messages: &[Message]) -> Option<String> {
    match messages.last()? {
        Message::User(m) => Some(m.content.joined_text()),
        _ => None,
    }
}

/// Makes each token in `recent` less likely (once, however often it occurs): positive logits
/// are divided by `penalty`, negative ones multiplied, as llama.cpp and candle do.
fn penalize_repeats(logits: &mut [f32], penalty: f32, recent: &[u32]) {
    let mut seen = std::collections::HashSet::new();
    for &token in recent {
        if let Some(logit) = logits
            .get_mut(token as usize)
            .filter(|_| seen.insert(token))
        {
            *logit = if *logit >= 0.0 {
                *logit / penalty
            } else {
                *logit * penalty
            };
        }
    }
}

/// Numbers the local model's tool calls, process-wide, so ids never repeat.
static CALL_IDS: AtomicU64 = AtomicU64::new(1);

/// One conversation's use of the model: the shared weights plus its own KV cache.
pub struct LocalLlm {
    model: Arc<LocalModel>,
    state: Arc<Mutex<CacheState>>,
    options: LocalLlmOptions,
}

struct CacheState {
    cache: KvCache,
    /// Tokens whose keys and values are in the cache.
    cached: Vec<u32>,
}

impl LocalLlm {
    /// Caps the length of each reply.
    pub fn set_max_tokens(&mut self, max_tokens: usize) {
        self.options.max_tokens = max_tokens;
    }

    /// A conversation on the shared model.
    pub fn new(model: Arc<LocalModel>, options: LocalLlmOptions) -> Self {
        Self {
            model,
            state: Arc::new(Mutex::new(CacheState {
                cache: KvCache::default(),
                cached: Vec::new(),
            })),
            options,
        }
    }
}

impl LlmEngine for LocalLlm {
    fn model(&self) -> &str {
        MODEL
    }

    fn provider(&self) -> &str {
        "local"
    }

    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let model = self.model.clone();
        let state = self.state.clone();
        let options = self.options.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(text) = said_by_rule(&request.messages, &options.tool_words) {
                let _ = tx.send(Ok(LlmEvent::Text(text)));
                return;
            }
            let tools = ToolSet::new(&request.tools.standard_tools)
                .with_examples(&options.tool_examples)
                .with_words(&options.tool_words);
            if let Some(text) = pending_user_text(&request.messages).filter(|_| !tools.is_empty()) {
                match model.decide_tool_call(&tools, request.tool_choice.as_ref(), &text) {
                    Ok(Some(call)) => {
                        let id = format!("call_local_{}", CALL_IDS.fetch_add(1, Ordering::Relaxed));
                        let _ = tx.send(Ok(LlmEvent::ToolCall {
                            id,
                            name: call.name,
                            arguments: call.arguments.to_string(),
                        }));
                        let _ = tx.send(Ok(LlmEvent::Finished(StopReason::ToolUse)));
                        return;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "local tool routing failed; answering in words")
                    }
                }
            }
            let turns = recent(render(&request.messages), options.history_turns);
            let prompt = model.chatml(turns);
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = run(&model, &mut state, &prompt, &options, &tx) {
                // The cache may hold half a step: start clean next time.
                state.cache.clear();
                state.cached.clear();
                let _ = tx.send(Err(LlmError::Provider(e.to_string())));
            }
        });
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}

/// Prefills what the cache lacks, then generates until the end of the turn.
fn run(
    model: &LocalModel,
    state: &mut CacheState,
    prompt: &[u32],
    options: &LocalLlmOptions,
    tx: &mpsc::UnboundedSender<Result<LlmEvent, LlmError>>,
) -> candle_core::Result<()> {
    // Reuse what the prompt shares with the cache (at least one token must run, for the
    // logits): after an interruption the context holds only the spoken part of the answer,
    // and everything before it is still good.
    let shared = state
        .cached
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len().saturating_sub(1));
    state.cache.truncate(shared)?;
    state.cached.truncate(shared);
    let start = state.cached.len();
    let fresh = &prompt[start..];
    let mut logits = model.llama.forward(&mut state.cache, fresh)?;
    state.cached.extend_from_slice(fresh);
    let mut generated: Vec<u32> = Vec::new();
    let mut pending = Vec::new();
    for _ in 0..options.max_tokens {
        let window = &generated[generated.len().saturating_sub(options.repeat_window)..];
        penalize_repeats(&mut logits, options.repeat_penalty, window);
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(model.eos, |(i, _)| i as u32);
        if next == model.im_end || next == model.eos {
            break;
        }
        generated.push(next);
        pending.extend(model.tokenizer.bytes(next));
        // Send whole characters only: a token may end inside a multi-byte one.
        let valid = match std::str::from_utf8(&pending) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        if valid > 0 {
            let text = String::from_utf8_lossy(&pending[..valid]).into_owned();
            pending.drain(..valid);
            if tx.send(Ok(LlmEvent::Text(text))).is_err() {
                // The listener is gone (an interruption): stop here, the cache stays valid.
                break;
            }
        }
        logits = model.llama.forward(&mut state.cache, &[next])?;
        state.cached.push(next);
    }
    let _ = tx.send(Ok(LlmEvent::Usage(TokenUsage {
        input: fresh.len() as u64,
        output: generated.len() as u64,
        cache_read: start as u64,
        cache_write: 0,
    })));
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use voxide_core::context::AssistantMessage;
    use voxide_core::context::ToolCall;
    use voxide_core::context::async_tool_messages::{
        build_cancelled_message, build_final_result_message, build_intermediate_result_message,
        build_started_message,
    };

    fn rule(name: &str) -> ToolWords {
        ToolWords {
            name: name.into(),
            read: |_| None,
            say: |arguments, outcome| match outcome {
                Outcome::Started => Some(format!("started {}", arguments["n"])),
                Outcome::Result(result) => Some(format!("got {result}")),
                Outcome::Update(_) | Outcome::Cancelled => None,
            },
        }
    }

    fn call(id: &str, name: &str) -> Message {
        Message::Assistant(AssistantMessage {
            tool_calls: Some(vec![ToolCall::function(id, name, &json!({"n": 7}))]),
            ..AssistantMessage::default()
        })
    }

    #[test]
    fn a_question_the_user_went_on_with_before_any_answer_is_one_turn() {
        let mut messages = vec![Message::user("What time is it?"), call("a", "clock")];
        messages.push(Message::tool("a", "noon"));
        messages.push(Message::user("And what is seven squared?"));
        let turns = recent(render(&messages), 0);
        assert_eq!(turns.len(), 1, "{turns:?}");
        assert_eq!(turns[0].0, "user");
        assert!(turns[0].1.starts_with("What time is it?"), "{turns:?}");
        assert!(turns[0].1.contains("noon"), "{turns:?}");
        assert!(
            turns[0].1.ends_with("And what is seven squared?"),
            "{turns:?}"
        );
    }

    #[test]
    fn the_model_sees_the_instructions_and_only_the_last_exchanges() {
        let turns = vec![
            ("system", "Be brief.".to_owned()),
            ("user", "one".to_owned()),
            ("assistant", "1".to_owned()),
            ("user", "two".to_owned()),
            ("assistant", "2".to_owned()),
            ("system", "a note".to_owned()),
            ("user", "three".to_owned()),
        ];
        let roles = |kept: Vec<(&str, String)>| -> Vec<String> {
            kept.into_iter().map(|(_, text)| text).collect()
        };
        assert_eq!(roles(recent(turns.clone(), 0)), ["Be brief.", "three"]);
        assert_eq!(
            roles(recent(turns.clone(), 1)),
            ["Be brief.", "two", "2", "a note", "three"]
        );
        assert_eq!(roles(recent(turns.clone(), 5)).len(), turns.len());
        let instructions = vec![("system", "Be brief.".to_owned())];
        assert_eq!(roles(recent(instructions, 0)), ["Be brief."]);
    }

    #[test]
    fn results_of_tools_with_templates_are_said_from_them_and_others_left_to_the_model() {
        let rules = [rule("sum")];
        let asked = vec![Message::user("seven?"), call("a", "sum")];
        let mut answered = asked.clone();
        answered.push(Message::tool("a", "7"));
        assert_eq!(said_by_rule(&answered, &rules).as_deref(), Some("got 7"));

        let mut other = vec![Message::user("weather?"), call("b", "weather")];
        other.push(Message::tool("b", "sunny"));
        assert_eq!(
            said_by_rule(&other, &rules),
            None,
            "no template: the model answers"
        );
        assert_eq!(said_by_rule(&asked, &rules), None, "nothing to say yet");
        assert_eq!(said_by_rule(&[Message::user("hi")], &rules), None);
    }

    #[test]
    fn an_outcome_whose_template_adds_nothing_leaves_the_others_to_speak() {
        let rules = [
            ToolWords {
                name: "timer".into(),
                read: |_| None,
                say: |arguments, outcome| match outcome {
                    Outcome::Cancelled => Some(format!("timer {} stopped", arguments["n"])),
                    _ => None,
                },
            },
            ToolWords {
                name: "cancel_timer".into(),
                read: |_| None,
                say: |_, _| Some(String::new()),
            },
        ];
        let messages = vec![
            Message::user("a timer"),
            call("a", "timer"),
            build_started_message("a"),
            Message::assistant("started"),
            Message::user("cancel it"),
            call("b", "cancel_timer"),
            build_cancelled_message("a"),
            Message::tool("b", "\"Cancelled the timer call a.\""),
        ];
        assert_eq!(
            said_by_rule(&messages, &rules).as_deref(),
            Some("timer 7 stopped")
        );
    }

    #[test]
    fn an_async_result_is_said_and_its_unsaid_updates_skipped() {
        let rules = [rule("sum")];
        let mut messages = vec![Message::user("seven?"), call("a", "sum")];
        messages.push(build_started_message("a"));
        assert_eq!(
            said_by_rule(&messages, &rules).as_deref(),
            Some("started 7")
        );
        messages.push(Message::assistant("started 7"));
        messages.push(build_intermediate_result_message("a", Some(&json!(3))));
        messages.push(build_final_result_message("a", Some(&json!(7))));
        assert_eq!(said_by_rule(&messages, &rules).as_deref(), Some("got 7"));
    }
}
