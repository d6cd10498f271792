//! Interruption latency: the user talks over the bot, and the bot must go quiet. Measured on the
//! recording itself, for every user utterance that starts while the bot is audible: from the
//! utterance's first sample in the input to the last sample of bot audio emitted before it stops
//! (the output is time-aligned with the input).

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::conversation::{ConversationError, RATE, user_speech, write_input};
use crate::audio::wav::{self, Wav};
use crate::bot::BotOptions;
use crate::bot::run::{RunOptions, RunSummary, run};
use crate::services::tts::PiperVoice;

/// Questions whose answers run long enough to be talked over.
const QUESTIONS: &[&str] = &[
    "Tell me a long story about a dragon.",
    "Describe the city of Paris in detail.",
    "Explain how the moon affects the tides.",
    "Tell me everything about the history of bread.",
];
/// The bench's instruction unless one is given: answers long enough to be talked over.
pub const LONG_ANSWERS: &str = "You are a storyteller. Answer every message with a long, \
detailed story of at least six sentences.";
/// What the user says over the bot.
const BARGE_INS: &[&str] = &[
    "Stop, wait a moment.",
    "Hold on, please.",
    "Sorry, one question.",
];

/// How soon after an utterance starts the session's interruption must come to be its.
const INTERRUPTION_WINDOW: f64 = 1.0;

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct InterruptionsReport {
    /// Rounds played.
    pub rounds: usize,
    /// Utterances that started while the bot was speaking (the others measure nothing).
    pub measured: usize,
    /// Median ms from the user's first sample to the bot's last.
    pub p50_ms: f64,
    /// 99th percentile (the largest, below 100 rounds).
    pub p99_ms: f64,
    /// Every measurement, ms.
    pub latencies_ms: Vec<f64>,
    /// Interruption events the session reported.
    pub interruptions: usize,
    /// The run's summary.
    pub run: RunSummary,
}

/// Plays `rounds` question-then-barge-in rounds; the barge-in starts `after` the question ends.
pub async fn run_interruptions(
    rounds: usize,
    after: Duration,
    bot: BotOptions,
    workdir: PathBuf,
) -> Result<InterruptionsReport, ConversationError> {
    let voice_err = |e: &dyn std::fmt::Display| ConversationError::Voice(e.to_string());
    let (audio, starts) = tokio::task::spawn_blocking(move || {
        let voice = PiperVoice::shared().map_err(|e| voice_err(&e))?;
        let say = |text: &str| user_speech(&voice, text);
        let mut out = vec![0i16; RATE as usize];
        let mut starts = Vec::new();
        // Every utterance may cut in: the barge-ins, and the next question when the answer to
        // the last barge-in is still playing. Each starts at its first audible sample.
        let mut speak = |out: &mut Vec<i16>, speech: Vec<i16>| {
            let lead = speech
                .iter()
                .position(|s| s.unsigned_abs() > 300)
                .unwrap_or(0);
            starts.push((out.len() + lead) as f64 / f64::from(RATE));
            out.extend(speech);
        };
        for round in 0..rounds {
            speak(&mut out, say(QUESTIONS[round % QUESTIONS.len()])?);
            out.extend(vec![0; (after.as_secs_f64() * f64::from(RATE)) as usize]);
            speak(&mut out, say(BARGE_INS[round % BARGE_INS.len()])?);
            // Room for the answer to the interruption before the next round.
            out.extend(vec![0; RATE as usize * 9]);
        }
        Ok::<_, ConversationError>((out, starts))
    })
    .await
    .map_err(|e| voice_err(&e))??;
    let input = write_input(&workdir, "interruptions_user.wav", audio)?;
    let output = workdir.join("interruptions_bot.wav");
    let events = workdir.join("interruptions_events.jsonl");
    let summary = run(RunOptions {
        input,
        output: output.clone(),
        events: Some(events.clone()),
        fast: false,
        max_tail: Duration::from_secs(15),
        settle: Duration::from_secs(2),
        bot,
    })
    .await?;
    let bot_audio = wav::read(&output).map_err(|e| voice_err(&e))?;
    // When the session reported interruptions, in seconds on the input's clock.
    let interrupted: Vec<f64> = std::fs::read_to_string(&events)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["type"] == "interruption")
        .filter_map(|e| e["t_ms"].as_f64())
        .map(|ms| ms / 1e3)
        .collect();
    let interruptions = interrupted.len();
    // Only utterances the session took as an interruption count: the bot going quiet on its
    // own as someone starts talking measures nothing.
    let mut latencies: Vec<f64> = starts
        .iter()
        .filter(|&&start| {
            interrupted
                .iter()
                .any(|&t| (start..start + INTERRUPTION_WINDOW).contains(&t))
        })
        .filter_map(|&start| stop_latency(&bot_audio, start))
        .collect();
    let measured = latencies.clone();
    latencies.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok(InterruptionsReport {
        rounds,
        measured: latencies.len(),
        p50_ms: pick(0.5),
        p99_ms: pick(0.99),
        latencies_ms: measured,
        interruptions,
        run: summary,
    })
}

/// When the bot was audible just before `start` (seconds), the ms from `start` to its last
/// audible sample before a silence of at least 300 ms; `None` when it was not speaking.
fn stop_latency(bot: &Wav, start: f64) -> Option<f64> {
    let rate = f64::from(bot.sample_rate);
    let samples = &bot.samples;
    let at = (start * rate) as usize;
    let loud = |s: &i16| s.unsigned_abs() > 200;
    // Speaking: audible in the 200 ms before the user cut in.
    let before = at.saturating_sub((0.2 * rate) as usize);
    if !samples.get(before..at)?.iter().any(loud) {
        return None;
    }
    let quiet = (0.3 * rate) as usize;
    let limit = (at + (2.0 * rate) as usize).min(samples.len());
    let mut last = at;
    let mut i = at;
    while i < limit {
        if loud(&samples[i]) {
            last = i;
        } else if i - last >= quiet {
            return Some((last as f64 / rate - start) * 1e3);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_is_found_after_the_barge_in() {
        let rate = 1_000;
        // Audible until 1.25 s, then silent; the user cut in at 1.0 s.
        let mut samples = vec![1_000i16; 1_250];
        samples.extend(vec![0; 1_000]);
        let wav = Wav {
            samples,
            sample_rate: rate,
            channels: 1,
        };
        let ms = stop_latency(&wav, 1.0).expect("measured");
        assert!((ms - 249.0).abs() < 1.5, "{ms}");
        // Silent before the barge-in: nothing to measure.
        let quiet = Wav {
            samples: vec![0; 3_000],
            sample_rate: rate,
            channels: 1,
        };
        assert_eq!(stop_latency(&quiet, 1.0), None);
    }
}
