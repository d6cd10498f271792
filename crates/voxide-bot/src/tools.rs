//! The built-in tools: `get_current_time`, `calculate`, the asynchronous `set_timer`, and
//! the phone tools `end_call` and `transfer_call` (with [`super::call_control::CallControl`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::calculator::{evaluate, format_number, read_arithmetic, read_number, say_expression};
use crate::config::Builtin;
use crate::services::llm::cancel_tool_schema;
use crate::services::llm::local::{Outcome, ToolExample, ToolSet, ToolWords};
use crate::services::llm::{FunctionOptions, FunctionRegistry, ResultProperties};
use crate::services::stt::{Reader, Reading};

/// The longest timer one can set: a day.
pub const MAX_TIMER_SECS: u64 = 86_400;

/// Arguments of `get_current_time` (none).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct TimeArgs {}

/// Arguments of `calculate`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CalculateArgs {
    /// The arithmetic to work out, e.g. `12 * 7` or `twenty five plus seventeen`.
    pub expression: String,
}

/// Arguments of `set_timer`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct TimerArgs {
    /// Seconds until the timer rings.
    pub seconds: u64,
    /// What the timer is for.
    pub label: Option<String>,
}

/// Requests for the built-in tools `keep` names, as users say them: what the embedded Whisper
/// expects by default (`BotOptions::stt_prompt`). Whisper leans hardest on what it read last.
pub fn requests(keep: &[Builtin]) -> Vec<&'static str> {
    const REQUESTS: [(Builtin, &str); 3] = [
        (
            Builtin::Timer,
            "Set a timer for 5 minutes. Cancel the timer.",
        ),
        (Builtin::Clock, "What is the time?"),
        (Builtin::Calculator, "What is 12 plus 30? Multiply 3 by 4."),
    ];
    REQUESTS
        .iter()
        .filter(|(tool, _)| keep.contains(tool))
        .map(|&(_, words)| words)
        .collect()
}

/// Registers the built-in tools `keep` names.
pub fn register(registry: &mut FunctionRegistry, keep: &[Builtin]) {
    if keep.contains(&Builtin::Clock) {
        register_clock(registry);
    }
    if keep.contains(&Builtin::Calculator) {
        register_calculator(registry);
    }
    if keep.contains(&Builtin::Timer) {
        register_timer(registry);
    }
    if keep.contains(&Builtin::EndCall) {
        register_end_call(registry);
    }
    if keep.contains(&Builtin::SendDtmf) {
        register_send_dtmf(registry);
    }
}

/// The most keys one `send_dtmf` presses.
pub const MAX_KEYS: usize = 32;

/// Arguments of `send_dtmf`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendDtmfArgs {
    /// The keys to press, in order: digits, `*` and `#` (e.g. `2` or `1234#`).
    pub keys: String,
}

fn register_send_dtmf(registry: &mut FunctionRegistry) {
    registry.register_direct_function(
        super::call_control::SEND_DTMF,
        "Presses keys on the phone's keypad, to choose in a phone menu or enter a number. The \
         keys are sent once your reply has been spoken.",
        |args: SendDtmfArgs, params| async move {
            let keys: String = args.keys.chars().filter(|c| !c.is_whitespace()).collect();
            let bad = keys.is_empty()
                || keys.chars().count() > MAX_KEYS
                || !keys.chars().all(crate::transports::dtmf::is_key);
            // Sent behind the answer (`CallControl`); the model speaks again when the menu does.
            let (result, run_llm) = if bad {
                let error = format!("keys: 1 to {MAX_KEYS} of 0-9, * and #");
                (json!({"error": error}), true)
            } else {
                (json!({"status": format!("pressing {keys}")}), false)
            };
            params.result_callback.deliver(
                result,
                ResultProperties {
                    run_llm: Some(run_llm),
                    ..ResultProperties::final_result()
                },
            );
        },
        FunctionOptions::default(),
    );
}

