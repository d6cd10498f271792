//! Voice-to-voice latency over a whole conversation: a Piper-voiced user asks one question after
//! another, with room for each answer, through `voxide run` at real-time pace.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::audio::resample::StreamResampler;
use crate::audio::wav::{self, Wav};
use crate::bot::BotOptions;
use crate::bot::run::{RunError, RunOptions, RunSummary, run};
use crate::services::tts::{PiperVoice, Synthesizer};

/// What the user says, one turn each.
pub const QUESTIONS: &[&str] = &[
    "Hello, how are you today?",
    "What is the capital of France?",
    "Tell me a fun fact about cats.",
    "What is twelve times seven?",
    "Can you recommend a good book?",
    "How do I make a cup of tea?",
    "What time is it?",
    "What is your favourite season?",
    "Tell me a short joke.",
    "Thank you, goodbye!",
];

/// Rate of the user's recordings.
pub(super) const RATE: u32 = 16_000;

/// `text` in the Piper voice at [`RATE`], with 100 ms of silence after it.
pub(super) fn user_speech(voice: &PiperVoice, text: &str) -> Result<Vec<i16>, ConversationError> {
    let voice_err = |e: &dyn std::fmt::Display| ConversationError::Voice(e.to_string());
    let speech = voice.synthesize(text).map_err(|e| voice_err(&e))?;
    let mut down = StreamResampler::new(speech.sample_rate, RATE).map_err(|e| voice_err(&e))?;
    let mut out = down.process(&speech.samples);
    out.extend(down.process(&vec![0; speech.sample_rate as usize / 10]));
    Ok(out)
}

/// Writes the user's recording into `workdir` as `name`.
pub(super) fn write_input(
    workdir: &std::path::Path,
    name: &str,
    samples: Vec<i16>,
) -> Result<PathBuf, ConversationError> {
    let voice_err = |e: &dyn std::fmt::Display| ConversationError::Voice(e.to_string());
    std::fs::create_dir_all(workdir).map_err(|e| voice_err(&e))?;
    let path = workdir.join(name);
    let wav = Wav {
        samples,
        sample_rate: RATE,
        channels: 1,
    };
    wav::write(&path, &wav).map_err(|e| voice_err(&e))?;
    Ok(path)
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct ConversationReport {
    /// Turns asked.
    pub turns: usize,
    /// Turns answered with a latency measured.
    pub answered: usize,
    /// Median voice-to-voice latency, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// Fastest, ms.
    pub min_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
    /// Every measurement, in order.
    pub voice_to_voice_ms: Vec<f64>,
    /// Median wait from the end of speech to the end of the turn, ms (part of voice-to-voice).
    pub turn_wait_p50_ms: f64,
    /// 90th percentile of that wait, ms.
    pub turn_wait_p90_ms: f64,
    /// The run's summary (transcripts, what the bot said, tool calls).
    pub run: RunSummary,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    /// The user's voice could not be made.
    #[error("cannot voice the questions: {0}")]
    Voice(String),
    /// The run failed.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Voices the questions with `gap` of silence after each and runs the default bot on them.
pub async fn run_conversation(
    turns: usize,
    gap: Duration,
    bot: BotOptions,
    workdir: PathBuf,
) -> Result<ConversationReport, ConversationError> {
    let voice_err = |e: &dyn std::fmt::Display| ConversationError::Voice(e.to_string());
    let questions: Vec<&str> = QUESTIONS.iter().copied().cycle().take(turns).collect();
    let audio = tokio::task::spawn_blocking(move || -> Result<Vec<i16>, ConversationError> {
        let voice = PiperVoice::shared().map_err(|e| voice_err(&e))?;
        let mut out = vec![0i16; RATE as usize];
        for question in questions {
            out.extend(user_speech(&voice, question)?);
            out.extend(vec![0; (gap.as_secs_f64() * f64::from(RATE)) as usize]);
        }
        Ok(out)
    })
    .await
    .map_err(|e| voice_err(&e))??;
    let input = write_input(&workdir, "conversation_user.wav", audio)?;
    let summary = run(RunOptions {
        input,
        output: workdir.join("conversation_bot.wav"),
        events: Some(workdir.join("conversation_events.jsonl")),
        fast: false,
        max_tail: Duration::from_secs(20),
        settle: Duration::from_secs(2),
        bot,
    })
    .await?;
    let v2v = sorted(&summary.voice_to_voice_ms);
    let waits = sorted(&summary.turn_wait_ms);
    Ok(ConversationReport {
        turns,
        answered: v2v.len(),
        p50_ms: quantile(&v2v, 0.5),
        p90_ms: quantile(&v2v, 0.9),
        turn_wait_p50_ms: quantile(&waits, 0.5),
        turn_wait_p90_ms: quantile(&waits, 0.9),
        min_ms: v2v.first().copied().unwrap_or(0.0),
        max_ms: v2v.last().copied().unwrap_or(0.0),
        voice_to_voice_ms: summary.voice_to_voice_ms.clone(),
        run: summary,
    })
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// The `q` quantile of sorted values (nearest rank); 0 when there are none.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(0.0)
}
