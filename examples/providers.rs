//! Tries the network providers whose keys are set: each text LLM is asked a question that needs
//! two tools ("What time is it, and what is seventeen times twenty-three?"), each listener
//! (Deepgram, AssemblyAI, OpenAI transcription) transcribes the shipped recording in real time,
//! and each voice (Cartesia, ElevenLabs, OpenAI speech, Deepgram Aura) says a sentence. It prints the
//! time to the first answer, what came back, and the usage and its price.
//!
//! Run with any of `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY`, `DEEPGRAM_API_KEY`,
//! `ASSEMBLYAI_API_KEY`, `CARTESIA_API_KEY`, `ELEVENLABS_API_KEY` set: `cargo run --example
//! providers`. `OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`, `GEMINI_BASE_URL`, `DEEPGRAM_URL`,
//! `ASSEMBLYAI_URL`, `CARTESIA_URL` and `ELEVENLABS_URL` point a client at
//! another server (Ollama: `OPENAI_BASE_URL=http://127.0.0.1:11434/v1`, with
//! `VOXIDE_LLM_MODEL=llama3.2`). Without any, it says what it needs and exits 0: the offline bot
//! needs none (`cargo run --example voice_turn`).

use std::time::Instant;

use futures_util::StreamExt;
use serde_json::json;

use voxide::context::{FunctionSchema, Message, ToolsSchema};
use voxide::frames::TokenUsage;
use voxide::services::llm::anthropic::{AnthropicLlm, AnthropicSettings};
use voxide::services::llm::gemini::{GeminiLlm, GeminiSettings};
use voxide::services::llm::openai::{OpenAiLlm, OpenAiSettings};
use voxide::services::llm::{LlmEngine, LlmError, LlmEvent, LlmRequest, PriceTable, tts_cost};
use voxide::services::stt::assemblyai::{AssemblyAiSettings, AssemblyAiStt};
use voxide::services::stt::deepgram::{DeepgramSettings, DeepgramStt};
use voxide::services::stt::openai::{OpenAiStt, OpenAiSttSettings};
use voxide::services::stt::{SttEngine, SttEvent, SttInput};
use voxide::services::tts::cartesia::{CartesiaSettings, CartesiaTts};
use voxide::services::tts::deepgram::{AuraSettings, AuraTts};
use voxide::services::tts::elevenlabs::{ElevenLabsSettings, ElevenLabsTts};
use voxide::services::tts::openai::{OpenAiSpeech, OpenAiSpeechSettings};
use voxide::services::tts::{TtsEngine, TtsEvent, TtsInput};

fn request() -> LlmRequest {
    LlmRequest {
        messages: vec![
            Message::system("You are a voice assistant. Use the tools for the time and for sums."),
            Message::user("What time is it, and what is seventeen times twenty-three?"),
        ],
        tools: ToolsSchema::new(vec![
            FunctionSchema::new("get_current_time", "Tells the current date and time."),
            FunctionSchema::new("calculate", "Works out arithmetic, such as 12*7.").property(
                "expression",
                json!({"type": "string", "description": "The arithmetic, e.g. 17*23"}),
                true,
            ),
        ]),
        tool_choice: None,
    }
}

async fn try_engine(engine: &dyn LlmEngine) {
    println!("== {} / {}", engine.provider(), engine.model());
    let started = Instant::now();
    let mut stream = engine.generate(request());
    let mut first = None;
    let mut usage = TokenUsage::default();
    while let Some(event) = stream.next().await {
        if first.is_none() {
            first = Some(started.elapsed());
        }
        match event {
            Ok(LlmEvent::Text(text)) => print!("{text}"),
            Ok(LlmEvent::ToolCall {
                name, arguments, ..
            }) => println!("[call {name}({arguments})]"),
            Ok(LlmEvent::Usage(more)) => usage += more,
            Ok(LlmEvent::Finished(reason)) => println!("[finished: {reason:?}]"),
            Ok(_) => {}
            Err(e) => println!("[error: {e}]"),
        }
    }
    let cost = PriceTable::default().cost(engine.model(), &usage);
    println!(
        "first event after {:.0} ms, all in {:.0} ms; tokens in {} (cached {}), out {}; cost {}",
        first.unwrap_or_default().as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64() * 1e3,
        usage.input,
        usage.cache_read,
        usage.output,
        cost.map_or("unknown".to_owned(), |c| format!("${c:.6}")),
    );
}

