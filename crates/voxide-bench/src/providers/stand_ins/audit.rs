//! What the stand-ins do wrong on purpose, and the ledger that says whether the bot made up for
//! it: every final answered exactly once, every tool result that finished delivered to the model.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

/// How often the stand-ins fail, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// The share of each kind of chance: a socket dropped at a finalize or a new context, a
    /// first token sent late, a request or a socket's upgrade refused (429 or 5xx).
    pub rate: f64,
    /// How late a late first token comes: past the client's first-token deadline.
    pub late: Duration,
    /// Seeds the draws, so a run can be repeated.
    pub seed: u64,
}

impl Faults {
    /// Nothing goes wrong.
    pub const NONE: Self = Self {
        rate: 0.0,
        late: Duration::from_secs(6),
        seed: 1,
    };
}

/// What a refused request or upgrade is answered with, in turn.
pub const REFUSALS: [u16; 3] = [429, 500, 503];

/// The draws and what they caused.
#[derive(Debug)]
pub struct FaultState {
    faults: Faults,
    /// splitmix64's state.
    state: Mutex<u64>,
    sockets_dropped: AtomicUsize,
    first_tokens_late: AtomicUsize,
    requests_refused: AtomicUsize,
    upgrades_refused: AtomicUsize,
}

/// What went wrong on purpose, counted.
#[derive(Debug, Clone, Serialize)]
pub struct FaultCounts {
    /// The share of each kind of chance taken.
    pub rate: f64,
    /// Sockets dropped at a finalize (STT) or a new context (TTS).
    pub sockets_dropped: usize,
    /// First tokens sent past the deadline.
    pub first_tokens_late: usize,
    /// Chat requests answered with 429, 500 or 503.
    pub requests_refused: usize,
    /// Socket upgrades answered with 429, 500 or 503.
    pub upgrades_refused: usize,
}

/// One kind of fault.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// A socket dropped without a word.
    SocketDropped,
    /// A first token past the client's deadline.
    FirstTokenLate,
    /// A chat request refused.
    RequestRefused,
    /// A socket's upgrade refused.
    UpgradeRefused,
}

impl FaultState {
    /// Draws seeded by `faults.seed`.
    pub fn new(faults: Faults) -> Self {
        Self {
            faults,
            state: Mutex::new(faults.seed),
            sockets_dropped: AtomicUsize::new(0),
            first_tokens_late: AtomicUsize::new(0),
            requests_refused: AtomicUsize::new(0),
            upgrades_refused: AtomicUsize::new(0),
        }
    }

    /// How late a late first token comes.
    pub fn late(&self) -> Duration {
        self.faults.late
    }

    /// Whether this chance of `fault` is taken (and counted).
    pub fn strike(&self, fault: Fault) -> bool {
        if self.faults.rate <= 0.0 {
            return false;
        }
        let draw = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = *state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) >> 11
        };
        let struck = (draw as f64 / (1u64 << 53) as f64) < self.faults.rate;
        if struck {
            let counter = match fault {
                Fault::SocketDropped => &self.sockets_dropped,
                Fault::FirstTokenLate => &self.first_tokens_late,
                Fault::RequestRefused => &self.requests_refused,
                Fault::UpgradeRefused => &self.upgrades_refused,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        struck
    }

    /// The status a refusal answers with: 429, 500 and 503 in turn.
    pub fn refusal(&self) -> u16 {
        let refused = self.requests_refused.load(Ordering::Relaxed)
            + self.upgrades_refused.load(Ordering::Relaxed);
        REFUSALS[refused % REFUSALS.len()]
    }

    /// What was struck so far.
    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            rate: self.faults.rate,
            sockets_dropped: self.sockets_dropped.load(Ordering::Relaxed),
            first_tokens_late: self.first_tokens_late.load(Ordering::Relaxed),
            requests_refused: self.requests_refused.load(Ordering::Relaxed),
            upgrades_refused: self.upgrades_refused.load(Ordering::Relaxed),
        }
    }
}

/// Each final the STT stand-in wrote and the answers the LLM stand-in began for it; each tool
/// call it asked for, the results the tool stand-in finished, and those that reached the model.
///
/// Requests are told apart: an answer ends on the user's words; a guess is an answer to fewer of
/// a turn's words than a later request of the session asks about (the user went on, and the
/// bot threw its early answer away: it is not counted as an answer); a follow-up ends on a tool
/// result or an async tool's message.
#[derive(Debug, Default)]
pub struct Ledger {
    answers: HashMap<String, usize>,
    /// By session, the turns the session's latest answer named.
    latest: HashMap<String, Vec<String>>,
    guesses: usize,
    follow_ups: usize,
    tool_calls: usize,
    tools_finished: HashSet<String>,
    tools_delivered: HashSet<String>,
    twice_examples: Vec<String>,
    /// By turn, the first request that named it: its text, its shape, when it came.
    first_asked: HashMap<String, (String, String, std::time::Instant)>,
    /// The turns a fault struck.
    struck: BTreeSet<String>,
}

