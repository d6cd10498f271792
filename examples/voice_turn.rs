//! The default bot answering a recorded question, through the library API: the same thing
//! `voxide run` does, in a few lines of your own code.
//!
//! Run with `cargo run --release --example voice_turn -- [QUESTION.wav] [ANSWER.wav]`
//! (defaults: the shipped `assets/test/hello_16k.wav` and `voice_turn_answer.wav`). Needs the
//! models: `scripts/setup.sh` fetches them.

use std::time::Duration;

use anyhow::Result;

use voxide::bot::run::{RunOptions, run};
use voxide::bot::{self, BotOptions};

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let input = args.next().unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav").into()
    });
    let output = args
        .next()
        .unwrap_or_else(|| "voice_turn_answer.wav".into());

    let options = BotOptions::default();
    let preload = options.clone();
    tokio::task::spawn_blocking(move || bot::preload(&preload)).await??;
    let summary = run(RunOptions {
        input: input.into(),
        output: output.clone().into(),
        events: None,
        fast: false,
        max_tail: Duration::from_secs(20),
        settle: Duration::from_secs(2),
        bot: options,
    })
    .await?;
    println!("heard:  {}", summary.transcripts.join(" | "));
    println!("said:   {}", summary.bot_text.join(" "));
    for ms in &summary.voice_to_voice_ms {
        println!("voice-to-voice: {ms:.0} ms");
    }
    println!("answer: {output}");
    Ok(())
}