/// Registers `transfer_call` to `destinations` (name, address), when there are any.
pub fn register_transfer(registry: &mut FunctionRegistry, destinations: &[(String, String)]) {
    if destinations.is_empty() {
        return;
    }
    let names: Vec<&str> = destinations.iter().map(|(name, _)| name.as_str()).collect();
    let parameters = json!({
        "type": "object",
        "properties": {"destination": {"type": "string", "enum": names,
            "description": "Who takes the call."}},
        "required": ["destination"],
    });
    let Ok(schema) = crate::context::FunctionSchema::from_parameters(
        super::call_control::TRANSFER_CALL,
        "Hands the phone call to another person or department, who takes it from there. Say \
         whom you put the caller through to in the same reply, before calling it.",
        &parameters,
    ) else {
        return;
    };
    let known: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    registry.register_with_schema(
        schema,
        move |params| {
            let known = known.clone();
            async move {
                let asked = params.arguments["destination"].as_str().unwrap_or_default();
                // The transfer itself follows the answer (`CallControl`); nothing is said after.
                let result = if known.iter().any(|n| n == asked) {
                    json!({"status": format!("transferring the call to {asked}")})
                } else {
                    json!({"error": format!("no destination {asked:?}: one of {known:?}")})
                };
                let run_llm = result.get("error").is_some();
                params.result_callback.deliver(
                    result,
                    ResultProperties {
                        run_llm: Some(run_llm),
                        ..ResultProperties::final_result()
                    },
                );
            }
        },
        FunctionOptions::default(),
    );
}

/// Arguments of `end_call` (none).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct EndCallArgs {}

fn register_end_call(registry: &mut FunctionRegistry) {
    registry.register_direct_function(
        super::call_control::END_CALL,
        "Ends the call (hangs up). Use it when the caller is done or asks to hang up, and say \
         your goodbye in the same reply, before calling it.",
        |_: EndCallArgs, params| async move {
            // No answer after it: the goodbye was said, and the call ends behind it.
            params.result_callback.deliver(
                json!({"status": "the call ends after your goodbye"}),
                ResultProperties {
                    run_llm: Some(false),
                    ..ResultProperties::final_result()
                },
            );
        },
        FunctionOptions::default(),
    );
}

fn register_clock(registry: &mut FunctionRegistry) {
    registry.register_direct_function(
        "get_current_time",
        "Tells the current date and time.",
        |_: TimeArgs, params| async move {
            params.result_callback.done(current_time(SystemTime::now()));
        },
        FunctionOptions::default(),
    );
}

fn register_calculator(registry: &mut FunctionRegistry) {
    registry.register_direct_function(
        "calculate",
        "Works out arithmetic, such as 12*7 or 15% of 80.",
        |args: CalculateArgs, params| async move {
            params.result_callback.done(calculate(&args.expression));
        },
        FunctionOptions::default(),
    );
}

fn register_timer(registry: &mut FunctionRegistry) {
    registry.register_direct_function(
        "set_timer",
        "Starts a timer that rings after the given number of seconds.",
        |args: TimerArgs, params| async move {
            let label = args.label.unwrap_or_else(|| "timer".to_owned());
            if !(1..=MAX_TIMER_SECS).contains(&args.seconds) {
                params.result_callback.done(json!({
                    "error": format!("a timer runs from 1 to {MAX_TIMER_SECS} seconds"),
                }));
                return;
            }
            run_timer(args.seconds, &label, &params.result_callback).await;
        },
        FunctionOptions {
            // Generous: the call lives as long as the timer does.
            timeout: Some(Duration::from_secs(MAX_TIMER_SECS + 60)),
            cancellable_by_llm: true,
            ..FunctionOptions::asynchronous()
        },
    );
}

/// The built-in tools as the embedded LLM sees them (with `cancel_set_timer`).
pub fn tool_set() -> ToolSet {
    let mut registry = FunctionRegistry::default();
    register(&mut registry, &Builtin::ALL);
    let mut schemas = registry.direct_schemas().to_vec();
    schemas.push(cancel_tool_schema("set_timer"));
    ToolSet::new(&schemas)
        .with_examples(&local_examples())
        .with_words(&local_words())
}

