//! The whole bot on a recording, in real time as a caller speaks (a fast run can end before the
//! VAD heard the question): what it said, its events and its audio.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use voxide::audio::wav;
use voxide::bot::BotOptions;
use voxide::bot::run::{RunOptions, RunSummary, run};

/// A scratch folder for one test binary's files.
pub fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("voxide-bot-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// What a run left.
pub struct Ran {
    pub summary: RunSummary,
    pub events: Vec<Value>,
    /// The bot's audio, mono.
    pub audio: Vec<i16>,
}

/// Runs `bot` on `input`; its files are named after `name`.
pub async fn run_bot(bot: BotOptions, input: &Path, name: &str) -> Ran {
    let dir = scratch();
    let (log, answer) = (
        dir.join(format!("{name}_events.jsonl")),
        dir.join(format!("{name}_answer.wav")),
    );
    let summary = run(RunOptions {
        input: input.to_path_buf(),
        output: answer.clone(),
        events: Some(log.clone()),
        fast: false,
        max_tail: Duration::from_secs(30),
        settle: Duration::from_secs(2),
        bot,
    })
    .await
    .expect("the run");
    let events = std::fs::read_to_string(&log)
        .expect("the event log")
        .lines()
        .map(|line| serde_json::from_str(line).expect("an event"))
        .collect();
    let audio = wav::read(&answer).expect("the answer").to_mono();
    Ran {
        summary,
        events,
        audio,
    }
}

/// The first event of `kind`.
pub fn event<'a>(events: &'a [Value], kind: &str) -> Option<&'a Value> {
    events.iter().find(|e| e["type"] == kind)
}
