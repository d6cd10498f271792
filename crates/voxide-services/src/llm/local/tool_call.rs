//! Schema-constrained tool calls for the local model.
//!
//! A 135M model does not write tool calls unaided, but it ranks them well enough when asked
//! the right way. Each user turn gets a side prompt: the tools in one line each, a few worked
//! examples as earlier turns, the user's words, and the opening of a JSON call, `{"name": "`.
//! The model's own probabilities for each tool name (and `none`) decide whether a tool is
//! called; the arguments are then written under the tool's [`ArgumentsGrammar`], so every call
//! parses and validates.
//!
//! Tools with [`ToolWords`] are handled by rule where the model is weakest: the rule reads the
//! arguments from the user's words (a sum, a duration), a tool whose words say nothing it needs
//! is not offered, one whose words do is favoured, and its results are said from a template.
//!
//! The side prompt up to the user's words is prefilled once per tool set and shared by every
//! session, so a decision costs only the user's words plus a few tokens.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::LocalModel;
use super::grammar::{ArgumentsGrammar, ValueKind, Verdict};
use super::llama::KvCache;
use voxide_core::context::{FunctionSchema, ToolChoice};

/// The pseudo tool that means "answer in words".
const NONE: &str = "none";
/// Log-probability a tool name must beat `none` by (tuned on the worked examples, not on the
/// accuracy suite).
const NONE_MARGIN: f32 = 0.3;
/// Log-probability added to a tool whose rule read its arguments from the words: the rule has
/// seen a sum, a duration or a question about the time, and the model is left to overrule it
/// (tuned on `voxide bench tools` and a set of near misses, not on the held-out set).
const RULE_EVIDENCE: f32 = 2.0;
/// Tokens one argument value may take at most.
const MAX_VALUE_TOKENS: usize = 24;
/// Best-scored tokens checked against the grammar before the whole vocabulary is sorted.
const SHORTLIST: usize = 256;

/// A tool call the model decided on.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The tool's name.
    pub name: String,
    /// The arguments, valid for the tool's grammar.
    pub arguments: Value,
}

/// A worked example for the side prompt: what a user said and the call it makes (`None`: an
/// answer in words). A model this small follows examples far better than descriptions.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolExample {
    /// What the user said.
    pub user: String,
    /// The tool it calls and its arguments, or `None`.
    pub call: Option<(String, Value)>,
}

impl ToolExample {
    /// An example that calls `name` with `arguments`.
    pub fn call(user: &str, name: &str, arguments: Value) -> Self {
        Self {
            user: user.to_owned(),
            call: Some((name.to_owned(), arguments)),
        }
    }

    /// An example answered in words.
    pub fn words(user: &str) -> Self {
        Self {
            user: user.to_owned(),
            call: None,
        }
    }

    /// The call as the model writes it.
    fn reply(&self) -> String {
        match &self.call {
            // Spaced exactly like the opening the model is given at run time.
            Some((name, arguments)) => {
                let fields: Vec<String> = arguments
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| format!("\"{k}\": {v}"))
                    .collect();
                format!(
                    "{{\"name\": \"{name}\", \"arguments\": {{{}}}}}",
                    fields.join(", ")
                )
            }
            None => format!("{{\"name\": \"{NONE}\"}}"),
        }
    }
}

