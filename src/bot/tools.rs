//! The built-in tools: `get_current_time`, `calculate` and the asynchronous `set_timer`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::calculator::{evaluate, format_number};
use crate::config::Builtin;
use crate::services::llm::cancel_tool_schema;
use crate::services::llm::local::{ToolExample, ToolSet};
use crate::services::llm::{FunctionOptions, FunctionRegistry, ResultProperties};

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
    ToolSet::new(&schemas).with_examples(&local_examples())
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
fn civil_from_days(days: i64) -> (i64, u32, u32) {
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
    fn calculate_answers_or_says_why_not() {
        assert_eq!(calculate("12*7")["result"], "84");
        assert_eq!(
            calculate("1/0")["error"],
            "the result is not a finite number"
        );
    }
}
