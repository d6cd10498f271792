//! Function calling through the LLM service and the assistant aggregator, driven by a scripted
//! engine that emits tool calls the way providers stream them (assembled calls, then the end).

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, BoxStream};
use serde_json::{Value, json};
use tokio::sync::mpsc;

mod common;

use common::scripted::{Bot, ScriptedLlm, call, held_until_released, say};
use voxide::context::async_tool_messages::{AsyncToolMessageKind, parse_message};
use voxide::context::{ContentBlock, Message, StopReason};
use voxide::events::Event;
use voxide::frames::OnContextUpdated;
use voxide::frames::{CancelReason, DataFrame, SystemFrame, TokenUsage};
use voxide::services::llm::{
    FunctionOptions, LlmEngine, LlmError, LlmEvent, LlmRequest, LlmService, LlmServiceOptions,
    Price, PriceTable, ResultProperties,
};

fn json_of(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| serde_json::to_value(m).expect("json"))
        .collect()
}

#[tokio::test]
async fn a_sync_call_runs_one_inference_after_its_result() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "get_time", json!({}))],
        vec![say("It is noon.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("get_time"),
        |p| async move { p.result_callback.done(json!("12:00")) },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, errors) = bot.stop().await;
    assert_eq!(engine.runs(), 2);
    assert!(errors.is_empty(), "{errors:?}");
    let v = json_of(&messages);
    assert_eq!(v[2]["tool_calls"][0]["function"]["name"], "get_time");
    assert_eq!(
        v[3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "\"12:00\""})
    );
    assert_eq!(v[4], json!({"role": "assistant", "content": "It is noon."}));
    // The second request saw the result.
    let second = &engine.requests.lock().expect("lock")[1];
    assert_eq!(second.messages[3].text(), Some("\"12:00\""));
}

#[tokio::test]
async fn two_parallel_calls_run_exactly_one_inference_after_the_second() {
    let engine = ScriptedLlm::new(vec![
        vec![
            call("a", "slow", json!({"ms": 30})),
            call("b", "slow", json!({"ms": 1})),
        ],
        vec![say("Both done.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("slow"),
        |p| async move {
            let ms = p.arguments["ms"].as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            p.result_callback.done(json!(ms));
        },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    assert_eq!(engine.runs(), 2);
    let second = &engine.requests.lock().expect("lock")[1];
    let tool_results: Vec<_> = second
        .messages
        .iter()
        .filter(|m| m.role() == "tool")
        .filter_map(|m| m.text())
        .collect();
    assert_eq!(tool_results, vec!["30", "1"]);
    assert_eq!(messages.last().and_then(Message::text), Some("Both done."));
}

#[tokio::test]
async fn an_unknown_tool_gets_a_not_available_result() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "launch_rocket", json!({}))],
        vec![say("I can't.")],
    ]);
    let mut bot = Bot::start(LlmService::new(engine.clone()));
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let tool = messages
        .iter()
        .find(|m| m.role() == "tool")
        .and_then(Message::text)
        .expect("tool message");
    assert!(tool.contains("launch_rocket is not available"), "{tool}");
    assert_eq!(engine.runs(), 2);
}

