//! Tool-call accuracy of the local model: a suite of spoken requests, each with the tool it
//! should call (or none) and, where it matters, the argument it should carry. As text, or
//! voiced by espeak-ng voices and heard by the embedded Whisper as the bot hears a turn (its
//! prompt, and its second listen to a garbled request), so a routing change is measured on
//! what Whisper makes of a voice.

use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use super::engines::EnginesBenchError;
use super::wer::for_whisper;
use crate::audio::wav::to_f32;
use crate::bot::calculator::evaluate;
use crate::bot::tools::{reader, tool_set};
use crate::bot::{BotOptions, Builtin};
use crate::models::ModelError;
use crate::services::llm::local::{LocalModel, ToolSet};
use crate::services::stt::{PromptedWhisper, Whisper};
use crate::services::tts::{EspeakVoice, Synthesizer, TtsError};

/// What one request should produce.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// An answer in words.
    Words,
    /// A call with no argument worth checking.
    Call(&'static str),
    /// `calculate` whose expression evaluates to this.
    Calculate(f64),
    /// `set_timer` with these seconds.
    Timer(u64),
}

/// The suite: what users say to a voice assistant, as a transcript would have it.
pub const SUITE: &[(&str, Expect)] = &[
    ("What time is it?", Expect::Call("get_current_time")),
    (
        "Can you tell me the time please?",
        Expect::Call("get_current_time"),
    ),
    ("What's the date today?", Expect::Call("get_current_time")),
    (
        "What day of the week is it?",
        Expect::Call("get_current_time"),
    ),
    ("What is 12 times 7?", Expect::Calculate(84.0)),
    ("How much is 250 divided by 5?", Expect::Calculate(50.0)),
    ("Calculate 15% of 80.", Expect::Calculate(12.0)),
    (
        "What's twenty five plus seventeen?",
        Expect::Calculate(42.0),
    ),
    ("What is the square root of 144?", Expect::Calculate(12.0)),
    ("Can you add 3.5 and 4.25?", Expect::Calculate(7.75)),
    ("Set a timer for 10 seconds.", Expect::Timer(10)),
    ("Start a 30 second timer for the eggs.", Expect::Timer(30)),
    ("Remind me in 90 seconds.", Expect::Timer(90)),
    ("Set a timer for five minutes.", Expect::Timer(300)),
    ("Please set a timer for 45 seconds.", Expect::Timer(45)),
    ("Cancel the timer.", Expect::Call("cancel_set_timer")),
    ("Stop my timer please.", Expect::Call("cancel_set_timer")),
    ("Hello, how are you?", Expect::Words),
    ("Tell me a joke.", Expect::Words),
    ("What is the capital of France?", Expect::Words),
    ("Thank you, that's all.", Expect::Words),
    ("My name is Anna.", Expect::Words),
    ("What's your favourite colour?", Expect::Words),
    ("Good morning!", Expect::Words),
    // Near misses: words a rule could take for a tool's.
    ("What year is it?", Expect::Call("get_current_time")),
    (
        "How much is a hundred minus thirty seven?",
        Expect::Calculate(63.0),
    ),
    ("Time my tea for three minutes.", Expect::Timer(180)),
    ("How many days are in a year?", Expect::Words),
    ("I don't have time for this.", Expect::Words),
    ("What's the best time to visit Japan?", Expect::Words),
    ("Is it a good day for a picnic?", Expect::Words),
    ("Stop talking about the weather.", Expect::Words),
    ("I need five minutes to think.", Expect::Words),
    ("My son is ten years old.", Expect::Words),
];

/// One request's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCase {
    /// What the user said.
    pub text: String,
    /// The espeak-ng voice that said it (spoken runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voice: Option<String>,
    /// What Whisper heard (spoken runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heard: Option<String>,
    /// The tool it should call (`none`: words).
    pub expected: String,
    /// The tool it called (`none`: words).
    pub called: String,
    /// The arguments it wrote.
    pub arguments: Value,
    /// Right tool (or rightly none).
    pub tool_right: bool,
    /// Right tool and, where checked, the right argument.
    pub all_right: bool,
    /// Milliseconds to decide and write the arguments.
    pub ms: f64,
}

/// The suite's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ToolsReport {
    /// Requests in the suite.
    pub cases: usize,
    /// Requests where the right tool was called, or rightly none.
    pub tool_right: usize,
    /// Of those, also with the right argument.
    pub all_right: usize,
    /// Chat requests that wrongly called a tool.
    pub false_calls: usize,
    /// Tool requests answered in words instead.
    pub missed_calls: usize,
    /// Tool requests called with the right tool and, where checked, the right argument.
    pub tool_requests_right: usize,
    /// Tool requests in the suite (times the voices).
    pub tool_requests: usize,
    /// Median ms per decision (prefix cached, as in a running session).
    pub decide_p50_ms: f64,
    /// Whisper's ms per request, p50 and p90 (spoken runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stt_ms: Option<[f64; 2]>,
    /// Every request.
    pub results: Vec<ToolCase>,
}

