//! Per-stage cost of the embedded engines on this machine: VAD per 20 ms of audio (one stream,
//! and many streams batched into one inference), Smart Turn per inference, Piper time to first
//! audio and real-time factor.

use std::time::Instant;

use serde::Serialize;
use voxide_engines::speaker::SpeakerEncoder;

use crate::audio::mel::LogMel;
use crate::audio::resample::StreamResampler;
use crate::audio::turn::{SmartTurn, SmartTurnEngine};
use crate::audio::vad::SileroVad;
use crate::context::{Message, ToolsSchema};
use crate::models::ModelError;
use crate::services::llm::local::{LocalLlm, LocalLlmOptions, LocalModel};
use crate::services::llm::{LlmEngine, LlmEvent, LlmRequest};
use crate::services::stt::{SttError, Whisper, WindowPolicy};
use crate::services::tts::{PiperVoice, Synthesizer, TtsError};

/// One JSON line of results.
#[derive(Debug, Clone, Serialize)]
pub struct EnginesReport {
    /// Silero, one stream: µs of CPU per 20 ms of audio (a 32 ms window costs 1.6 of these).
    pub vad_us_per_20ms: f64,
    /// Silero, `vad_batch` streams in one inference: µs per stream per 20 ms.
    pub vad_batched_us_per_20ms: f64,
    /// Streams per batched inference.
    pub vad_batch: usize,
    /// Smart Turn, median ms per inference on 8 s of audio (features included), on the engine
    /// voxide picks for this CPU.
    pub smart_turn_p50_ms: f64,
    /// That engine.
    pub smart_turn_engine: SmartTurnEngine,
    /// Smart Turn on ONNX Runtime, median ms per inference, for comparison.
    pub smart_turn_onnx_runtime_p50_ms: f64,
    /// Of which the log-mel features, median ms.
    pub smart_turn_features_p50_ms: f64,
    /// The speaker encoder (GE2E), median ms per second of speech: what the VAD pays per check
    /// of who is speaking (four a second) where the room talks.
    pub speaker_embed_ms: f64,
    /// Echo canceller (AEC3), one stream at 16 kHz: µs of CPU per 20 ms of input.
    pub aec_us_per_20ms: f64,
    /// Echo canceller: echo removed from Piper speech played through a simulated room (60 ms,
    /// four reflections, 10 dB down), in dB, after the first two seconds.
    pub aec_erle_db: f64,
    /// Piper, ms from text to the audio of a short first sentence.
    pub tts_first_audio_ms: f64,
    /// Piper, synthesis time over audio duration for a longer sentence.
    pub tts_rtf: f64,
    /// Whisper on Piper-voiced utterances: one entry per utterance.
    pub stt: Vec<SttFigure>,
    /// Local LLM, ms from request to the first text, with a fresh cache.
    pub llm_first_token_ms: f64,
    /// Local LLM, prompt tokens processed per second (fresh cache).
    pub llm_prompt_tokens_per_sec: f64,
    /// Local LLM, tokens generated per second.
    pub llm_tokens_per_sec: f64,
}

/// Whisper's time for one utterance, with the window policy in use and the full 30 s window.
#[derive(Debug, Clone, Serialize)]
pub struct SttFigure {
    /// Length of the speech, seconds.
    pub audio_secs: f64,
    /// Milliseconds with the default (speech-length) window.
    pub ms: f64,
    /// Milliseconds with the full 30 s window.
    pub full_window_ms: f64,
    /// Words of the spoken text recovered with the default window, of all words.
    pub words_right: usize,
    /// Words spoken.
    pub words: usize,
}

