//! Word error rate of the embedded STT on sentences voiced by both embedded voices (espeak-ng
//! and Piper), which is also the TTS round trip: text → speech → text.

use std::time::Instant;

use serde::Serialize;
use voxide_core::text::word_edits;

use super::engines::EnginesBenchError;
use crate::audio::resample::StreamResampler;
use crate::audio::wav::to_f32;
use crate::services::stt::Whisper;
use crate::services::tts::{EspeakVoice, PiperVoice, Synthesizer, TtsError};

/// Sentences of the kind a voice assistant hears, without digits (so no number normalisation
/// decides the score).
pub const SENTENCES: &[&str] = &[
    "Good morning, how are you today?",
    "What is the weather like in Paris?",
    "Please set a timer for the pasta.",
    "Can you tell me a short story about a dragon?",
    "I would like to book a table for two people.",
    "Turn off the lights in the living room.",
    "What time does the train leave tomorrow?",
    "Remind me to call my mother this evening.",
    "How far is the moon from the earth?",
    "Play some quiet music while I read.",
    "The meeting has been moved to next week.",
    "Thank you, that was very helpful.",
    "Where is the nearest pharmacy?",
    "Could you explain how a rainbow forms?",
    "My flight was cancelled this morning.",
    "Add milk and bread to the shopping list.",
    "Is it going to rain this afternoon?",
    "Tell me something interesting about whales.",
    "I need a recipe for chocolate cake.",
    "How do I say hello in Spanish?",
    "Stop talking and listen to me.",
    "What is the capital city of Australia?",
    "Wake me up early tomorrow morning.",
    "The children are playing in the garden.",
];

/// One voice's figures.
#[derive(Debug, Clone, Serialize)]
pub struct VoiceWer {
    /// The TTS engine that voiced the sentences.
    pub voice: String,
    /// Sentences.
    pub sentences: usize,
    /// Reference words.
    pub words: usize,
    /// Word-level edits (substitutions, deletions, insertions) from reference to transcript.
    pub errors: usize,
    /// errors / words.
    pub wer: f64,
    /// Sentences transcribed exactly (after normalisation).
    pub exact: usize,
    /// Median ms of the TTS per sentence.
    pub tts_p50_ms: f64,
    /// Synthesis time over audio duration, all sentences.
    pub tts_rtf: f64,
    /// Median ms of the STT per sentence.
    pub stt_p50_ms: f64,
    /// The transcripts that were not exact: (said, heard).
    pub misses: Vec<(String, String)>,
}

/// The report: one entry per voice.
#[derive(Debug, Clone, Serialize)]
pub struct WerReport {
    /// The STT model.
    pub stt: String,
    /// Per voice.
    pub voices: Vec<VoiceWer>,
}

/// Voices every sentence with each embedded voice and transcribes it.
pub fn run() -> Result<WerReport, EnginesBenchError> {
    let whisper = Whisper::shared()?;
    let espeak = EspeakVoice::new("en-us").map_err(|e| TtsError::Engine(e.to_string()))?;
    let piper = PiperVoice::shared()?;
    let voices: [(&str, &dyn Synthesizer); 2] = [("espeak-ng", &espeak), ("piper", &*piper)];
    let mut out = Vec::new();
    for (name, voice) in voices {
        voice.synthesize("Warming up.")?;
        let (mut tts_ms, mut stt_ms, mut misses) = (Vec::new(), Vec::new(), Vec::new());
        let (mut words, mut errors, mut exact) = (0, 0, 0);
        let (mut synth_secs, mut audio_secs) = (0.0, 0.0);
        for text in SENTENCES {
            let started = Instant::now();
            let speech = voice.synthesize(text)?;
            let took = started.elapsed().as_secs_f64();
            tts_ms.push(took * 1e3);
            synth_secs += took;
            audio_secs += speech.samples.len() as f64 / f64::from(speech.sample_rate);
            let audio = for_whisper(&speech)?;
            let started = Instant::now();
            let heard = whisper.transcribe(&to_f32(&audio))?;
            stt_ms.push(started.elapsed().as_secs_f64() * 1e3);
            let (reference, hypothesis) = (normalize(text), normalize(&heard));
            let edits = word_edits(&reference, &hypothesis);
            words += reference.len();
            errors += edits;
            if edits == 0 {
                exact += 1;
            } else {
                misses.push(((*text).to_owned(), heard));
            }
        }
        out.push(VoiceWer {
            voice: name.to_owned(),
            sentences: SENTENCES.len(),
            words,
            errors,
            wer: errors as f64 / words.max(1) as f64,
            exact,
            tts_p50_ms: median(&mut tts_ms),
            tts_rtf: synth_secs / audio_secs.max(1e-9),
            stt_p50_ms: median(&mut stt_ms),
            misses,
        });
    }
    Ok(WerReport {
        stt: "whisper-tiny.en".into(),
        voices: out,
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Lower-case words without punctuation.
pub fn normalize(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || c == '-')
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric() || *c == '\'')
                .collect::<String>()
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// `speech` at Whisper's 16 kHz, the resampler flushed with a little silence, as the end of a
/// turn would.
pub(super) fn for_whisper(
    speech: &crate::services::tts::Speech,
) -> Result<Vec<i16>, crate::audio::resample::ResampleError> {
    let mut down = StreamResampler::new(speech.sample_rate, 16_000)?;
    let mut audio = down.process(&speech.samples);
    audio.extend(down.process(&vec![0; speech.sample_rate as usize / 5]));
    Ok(audio)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_count_substitutions_deletions_and_insertions() {
        let w = |s: &str| normalize(s);
        assert_eq!(word_edits(&w("the cat sat"), &w("The cat sat.")), 0);
        assert_eq!(word_edits(&w("the cat sat"), &w("the bat sat")), 1);
        assert_eq!(word_edits(&w("the cat sat"), &w("the sat")), 1);
        assert_eq!(word_edits(&w("the cat sat"), &w("the cat sat down")), 1);
        assert_eq!(word_edits(&w("a b"), &w("")), 2);
        assert_eq!(normalize("Don't stop-now!"), ["don't", "stop", "now"]);
    }
}