/// A listener on the shipped recording, in real time, as one VAD segment.
async fn try_listener(engine: &dyn SttEngine) {
    println!("== {} / {}", engine.name(), engine.model());
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav");
    let audio = match voxide::audio::wav::read(path) {
        Ok(wav) => wav.to_mono(),
        Err(e) => return println!("[cannot read {path}: {e}]"),
    };
    let mut stream = engine.start();
    let _ = stream.input.send(SttInput::SpeechStarted).await;
    for chunk in audio.chunks(320) {
        if stream
            .input
            .send(SttInput::Audio(chunk.to_vec()))
            .await
            .is_err()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let asked = Instant::now();
    let _ = stream.input.send(SttInput::Finalize).await;
    while let Some(event) = stream.events.recv().await {
        match event {
            SttEvent::Interim(text) => println!("[interim] {text}"),
            SttEvent::Settled(text) => println!("[settled] {text}"),
            SttEvent::Finalized(text) => {
                println!(
                    "[final after {:.0} ms] {text}",
                    asked.elapsed().as_secs_f64() * 1e3
                );
                break;
            }
            SttEvent::Error(e) | SttEvent::Failed(e) => {
                println!("[error: {e}]");
                break;
            }
            SttEvent::Switched { .. } => {}
        }
    }
    let seconds = audio.len() as f64 / 16_000.0;
    let cost = voxide::services::llm::stt_cost(engine.model(), seconds);
    println!(
        "{seconds:.1} s of audio sent; cost {}",
        cost.map_or("unknown".to_owned(), |c| format!("${c:.6}"))
    );
}

/// A voice saying one sentence.
async fn try_voice(voice: &dyn TtsEngine) {
    println!("== {} / {}", voice.name(), voice.model());
    let text = "Hello from voxide. This sentence came back as streamed audio.";
    let started = Instant::now();
    let mut context = voice.open();
    let _ = context.input.send(TtsInput::Text(text.into())).await;
    let _ = context.input.send(TtsInput::Flush).await;
    let (mut first, mut samples, mut words) = (None, 0usize, 0usize);
    while let Some(event) = context.events.recv().await {
        match event {
            TtsEvent::Audio(audio) => {
                first.get_or_insert_with(|| started.elapsed());
                samples += audio.len();
            }
            TtsEvent::Words { words: timed, .. } => words += timed.len(),
            TtsEvent::Done => break,
            TtsEvent::Error(e) | TtsEvent::Failed(e) => {
                println!("[error: {e}]");
                break;
            }
            _ => {}
        }
    }
    let cost = tts_cost(voice.model(), text.chars().count() as u64);
    println!(
        "first audio after {:.0} ms; {:.2} s of audio, {words} words timed; cost {}",
        first.unwrap_or_default().as_secs_f64() * 1e3,
        samples as f64 / f64::from(voice.sample_rate()),
        cost.map_or("unknown".to_owned(), |c| format!("${c:.6}")),
    );
}

fn model(default: &str) -> String {
    std::env::var("VOXIDE_LLM_MODEL").unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() {
    let mut engines: Vec<Box<dyn LlmEngine>> = Vec::new();
    let mut missing = Vec::new();
    let mut add = |name: &str, engine: Result<Box<dyn LlmEngine>, LlmError>| match engine {
        Ok(engine) => engines.push(engine),
        Err(e) => missing.push(format!("{name}: {e}")),
    };
    add(
        "openai",
        OpenAiSettings::from_env().and_then(|s| {
            let model = model(&s.model);
            Ok(Box::new(OpenAiLlm::new(OpenAiSettings { model, ..s })?) as Box<dyn LlmEngine>)
        }),
    );
    add(
        "anthropic",
        AnthropicSettings::from_env().and_then(|s| {
            let model = model(&s.model);
            Ok(
                Box::new(AnthropicLlm::new(AnthropicSettings { model, ..s })?)
                    as Box<dyn LlmEngine>,
            )
        }),
    );
    add(
        "gemini",
        GeminiSettings::from_env().and_then(|s| {
            let model = model(&s.model);
            Ok(Box::new(GeminiLlm::new(GeminiSettings { model, ..s })?) as Box<dyn LlmEngine>)
        }),
    );
    let mut listeners: Vec<Box<dyn SttEngine>> = Vec::new();
    match DeepgramSettings::from_env() {
        Ok(settings) => listeners.push(Box::new(DeepgramStt::new(settings))),
        Err(e) => missing.push(format!("deepgram: {e}")),
    }
    match AssemblyAiSettings::from_env() {
        Ok(settings) => listeners.push(Box::new(AssemblyAiStt::new(settings))),
        Err(e) => missing.push(format!("assemblyai: {e}")),
    }
    match OpenAiSttSettings::from_env() {
        Ok(settings) => listeners.push(Box::new(OpenAiStt::new(settings))),
        Err(e) => missing.push(format!("openai transcription: {e}")),
    }
    let mut voices: Vec<Box<dyn TtsEngine>> = Vec::new();
    match CartesiaSettings::from_env() {
        Ok(settings) => voices.push(Box::new(CartesiaTts::new(settings))),
        Err(e) => missing.push(format!("cartesia: {e}")),
    }
    match ElevenLabsSettings::from_env() {
        Ok(settings) => voices.push(Box::new(ElevenLabsTts::new(settings))),
        Err(e) => missing.push(format!("elevenlabs: {e}")),
    }
    match AuraSettings::from_env() {
        Ok(settings) => voices.push(Box::new(AuraTts::new(settings))),
        Err(e) => missing.push(format!("deepgram aura: {e}")),
    }
    match OpenAiSpeechSettings::from_env().and_then(OpenAiSpeech::new) {
        Ok(voice) => voices.push(Box::new(voice)),
        Err(e) => missing.push(format!("openai speech: {e}")),
    }
    for line in &missing {
        eprintln!("skipped {line}");
    }
    if engines.is_empty() && listeners.is_empty() && voices.is_empty() {
        eprintln!(
            "No provider key is set, so nothing was tried. Set OPENAI_API_KEY, ANTHROPIC_API_KEY, \
             GEMINI_API_KEY, DEEPGRAM_API_KEY, ASSEMBLYAI_API_KEY, CARTESIA_API_KEY or \
             ELEVENLABS_API_KEY (or OPENAI_BASE_URL for a local OpenAI-compatible server) and run \
             it again."
        );
        return;
    }
    for engine in &engines {
        engine.warm().await;
        try_engine(engine.as_ref()).await;
    }
    for listener in &listeners {
        try_listener(listener.as_ref()).await;
    }
    for voice in &voices {
        try_voice(voice.as_ref()).await;
    }
}
