//! Tries the network providers whose keys are set: each text LLM is asked a question that needs
//! two tools ("What time is it, and what is seventeen times twenty-three?") and the example
//! prints the time to the first event, what came back, the tokens and their price.
//!
//! Run with any of `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY` set:
//! `cargo run --example providers`. `OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL` and `GEMINI_BASE_URL`
//! point a client at another server (Ollama: `OPENAI_BASE_URL=http://127.0.0.1:11434/v1`, with
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
use voxide::services::llm::{LlmEngine, LlmError, LlmEvent, LlmRequest, PriceTable};

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
    for line in &missing {
        eprintln!("skipped {line}");
    }
    if engines.is_empty() {
        eprintln!(
            "No provider key is set, so nothing was tried. Set OPENAI_API_KEY, ANTHROPIC_API_KEY \
             or GEMINI_API_KEY (or OPENAI_BASE_URL for a local OpenAI-compatible server) and run \
             it again."
        );
        return;
    }
    for engine in &engines {
        engine.warm().await;
        try_engine(engine.as_ref()).await;
    }
}