/// How the embedded model handles the built-in tools by rule: the calculator reads the
/// arithmetic in the words and the timer a spoken duration (a question with neither does not
/// call them), and every result is said from a template, so the numbers spoken are the tool's.
pub fn local_words() -> Vec<ToolWords> {
    let rule = |name: &str, read, say| ToolWords {
        name: name.to_owned(),
        read,
        say,
    };
    vec![
        rule("get_current_time", read_clock_question, say_time),
        rule(
            "calculate",
            |words| read_arithmetic(words).map(|expression| json!({"expression": expression})),
            say_calculation,
        ),
        rule("set_timer", read_timer, say_timer),
        rule("cancel_set_timer", read_timer_cancel, say_timer_cancel),
    ]
}

/// The clock's (empty) arguments when the words ask for the time or the date.
fn read_clock_question(sentence: &str) -> Option<Value> {
    const ASKS: [&str; 15] = [
        "what time",
        "the time",
        "time is it",
        "time now",
        "the clock",
        "the date",
        "what date",
        "today's date",
        "what day",
        "which day",
        "day of the week",
        "day is it",
        "day today",
        "year is it",
        "month is it",
    ];
    let text = format!(" {} ", plain_words(sentence).join(" "));
    ASKS.iter()
        .any(|p| text.contains(&format!(" {p} ")))
        .then(|| json!({}))
}

/// `cancel_set_timer`'s (empty) arguments when the words stop a timer. Whisper hears a
/// synthetic "cancel" as "console" or "Kensal": a word that sounds like it ([`sound_key`])
/// counts.
fn read_timer_cancel(sentence: &str) -> Option<Value> {
    let words = plain_words(sentence);
    let has = |list: &[&str]| words.iter().any(|w| list.contains(&w.as_str()));
    let cancel = sound_key("cancel");
    let stop = has(&["stop", "forget", "mind", "remove", "delete", "off", "kill"])
        || words.iter().any(|w| sound_key(w) == cancel);
    (stop && has(&TIMER_WORDS)).then(|| json!({}))
}

/// Words that name a timer.
const TIMER_WORDS: [&str; 5] = ["timer", "timers", "alarm", "reminder", "countdown"];

/// How a word sounds, roughly (American Soundex, with "c" and "k" alike at the start): its
/// first letter and the classes of the next three consonant sounds. "cancel", "console" and
/// "Kensal" share `c524`.
fn sound_key(word: &str) -> String {
    fn class(c: char) -> Option<char> {
        Some(match c {
            'b' | 'f' | 'p' | 'v' => '1',
            'c' | 'g' | 'j' | 'k' | 'q' | 's' | 'x' | 'z' => '2',
            'd' | 't' => '3',
            'l' => '4',
            'm' | 'n' => '5',
            'r' => '6',
            _ => return None,
        })
    }
    let mut letters = word
        .chars()
        .filter(char::is_ascii_alphabetic)
        .map(|c| c.to_ascii_lowercase());
    let Some(first) = letters.next() else {
        return String::new();
    };
    let mut key = String::from(if first == 'k' { 'c' } else { first });
    let mut last = class(first);
    for c in letters {
        let code = class(c);
        if let Some(digit) = code
            && code != last
        {
            key.push(digit);
            if key.len() == 4 {
                break;
            }
        }
        // "h" and "w" do not part two letters of one class; vowels do.
        if !matches!(c, 'h' | 'w') {
            last = code;
        }
    }
    while key.len() < 4 {
        key.push('0');
    }
    key
}

/// How the built-in tools `keep` names read a transcript, for the embedded Whisper's second
/// listen ([`Reading`]): a request one of their rules reads, the words of a request none can
/// ("Console my timer": a timer's word, and no rule reads it), or talk.
pub fn reader(keep: &[Builtin]) -> Reader {
    let keep = keep.to_vec();
    Arc::new(move |text| read_request(&keep, text))
}

