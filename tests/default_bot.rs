//! The default bot on the embedded LLM: a spoken request becomes a schema-valid tool call, the
//! tool runs, and the answer states its result. Needs the models (`scripts/setup.sh`).

use serde_json::Value;
use tokio::sync::mpsc;

mod common;

use common::scripted::Probe;
use voxide::aggregators::AssistantAggregator;
use voxide::bot;
use voxide::context::{ContextHandle, Message};
use voxide::events::EndReason;
use voxide::frames::DataFrame;
use voxide::pipeline::{Pipeline, Session};
use voxide::services::llm::LlmService;

/// Runs one user request through the default bot; returns the context afterwards.
async fn ask(request: &str, responses: usize) -> Vec<Message> {
    let mut context = bot::context();
    context.messages.push(Message::user(request));
    let context = ContextHandle::new(context);
    let mut llm =
        LlmService::new(bot::local_llm().expect("the local LLM loads; run scripts/setup.sh"));
    bot::BotOptions::default().register_tools(llm.functions());
    let (tx, mut frames) = mpsc::unbounded_channel();
    let pipeline = Pipeline::new()
        .then(llm)
        .then(AssistantAggregator::new(context.clone()))
        .then(Probe(tx));
    let session = Session::builder(pipeline).idle_timeout(None).spawn();
    let handle = session.handle();
    handle
        .queue_frame(DataFrame::LlmContext(context.clone()))
        .await
        .expect("queued");
    let mut seen = 0;
    while seen < responses {
        match frames.recv().await {
            Some(name) if name == "llm_full_response_end" => seen += 1,
            Some(_) => {}
            None => panic!("the session ended early"),
        }
    }
    handle.stop_when_done().await.expect("queued");
    assert_eq!(session.join().await, EndReason::Completed);
    context.messages()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arithmetic_goes_through_the_calculate_tool_and_back() {
    let messages = ask("What is 12 times 7?", 2).await;
    let json: Vec<Value> = messages
        .iter()
        .map(|m| serde_json::to_value(m).expect("json"))
        .collect();
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&json).unwrap_or_default()
    );
    let call = json
        .iter()
        .find_map(|m| m["tool_calls"][0]["function"].as_object())
        .expect("a tool call");
    assert_eq!(call["name"], "calculate");
    let arguments: Value =
        serde_json::from_str(call["arguments"].as_str().expect("string")).expect("valid JSON");
    let expression = arguments["expression"].as_str().expect("an expression");
    assert_eq!(voxide::bot::calculator::evaluate(expression), Ok(84.0));
    let result = json
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the tool's result");
    assert!(result["content"].as_str().is_some_and(|c| c.contains("84")));
    let last = json.last().expect("messages");
    assert_eq!(last["role"], "assistant");
    assert_eq!(
        last["content"], "12 times 7 is 84.",
        "the answer states the result"
    );
}

/// The bot's last words.
fn answer(messages: &[Message]) -> String {
    match messages.last() {
        Some(Message::Assistant(m)) => m
            .content
            .as_ref()
            .and_then(Option::as_ref)
            .map(|c| c.joined_text())
            .unwrap_or_default(),
        other => panic!("the bot did not answer last: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoken_arithmetic_is_answered_with_the_calculators_own_number() {
    let messages = ask("What is seventeen times twenty three?", 2).await;
    assert_eq!(answer(&messages), "17 times 23 is 391.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_for_the_clock_is_answered_from_the_clock() {
    let messages = ask("What time is it right now?", 2).await;
    let Some(Message::Tool(result)) = messages.iter().rev().nth(1) else {
        panic!("the clock was not asked: {messages:?}");
    };
    let now: Value = serde_json::from_str(&result.content.joined_text()).expect("JSON");
    let said = answer(&messages);
    assert!(
        said.contains(now["time"].as_str().expect("time"))
            && said.contains(now["date"].as_str().expect("date")),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_with_no_duration_sets_no_timer() {
    let messages = ask("Is it going to be a busy afternoon for you?", 1).await;
    assert!(
        messages
            .iter()
            .all(|m| !matches!(m, Message::Assistant(a) if a.tool_calls.is_some())),
        "{messages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_runs_in_the_background_and_reports_when_it_rings() {
    use voxide::context::async_tool_messages::{AsyncToolMessageKind, parse_message};
    // The call, the reply to its start, and the reply to its ring.
    let messages = ask("Set a timer for 12 seconds.", 3).await;
    for m in &messages {
        eprintln!("{}", serde_json::to_string(m).unwrap_or_default());
    }
    let kinds: Vec<AsyncToolMessageKind> = messages
        .iter()
        .filter_map(parse_message)
        .map(|p| p.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            AsyncToolMessageKind::Started,
            AsyncToolMessageKind::Intermediate,
            AsyncToolMessageKind::Intermediate,
            AsyncToolMessageKind::Final
        ]
    );
    let last = messages.last().and_then(parse_message);
    assert!(last.is_none(), "the bot spoke after the ring");
    assert_eq!(answer(&messages), "Your timer for 12 seconds is done.");
    let said: Vec<String> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Assistant(a) => a.content.as_ref()?.as_ref().map(|c| c.joined_text()),
            _ => None,
        })
        .collect();
    assert_eq!(
        said.first().map(String::as_str),
        Some("Timer set for 12 seconds.")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_talk_is_answered_in_words_without_a_tool() {
    let messages = ask("Hello, how are you?", 1).await;
    assert!(
        messages.iter().all(|m| !matches!(m, Message::Tool(_))),
        "{messages:?}"
    );
    assert!(matches!(messages.last(), Some(Message::Assistant(_))));
}