/// Why the bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum EnginesBenchError {
    /// A model is missing or broken.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Synthesis failed.
    #[error(transparent)]
    Tts(#[from] TtsError),
    /// Transcription failed.
    #[error(transparent)]
    Stt(#[from] SttError),
    /// Resampling failed.
    #[error(transparent)]
    Resample(#[from] crate::audio::resample::ResampleError),
    /// The local LLM failed.
    #[error("the local LLM failed: {0}")]
    Llm(String),
    /// The echo canceller failed.
    #[error("the echo canceller failed: {0}")]
    Aec(String),
}

/// Runs every measurement once (after a warm-up) and reports medians.
pub fn run(vad_batch: usize) -> Result<EnginesReport, EnginesBenchError> {
    let speech = synthetic_speech(16_000 * 8);

    let vad = SileroVad::shared()?;
    let windows: Vec<&[f32]> = speech.chunks_exact(512).collect();
    let mut state = vad.new_state(16_000);
    for w in windows.iter().take(20) {
        vad.probability(&mut state, w)?;
    }
    let started = Instant::now();
    for w in &windows {
        vad.probability(&mut state, w)?;
    }
    let per_window = started.elapsed().as_secs_f64() / windows.len() as f64;
    // A 512-sample window is 32 ms of audio.
    let vad_us_per_20ms = per_window * 1e6 * 20.0 / 32.0;

    let mut states: Vec<_> = (0..vad_batch).map(|_| vad.new_state(16_000)).collect();
    let started = Instant::now();
    for w in &windows {
        let mut batch: Vec<_> = states.iter_mut().map(|s| (s, *w)).collect();
        vad.probabilities(&mut batch)?;
    }
    let per_stream = started.elapsed().as_secs_f64() / (windows.len() * vad_batch.max(1)) as f64;
    let vad_batched_us_per_20ms = per_stream * 1e6 * 20.0 / 32.0;

    let turn = SmartTurn::shared()?;
    let smart_turn_p50_ms = median_ms(&turn, &speech)?;
    let ort = SmartTurn::load_on(SmartTurnEngine::OnnxRuntime)?;
    let smart_turn_onnx_runtime_p50_ms = median_ms(&ort, &speech)?;
    let mut feature_times: Vec<f64> = (0..9)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(LogMel::shared().features(&speech, true));
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    feature_times.sort_by(f64::total_cmp);

    let encoder = SpeakerEncoder::shared()?;
    let mut embed_times: Vec<f64> = speech
        .chunks_exact(16_000)
        .map(|stretch| {
            let started = Instant::now();
            std::hint::black_box(encoder.embed(stretch));
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    embed_times.sort_by(f64::total_cmp);

    let voice = PiperVoice::shared()?;
    voice.synthesize("Warming up.")?;
    let started = Instant::now();
    voice.synthesize("Sure, one moment.")?;
    let tts_first_audio_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let long = voice.synthesize(
        "The weather in Paris is mild today, with a light breeze and a few clouds in the afternoon.",
    )?;
    let audio_secs = long.samples.len() as f64 / f64::from(long.sample_rate);
    let tts_rtf = started.elapsed().as_secs_f64() / audio_secs.max(1e-9);

    let (aec_us_per_20ms, aec_erle_db) = aec_figures(&long.samples, long.sample_rate)?;

    let whisper = Whisper::shared()?;
    let mut stt = Vec::new();
    for text in [
        // About 1, 3 and 6 seconds of speech.
        "Good morning to you.",
        "What time is it in Tokyo right now, and will it rain there today?",
        "Please set a timer for ten minutes and tell me when the pasta is ready, then remind me \
         to call my sister this weekend.",
    ] {
        let speech = voice.synthesize(text)?;
        let mut down = StreamResampler::new(speech.sample_rate, 16_000)?;
        let mut audio = down.process(&speech.samples);
        audio.extend(down.process(&vec![0; speech.sample_rate as usize / 5]));
        let audio = crate::audio::wav::to_f32(&audio);
        whisper.transcribe(&audio)?;
        let started = Instant::now();
        let heard = whisper.transcribe(&audio)?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let full = Whisper::load_default()?.with_window(WindowPolicy::FULL);
        let started = Instant::now();
        let heard_full = full.transcribe(&audio)?;
        let full_window_ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::info!(text, heard, heard_full, "stt");
        let (words_right, words) = word_matches(text, &heard);
        stt.push(SttFigure {
            audio_secs: speech.samples.len() as f64 / f64::from(speech.sample_rate),
            ms,
            full_window_ms,
            words_right,
            words,
        });
    }

    let (llm_first_token_ms, llm_prompt_tokens_per_sec, llm_tokens_per_sec) = llm_figures()?;

    Ok(EnginesReport {
        llm_first_token_ms,
        llm_prompt_tokens_per_sec,
        llm_tokens_per_sec,
        stt,
        vad_us_per_20ms,
        vad_batched_us_per_20ms,
        vad_batch,
        smart_turn_p50_ms,
        smart_turn_engine: turn.engine(),
        smart_turn_onnx_runtime_p50_ms,
        smart_turn_features_p50_ms: feature_times[feature_times.len() / 2],
        speaker_embed_ms: embed_times[embed_times.len() / 2],
        aec_us_per_20ms,
        aec_erle_db,
        tts_first_audio_ms,
        tts_rtf,
    })
}

/// The echo canceller's cost and echo reduction on `speech` played into a simulated room.
/// Smart Turn's median time per inference on `speech`, after one to warm up.
fn median_ms(model: &SmartTurn, speech: &[f32]) -> Result<f64, ModelError> {
    model.predict(speech)?;
    let mut times: Vec<f64> = (0..15)
        .map(|_| {
            let started = Instant::now();
            model
                .predict(speech)
                .map(|_| started.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_, _>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn aec_figures(speech: &[i16], rate: u32) -> Result<(f64, f64), EnginesBenchError> {
    const RATE: u32 = 16_000;
    let mut down = StreamResampler::new(rate, RATE)?;
    // Three passes of the sentence: time to converge, then steady state.
    let played: Vec<i16> = down.process(&[speech, speech, speech].concat());
    let mic = crate::audio::aec::simulated_room(&played, RATE);
    let mic: Vec<i16> = mic.iter().map(|&v| v as i16).collect();
    let started = Instant::now();
    let out = crate::audio::aec::cancel_recording(RATE, &played, &mic)
        .map_err(|e| EnginesBenchError::Aec(e.to_string()))?;
    let chunks = mic.len() as f64 / (RATE as f64 / 50.0);
    let us_per_20ms = started.elapsed().as_secs_f64() * 1e6 / chunks;
    let power = |x: &[i16]| {
        x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len().max(1) as f64 + 1e-9
    };
    let from = (2 * RATE as usize).min(out.len());
    let erle = 10.0 * (power(&mic[from..out.len()]) / power(&out[from..])).log10();
    Ok((us_per_20ms, erle))
}

/// First-token latency, prompt speed and generation speed of the local LLM.
fn llm_figures() -> Result<(f64, f64, f64), EnginesBenchError> {
    use futures_util::StreamExt;
    let model = LocalModel::shared()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| EnginesBenchError::Llm(e.to_string()))?;
    let messages = vec![
        Message::system(
            "You are a friendly voice assistant. Answer in one or two short sentences.",
        ),
        Message::user("Tell me something interesting about the moon."),
    ];
    let prompt_tokens = model.prompt(&messages).len();
    let llm = LocalLlm::new(model, LocalLlmOptions::default());
    runtime.block_on(async {
        let started = Instant::now();
        let mut stream = llm.generate(LlmRequest {
            messages,
            tools: ToolsSchema::default(),
            tool_choice: None,
        });
        let mut first = None;
        let mut output = 0;
        while let Some(event) = stream.next().await {
            match event.map_err(|e| EnginesBenchError::Llm(e.to_string()))? {
                LlmEvent::Text(_) if first.is_none() => first = Some(started.elapsed()),
                LlmEvent::Usage(u) => output = u.output,
                _ => {}
            }
        }
        let first = first.map_or(0.0, |d| d.as_secs_f64());
        let total = started.elapsed().as_secs_f64();
        Ok((
            first * 1e3,
            prompt_tokens as f64 / first.max(1e-9),
            output.saturating_sub(1) as f64 / (total - first).max(1e-9),
        ))
    })
}

/// A voiced, speech-like signal (harmonics with a syllable-rate envelope), deterministic.
fn synthetic_speech(samples: usize) -> Vec<f32> {
    (0..samples)
        .map(|i| {
            let t = i as f32 / 16_000.0;
            let envelope = (0.5 + 0.5 * (2.0 * std::f32::consts::PI * 4.0 * t).sin()).powi(2);
            let voice: f32 = (1..6)
                .map(|h| (2.0 * std::f32::consts::PI * 140.0 * h as f32 * t).sin() / h as f32)
                .sum();
            0.2 * envelope * voice
        })
        .collect()
}

/// Words of `spoken` found in order in `heard` (case and punctuation aside), and how many it has.
pub fn word_matches(spoken: &str, heard: &str) -> (usize, usize) {
    let words = |s: &str| -> Vec<String> {
        s.split_whitespace()
            .map(|w| {
                w.chars()
                    .filter(|c| c.is_alphanumeric())
                    .collect::<String>()
                    .to_lowercase()
            })
            .filter(|w| !w.is_empty())
            .collect()
    };
    let (spoken, heard) = (words(spoken), words(heard));
    // Longest common subsequence: insertions and substitutions both cost the word.
    let mut table = vec![vec![0usize; heard.len() + 1]; spoken.len() + 1];
    for i in 1..=spoken.len() {
        for j in 1..=heard.len() {
            table[i][j] = if spoken[i - 1] == heard[j - 1] {
                table[i - 1][j - 1] + 1
            } else {
                table[i - 1][j].max(table[i][j - 1])
            };
        }
    }
    (table[spoken.len()][heard.len()], spoken.len())
}
