//! Your own bot in Rust: the embedded stack with one sync tool and one async tool that reports
//! progress, run on a recording (`cargo run --release -p voxide-bot --example custom_bot -- question.wav`).
//! Its test runs it in CI on the shipped question.

use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use voxide_bot::BotOptions;
use voxide_bot::run::{RunOptions, RunSummary, run};
use voxide_services::llm::local::ToolExample;
use voxide_services::llm::{FunctionOptions, ResultProperties};

#[derive(Deserialize, JsonSchema)]
struct City {
    /// The city, e.g. Paris.
    city: String,
}

#[derive(Deserialize, JsonSchema)]
struct Booking {
    /// How many people.
    people: u32,
}

/// The default bot with the program's own tools instead of the built-in ones.
fn bot() -> BotOptions {
    let mut bot = BotOptions {
        builtin: Vec::new(),
        // Only the small embedded model needs to be shown when to call them.
        tool_examples: vec![
            ToolExample::call(
                "Is it raining in Rome?",
                "get_weather",
                json!({"city": "Rome"}),
            ),
            ToolExample::call(
                "Book us a table for four.",
                "book_table",
                json!({"people": 4}),
            ),
            ToolExample::words("Thanks, that is all."),
        ],
        ..BotOptions::default()
    };
    bot.rust_tools.add(|registry| {
        registry.register_direct_function(
            "get_weather",
            "Tells today's weather in a city.",
            |args: City, params| async move {
                params
                    .result_callback
                    .done(json!({"city": args.city, "sky": "sunny", "celsius": 21}));
            },
            FunctionOptions::default(),
        );
        // An async tool: the talk goes on while it works; its progress goes into the context.
        registry.register_direct_function(
            "book_table",
            "Books a restaurant table; it takes a while.",
            |args: Booking, params| async move {
                for step in ["finding a restaurant", "asking for a table"] {
                    let progress = ResultProperties {
                        run_llm: Some(false),
                        ..ResultProperties::intermediate()
                    };
                    params
                        .result_callback
                        .deliver(json!({"status": step}), progress);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                params
                    .result_callback
                    .done(json!({"booked": true, "people": args.people, "time": "19:30"}));
            },
            FunctionOptions::asynchronous(),
        );
    });
    bot
}

/// One session of the bot on `input`; its answers go to `output`.
async fn talk(input: PathBuf, output: PathBuf) -> anyhow::Result<RunSummary> {
    let bot = bot();
    let preload = bot.clone();
    tokio::task::spawn_blocking(move || voxide_bot::preload(&preload)).await??;
    let options = RunOptions {
        input,
        output,
        events: None,
        fast: false,
        max_tail: Duration::from_secs(30),
        settle: Duration::from_secs(2),
        bot,
    };
    Ok(run(options).await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let input = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "assets/test/hello_16k.wav".into());
    let summary = talk(input.into(), "custom_bot_answer.wav".into()).await?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

#[cfg(test)]
mod whole_bot {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_custom_bot_answers_a_recorded_question() {
        let input = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/test/hello_16k.wav"
        );
        let output = std::env::temp_dir().join(format!("custom_bot_{}.wav", std::process::id()));
        let summary = super::talk(input.into(), output).await.expect("the run");
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(
            summary.voice_to_voice_ms.len(),
            1,
            "one spoken answer: {summary:?}"
        );
    }
}