#[tokio::test]
async fn a_panicking_handler_is_reported_and_the_model_gets_a_failed_result_without_the_panic_text()
{
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "explode", json!({}))],
        vec![say("That failed.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("explode"),
        |_p| async move { panic!("secret internal detail") },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, errors) = bot.stop().await;
    assert!(
        errors.iter().any(|e| e.contains("secret internal detail")),
        "{errors:?}"
    );
    let all = serde_json::to_string(&json_of(&messages)).expect("json");
    assert!(!all.contains("secret internal detail"));
    assert!(all.contains("failed and returned no result"));
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_call_is_cancelled_and_the_llm_runs() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "hang", json!({}))],
        vec![say("It took too long.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("hang"),
        |_p| async move { std::future::pending::<()>().await },
        FunctionOptions {
            timeout: Some(Duration::from_secs(5)),
            ..FunctionOptions::default()
        },
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let tool = messages
        .iter()
        .find(|m| m.role() == "tool")
        .and_then(Message::text);
    assert_eq!(tool, Some("CANCELLED"));
    assert_eq!(engine.runs(), 2);
}

#[tokio::test]
async fn an_async_call_delivers_started_intermediate_and_final_messages() {
    let engine = ScriptedLlm::new(vec![
        vec![call("t1", "set_timer", json!({"seconds": 1}))],
        vec![say("Timer set.")],
        vec![say("Halfway.")],
        vec![say("Ding!")],
    ]);
    let (go_tx, go_rx) = mpsc::unbounded_channel::<()>();
    let go_rx = Arc::new(tokio::sync::Mutex::new(go_rx));
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("set_timer"),
        move |p| {
            let go = go_rx.clone();
            async move {
                let mut go = go.lock().await;
                go.recv().await;
                p.result_callback
                    .deliver(json!({"remaining": 0.5}), ResultProperties::intermediate());
                go.recv().await;
                p.result_callback.done(json!({"rang": true}));
            }
        },
        FunctionOptions::asynchronous(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await; // the tool call, then "Timer set." while the timer runs
    go_tx.send(()).expect("go");
    bot.responses(1).await; // "Halfway."
    go_tx.send(()).expect("go");
    bot.responses(1).await; // "Ding!"
    let (messages, _) = bot.stop().await;
    let kinds: Vec<AsyncToolMessageKind> = messages
        .iter()
        .filter_map(parse_message)
        .map(|p| p.kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            AsyncToolMessageKind::Started,
            AsyncToolMessageKind::Intermediate,
            AsyncToolMessageKind::Final
        ]
    );
    assert_eq!(engine.runs(), 4);
    let first = &engine.requests.lock().expect("lock")[0];
    assert!(
        first.messages[0]
            .text()
            .is_some_and(|s| s.contains("async_tool")),
        "async instructions added"
    );
}

#[tokio::test]
async fn interruption_cancels_sync_calls_but_not_async_ones() {
    let engine = ScriptedLlm::new(vec![
        vec![
            call("s1", "lookup", json!({})),
            call("a1", "background", json!({})),
        ],
        vec![say("Working on it.")],
    ]);
    let (done_tx, background) = held_until_released(json!("finished"));
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("lookup"),
        |_p| async move { std::future::pending::<()>().await },
        FunctionOptions::default(),
    );
    llm.register_function(
        Some("background"),
        background,
        FunctionOptions::asynchronous(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(1).await;
    bot.handle
        .queue_frame(SystemFrame::Interruption)
        .await
        .expect("queued");
    // The async call survives the interruption and still delivers.
    done_tx.send(()).expect("done");
    loop {
        let finished = bot
            .context
            .messages()
            .iter()
            .filter_map(parse_message)
            .any(|p| p.kind == AsyncToolMessageKind::Final);
        if finished {
            break;
        }
        bot.frames.recv().await.expect("frames");
    }
    let (messages, _) = bot.stop().await;
    let sync_result = messages.iter().find_map(|m| match m {
        Message::Tool(t) if t.tool_call_id == "s1" => m.text(),
        _ => None,
    });
    assert_eq!(sync_result, Some("CANCELLED"));
}

#[tokio::test]
async fn a_result_during_the_users_turn_runs_the_llm_when_the_turn_ends() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "get_time", json!({}))],
        vec![say("It is noon.")],
    ]);
    let (release_tx, get_time) = held_until_released(json!("12:00"));
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(Some("get_time"), get_time, FunctionOptions::default());
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(1).await;
    bot.handle
        .queue_frame(SystemFrame::UserStartedSpeaking)
        .await
        .expect("queued");
    release_tx.send(()).expect("release");
    // Wait until the result is in the context: the LLM must not have run yet.
    while !bot
        .context
        .messages()
        .iter()
        .any(|m| m.text() == Some("\"12:00\""))
    {
        bot.frames.recv().await.expect("frames");
    }
    assert_eq!(engine.runs(), 1, "the LLM ran while the user was speaking");
    bot.handle
        .queue_frame(SystemFrame::UserStoppedSpeaking)
        .await
        .expect("queued");
    bot.responses(1).await;
    assert_eq!(engine.runs(), 2);
    bot.stop().await;
}

