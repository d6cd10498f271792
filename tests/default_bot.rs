//! The default bot on the embedded LLM: a spoken request becomes a schema-valid tool call, the
//! tool runs, and the model answers from its result. Needs the models (`scripts/setup.sh`).

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
    assert!(
        last["content"].as_str().is_some_and(|c| c.contains("84")),
        "the answer uses the result: {last}"
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
    assert!(matches!(messages.last(), Some(Message::Assistant(_))));
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