fn read_request(keep: &[Builtin], text: &str) -> Reading {
    const CLOCK: &[&str] = &["time", "clock", "date", "day", "year", "month"];
    const CALCULATOR: &[&str] = &[
        "plus",
        "minus",
        "times",
        "divided",
        "multiply",
        "multiplied",
        "divide",
        "add",
        "subtract",
        "percent",
        "calculate",
        "root",
        "squared",
        "sum",
        "product",
    ];
    const TIMER: &[&str] = &[
        "timer",
        "timers",
        "alarm",
        "remind",
        "reminder",
        "countdown",
    ];
    let words = plain_words(text);
    let mut garbled = false;
    for tool in keep {
        let (reads, cues) = match tool {
            Builtin::Clock => (read_clock_question(text).is_some(), CLOCK),
            // A percentage of nothing ("Calculate 15% or maybe") lost its other number.
            Builtin::Calculator => (
                read_arithmetic(text).is_some_and(|sum| !sum.ends_with('%')),
                CALCULATOR,
            ),
            Builtin::Timer => (
                read_timer(text).is_some() || read_timer_cancel(text).is_some(),
                TIMER,
            ),
            // Hanging up and pressing keys are the model's judgement, not requests the words
            // spell out.
            Builtin::EndCall | Builtin::SendDtmf => (false, &[][..]),
        };
        if reads {
            return Reading::Request;
        }
        garbled |= words.iter().any(|w| cues.contains(&w.as_str()))
            || (*tool == Builtin::Calculator && text.contains('%'));
    }
    if garbled {
        Reading::Garbled
    } else {
        Reading::Talk
    }
}

/// Lower-case words, punctuation dropped (apostrophes kept).
fn plain_words(sentence: &str) -> Vec<String> {
    sentence
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

fn result_json(outcome: Outcome<'_>) -> Option<Value> {
    match outcome {
        Outcome::Result(text) => serde_json::from_str(text).ok(),
        _ => None,
    }
}

fn say_time(_: &Value, outcome: Outcome<'_>) -> Option<String> {
    let result = result_json(outcome)?;
    Some(format!(
        "It is {} {} on {}.",
        result["time"].as_str()?,
        result["timezone"].as_str()?,
        result["date"].as_str()?
    ))
}

fn say_calculation(_: &Value, outcome: Outcome<'_>) -> Option<String> {
    let result = result_json(outcome)?;
    let expression = say_expression(result["expression"].as_str()?);
    Some(
        match (result["result"].as_str(), result["error"].as_str()) {
            (Some(value), _) => format!("{} is {value}.", capitalized(&expression)),
            (None, Some(error)) => format!("I could not work out {expression}: {error}."),
            (None, None) => return None,
        },
    )
}

fn say_timer(arguments: &Value, outcome: Outcome<'_>) -> Option<String> {
    let length = say_duration(arguments["seconds"].as_u64()?);
    let label = arguments["label"].as_str().filter(|l| !l.is_empty());
    Some(match outcome {
        Outcome::Started => match label {
            Some(label) => format!("Timer set for {length}, for {label}."),
            None => format!("Timer set for {length}."),
        },
        Outcome::Update(_) => return None,
        Outcome::Cancelled => format!("The timer for {length} is cancelled."),
        Outcome::Result(_) => {
            let result = result_json(outcome)?;
            if let Some(error) = result["error"].as_str() {
                format!("I could not set that timer: {error}.")
            } else {
                match label {
                    Some(label) => format!("Your timer for {length} is done: {label}."),
                    None => format!("Your timer for {length} is done."),
                }
            }
        }
    })
}

/// The cancelled timer's own outcome says which timer stopped, so a cancel that worked adds
/// nothing to it.
fn say_timer_cancel(_: &Value, outcome: Outcome<'_>) -> Option<String> {
    let Outcome::Result(result) = outcome else {
        return None;
    };
    // The result comes as a JSON string, or as plain text.
    let text = serde_json::from_str::<String>(result).unwrap_or_else(|_| result.to_owned());
    if text.starts_with("Cancelled") {
        Some(String::new())
    } else if text.starts_with("No ") {
        Some("No timer is running.".into())
    } else {
        None
    }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// Seconds as a voice says them: "2 minutes", "1 hour and 30 minutes", "45 seconds".
fn say_duration(seconds: u64) -> String {
    let parts: Vec<String> = [
        (seconds / 3600, "hour"),
        (seconds / 60 % 60, "minute"),
        (seconds % 60, "second"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, unit)| format!("{n} {unit}{}", if n == 1 { "" } else { "s" }))
    .collect();
    match parts.as_slice() {
        [] => "0 seconds".into(),
        [.., last] if parts.len() > 1 => {
            format!("{} and {last}", parts[..parts.len() - 1].join(", "))
        }
        _ => parts.join(""),
    }
}

/// `set_timer`'s arguments from the words: the duration they name, and what the timer is for
/// ("remind me to call my sister in an hour", "a timer for the eggs").
fn read_timer(sentence: &str) -> Option<Value> {
    const ASKS: [&str; 12] = [
        "timer",
        "alarm",
        "remind",
        "reminder",
        "wake",
        "ping",
        "countdown",
        "alert",
        "notify",
        "time",
        "buzz",
        "ring",
    ];
    let asks = plain_words(sentence)
        .iter()
        .any(|w| ASKS.contains(&w.as_str()))
        || sentence.to_lowercase().contains("let me know");
    if !asks {
        return None;
    }
    let seconds = read_duration(sentence)?;
    let lower = sentence.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .collect();
    let label = read_label(&words);
    Some(match label {
        Some(label) => json!({"seconds": seconds, "label": label}),
        None => json!({"seconds": seconds}),
    })
}

/// What a timer is for: the words after "remind me to" or "for the" that name no duration.
fn read_label(words: &[&str]) -> Option<String> {
    let stops = ["in", "after", "for", "at", "please"];
    let start = words
        .windows(3)
        .position(|w| w == ["remind", "me", "to"])
        .map(|i| i + 3)
        .or_else(|| {
            words
                .windows(2)
                .position(|w| w[0] == "for" && matches!(w[1], "the" | "my"))
                .map(|i| i + 1)
        })?;
    let label: Vec<&str> = words[start..]
        .iter()
        .copied()
        .take_while(|w| !stops.contains(w))
        .collect();
    let text = label.join(" ");
    (!label.is_empty() && read_duration(&text).is_none()).then_some(text)
}

/// The seconds a spoken duration adds up to ("ten minutes", "an hour and a half", "90
/// seconds", "one minute and thirty seconds"); `None` when the words name no duration.
pub fn read_duration(sentence: &str) -> Option<u64> {
    let lower = sentence.to_lowercase().replace('-', " ");
    let words: Vec<&str> = lower
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '?' | '!'))
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| !w.is_empty())
        .collect();
    let mut total = 0.0;
    let mut free = 0; // words before this index belong to an earlier duration
    for (at, word) in words.iter().enumerate() {
        let Some(unit) = unit_seconds(word) else {
            continue;
        };
        let before = &words[free..at];
        let count = match before {
            [.., "half", "a" | "an"] => Some(0.5),
            [.., "a" | "an"] => Some(1.0),
            _ => (0..before.len()).find_map(|s| read_number(&before[s..].join(" "))),
        };
        let Some(count) = count else {
            continue;
        };
        let half = matches!(words.get(at + 1..at + 4), Some(["and", "a", "half"]));
        total += (count + if half { 0.5 } else { 0.0 }) * unit;
        free = at + 1;
    }
    (total >= 1.0 && total <= MAX_TIMER_SECS as f64).then(|| total.round() as u64)
}