#[tokio::test]
async fn the_model_can_cancel_a_running_async_call() {
    let engine = ScriptedLlm::new(vec![
        vec![call("t1", "set_timer", json!({"seconds": 600}))],
        vec![say("Timer set.")],
        vec![call("x1", "cancel_set_timer", json!({}))],
        vec![say("Cancelled it.")],
    ]);
    let mut llm = LlmService::with_options(engine.clone(), LlmServiceOptions::default());
    llm.register_function(
        Some("set_timer"),
        |_p| async move { std::future::pending::<()>().await },
        FunctionOptions {
            cancellable_by_llm: true,
            ..FunctionOptions::asynchronous()
        },
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    assert!(
        engine.requests.lock().expect("lock")[0]
            .tools
            .standard_tools
            .iter()
            .any(|t| t.name == "cancel_set_timer")
    );
    bot.context
        .lock()
        .messages
        .push(Message::user("cancel the timer"));
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let cancel_result = messages.iter().find_map(|m| match m {
        Message::Tool(t) if t.tool_call_id == "x1" => m.text(),
        _ => None,
    });
    assert!(
        cancel_result.is_some_and(|r| r.contains("Cancelled the set_timer call t1")),
        "{cancel_result:?}"
    );
    assert!(
        messages
            .iter()
            .filter_map(parse_message)
            .any(|p| p.is_cancelled())
    );
}

/// Runs `cancel_set_timer` with `args` while the timers `running` run; returns what the model was
/// told and how many timers were cancelled.
async fn cancel_outcome(running: &[&str], args: Value) -> (String, usize) {
    let mut script = Vec::new();
    if !running.is_empty() {
        script.push(
            running
                .iter()
                .map(|id| call(id, "set_timer", json!({"seconds": 600})))
                .collect(),
        );
        script.push(vec![say("Timers set.")]);
    }
    script.push(vec![call("x1", "cancel_set_timer", args)]);
    script.push(vec![say("Done.")]);
    let engine = ScriptedLlm::new(script);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("set_timer"),
        |_p| async move { std::future::pending::<()>().await },
        FunctionOptions {
            cancellable_by_llm: true,
            ..FunctionOptions::asynchronous()
        },
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    if !running.is_empty() {
        bot.responses(2).await;
        bot.context.lock().messages.push(Message::user("cancel it"));
        bot.run_llm().await;
    }
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let told = messages
        .iter()
        .find_map(|m| match m {
            Message::Tool(t) if t.tool_call_id == "x1" => m.text().map(str::to_owned),
            _ => None,
        })
        .expect("the cancel call has a result");
    let cancelled = messages
        .iter()
        .filter_map(parse_message)
        .filter(|p| p.is_cancelled())
        .count();
    (told, cancelled)
}

#[tokio::test]
async fn cancel_tool_with_nothing_running_says_so() {
    let (told, cancelled) = cancel_outcome(&[], json!({})).await;
    assert_eq!(
        told,
        "\"No set_timer call is running; nothing was cancelled.\""
    );
    assert_eq!(cancelled, 0);
}

#[tokio::test]
async fn cancel_tool_with_an_unknown_id_cancels_nothing() {
    let (told, cancelled) = cancel_outcome(&["t1"], json!({"tool_call_id": "nope"})).await;
    assert!(
        told.contains("no running set_timer call with id nope"),
        "{told}"
    );
    assert_eq!(cancelled, 0);
}

#[tokio::test]
async fn cancel_tool_with_several_running_and_no_id_lists_them() {
    let (told, cancelled) = cancel_outcome(&["t1", "t2"], json!({})).await;
    assert!(
        told.contains("Several set_timer calls are running"),
        "{told}"
    );
    assert!(told.contains("t1") && told.contains("t2"), "{told}");
    assert_eq!(cancelled, 0);
}

#[tokio::test]
async fn cancel_tool_with_an_id_cancels_that_call_only() {
    let (told, cancelled) = cancel_outcome(&["t1", "t2"], json!({"tool_call_id": "t2"})).await;
    assert!(told.contains("Cancelled the set_timer call t2"), "{told}");
    assert_eq!(cancelled, 1);
}

#[tokio::test]
async fn a_result_after_the_call_settled_is_dropped() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "twice", json!({}))],
        vec![say("Got it.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("twice"),
        |p| async move {
            p.result_callback.done(json!("first"));
            p.result_callback.done(json!("second"));
        },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let results: Vec<_> = messages
        .iter()
        .filter(|m| m.role() == "tool")
        .filter_map(Message::text)
        .collect();
    assert_eq!(results, vec!["\"first\""]);
    assert_eq!(engine.runs(), 2);
}

#[tokio::test]
async fn a_handler_may_return_at_once_and_deliver_later() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "later", json!({}))],
        vec![say("Done.")],
    ]);
    let (release_tx, release_rx) = mpsc::unbounded_channel::<()>();
    let release_rx = Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("later"),
        move |p| {
            let rx = release_rx.clone();
            async move {
                let Some(mut rx) = rx.lock().await.take() else {
                    return;
                };
                let callback = p.result_callback.clone();
                tokio::spawn(async move {
                    rx.recv().await;
                    callback.done(json!("late but fine"));
                });
            }
        },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(1).await;
    assert_eq!(engine.runs(), 1, "nothing runs before the result");
    release_tx.send(()).expect("release");
    bot.responses(1).await;
    let (messages, _) = bot.stop().await;
    assert!(
        messages
            .iter()
            .any(|m| m.text() == Some("\"late but fine\""))
    );
}