/// What became of a call, as the model is asked to speak about it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome<'a> {
    /// An asynchronous call began; its result comes later.
    Started,
    /// A partial result of a call still running (JSON).
    Update(&'a str),
    /// The call's result (JSON, or the text a tool gave).
    Result(&'a str),
    /// The call was cancelled before it finished.
    Cancelled,
}

/// A tool the embedded model handles by rule where a model this small cannot be trusted:
/// its arguments are read from the user's words, and what it returned is said from a template,
/// so every number spoken about the result is the result's.
#[derive(Debug, Clone)]
pub struct ToolWords {
    /// The tool's name.
    pub name: String,
    /// The call's arguments from what the user said; `None` when the words do not fill them,
    /// and then the tool is not called.
    pub read: fn(&str) -> Option<Value>,
    /// What to say about an outcome of a call made with these arguments; `None` leaves the
    /// words to the model, an empty sentence adds nothing to what the other outcomes say.
    pub say: fn(&Value, Outcome<'_>) -> Option<String>,
}

/// The tools the local model can call in one request, with their grammars.
pub struct ToolSet {
    tools: Vec<(FunctionSchema, ArgumentsGrammar)>,
    examples: Vec<ToolExample>,
    words: Vec<ToolWords>,
}

impl ToolSet {
    /// The tools of `schemas` the local model can write; the others are skipped with a warning.
    pub fn new(schemas: &[FunctionSchema]) -> Self {
        let tools = schemas
            .iter()
            .filter_map(|schema| match ArgumentsGrammar::from_schema(schema) {
                Ok(grammar) => Some((schema.clone(), grammar)),
                Err(reason) => {
                    tracing::warn!(tool = %schema.name, %reason, "not offered to the local model");
                    None
                }
            })
            .collect();
        Self {
            tools,
            examples: Vec::new(),
            words: Vec::new(),
        }
    }

    /// Tools whose arguments are read from the words by rule.
    pub fn with_words(mut self, words: &[ToolWords]) -> Self {
        self.words = words.to_vec();
        self
    }

    /// Adds worked examples; those for tools not in the set are left out.
    pub fn with_examples(mut self, examples: &[ToolExample]) -> Self {
        self.examples = examples
            .iter()
            .filter(|e| {
                e.call
                    .as_ref()
                    .is_none_or(|(name, _)| self.tools.iter().any(|(s, _)| s.name == *name))
            })
            .cloned()
            .collect();
        self
    }

    /// True when there is nothing to call.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The side prompt's instructions: one line per tool.
    fn instructions(&self) -> String {
        let mut text = String::from(
            "Pick the tool that does what the user asks. Reply with a JSON call of it, or with \
             {\"name\": \"none\"} when the user is just talking.\nTools:\n",
        );
        for (schema, grammar) in &self.tools {
            let params: Vec<String> = grammar
                .fields
                .iter()
                .map(|f| format!("{}: {}", f.name, kind_name(&f.kind)))
                .collect();
            text.push_str(&format!(
                "{}({}): {}\n",
                schema.name,
                params.join(", "),
                schema.description
            ));
        }
        text.push_str("none: no tool; answer in words.");
        text
    }
}

fn kind_name(kind: &ValueKind) -> String {
    match kind {
        ValueKind::String => "text".into(),
        ValueKind::Number => "number".into(),
        ValueKind::Integer => "integer".into(),
        ValueKind::Boolean => "true or false".into(),
        ValueKind::Enum(values) => values.join(" or "),
    }
}

/// The model's state after the side prompt's instructions, kept per tool set.
#[derive(Default)]
pub(super) struct PrefixCache {
    prefixes: BTreeMap<Vec<u32>, KvCache>,
}

/// Prefixes kept at most (one per distinct tool set).
const MAX_PREFIXES: usize = 8;

fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    let norm = max + sum.ln();
    logits.iter().map(|l| l - norm).collect()
}

impl LocalModel {
    /// Prefills the side prompt of `tools` (instructions and examples), which every later
    /// decision on the same tools then shares: the first decision of a session does not pay
    /// for it.
    pub fn prepare_tools(&self, tools: &ToolSet) -> candle_core::Result<()> {
        self.prefilled(&self.side_prompt(tools)).map(drop)
    }

    /// The side prompt up to the user's words.
    fn side_prompt(&self, tools: &ToolSet) -> Vec<u32> {
        let mut prefix = self.chat_turn("system", &tools.instructions());
        for example in &tools.examples {
            prefix.extend(self.chat_turn("user", &example.user));
            prefix.extend(self.chat_turn("assistant", &example.reply()));
        }
        prefix
    }

    /// Decides whether `user_text` calls one of `tools` and with what arguments; `None` means
    /// the model answers in words.
    pub fn decide_tool_call(
        &self,
        tools: &ToolSet,
        tool_choice: Option<&ToolChoice>,
        user_text: &str,
    ) -> candle_core::Result<Option<Decision>> {
        let mut candidates: Vec<&str> = match tool_choice {
            Some(ToolChoice::None) => return Ok(None),
            Some(ToolChoice::Function(name)) => vec![name.as_str()],
            _ => tools.tools.iter().map(|(s, _)| s.name.as_str()).collect(),
        };
        candidates.retain(|name| tools.tools.iter().any(|(s, _)| s.name == *name));
        if candidates.is_empty() {
            return Ok(None);
        }
        if !matches!(
            tool_choice,
            Some(ToolChoice::Required | ToolChoice::Function(_))
        ) {
            candidates.push(NONE);
        }

        // Tools read by rule whose words say nothing they need are not candidates (unless the
        // caller forced a call); those whose words do are favoured by the rule's evidence.
        let mut read: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
        for rule in &tools.words {
            if let Some(Value::Object(arguments)) = (rule.read)(user_text) {
                read.insert(rule.name.as_str(), arguments);
            }
        }
        if candidates.contains(&NONE) {
            candidates
                .retain(|c| read.contains_key(c) || !tools.words.iter().any(|w| w.name == *c));
            if candidates == [NONE] {
                return Ok(None);
            }
        }

        let mut cache = self.prefilled(&self.side_prompt(tools))?;
        let logits = self.open_call(&mut cache, user_text)?;

        let name = if candidates.len() == 1 {
            candidates[0]
        } else {
            let mut scores = self.rank(&cache, &logits, &candidates)?;
            tracing::debug!(?candidates, ?scores, "local tool routing");
            for (i, candidate) in candidates.iter().enumerate() {
                // A wrong call costs a voice user more than a missed one (they can ask again),
                // so a call has to beat answering in words by a margin.
                if *candidate == NONE {
                    scores[i] += NONE_MARGIN;
                } else if read.contains_key(candidate) {
                    scores[i] += RULE_EVIDENCE;
                }
            }
            let best = scores
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(i, _)| i);
            candidates[best]
        };
        if name == NONE {
            return Ok(None);
        }
        let Some((_, grammar)) = tools.tools.iter().find(|(s, _)| s.name == name) else {
            return Ok(None);
        };
        let arguments = match read.remove(name) {
            Some(arguments) => arguments,
            None => match self.write_arguments(&mut cache, name, grammar)? {
                Some(arguments) => arguments,
                None => return Ok(None),
            },
        };
        Ok(Some(Decision {
            name: name.to_owned(),
            arguments: Value::Object(arguments),
        }))
    }

    /// The call's arguments, written one field at a time under the tool's grammar; none when
    /// a field has no valid value (the model answers in words then).
    fn write_arguments(
        &self,
        cache: &mut KvCache,
        name: &str,
        grammar: &ArgumentsGrammar,
    ) -> candle_core::Result<Option<Map<String, Value>>> {
        let mut forced = format!("{name}\", \"arguments\": {{");
        let mut arguments = Map::new();
        for (i, field) in grammar.fields.iter().enumerate() {
            if i > 0 {
                forced.push_str(", ");
            }
            forced.push_str(&format!("\"{}\": ", field.name));
            if field.kind.quoted() {
                forced.push('"');
            }
            let logits = self.llama.forward(cache, &self.tokenizer.encode(&forced))?;
            let Some(text) = self.write_value(cache, logits, &field.kind)? else {
                tracing::debug!(tool = name, field = %field.name, "no valid value; answering in words");
                return Ok(None);
            };
            let value = match field.kind {
                ValueKind::String | ValueKind::Enum(_) => Value::String(text),
                _ => match serde_json::from_str(&text) {
                    Ok(v) => v,
                    Err(_) => return Ok(None),
                },
            };
            arguments.insert(field.name.clone(), value);
            forced = if field.kind.quoted() {
                "\"".into()
            } else {
                String::new()
            };
        }
        Ok(Some(arguments))
    }

    /// ChatML tokens of one complete turn.
    pub(super) fn chat_turn(&self, role: &str, text: &str) -> Vec<u32> {
        let mut ids = vec![self.im_start];
        ids.extend(self.tokenizer.encode(&format!("{role}\n{text}")));
        ids.push(self.im_end);
        ids.extend(self.tokenizer.encode("\n"));
        ids
    }

    /// Feeds the user's turn and the opening of a call; returns the logits for the name.
    fn open_call(&self, cache: &mut KvCache, user_text: &str) -> candle_core::Result<Vec<f32>> {
        let mut rest = self.chat_turn("user", user_text);
        rest.push(self.im_start);
        rest.extend(self.tokenizer.encode("assistant\n{\"name\": \""));
        self.llama.forward(cache, &rest)
    }

    /// The log-probability of each candidate name after the opening of a call.
    fn rank(
        &self,
        cache: &KvCache,
        logits: &[f32],
        candidates: &[&str],
    ) -> candle_core::Result<Vec<f32>> {
        let tokens: Vec<(&str, Vec<u32>)> = candidates
            .iter()
            .map(|c| (*c, self.tokenizer.encode(c)))
            .collect();
        let mut scores = vec![0.0f32; tokens.len()];
        let all: Vec<usize> = (0..tokens.len()).collect();
        self.score(cache, logits, &tokens, &all, 0, &mut scores)?;
        Ok(scores)
    }

    /// A KV cache holding `prefix`, prefilled once per prefix.
    fn prefilled(&self, prefix: &[u32]) -> candle_core::Result<KvCache> {
        let mut kept = self.prefixes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cache) = kept.prefixes.get(prefix) {
            return Ok(cache.clone());
        }
        let mut cache = KvCache::default();
        self.llama.forward(&mut cache, prefix)?;
        if kept.prefixes.len() >= MAX_PREFIXES {
            kept.prefixes.clear();
        }
        kept.prefixes.insert(prefix.to_vec(), cache.clone());
        Ok(cache)
    }

    /// Adds to `scores` the log-probability of each candidate's tokens from `depth` on, walking
    /// only as deep as needed to tell the candidates in `group` apart.
    fn score(
        &self,
        cache: &KvCache,
        logits: &[f32],
        candidates: &[(&str, Vec<u32>)],
        group: &[usize],
        depth: usize,
        scores: &mut [f32],
    ) -> candle_core::Result<()> {
        let logp = log_softmax(logits);
        let mut by_token: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &i in group {
            if let Some(&token) = candidates[i].1.get(depth) {
                by_token.entry(token).or_default().push(i);
            }
        }
        for (token, members) in by_token {
            for &i in &members {
                scores[i] += logp
                    .get(token as usize)
                    .copied()
                    .unwrap_or(f32::NEG_INFINITY);
            }
            if members.len() > 1 {
                let mut branch = cache.clone();
                let next = self.llama.forward(&mut branch, &[token])?;
                self.score(&branch, &next, candidates, &members, depth + 1, scores)?;
            }
        }
        Ok(())
    }

    /// Writes one value under `kind`'s grammar; `None` when the model finds no valid value.
    fn write_value(
        &self,
        cache: &mut KvCache,
        mut logits: Vec<f32>,
        kind: &ValueKind,
    ) -> candle_core::Result<Option<String>> {
        let mut text = String::new();
        for _ in 0..MAX_VALUE_TOKENS {
            if kind.complete(&text) {
                break;
            }
            let Some((token, verdict)) = self.pick(&logits, kind, &text) else {
                break;
            };
            if verdict == Verdict::Close {
                break;
            }
            text.push_str(&self.pieces[token as usize]);
            logits = self.llama.forward(cache, &[token])?;
        }
        Ok(kind.valid(&text).then_some(text))
    }

    /// The best-scored token the grammar allows after `so_far`.
    fn pick(&self, logits: &[f32], kind: &ValueKind, so_far: &str) -> Option<(u32, Verdict)> {
        let allowed = |i: &usize| -> Option<(u32, Verdict)> {
            let piece = self.pieces.get(*i)?;
            match kind.judge(so_far, piece) {
                Verdict::Reject => None,
                verdict => Some((*i as u32, verdict)),
            }
        };
        let by_score = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let short = SHORTLIST.min(order.len());
        if short < order.len() {
            order.select_nth_unstable_by(short, by_score);
        }
        let (head, tail) = order.split_at_mut(short);
        head.sort_unstable_by(by_score);
        if let Some(found) = head.iter().find_map(allowed) {
            return Some(found);
        }
        tail.sort_unstable_by(by_score);
        tail.iter().find_map(allowed)
    }
}