/// Texts kept to show what was answered twice.
const MAX_EXAMPLES: usize = 5;

/// The ledger, summed.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerCounts {
    /// Finals written.
    pub finals: usize,
    /// Finals answered exactly once.
    pub answered_once: usize,
    /// Finals never answered.
    pub lost: usize,
    /// Finals answered more than once.
    pub answered_twice: usize,
    /// Answers begun on fewer of a turn's words than the session then asked about whole:
    /// guesses the bot threw away.
    pub guesses_thrown_away: usize,
    /// Requests that end on a tool result or an async tool's message.
    pub follow_ups: usize,
    /// Tool calls the model asked for.
    pub tool_calls: usize,
    /// Tool results the tool finished.
    pub tools_finished: usize,
    /// Of those, the results that reached the model as a final async-tool message.
    pub tools_delivered: usize,
    /// Finished and never delivered.
    pub tools_dropped: usize,
    /// A few of the texts that answered a final a second time, as the model was asked them.
    pub twice_examples: Vec<String>,
    /// The turns a fault struck (`session S question Q`): the last final of the request refused
    /// or answered late, the last final the text a dropped TTS socket held named, and the final
    /// a dropped STT socket left unanswered. A run tells its own latency apart from the time the
    /// bot took to make up for a fault.
    pub struck_turns: Vec<String>,
}

impl Ledger {
    /// The STT wrote a final.
    pub fn final_written(&mut self, turn: &str) {
        self.answers.entry(turn.to_owned()).or_default();
    }

    /// The LLM began answering a request whose last message is the user's `text`: every turn it
    /// names is answered once more (a user turn may hold several finals). When the session's
    /// previous answer named only some of these turns, that was a guess the bot threw away.
    pub fn answered(&mut self, text: &str) {
        let turns = turns_named(text);
        let Some(session) = turns.first().map(|t| session_of(t).to_owned()) else {
            return;
        };
        if let Some(previous) = self.latest.get(&session)
            && previous.len() < turns.len()
            && previous.iter().all(|t| turns.contains(t))
        {
            for turn in previous {
                if let Some(n) = self.answers.get_mut(turn) {
                    *n = n.saturating_sub(1);
                }
            }
            self.guesses += 1;
        }
        for turn in &turns {
            let n = self.answers.entry(turn.clone()).or_default();
            *n += 1;
            if *n == 2 && self.twice_examples.len() < MAX_EXAMPLES {
                self.twice_examples.push(text.to_owned());
            }
        }
        self.latest.insert(session, turns);
    }

    /// As [`Ledger::answered`], for a request of `shape` (its messages' roles) that came `at`:
    /// an example of a text answered twice tells both requests' shapes and the time between
    /// them, which says what asked again (a guess thrown away for a changed context, a retry).
    pub fn answered_as(&mut self, text: &str, shape: &str, at: std::time::Instant) {
        let examples = self.twice_examples.len();
        self.answered(text);
        let turns = turns_named(text);
        if self.twice_examples.len() > examples
            && let Some((first_text, first_shape, when)) =
                turns.iter().find_map(|t| self.first_asked.get(t))
            && let Some(example) = self.twice_examples.last_mut()
        {
            *example = format!(
                "first \"{first_text}\" [{first_shape}], then \"{text}\" [{shape}] {} ms later",
                at.saturating_duration_since(*when).as_millis()
            );
        }
        for turn in turns {
            self.first_asked
                .entry(turn)
                .or_insert_with(|| (text.to_owned(), shape.to_owned(), at));
        }
    }

    /// A fault struck the turn a text names last (nothing when it names none).
    pub fn struck(&mut self, text: &str) {
        if let Some(turn) = turns_named(text).pop() {
            self.struck.insert(turn);
        }
    }

    /// The LLM was asked to go on after a tool result or an async tool's message.
    pub fn followed_up(&mut self) {
        self.follow_ups += 1;
    }

    /// The model was asked to call the tool.
    pub fn tool_called(&mut self) {
        self.tool_calls += 1;
    }

    /// The tool answered call `call_id`.
    pub fn tool_finished(&mut self, call_id: &str) {
        self.tools_finished.insert(call_id.to_owned());
    }

    /// Notes every final async-tool result among a request's messages.
    pub fn delivered(&mut self, messages: &[Value]) {
        for message in messages {
            let Some(content) = message["content"].as_str() else {
                continue;
            };
            let Ok(payload) = serde_json::from_str::<Value>(content) else {
                continue;
            };
            if payload["type"] == "async_tool"
                && payload["status"] == "finished"
                && let Some(id) = payload["tool_call_id"].as_str()
            {
                self.tools_delivered.insert(id.to_owned());
            }
        }
    }

