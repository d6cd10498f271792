//! The context keeps the model's order and every provider gets a request its API accepts: the
//! assistant aggregator fed the frames as they reach it behind a voice (the calls announced
//! before the words before them are heard), then each adapter's request checked against the
//! rules the real APIs enforce (`bench::providers::stand_ins::strict`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use voxide::aggregators::AssistantAggregator;
use voxide::bench::providers::stand_ins::strict::{self, Api};
use voxide::context::adapters::{anthropic, gemini, openai};
use voxide::context::{ContextHandle, LlmContext, Message, ToolsSchema};
use voxide::frames::{
    AudioFrame, ControlFrame, DataFrame, Frame, FunctionCallInProgress, FunctionCallResult,
    FunctionCallResultProperties, ResultKind, SystemFrame, TtsText, WordTiming,
};
use voxide::pipeline::{Pipeline, Session};

fn down(frame: impl Into<Frame>) -> Frame {
    frame.into()
}

fn announced(id: &str, name: &str, sync: bool) -> Frame {
    down(ControlFrame::FunctionCallInProgress(Box::new(
        FunctionCallInProgress {
            function_name: name.into(),
            tool_call_id: id.into(),
            arguments: json!({}),
            cancel_on_interruption: sync,
            group_id: 1,
        },
    )))
}

fn result(id: &str, name: &str, kind: ResultKind, value: Value, sync: bool) -> Frame {
    down(DataFrame::FunctionCallResult(Box::new(
        FunctionCallResult {
            function_name: name.into(),
            tool_call_id: id.into(),
            arguments: json!({}),
            result: Some(value),
            kind,
            cancel_on_interruption: sync,
            group_id: 1,
            properties: FunctionCallResultProperties::default(),
        },
    )))
}

/// A sentence the voice starts, a word every 0.3 s.
fn spoken(text: &str) -> Frame {
    let words: Vec<WordTiming> = text
        .split_whitespace()
        .enumerate()
        .map(|(i, word)| WordTiming {
            word: word.into(),
            start_secs: i as f64 * 0.3,
            end_secs: i as f64 * 0.3 + 0.25,
        })
        .collect();
    down(DataFrame::TtsText(TtsText {
        text: text.into(),
        spoken: true,
        words: Some(Arc::from(words)),
    }))
}

/// `secs` of the voice's audio reaching the listener.
fn played(secs: f64) -> Frame {
    let samples = vec![0i16; (secs * 16_000.0) as usize];
    down(DataFrame::OutputAudio(AudioFrame::new(samples, 16_000, 1)))
}

fn system(frame: SystemFrame) -> Frame {
    down(frame)
}