fn unit_seconds(word: &str) -> Option<f64> {
    match word {
        "second" | "seconds" | "sec" | "secs" => Some(1.0),
        "minute" | "minutes" | "min" | "mins" => Some(60.0),
        "hour" | "hours" => Some(3600.0),
        _ => None,
    }
}

/// Worked examples that teach the embedded model when to call these tools. They are not the
/// requests of the accuracy suite (`voxide bench tools`).
pub fn local_examples() -> Vec<ToolExample> {
    vec![
        ToolExample::call(
            "Do you know what time it is right now?",
            "get_current_time",
            json!({}),
        ),
        ToolExample::words("Nice to meet you!"),
        ToolExample::call(
            "What is 19 times 3?",
            "calculate",
            json!({"expression": "19*3"}),
        ),
        ToolExample::call(
            "Wake me up in 20 seconds.",
            "set_timer",
            json!({"seconds": 20}),
        ),
        ToolExample::words("Who wrote Hamlet?"),
        ToolExample::call(
            "Divide 100 by 4.",
            "calculate",
            json!({"expression": "100/4"}),
        ),
        ToolExample::call(
            "Set a two minute timer.",
            "set_timer",
            json!({"seconds": 120}),
        ),
        ToolExample::call("Never mind the timer.", "cancel_set_timer", json!({})),
        ToolExample::call(
            "Could you check the clock for me?",
            "get_current_time",
            json!({}),
        ),
        ToolExample::call(
            "Ping me in 15 seconds.",
            "set_timer",
            json!({"seconds": 15}),
        ),
        ToolExample::words("I like rainy days."),
    ]
}