#[tokio::test]
async fn on_context_updated_runs_once_the_result_is_in_the_context() {
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "note", json!({}))],
        vec![say("Noted.")],
    ]);
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel::<()>();
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("note"),
        move |p| {
            let seen_tx = seen_tx.clone();
            async move {
                let properties = ResultProperties {
                    on_context_updated: Some(OnContextUpdated::new(move || {
                        let _ = seen_tx.send(());
                    })),
                    ..ResultProperties::final_result()
                };
                p.result_callback.deliver(json!("ok"), properties);
            }
        },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    seen_rx.recv().await.expect("called");
    assert!(
        bot.context
            .messages()
            .iter()
            .any(|m| m.text() == Some("\"ok\""))
    );
    bot.responses(2).await;
    bot.stop().await;
    assert!(seen_rx.try_recv().is_err(), "called exactly once");
}

#[tokio::test]
async fn without_grouping_each_result_runs_the_llm() {
    let engine = ScriptedLlm::new(vec![
        vec![call("a", "echo", json!({})), call("b", "echo", json!({}))],
        vec![say("One.")],
        vec![say("Two.")],
    ]);
    let options = LlmServiceOptions {
        group_parallel_tools: false,
        run_in_parallel: false,
        ..LlmServiceOptions::default()
    };
    let (release_tx, echo) = held_until_released(json!("echo"));
    let mut llm = LlmService::with_options(engine.clone(), options);
    llm.register_function(Some("echo"), echo, FunctionOptions::default());
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(1).await;
    release_tx.send(()).expect("release");
    bot.responses(1).await;
    assert_eq!(engine.runs(), 2, "the first result ran the LLM on its own");
    release_tx.send(()).expect("release");
    bot.responses(1).await;
    let (messages, _) = bot.stop().await;
    assert_eq!(engine.runs(), 3);
    let settled: Vec<_> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool(t) if m.text() != Some("IN_PROGRESS") => Some(t.tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(settled, vec!["a", "b"]);
}

#[tokio::test]
async fn tool_calls_appear_once_each_on_the_session_event_stream() {
    let engine = ScriptedLlm::new(vec![
        vec![
            call("s1", "get_time", json!({"tz": "UTC"})),
            call("t1", "timer", json!({})),
        ],
        vec![say("Working.")],
        vec![say("Halfway.")],
        vec![say("Rang.")],
    ]);
    let (release_tx, release_rx) = mpsc::unbounded_channel::<()>();
    let release_rx = Arc::new(tokio::sync::Mutex::new(release_rx));
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("get_time"),
        |p| async move { p.result_callback.done(json!("12:00")) },
        FunctionOptions::default(),
    );
    llm.register_function(
        Some("timer"),
        move |p| {
            let release = release_rx.clone();
            async move {
                let mut release = release.lock().await;
                release.recv().await;
                p.result_callback
                    .deliver(json!("halfway"), ResultProperties::intermediate());
                release.recv().await;
                p.result_callback.done(json!({"rang": true}));
            }
        },
        FunctionOptions::asynchronous(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    release_tx.send(()).expect("release");
    bot.responses(1).await;
    release_tx.send(()).expect("release");
    bot.responses(1).await;
    let (_, _, events) = bot.stop_with_events().await;
    let tool_events: Vec<Value> = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::ToolCallStarted { .. }
                    | Event::ToolCallIntermediate { .. }
                    | Event::ToolCallResult { .. }
                    | Event::ToolCallCancelled { .. }
            )
        })
        .map(|e| serde_json::to_value(e).expect("json"))
        .collect();
    assert_eq!(
        tool_events,
        vec![
            json!({"type": "tool_call_started", "name": "get_time", "tool_call_id": "s1", "arguments": {"tz": "UTC"}}),
            json!({"type": "tool_call_started", "name": "timer", "tool_call_id": "t1", "arguments": {}}),
            json!({"type": "tool_call_result", "name": "get_time", "tool_call_id": "s1", "result": "12:00"}),
            json!({"type": "tool_call_intermediate", "name": "timer", "tool_call_id": "t1", "result": "halfway"}),
            json!({"type": "tool_call_result", "name": "timer", "tool_call_id": "t1", "result": {"rang": true}}),
        ]
    );
}

