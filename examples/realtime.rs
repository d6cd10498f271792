//! A recorded question answered by a realtime (speech-to-speech) provider, with the default bot's
//! tools: OpenAI Realtime, or Gemini Live with `--gemini`.
//!
//! Run with `OPENAI_API_KEY=... cargo run --example realtime -- [--gemini] [QUESTION.wav]
//! [ANSWER.wav]` (Gemini: `GEMINI_API_KEY`). `OPENAI_REALTIME_URL` / `GEMINI_LIVE_URL` point it
//! at a compatible server. Without a key it says what it needs and exits.

use std::time::Duration;

use anyhow::Result;

use voxide::bot::run::{RunOptions, run};
use voxide::bot::{BotOptions, LlmChoice};
use voxide::services::llm::gemini_live::GeminiLiveSettings;
use voxide::services::llm::openai_realtime::OpenAiRealtimeSettings;

#[tokio::main]
async fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let gemini = args.iter().any(|a| a == "--gemini");
    args.retain(|a| a != "--gemini");
    let mut args = args.into_iter();
    let input = args.next().unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav").into()
    });
    let output = args.next().unwrap_or_else(|| "realtime_answer.wav".into());

    let settings = if gemini {
        GeminiLiveSettings::from_env().map(LlmChoice::GeminiLive)
    } else {
        OpenAiRealtimeSettings::from_env().map(LlmChoice::OpenAiRealtime)
    };
    let llm = match settings {
        Ok(llm) => llm,
        Err(e) => {
            eprintln!("{e}.");
            eprintln!(
                "This example talks to a real provider. Set the key (and optionally the URL) and \
                 run it again; the offline bot needs none: `cargo run --example voice_turn`."
            );
            return Ok(());
        }
    };
    let summary = run(RunOptions {
        input: input.into(),
        output: output.clone().into(),
        events: None,
        fast: false,
        max_tail: Duration::from_secs(20),
        settle: Duration::from_secs(2),
        bot: BotOptions {
            llm,
            ..BotOptions::default()
        },
    })
    .await?;
    println!("heard:  {}", summary.transcripts.join(" | "));
    println!("said:   {}", summary.bot_text.join(" "));
    println!("answer: {output}");
    Ok(())
}