    /// The ledger, summed.
    pub fn counts(&self) -> LedgerCounts {
        let once = self.answers.values().filter(|n| **n == 1).count();
        let lost = self.answers.values().filter(|n| **n == 0).count();
        LedgerCounts {
            finals: self.answers.len(),
            answered_once: once,
            lost,
            answered_twice: self.answers.len() - once - lost,
            guesses_thrown_away: self.guesses,
            follow_ups: self.follow_ups,
            tool_calls: self.tool_calls,
            tools_finished: self.tools_finished.len(),
            tools_delivered: self.tools_delivered.len(),
            tools_dropped: self
                .tools_finished
                .difference(&self.tools_delivered)
                .count(),
            twice_examples: self.twice_examples.clone(),
            struck_turns: self.struck.iter().cloned().collect(),
        }
    }
}

/// `session S` of `session S question Q`.
fn session_of(turn: &str) -> &str {
    turn.split(" question ").next().unwrap_or(turn)
}

/// The turns (`session S question Q`, each final a sentence of its own) a text names.
pub fn turns_named(text: &str) -> Vec<String> {
    let words: Vec<&str> = text
        .split_whitespace()
        .map(|w| w.trim_end_matches(['.', ',', '?', '!', ':']))
        .collect();
    words
        .windows(4)
        .filter(|w| w[0] == "session" && w[2] == "question")
        .map(|w| format!("session {} question {}", w[1], w[3]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_final_is_lost_answered_once_or_twice_and_merged_finals_each_count() {
        let mut ledger = Ledger::default();
        for turn in [
            "session 1 question 0",
            "session 1 question 1",
            "session 2 question 0",
        ] {
            ledger.final_written(turn);
        }
        ledger.answered("session 1 question 0. session 1 question 1.");
        ledger.answered("session 1 question 1");
        let counts = ledger.counts();
        assert_eq!(
            (
                counts.finals,
                counts.answered_once,
                counts.lost,
                counts.answered_twice
            ),
            (3, 1, 1, 1)
        );
    }

    #[test]
    fn a_guess_at_fewer_words_the_session_then_asks_about_whole_is_not_an_answer() {
        let mut ledger = Ledger::default();
        for turn in ["session 1 question 0", "session 1 question 1"] {
            ledger.final_written(turn);
        }
        // "Hello there." guessed at the pause, then the whole turn.
        ledger.answered("session 1 question 0.");
        ledger.answered("session 1 question 0. session 1 question 1.");
        let counts = ledger.counts();
        assert_eq!(
            (
                counts.answered_once,
                counts.answered_twice,
                counts.guesses_thrown_away
            ),
            (2, 0, 1)
        );
        // The same words asked again are answered twice: nothing said they were a guess.
        ledger.answered("session 1 question 0. session 1 question 1.");
        let counts = ledger.counts();
        assert_eq!((counts.answered_once, counts.answered_twice), (0, 2));
    }

    #[test]
    fn a_turn_answered_twice_is_shown_with_both_requests_and_the_time_between() {
        let mut ledger = Ledger::default();
        let t0 = std::time::Instant::now();
        let whole = "session 1 question 0. session 1 question 1. session 1 question 2";
        ledger.answered_as(whole, "system user", t0);
        let later = t0 + std::time::Duration::from_millis(3261);
        ledger.answered_as(
            "session 1 question 0. session 1 question 1",
            "system user",
            later,
        );
        let counts = ledger.counts();
        assert_eq!(counts.answered_twice, 2);
        let example = counts.twice_examples.last().expect("an example");
        assert!(
            example.starts_with(&format!("first \"{whole}\" [system user]")),
            "{example}"
        );
        assert!(
            example.ends_with("[system user] 3261 ms later"),
            "{example}"
        );
    }

    #[test]
    fn a_tool_result_counts_as_delivered_only_as_a_final_async_tool_message() {
        let mut ledger = Ledger::default();
        ledger.tool_finished("call_1");
        ledger.tool_finished("call_2");
        let running = json!({"type": "async_tool", "status": "running", "tool_call_id": "call_2"});
        let finished =
            json!({"type": "async_tool", "status": "finished", "tool_call_id": "call_1"});
        ledger.delivered(&[
            json!({"role": "tool", "content": running.to_string()}),
            json!({"role": "developer", "content": finished.to_string()}),
            json!({"role": "user", "content": "not json"}),
        ]);
        let counts = ledger.counts();
        assert_eq!((counts.tools_delivered, counts.tools_dropped), (1, 1));
    }

    #[test]
    fn a_struck_text_names_its_last_turn_once() {
        let mut ledger = Ledger::default();
        ledger.struck("session s1 question 0. session s1 question 1.");
        ledger.struck("session s1 question 1: sure, it is noon.");
        ledger.struck("no turn here");
        assert_eq!(ledger.counts().struck_turns, ["session s1 question 1"]);
    }

    #[test]
    fn faults_strike_at_about_their_rate_and_never_at_zero() {
        let state = FaultState::new(Faults {
            rate: 0.1,
            ..Faults::NONE
        });
        let struck = (0..10_000)
            .filter(|_| state.strike(Fault::RequestRefused))
            .count();
        assert!((800..1_200).contains(&struck), "{struck}");
        assert_eq!(state.counts().requests_refused, struck);
        let none = FaultState::new(Faults::NONE);
        assert!(!(0..1_000).any(|_| none.strike(Fault::SocketDropped)));
    }
}