#[tokio::test]
async fn cancellations_are_events_with_their_reason() {
    let engine = ScriptedLlm::new(vec![vec![call("s1", "lookup", json!({}))]]);
    let mut llm = LlmService::new(engine.clone());
    llm.register_function(
        Some("lookup"),
        |_p| async move { std::future::pending::<()>().await },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(1).await;
    bot.handle
        .queue_frame(SystemFrame::Interruption)
        .await
        .expect("queued");
    let (_, _, events) = bot.stop_with_events().await;
    let cancelled: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallCancelled {
                tool_call_id,
                reason,
                ..
            } => Some((tool_call_id.clone(), *reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        cancelled,
        vec![("s1".to_owned(), CancelReason::Interruption)]
    );
}

/// An engine whose every completion stays silent forever.
struct SilentLlm;

impl LlmEngine for SilentLlm {
    fn model(&self) -> &str {
        "silent"
    }

    fn provider(&self) -> &str {
        "test"
    }

    fn generate(&self, _request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        Box::pin(stream::pending())
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_llm_times_out_with_an_error_and_an_event() {
    let options = LlmServiceOptions {
        completion_timeout: Duration::from_secs(10),
        ..LlmServiceOptions::default()
    };
    let mut bot = Bot::start(LlmService::with_options(SilentLlm, options));
    bot.run_llm().await;
    bot.responses(1).await;
    let (_, errors, events) = bot.stop_with_events().await;
    assert!(
        errors.iter().any(|e| e.contains("no answer for 10 s")),
        "{errors:?}"
    );
    assert!(events.contains(&Event::LlmCompletionTimeout { seconds: 10.0 }));
}

#[tokio::test]
async fn responses_carry_usage_cost_and_stop_reason_and_the_context_reports_them_per_turn() {
    let usage = |input, output| {
        LlmEvent::Usage(TokenUsage {
            input,
            output,
            ..TokenUsage::default()
        })
    };
    let engine = ScriptedLlm::new(vec![
        vec![
            say("Let me check. "),
            call("c1", "get_time", json!({})),
            usage(1_000, 10),
        ],
        vec![say("It is noon."), usage(2_000, 20)],
        vec![
            LlmEvent::Thinking("short answer".into()),
            say("Bye."),
            usage(3_000, 30),
            LlmEvent::Finished(StopReason::Length),
        ],
    ]);
    let options = LlmServiceOptions {
        prices: PriceTable::empty().with("scripted", Price::flat(1.0, 100.0)),
        ..LlmServiceOptions::default()
    };
    let mut llm = LlmService::with_options(engine.clone(), options);
    llm.register_function(
        Some("get_time"),
        |p| async move { p.result_callback.done(json!("12:00")) },
        FunctionOptions::default(),
    );
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    bot.context.lock().messages.push(Message::user("bye"));
    bot.run_llm().await;
    bot.responses(1).await;
    let report = bot.context.snapshot().usage_report();
    let (messages, _, events) = bot.stop_with_events().await;

    let metas: Vec<_> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Assistant(a) => a.meta.as_deref(),
            _ => None,
        })
        .collect();
    assert_eq!(metas.len(), 3);
    // The first response said something, then called: its metadata sits on the call message.
    assert_eq!(
        metas[0].blocks,
        vec![
            ContentBlock::Text("Let me check. ".into()),
            ContentBlock::ToolCall(voxide::context::ToolCall::function(
                "c1",
                "get_time",
                &json!({})
            )),
        ]
    );
    assert_eq!(metas[0].stop_reason, StopReason::ToolUse);
    assert_eq!(metas[0].cost_usd, Some(0.002));
    assert_eq!(metas[1].stop_reason, StopReason::Stop);
    assert_eq!(metas[2].stop_reason, StopReason::Length);
    assert_eq!(
        metas[2].blocks[0],
        ContentBlock::Thinking("short answer".into())
    );
    assert_eq!(
        (metas[2].provider.as_str(), metas[2].model.as_str()),
        ("test", "scripted")
    );
    // The text before the call precedes the call, in one message, as the model wrote it.
    let roles: Vec<_> = messages.iter().map(Message::role).collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant"
        ]
    );
    let Message::Assistant(first) = &messages[2] else {
        panic!("an assistant message: {messages:?}");
    };
    assert_eq!(
        first
            .content
            .clone()
            .flatten()
            .map(|c| c.joined_text())
            .as_deref(),
        Some("Let me check.")
    );
    assert_eq!(first.tool_calls.as_ref().map(Vec::len), Some(1));

    assert_eq!(report.turns.len(), 2);
    assert_eq!(report.turns[0].responses, 2);
    assert_eq!(report.turns[0].usage.input, 3_000);
    assert!((report.turns[0].cost_usd - (0.002 + 0.004)).abs() < 1e-12);
    assert_eq!(report.turns[1].responses, 1);
    assert_eq!(report.total.usage.total(), 6_060);
    assert!((report.total.cost_usd - 0.012).abs() < 1e-12);
    assert_eq!(report.total.unpriced, 0);

    let costs: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Metrics { data } => data.iter().find_map(|d| match d {
                voxide::frames::MetricsData::LlmUsage { cost_usd, .. } => *cost_usd,
                _ => None,
            }),
            _ => None,
        })
        .collect();
    assert_eq!(costs.len(), 3);
}

#[tokio::test]
async fn an_interrupted_response_is_kept_and_marked_aborted() {
    let engine = ScriptedLlm::new(vec![vec![say("I was saying")]]);
    let mut bot = Bot::start(LlmService::new(engine.clone()));
    // Hold the response open: the interruption arrives between its text and its end.
    bot.handle
        .queue_frame(voxide::frames::ControlFrame::LlmFullResponseStart)
        .await
        .expect("queued");
    bot.handle
        .queue_frame(DataFrame::LlmText("I was saying".into()))
        .await
        .expect("queued");
    while bot.frames.recv().await.as_deref() != Some("llm_text") {}
    bot.handle
        .queue_frame(SystemFrame::Interruption)
        .await
        .expect("queued");
    while bot.frames.recv().await.as_deref() != Some("interruption") {}
    let (messages, _) = bot.stop().await;
    let Some(Message::Assistant(last)) = messages.last() else {
        panic!("no assistant message: {messages:?}");
    };
    assert_eq!(
        messages.last().and_then(Message::text),
        Some("I was saying")
    );
    assert_eq!(
        last.meta.as_ref().map(|m| m.stop_reason),
        Some(StopReason::Aborted)
    );
}