/// Counts down, reporting the time left every few seconds without making the bot speak, then
/// rings with the final result (which does make it speak).
async fn run_timer(seconds: u64, label: &str, callback: &crate::services::llm::ResultCallback) {
    let every = (seconds / 6).max(5);
    let mut left = seconds;
    while left > every {
        tokio::time::sleep(Duration::from_secs(every)).await;
        left -= every;
        callback.deliver(
            json!({"label": label, "seconds_left": left}),
            ResultProperties {
                run_llm: Some(false),
                ..ResultProperties::intermediate()
            },
        );
    }
    tokio::time::sleep(Duration::from_secs(left)).await;
    callback.done(json!({"label": label, "rang": true, "after_seconds": seconds}));
}

/// The result of `calculate`: the value, or why there is none.
pub fn calculate(expression: &str) -> Value {
    match evaluate(expression) {
        Ok(value) => json!({"expression": expression, "result": format_number(value)}),
        Err(e) => json!({"expression": expression, "error": e.to_string()}),
    }
}

/// The result of `get_current_time` for `now` (UTC: the server knows no user's time zone).
pub fn current_time(now: SystemTime) -> Value {
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let (year, month, day) = civil_from_days(days as i64);
    const WEEKDAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let weekday = WEEKDAYS[(days % 7) as usize];
    let month_name = MONTHS[(month - 1) as usize];
    json!({
        "time": format!("{:02}:{:02}", (secs % 86_400) / 3600, (secs % 3600) / 60),
        "date": format!("{weekday}, {day} {month_name} {year}"),
        "timezone": "UTC",
    })
}