/// Runs the suite on the shared local model, as text.
pub fn run() -> Result<ToolsReport, ModelError> {
    let (model, tools) = warm()?;
    let mut results = Vec::new();
    for (text, expect) in SUITE {
        results.push(judge(&model, &tools, text, text, *expect)?);
    }
    Ok(report(results, None))
}

/// Runs the suite as the espeak-ng `voices` say it and the embedded Whisper hears it (with
/// its second listen unless `second_listen` is false).
pub fn run_spoken(
    voices: &[String],
    second_listen: bool,
) -> Result<ToolsReport, EnginesBenchError> {
    let (model, tools) = warm()?;
    let mut whisper =
        PromptedWhisper::new(Whisper::shared()?, &BotOptions::default().expected_words());
    if second_listen {
        whisper = whisper.with_reader(reader(&Builtin::ALL));
    }
    let mut results = Vec::new();
    let mut stt_ms = Vec::new();
    for name in voices {
        let voice = EspeakVoice::new(name).map_err(|e| TtsError::Engine(e.to_string()))?;
        for (text, expect) in SUITE {
            let speech = voice.synthesize(text)?;
            let audio = for_whisper(&speech)?;
            let started = Instant::now();
            let heard = whisper.transcribe(&to_f32(&audio))?;
            stt_ms.push(started.elapsed().as_secs_f64() * 1e3);
            let mut case = judge(&model, &tools, text, &heard, *expect)
                .map_err(|e| EnginesBenchError::Llm(e.to_string()))?;
            case.voice = Some(name.clone());
            case.heard = Some(heard);
            results.push(case);
        }
    }
    stt_ms.sort_by(f64::total_cmp);
    let at = |q: f64| stt_ms[((stt_ms.len() - 1) as f64 * q).round() as usize];
    let stt = (!stt_ms.is_empty()).then(|| [at(0.5), at(0.9)]);
    Ok(report(results, stt))
}

/// The shared local model and the built-in tools, their prefix prefilled so the timings are
/// those of a running session.
fn warm() -> Result<(std::sync::Arc<LocalModel>, ToolSet), ModelError> {
    let model = LocalModel::shared()?;
    let tools = tool_set();
    model.prepare_tools(&tools).map_err(inference)?;
    Ok((model, tools))
}

fn inference(e: candle_core::Error) -> ModelError {
    ModelError::Inference {
        name: "smollm2-135m".into(),
        reason: e.to_string(),
    }
}

/// What the model makes of `heard` (the words of `text`), judged against `expect`.
fn judge(
    model: &LocalModel,
    tools: &ToolSet,
    text: &str,
    heard: &str,
    expect: Expect,
) -> Result<ToolCase, ModelError> {
    let start = Instant::now();
    let decision = model
        .decide_tool_call(tools, None, heard)
        .map_err(inference)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let (called, arguments) =
        decision.map_or(("none".to_owned(), Value::Null), |d| (d.name, d.arguments));
    let expected = match expect {
        Expect::Words => "none",
        Expect::Call(name) => name,
        Expect::Calculate(_) => "calculate",
        Expect::Timer(_) => "set_timer",
    };
    let tool_right = called == expected;
    let all_right = tool_right
        && match expect {
            Expect::Calculate(value) => arguments["expression"]
                .as_str()
                .and_then(|e| evaluate(e).ok())
                .is_some_and(|v| (v - value).abs() < 1e-9),
            Expect::Timer(seconds) => arguments["seconds"].as_u64() == Some(seconds),
            _ => true,
        };
    Ok(ToolCase {
        text: text.to_owned(),
        voice: None,
        heard: None,
        expected: expected.to_owned(),
        called,
        arguments,
        tool_right,
        all_right,
        ms,
    })
}

fn report(results: Vec<ToolCase>, stt_ms: Option<[f64; 2]>) -> ToolsReport {
    let mut times: Vec<f64> = results.iter().map(|r| r.ms).collect();
    times.sort_by(f64::total_cmp);
    let requests = || results.iter().filter(|r| r.expected != "none");
    ToolsReport {
        cases: results.len(),
        tool_right: results.iter().filter(|r| r.tool_right).count(),
        all_right: results.iter().filter(|r| r.all_right).count(),
        false_calls: results
            .iter()
            .filter(|r| r.expected == "none" && r.called != "none")
            .count(),
        missed_calls: requests().filter(|r| r.called == "none").count(),
        tool_requests_right: requests().filter(|r| r.all_right).count(),
        tool_requests: requests().count(),
        decide_p50_ms: times.get(times.len() / 2).copied().unwrap_or(0.0),
        stt_ms,
        results,
    }
}