/// Runs the aggregator on `frames` over a context that holds `messages`, each frame handled
/// before the next comes (as they reach it in a call: a system frame would jump data frames
/// queued before it); the context after.
async fn aggregate(messages: Vec<Message>, frames: Vec<Frame>) -> Vec<Message> {
    let context = ContextHandle::new(LlmContext {
        messages,
        ..LlmContext::default()
    });
    let session = Session::builder(Pipeline::new().then(AssistantAggregator::new(context.clone())))
        .idle_timeout(None)
        .spawn();
    let handle = session.handle();
    for frame in frames {
        handle.queue_frame(frame).await.expect("queued");
        // On paused time, the clock moves only once every task is idle: the frame was handled.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    handle.stop_when_done().await.expect("queued");
    session.join().await;
    context.snapshot().messages
}

/// Each provider's request for `messages`, checked as its API would check it.
fn requests(messages: &[Message]) -> [Value; 3] {
    let tools = ToolsSchema::default();
    let none = strict::Thinking::new();
    let openai = openai::request(messages, &tools, None).expect("an OpenAI request");
    let anthropic = anthropic::request(messages, &tools, None).expect("an Anthropic request");
    let gemini = gemini::request(messages, &tools, None).expect("a Gemini request");
    for (api, body) in [
        (Api::OpenAi, &openai),
        (Api::Anthropic, &anthropic),
        (Api::Gemini, &gemini),
    ] {
        assert_eq!(strict::check(api, body, &none), Ok(()), "{api:?}: {body:#}");
    }
    [openai, anthropic, gemini]
}

fn question() -> Vec<Message> {
    vec![
        Message::system("Be brief."),
        Message::user("What time is it, and what is seventeen times twenty three?"),
    ]
}

#[tokio::test(start_paused = true)]
async fn words_heard_after_the_calls_were_announced_stay_before_them_in_one_turn() {
    let context = aggregate(
        question(),
        vec![
            down(ControlFrame::LlmFullResponseStart),
            // The calls pass the voice at once; the words before them are still to be heard.
            announced("toolu_time", "get_current_time", true),
            announced("toolu_calc", "calculate", true),
            system(SystemFrame::BotStartedSpeaking),
            spoken("Let me check."),
            played(1.0),
            result(
                "toolu_time",
                "get_current_time",
                ResultKind::Final,
                json!("noon"),
                true,
            ),
            result(
                "toolu_calc",
                "calculate",
                ResultKind::Final,
                json!(391),
                true,
            ),
            down(ControlFrame::LlmFullResponseEnd),
            system(SystemFrame::BotStoppedSpeaking),
        ],
    )
    .await;
    let [openai, anthropic, gemini] = requests(&context);
    assert_eq!(
        anthropic["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "What time is it, and what is seventeen times twenty three?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_time", "name": "get_current_time", "input": {}},
                {"type": "tool_use", "id": "toolu_calc", "name": "calculate", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_time", "content": "\"noon\""},
                {"type": "tool_result", "tool_use_id": "toolu_calc", "content": "391"}
            ]}
        ])
    );
    assert_eq!(
        openai["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What time is it, and what is seventeen times twenty three?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "toolu_time", "type": "function", "function": {"name": "get_current_time", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_time", "content": "\"noon\""},
            {"role": "assistant", "tool_calls": [
                {"id": "toolu_calc", "type": "function", "function": {"name": "calculate", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_calc", "content": "391"}
        ])
    );
    let model = &gemini["contents"][1];
    assert_eq!(model["role"], "model");
    assert_eq!(model["parts"][0], json!({"text": "Let me check."}));
    assert_eq!(model["parts"][1]["functionCall"]["id"], "toolu_time");
    assert_eq!(model["parts"][2]["functionCall"]["id"], "toolu_calc");
}

#[tokio::test(start_paused = true)]
async fn an_async_result_that_comes_while_the_bot_speaks_follows_its_words() {
    let context = aggregate(
        question(),
        vec![
            down(ControlFrame::LlmFullResponseStart),
            announced("toolu_timer", "set_timer", false),
            system(SystemFrame::BotStartedSpeaking),
            spoken("Starting a timer."),
            played(1.0),
            down(ControlFrame::LlmFullResponseEnd),
            system(SystemFrame::BotStoppedSpeaking),
            // The answer to the started message, then the final while that answer plays.
            down(ControlFrame::LlmFullResponseStart),
            system(SystemFrame::BotStartedSpeaking),
            spoken("It is running."),
            result(
                "toolu_timer",
                "set_timer",
                ResultKind::Final,
                json!("rang"),
                false,
            ),
            played(1.0),
            down(ControlFrame::LlmFullResponseEnd),
            system(SystemFrame::BotStoppedSpeaking),
        ],
    )
    .await;
    let roles: Vec<&str> = context.iter().map(Message::role).collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "developer"
        ]
    );
    let [_, anthropic, gemini] = requests(&context);
    let turns = anthropic["messages"].as_array().expect("turns");
    assert_eq!(turns.last().expect("a turn")["role"], "user");
    assert!(
        turns.last().expect("a turn")["content"][0]["text"]
            .as_str()
            .expect("text")
            .contains("\"status\": \"finished\"")
    );
    assert_eq!(
        gemini["contents"]
            .as_array()
            .expect("turns")
            .last()
            .expect("a turn")["role"],
        "user"
    );
}

#[tokio::test(start_paused = true)]
async fn an_interruption_during_the_words_before_a_call_keeps_what_was_heard_before_the_call() {
    let mut context = aggregate(
        question(),
        vec![
            down(ControlFrame::LlmFullResponseStart),
            announced("toolu_time", "get_current_time", true),
            system(SystemFrame::BotStartedSpeaking),
            spoken("Let me check that for you."),
            // "Let me" played, then the user spoke.
            played(0.5),
            system(SystemFrame::Interruption),
            result(
                "toolu_time",
                "get_current_time",
                ResultKind::Cancelled,
                Value::Null,
                true,
            ),
            system(SystemFrame::BotStoppedSpeaking),
        ],
    )
    .await;
    context.push(Message::user("Never mind."));
    let [openai, anthropic, _] = requests(&context);
    assert_eq!(openai["messages"][2]["content"], "Let me");
    assert_eq!(
        anthropic["messages"][1]["content"],
        json!([
            {"type": "text", "text": "Let me"},
            {"type": "tool_use", "id": "toolu_time", "name": "get_current_time", "input": {}}
        ])
    );
    assert_eq!(
        anthropic["messages"][2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "toolu_time", "content": "CANCELLED"},
            {"type": "text", "text": "Never mind."}
        ])
    );
}