/// Year, month (1-12) and day of the proleptic Gregorian calendar for days since 1970-01-01
/// (Howard Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whisper_expects_the_requests_of_the_bots_own_tools_unless_told_otherwise() {
        use crate::BotOptions;
        let default = BotOptions::default().expected_words();
        assert!(default.contains("Cancel the timer."), "{default}");
        assert!(default.contains("What is the time?"), "{default}");
        let desk = BotOptions {
            builtin: vec![Builtin::Clock],
            tool_examples: vec![
                ToolExample::call("Where is my order 1234?", "lookup_order", json!({})),
                ToolExample::words("Hello there."),
            ],
            ..BotOptions::default()
        };
        assert_eq!(
            desk.expected_words(),
            "What is the time? Where is my order 1234?"
        );
        let told = BotOptions {
            stt_prompt: Some(String::new()),
            ..BotOptions::default()
        };
        assert_eq!(told.expected_words(), "");
    }

    #[test]
    fn time_is_told_in_words_a_voice_can_say() {
        // 2026-11-21 18:55:47 UTC.
        let now = UNIX_EPOCH + Duration::from_secs(1_795_287_347);
        assert_eq!(
            current_time(now),
            json!({"time": "18:55", "date": "Saturday, 21 November 2026", "timezone": "UTC"})
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn a_timer_is_cancelled_by_a_word_that_sounds_like_cancel() {
        assert_eq!(sound_key("cancel"), "c524");
        assert_eq!(sound_key("Console"), sound_key("cancel"));
        assert_eq!(sound_key("Kensal"), sound_key("cancel"));
        assert_eq!(sound_key("Ashcraft"), "a261");
        for cancelled in ["Cancel my timer.", "Console the timer.", "Kensal the alarm"] {
            assert_eq!(read_timer_cancel(cancelled), Some(json!({})), "{cancelled}");
        }
        assert_eq!(read_timer_cancel("Count the timer down."), None);
        assert_eq!(read_timer_cancel("Cancel it."), None);
    }

    #[test]
    fn whisper_listens_again_to_the_words_of_a_request_no_rule_can_read() {
        let all = reader(&Builtin::ALL);
        for (heard, reading) in [
            ("Cancel the timer.", Reading::Request),
            ("What year is it?", Reading::Request),
            ("How much is 100 minus 30 7?", Reading::Request),
            ("What year in it?", Reading::Garbled),
            ("Remind the 90s.", Reading::Garbled),
            ("How much is 4 B minus 18?", Reading::Garbled),
            // A percentage whose other number was lost.
            ("Calculate 15% or maybe.", Reading::Garbled),
            ("Hello, how are you?", Reading::Talk),
            ("My name is Anna.", Reading::Talk),
        ] {
            assert_eq!(all(heard), reading, "{heard}");
        }
        // Only the bot's own tools count.
        let clock = reader(&[Builtin::Clock]);
        assert_eq!(clock("How much is 4 B minus 18?"), Reading::Talk);
        assert_eq!(clock("What year in it?"), Reading::Garbled);
    }

    #[test]
    fn a_timer_reads_its_duration_and_purpose_from_the_words() {
        let read = |s: &str| read_timer(s);
        assert_eq!(
            read("Set a timer for ten minutes."),
            Some(json!({"seconds": 600}))
        );
        assert_eq!(
            read("Start a 30-second timer for the eggs."),
            Some(json!({"seconds": 30, "label": "the eggs"}))
        );
        assert_eq!(
            read("Remind me to call my sister in an hour."),
            Some(json!({"seconds": 3600, "label": "call my sister"}))
        );
        assert_eq!(
            read("Wake me in one minute and thirty seconds"),
            Some(json!({"seconds": 90}))
        );
        assert_eq!(
            read("Ring in half an hour."),
            Some(json!({"seconds": 1800}))
        );
        assert_eq!(
            read("An alarm in a minute and a half, please."),
            Some(json!({"seconds": 90}))
        );
        assert_eq!(read("I need five minutes to think."), None);
        assert_eq!(read("Is it going to be a busy afternoon for you?"), None);
        assert_eq!(read("Set a timer."), None);
        assert_eq!(read("Set a timer for 3 days."), None);
    }

    #[test]
    fn results_are_said_from_the_tools_values() {
        let words = local_words();
        let say = |name: &str, arguments: Value, outcome| {
            let rule = words.iter().find(|w| w.name == name).expect("a rule");
            (rule.say)(&arguments, outcome)
        };
        let sum = calculate("17 * 23").to_string();
        assert_eq!(
            say("calculate", json!({}), Outcome::Result(&sum)).as_deref(),
            Some("17 times 23 is 391.")
        );
        let time = current_time(UNIX_EPOCH + Duration::from_secs(1_795_287_347)).to_string();
        assert_eq!(
            say("get_current_time", json!({}), Outcome::Result(&time)).as_deref(),
            Some("It is 18:55 UTC on Saturday, 21 November 2026.")
        );
        let timer = json!({"seconds": 90, "label": "the eggs"});
        assert_eq!(
            say("set_timer", timer.clone(), Outcome::Started).as_deref(),
            Some("Timer set for 1 minute and 30 seconds, for the eggs.")
        );
        let rang = json!({"label": "the eggs", "rang": true, "after_seconds": 90}).to_string();
        assert_eq!(
            say("set_timer", timer.clone(), Outcome::Result(&rang)).as_deref(),
            Some("Your timer for 1 minute and 30 seconds is done: the eggs.")
        );
        assert_eq!(say("set_timer", timer, Outcome::Update("{}")), None);
        assert_eq!(
            say(
                "cancel_set_timer",
                json!({}),
                Outcome::Result("No set_timer call is running; nothing was cancelled.")
            )
            .as_deref(),
            Some("No timer is running.")
        );
        // As the tool batch hands it over, a JSON string: the cancelled timer's own outcome
        // says it stopped.
        let cancelled = json!("Cancelled the set_timer call call_1; it is no longer running.");
        assert_eq!(
            say(
                "cancel_set_timer",
                json!({}),
                Outcome::Result(&cancelled.to_string())
            )
            .as_deref(),
            Some("")
        );
    }

    #[test]
    fn calculate_answers_or_says_why_not() {
        assert_eq!(calculate("12*7")["result"], "84");
        assert_eq!(
            calculate("1/0")["error"],
            "the result is not a finite number"
        );
    }
}
