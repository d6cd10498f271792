//! Flows: the shipped booking line and a Pipecat Flows JSON file walked node by node through the
//! LLM service with a scripted model, every request checked for the node's prompt and tools; and
//! no dead air while a tool works (a filler line or a thinking sound, once); and a long call
//! folded into summaries in the background.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use common::scripted::{Bot, ScriptedLlm, call, say};
use voxide::bot::call_control::CallControl;
use voxide::bot::filler::{FillerParams, ToolFiller};
use voxide::config::BotConfig;
use voxide::context::{ContextHandle, LlmContext, Message};
use voxide::events::EndReason;
use voxide::flows::{Flow, FlowOptions, FlowSession};
use voxide::pipeline::{AppResources, Pipeline};
use voxide::services::llm::{
    ContextSummarizer, FunctionOptions, LlmEngine, LlmError, LlmEvent, LlmRequest, LlmService,
};

fn flow(file: &str) -> (Arc<Flow>, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/bots")
        .join(file);
    let options = BotConfig::load(&path)
        .expect("the bot file loads")
        .resolve()
        .expect("the bot file resolves");
    (options.flow.expect("a flow"), options.instructions)
}

/// The scripted model behind a flow session: the LLM service, the flow's stage, the context at
/// the initial node.
fn start(
    flow: Arc<Flow>,
    instructions: &str,
    llm: ScriptedLlm,
    tools: impl FnOnce(&mut LlmService),
) -> (Bot, FlowSession) {
    let session = FlowSession::new(flow, instructions, FlowOptions::default());
    let mut service = LlmService::new(llm);
    tools(&mut service);
    session.register(service.functions());
    let context = ContextHandle::new(session.initial_context());
    let front = Pipeline::new()
        .then(service)
        .then(session.stage(context.clone()));
    (
        Bot::start_in(front, context, AppResources::default()),
        session,
    )
}

fn system(request: &LlmRequest) -> String {
    request
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::System(_) => m.text().map(str::to_owned),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn tools(request: &LlmRequest) -> Vec<String> {
    request
        .tools
        .standard_tools
        .iter()
        .map(|t| t.name.clone())
        .collect()
}

#[tokio::test]
async fn the_booking_line_walks_its_nodes_and_each_request_carries_the_nodes_task_and_tools() {
    let (flow, instructions) = flow("booking.toml");
    let llm = ScriptedLlm::new(vec![
        vec![say("Chez Voxide, hello! Would you like a table?")],
        vec![call("c1", "wants_table", json!({}))],
        vec![say("For how many, and which day?")],
        vec![call(
            "c2",
            "collect_booking",
            json!({"party_size": 4, "day": "Friday"}),
        )],
        vec![say("A table for four on Friday: is that right?")],
        vec![call("c3", "confirm_booking", json!({}))],
        vec![say("Under what name?")],
        vec![call("c4", "take_name", json!({"name": "Ada"}))],
        vec![say("Thank you, Ada. Goodbye!")],
    ]);
    let (mut bot, session) = start(flow, &instructions, llm.clone(), |_| {});
    // The initial node answers at once: the bot speaks first.
    bot.responses(1).await;
    bot.user_says("Yes, please.", 2).await;
    bot.user_says("Four of us, on Friday.", 2).await;
    bot.user_says("Yes, that's right.", 3).await;
    bot.user_says("Ada.", 2).await;
    // The goodbye node's post-action ends the call once its answer is out.
    assert_eq!(bot.session.join().await, EndReason::Completed);

    assert_eq!(
        session.visited(),
        ["greet", "collect", "confirm", "book", "goodbye"]
    );
    let state = session.state();
    assert_eq!(state["party_size"], 4);
    assert_eq!(state["day"], "Friday");
    assert_eq!(state["name"], "Ada");

    let requests = llm.requests.lock().expect("lock").clone();
    assert_eq!(requests.len(), 9, "{requests:#?}");
    // Request by request: the node's task (its state filled in) and only its functions.
    let expect = [
        ("Greet the caller", vec!["wants_table"]),
        ("Greet the caller", vec!["wants_table"]),
        ("Ask how many people", vec!["collect_booking"]),
        ("Ask how many people", vec!["collect_booking"]),
        (
            "a table for 4 on Friday, and ask",
            vec!["confirm_booking", "change_booking"],
        ),
        (
            "a table for 4 on Friday, and ask",
            vec!["confirm_booking", "change_booking"],
        ),
        ("A table for 4 on Friday is booked", vec!["take_name"]),
        ("A table for 4 on Friday is booked", vec!["take_name"]),
        ("Thank Ada by name", vec![]),
    ];
    for (i, (request, (task, offered))) in requests.iter().zip(expect).enumerate() {
        let system = system(request);
        assert!(
            system.starts_with("You are the booking line of Chez Voxide"),
            "request {i}: {system}"
        );
        assert!(
            system.contains(task),
            "request {i} lacks {task:?}: {system}"
        );
        assert_eq!(tools(request), offered, "request {i}");
    }
    // Appending, the conversation grows: the confirm node still hears the greeting.
    let confirm = &requests[4].messages;
    assert!(
        confirm.iter().any(|m| m.text() == Some("Yes, please.")),
        "{confirm:#?}"
    );
    assert!(!system(&requests[4]).contains("{state."), "filled in");
    // The book node resets: its role and its task, none of what came before.
    let book = &requests[6].messages;
    assert!(book.len() <= 3, "{book:#?}");
    assert!(system(&requests[6]).contains("is booked. Ask for the name"));
    assert!(
        book.iter().all(|m| m.text() != Some("Yes, please.")),
        "{book:#?}"
    );
    // Its pre-action was said, and written into the conversation, before its answer.
    let said: Vec<String> = bot
        .context
        .messages()
        .iter()
        .filter(|m| matches!(m, Message::Assistant(_)))
        .filter_map(|m| m.text().map(str::to_owned))
        .collect();
    assert_eq!(
        said,
        [
            "Lovely, that's booked.",
            "Under what name?",
            "Thank you, Ada. Goodbye!"
        ]
    );
}

#[tokio::test]
async fn a_pipecat_flow_from_json_runs_with_a_bot_tool_that_does_the_work_before_moving_on() {
    let (flow, instructions) = flow("clinic.json");
    // The JSON names `pick_slot` as a function of its own; the bot here also has a tool of that
    // name, which books the slot: its result comes back and the flow moves on.
    let llm = ScriptedLlm::new(vec![
        vec![say("Riverside clinic, hello.")],
        vec![call("c1", "appointment", json!({}))],
        vec![say("Which slot suits you?")],
        vec![call("c2", "pick_slot", json!({"slot": "Tuesday morning"}))],
        vec![say("Booked for Tuesday morning. Goodbye!")],
    ]);
    let (mut bot, session) = start(flow, &instructions, llm.clone(), |service| {
        service.functions().register_function(
            Some("pick_slot"),
            |params| async move {
                let slot = params.arguments["slot"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                params
                    .result_callback
                    .done(json!({"booked": slot, "room": 3}));
            },
            FunctionOptions::default(),
        );
    });
    bot.responses(1).await;
    bot.user_says("I'd like an appointment.", 2).await;
    bot.user_says("Tuesday morning.", 2).await;
    assert_eq!(bot.session.join().await, EndReason::Completed);

    assert_eq!(session.visited(), ["reception", "appointment", "done"]);
    let requests = llm.requests.lock().expect("lock").clone();
    assert!(system(&requests[0]).starts_with("You answer the phone for the Riverside clinic."));
    assert_eq!(
        tools(&requests[0]),
        ["appointment", "billing", "get_current_time"]
    );
    assert_eq!(tools(&requests[2]), ["pick_slot", "get_current_time"]);
    let described = &requests[2].tools.standard_tools[0];
    assert_eq!(described.description, "Books the slot the caller chose.");
    // The tool's own result is what the model reads back.
    let result = requests[4]
        .messages
        .iter()
        .find_map(|m| match m {
            Message::Tool(t) if t.tool_call_id == "c2" => Some(t.content.joined_text()),
            _ => None,
        })
        .expect("pick_slot's result");
    assert!(result.contains("\"room\": 3"), "{result}");
    assert_eq!(session.state()["slot"], "Tuesday morning");
}

#[test]
fn a_flow_bot_file_that_leads_nowhere_says_where() {
    let dir = common::bot_run::scratch();
    let path = dir.join("broken.toml");
    std::fs::write(
        &path,
        "[[node]]\nname = \"a\"\ntask = \"x\"\n[[node.function]]\nname = \"go\"\ntransition_to = \"b\"\n",
    )
    .expect("write");
    let e = BotConfig::load(&path)
        .expect("parses")
        .resolve()
        .expect_err("b is no node")
        .to_string();
    assert!(e.contains("\"b\"") && e.contains("no node"), "{e}");
    let json = dir.join("bad.json");
    std::fs::write(&json, r#"{"initial_node": "a", "nodes": {"a": {"task_messages": [], "pre_actions": [{"type": "function", "handler": "h"}]}}}"#).expect("write");
    let e = BotConfig::load(&json)
        .expect("parses")
        .resolve()
        .expect_err("python")
        .to_string();
    assert!(e.contains("bad.json") && e.contains("\"function\""), "{e}");
}

#[test]
fn a_flow_on_gemini_live_is_checked_like_one_on_openai_realtime() {
    let dir = common::bot_run::scratch();
    let check = |name: &str, llm: &str, node: &str| {
        let path = dir.join(name);
        let file = format!(
            "llm = \"{llm}\"\n[[node]]\nname = \"desk\"\ntask = \"Ask how to help.\"\n{node}"
        );
        std::fs::write(&path, file).expect("write");
        std::process::Command::new(env!("CARGO_BIN_EXE_voxide"))
            .args(["check", "--bot"])
            .arg(&path)
            .env("GEMINI_API_KEY", "g-test")
            .env("OPENAI_API_KEY", "sk-test")
            .output()
            .expect("voxide runs")
    };
    for llm in ["gemini-live", "openai-realtime"] {
        let fine = check("live.toml", llm, "");
        assert!(
            fine.status.success(),
            "{llm}: {}",
            String::from_utf8_lossy(&fine.stderr)
        );
        // The provider holds the conversation: a node that resets it is refused by name.
        let reset = check("reset.toml", llm, "context_strategy = \"reset\"\n");
        let stderr = String::from_utf8_lossy(&reset.stderr);
        assert!(!reset.status.success(), "{llm}");
        assert!(
            stderr.contains("\"desk\"") && stderr.contains("appends"),
            "{llm}: {stderr}"
        );
    }
}

/// Frame names at the sink up to the first phone action (a transfer, keys pressed), which
/// must come within 10 s.
async fn until_phone(bot: &mut Bot) -> Vec<String> {
    let mut seen = Vec::new();
    let came = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(name) = bot.frames.recv().await {
            let phone = name == "phone";
            seen.push(name);
            if phone {
                return;
            }
        }
    })
    .await;
    assert!(came.is_ok(), "no phone action: {seen:?}");
    seen
}

/// Frame names at the sink until `n` responses have ended.
async fn frames_until(bot: &mut Bot, n: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let mut ends = 0;
    while ends < n {
        let name = bot.frames.recv().await.expect("the session runs");
        ends += usize::from(name == "llm_full_response_end");
        seen.push(name);
    }
    seen
}

/// The LLM service with a tool `lookup` that takes `took`, behind a filler.
fn waiting_bot(took: Duration, lines: &[&str]) -> Bot {
    let llm = ScriptedLlm::new(vec![
        vec![call("c1", "lookup", json!({}))],
        vec![say("Found it.")],
    ]);
    let mut service = LlmService::new(llm);
    service.functions().register_function(
        Some("lookup"),
        move |params| async move {
            tokio::time::sleep(took).await;
            params.result_callback.done(json!({"found": true}));
        },
        FunctionOptions::default(),
    );
    let filler = ToolFiller::new(FillerParams {
        after: Duration::from_millis(1_500),
        lines: lines.iter().map(|l| (*l).to_owned()).collect(),
        speak_progress: false,
    });
    let context = ContextHandle::new(LlmContext::new(vec![
        Message::system("You are a test bot."),
        Message::user("Where is my order?"),
    ]));
    Bot::start_in(
        Pipeline::new().then(service).then(filler),
        context,
        AppResources::default(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_slow_tool_gets_exactly_one_filler_line_kept_out_of_the_conversation() {
    let mut bot = waiting_bot(Duration::from_secs(3), &["One moment.", "Still looking."]);
    bot.run_llm().await;
    let seen = frames_until(&mut bot, 2).await;
    assert_eq!(seen.iter().filter(|n| *n == "text").count(), 1, "{seen:?}");
    let (messages, errors) = bot.stop().await;
    assert_eq!(errors, Vec::<String>::new());
    assert!(
        messages.iter().all(|m| m.text() != Some("One moment.")),
        "{messages:#?}"
    );
    assert_eq!(messages.last().and_then(Message::text), Some("Found it."));
}

#[tokio::test(start_paused = true)]
async fn an_async_tools_progress_is_spoken_as_it_comes_and_kept_out_of_the_conversation() {
    let llm = ScriptedLlm::new(vec![
        vec![call("c1", "count_stock", json!({}))],
        vec![say("I'm counting; I'll tell you.")],
        vec![say("All 40 are in stock.")],
    ]);
    let mut service = LlmService::new(llm);
    service.functions().register_function(
        Some("count_stock"),
        |params| async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            params.result_callback.deliver(
                json!({"message": "Half the shelves are counted.", "counted": 20}),
                voxide::services::llm::ResultProperties::intermediate(),
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            params.result_callback.done(json!({"in_stock": 40}));
        },
        FunctionOptions::asynchronous(),
    );
    let filler = ToolFiller::new(FillerParams {
        after: Duration::from_millis(1_500),
        lines: vec!["One moment.".into()],
        speak_progress: true,
    });
    let context = ContextHandle::new(LlmContext::new(vec![
        Message::system("You are a test bot."),
        Message::user("How many are in stock?"),
    ]));
    let mut bot = Bot::start_in(
        Pipeline::new().then(service).then(filler),
        context,
        AppResources::default(),
    );
    bot.run_llm().await;
    let seen = frames_until(&mut bot, 3).await;
    // The progress once, said between the answers; no filler (the talk went on).
    assert_eq!(seen.iter().filter(|n| *n == "text").count(), 1, "{seen:?}");
    let (messages, errors) = bot.stop().await;
    assert_eq!(errors, Vec::<String>::new());
    assert!(
        !messages
            .iter()
            .any(|m| m.text() == Some("Half the shelves are counted."))
    );
    assert_eq!(
        messages.last().and_then(Message::text),
        Some("All 40 are in stock.")
    );
}

#[tokio::test(start_paused = true)]
async fn end_call_ends_the_session_behind_the_goodbye_and_the_model_says_nothing_after() {
    let llm = ScriptedLlm::new(vec![
        vec![say("Your cake is ready on Friday. Anything else?")],
        vec![say("Goodbye, Ada!"), call("c1", "end_call", json!({}))],
    ]);
    let mut service = LlmService::new(llm.clone());
    voxide::bot::tools::register(service.functions(), &[voxide::bot::Builtin::EndCall]);
    let context = ContextHandle::new(LlmContext::new(vec![
        Message::system("You are a bakery calling about an order."),
        Message::user("Hello?"),
    ]));
    let mut bot = Bot::start_in(
        Pipeline::new()
            .then(service)
            .then(CallControl::new(Vec::new())),
        context.clone(),
        AppResources::default(),
    );
    // An answer without the tool leaves the call up: the next turn is answered.
    bot.run_llm().await;
    bot.responses(1).await;
    bot.user_says("No, that's all, thanks.", 1).await;
    assert_eq!(bot.session.join().await, EndReason::Completed);
    assert_eq!(llm.runs(), 2, "no answer after end_call");
    let messages = context.messages();
    assert!(
        messages.iter().any(|m| m.text() == Some("Goodbye, Ada!")),
        "the goodbye was said: {messages:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn send_dtmf_presses_the_keys_behind_the_answer_and_bad_keys_are_the_models_to_fix() {
    let llm = ScriptedLlm::new(vec![
        vec![
            say("Choosing billing."),
            call("c1", "send_dtmf", json!({"keys": "2 #"})),
        ],
        vec![call("c2", "send_dtmf", json!({"keys": "call me"}))],
        vec![say("Those were not keys.")],
    ]);
    let mut service = LlmService::new(llm.clone());
    voxide::bot::tools::register(service.functions(), &[voxide::bot::Builtin::SendDtmf]);
    let context = ContextHandle::new(LlmContext::new(vec![
        Message::system("You navigate phone menus."),
        Message::user("For billing, press 2, then the pound key."),
    ]));
    let mut bot = Bot::start_in(
        Pipeline::new()
            .then(service)
            .then(CallControl::new(Vec::new())),
        context,
        AppResources::default(),
    );
    bot.run_llm().await;
    // The keys go to the line once the answer's words have gone; the model is not run again.
    let seen = until_phone(&mut bot).await;
    let words = seen.iter().position(|n| n == "llm_text");
    let end = seen.iter().position(|n| n == "llm_full_response_end");
    assert!(words < end && end < Some(seen.len() - 1), "{seen:?}");
    assert_eq!(llm.runs(), 1);
    // Keys that are not keys come back as an error, and the model answers it.
    bot.user_says("Now say something else.", 2).await;
    let (_, errors) = bot.stop().await;
    assert_eq!(errors, Vec::<String>::new());
    assert_eq!(llm.runs(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_nodes_transfer_post_action_hands_the_call_over_once_its_answer_is_out() {
    let config: BotConfig = toml::from_str(
        r#"
instructions = "You are a front desk."
[transfer]
sales = "sip:2001@pbx.example.com"
[[node]]
name = "greet"
task = "Greet the caller and ask what they need."
[[node.function]]
name = "wants_sales"
description = "The caller wants sales."
transition_to = "handoff"
[[node]]
name = "handoff"
task = "Say you are putting the caller through to sales."
post_actions = [{ type = "transfer", destination = "sales" }]
"#,
    )
    .expect("the bot file parses");
    let options = config.resolve().expect("the bot file resolves");
    let flow = options.flow.expect("a flow");
    let llm = ScriptedLlm::new(vec![
        vec![say("Front desk, how can I help?")],
        vec![call("c1", "wants_sales", json!({}))],
        vec![say("Putting you through to sales.")],
    ]);
    let (mut bot, session) = start(flow, &options.instructions, llm, |_| {});
    bot.responses(1).await;
    bot.run_llm().await;
    // The handoff node's answer goes out, then the transfer: once, after its words.
    let seen = until_phone(&mut bot).await;
    assert_eq!(session.visited(), ["greet", "handoff"]);
    let said = seen.iter().rposition(|n| n == "llm_text");
    assert!(
        said < Some(seen.len() - 1),
        "the words came first: {seen:?}"
    );

    // A destination the table lacks is named when the bot file loads.
    let wrong: BotConfig = toml::from_str(
        "[[node]]\nname = \"a\"\npost_actions = [{ type = \"transfer\", destination = \"x\" }]",
    )
    .expect("parses");
    let e = wrong.resolve().expect_err("no [transfer] x").to_string();
    assert!(e.contains("\"x\""), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_fast_tool_gets_no_filler() {
    let mut bot = waiting_bot(Duration::from_millis(300), &["One moment."]);
    bot.run_llm().await;
    let seen = frames_until(&mut bot, 2).await;
    assert!(
        !seen.iter().any(|n| n == "text" || n == "output_audio"),
        "{seen:?}"
    );
    bot.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_lines_a_slow_tool_gets_one_short_thinking_sound() {
    let mut bot = waiting_bot(Duration::from_secs(3), &[]);
    bot.run_llm().await;
    let seen = frames_until(&mut bot, 2).await;
    let audio = seen.iter().filter(|n| *n == "output_audio").count();
    // 0.75 s of sound in 20 ms frames, once.
    assert_eq!(audio, 38, "{seen:?}");
    assert!(!seen.iter().any(|n| n == "text"));
    bot.stop().await;
}

/// The whole bot (VAD, Smart Turn, Whisper, Piper) on a recorded question, its LLM a stand-in
/// that speaks OpenAI's wire protocol and calls the flow's function.
mod whole_bot {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::common;
    use common::bot_run::run_bot;
    use common::llm_stand_in::{Reply, start as stand_in};
    use voxide::bot::{LlmChoice, TextLlm, Voice};
    use voxide::config::BotConfig;
    use voxide::services::llm::openai::OpenAiSettings;

    const DESK: &str = r#"
name = "desk"
instructions = "You are the booking line of a small restaurant."

[[node]]
name = "greet"
respond_immediately = false
task = "Ask whether the caller would like a table."

[[node.function]]
name = "wants_table"
description = "The caller wants a table."
transition_to = "collect"

[[node]]
name = "collect"
pre_actions = [{ type = "tts_say", text = "Of course." }]
task = "Ask how many people and which day."

[[node.function]]
name = "collect_booking"
description = "Records the party size and the day."
parameters = { type = "object", properties = { party_size = { type = "integer" }, day = { type = "string" } } }
"#;

    fn sse(chunks: &[Value]) -> String {
        let mut out = String::from(": ping\r\n\r\n");
        for chunk in chunks {
            out.push_str(&format!("data: {chunk}\r\n\r\n"));
        }
        out + "data: [DONE]\r\n\r\n"
    }

    fn offered(body: &Value) -> Vec<String> {
        body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A flow for the embedded SmolLM2, taught its one function by examples.
    const TRAVEL: &str = r#"
name = "travel"
instructions = "You are a travel desk. Answer in one short sentence."

[[node]]
name = "start"
respond_immediately = false
task = "Find out what the caller needs."

[[node.function]]
name = "ask_weather"
description = "The caller asks about the weather somewhere."
parameters = { type = "object", properties = { city = { type = "string" } }, required = ["city"] }
transition_to = "weather"

[[node]]
name = "weather"
pre_actions = [{ type = "tts_say", text = "Let me think about the weather there." }]
task = "Say that {state.city} is usually mild at this time of year."

[[example]]
user = "What is the weather like in Rome?"
call = "ask_weather"
arguments = { city = "Rome" }

[[example]]
user = "Is it raining in Oslo today?"
call = "ask_weather"
arguments = { city = "Oslo" }

[[example]]
user = "What's the weather in Paris tomorrow?"
call = "ask_weather"
arguments = { city = "Paris" }

[[example]]
user = "How warm is it in Madrid?"
call = "ask_weather"
arguments = { city = "Madrid" }
"#;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_embedded_model_taught_by_examples_moves_a_flow_on() {
        let path = common::bot_run::scratch().join("travel.toml");
        std::fs::write(&path, TRAVEL).expect("write the bot file");
        let mut bot = BotConfig::load(&path)
            .expect("loads")
            .resolve()
            .expect("resolves");
        bot.voice = Voice::Piper;
        let ran = run_bot(bot, std::path::Path::new(common::HELLO), "travel").await;
        let moves: Vec<&str> = ran
            .events
            .iter()
            .filter(|e| e["type"] == "flow_node")
            .filter_map(|e| e["node"].as_str())
            .collect();
        assert_eq!(moves, ["start", "weather"], "{:?}", ran.summary);
        assert_eq!(ran.summary.tool_calls, ["ask_weather"]);
        assert_eq!(
            ran.summary.bot_text.first().map(String::as_str),
            Some("Let me think about the weather there."),
            "{:?}",
            ran.summary
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_spoken_question_moves_the_flow_on_and_its_next_node_answers_aloud() {
        let call = sse(&[
            json!({"choices": [{"delta": {"role": "assistant", "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function",
                 "function": {"name": "wants_table", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let ask = sse(&[
            json!({"choices": [{"delta": {"role": "assistant", "content": "For how many people, and which day?"}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
        ]);
        let reply = Reply::With(Arc::new(move |body: &Value| {
            if offered(body).contains(&"wants_table".to_owned()) {
                Reply::Stream(call.clone(), 64)
            } else {
                Reply::Stream(ask.clone(), 64)
            }
        }));
        let (addr, llm) = stand_in(vec![reply]).await;
        let path = common::bot_run::scratch().join("desk.toml");
        std::fs::write(&path, DESK).expect("write the bot file");
        let mut bot = BotConfig::load(&path)
            .expect("loads")
            .resolve()
            .expect("resolves");
        bot.llm = LlmChoice::Text(vec![TextLlm::OpenAi(OpenAiSettings {
            base_url: format!("http://{addr}/v1"),
            model: "gpt-4.1-mini".into(),
            ..OpenAiSettings::default()
        })]);
        bot.voice = Voice::Piper;
        let ran = run_bot(bot, std::path::Path::new(common::HELLO), "desk").await;

        assert_eq!(llm.refusals(), Vec::<String>::new());
        let posts = llm.posts();
        assert!(posts.len() >= 2, "{} requests", posts.len());
        // The greet node's request: its task, its one function; then the collect node's.
        let first = &posts[0].body;
        assert_eq!(offered(first), ["wants_table"]);
        assert!(
            first
                .to_string()
                .contains("Ask whether the caller would like a table.")
        );
        let next = &posts.last().expect("a request").body;
        assert_eq!(offered(next), ["collect_booking"]);
        assert!(
            next.to_string()
                .contains("Ask how many people and which day.")
        );
        // Heard: the pre-action at once, then the node's answer.
        let said = ran.summary.bot_text.join(" ");
        assert!(said.starts_with("Of course."), "{said:?}");
        assert!(said.contains("For how many people"), "{said:?}");
        assert_eq!(ran.summary.tool_calls, ["wants_table"]);
        assert_eq!(ran.summary.voice_to_voice_ms.len(), 1, "{:?}", ran.summary);
        eprintln!(
            "voice to voice at the node transition: {:.0} ms",
            ran.summary.voice_to_voice_ms[0]
        );
    }
}

/// Summaries that take three seconds to write, numbered.
#[derive(Clone, Default)]
struct SlowSummaries(Arc<std::sync::atomic::AtomicUsize>);

impl LlmEngine for SlowSummaries {
    fn model(&self) -> &str {
        "summaries"
    }

    fn provider(&self) -> &str {
        "test"
    }

    fn generate(
        &self,
        request: LlmRequest,
    ) -> futures_util::stream::BoxStream<'static, Result<LlmEvent, LlmError>> {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let asked = request
            .messages
            .last()
            .and_then(Message::text)
            .unwrap_or_default()
            .to_owned();
        Box::pin(futures_util::stream::once(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            // What it was asked to cover shows in the summary: the last turn it saw.
            let last = asked
                .lines()
                .rev()
                .find(|l| l.starts_with("User: "))
                .unwrap_or_default()
                .to_owned();
            Ok(LlmEvent::Text(format!("Summary {n}, up to: {last}")))
        }))
    }
}

/// Every async call in `messages` is whole: its call, its started, intermediate and final
/// messages all there or all gone; a call still running is there with what came so far.
fn async_calls_whole(messages: &[Message], running: &str) {
    use voxide::context::async_tool_messages::{AsyncToolMessageKind as Kind, parse_message};
    let mut calls: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for message in messages {
        if let Message::Assistant(a) = message {
            for call in a.tool_calls.iter().flatten() {
                calls.entry(call.id.clone()).or_default().push("call");
            }
        }
        if let Some(p) = parse_message(message) {
            let kind = match p.kind {
                Kind::Started => "started",
                Kind::Intermediate => "intermediate",
                Kind::Final => "final",
            };
            calls.entry(p.tool_call_id).or_default().push(kind);
        }
    }
    for (id, parts) in &calls {
        let whole: &[&str] = if id == running {
            &["call", "started", "intermediate"]
        } else {
            &["call", "started", "intermediate", "final"]
        };
        assert_eq!(parts, whole, "the async call {id} is not whole");
    }
    assert!(calls.contains_key(running), "the running call left");
}

#[tokio::test(start_paused = true)]
async fn a_200_turn_call_stays_near_its_budget_async_calls_whole_and_no_turn_waits_for_a_summary() {
    use voxide::context::async_tool_messages::{
        build_final_result_message, build_intermediate_result_message, build_started_message,
    };
    use voxide::context::{AssistantMessage, ToolCall};
    const BUDGET: usize = 3_000;
    let summaries = SlowSummaries::default();
    let llm = ScriptedLlm::default();
    let context = ContextHandle::new(LlmContext::new(vec![Message::system(
        "You are a test bot.",
    )]));
    let front = Pipeline::new()
        .then(ContextSummarizer::new(
            Arc::new(summaries.clone()),
            context.clone(),
            BUDGET,
        ))
        .then(LlmService::new(llm.clone()));
    let mut bot = Bot::start_in(front, context.clone(), AppResources::default());
    let async_call = |id: &str, done: bool| {
        let mut messages = vec![
            Message::Assistant(AssistantMessage {
                tool_calls: Some(vec![ToolCall::function(
                    id,
                    "check_stock",
                    &json!({"item": id}),
                )]),
                ..AssistantMessage::default()
            }),
            build_started_message(id),
            build_intermediate_result_message(id, Some(&json!({"progress": 50}))),
        ];
        if done {
            messages.push(build_final_result_message(
                id,
                Some(&json!({"in_stock": true})),
            ));
        }
        messages
    };
    let mut peak = 0;
    for turn in 0..200 {
        if turn % 10 == 5 {
            let id = format!("call_{turn}");
            context.lock().messages.extend(async_call(&id, turn != 195));
        }
        let started = tokio::time::Instant::now();
        bot.user_says(
            &format!("Turn {turn}: I would like to note one more thing about my order, item {turn}, for later."),
            1,
        )
        .await;
        // A summary being written never holds up the answer.
        assert_eq!(started.elapsed(), Duration::ZERO, "turn {turn} waited");
        peak = peak.max(context.lock().estimated_tokens());
        // The user pauses before the next turn.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (messages, errors, events) = bot.stop_with_events().await;
    assert_eq!(errors, Vec::<String>::new());

    let folds: Vec<(usize, usize, String)> = events
        .iter()
        .filter_map(|e| match e {
            voxide::events::Event::ContextSummarized {
                tokens_before,
                tokens_after,
                summary,
                ..
            } => Some((*tokens_before, *tokens_after, summary.clone())),
            _ => None,
        })
        .collect();
    eprintln!(
        "{} summaries over 200 turns; peak {peak} tokens for a budget of {BUDGET}",
        folds.len()
    );
    assert!(folds.len() >= 5, "{} summaries", folds.len());
    assert!(folds.iter().all(|(before, after, _)| after < before));
    // Over budget only while a summary is written: three turns at most.
    assert!(peak < BUDGET + 1_000, "peak {peak}");
    let now = LlmContext::new(messages.clone());
    assert!(now.estimated_tokens() < BUDGET + 1_000);
    // One summary, the latest, right after the instruction; the recent turns as they were.
    let summary = now.summary().expect("a summary");
    assert_eq!(summary, folds.last().expect("a fold").2);
    assert!(matches!(&messages[1], Message::System(_)));
    assert_eq!(
        messages
            .iter()
            .filter(|m| m.text().is_some_and(|t| t.contains("in summary")))
            .count(),
        1
    );
    assert!(
        messages
            .iter()
            .any(|m| m.text().is_some_and(|t| t.starts_with("Turn 199:")))
    );
    async_calls_whole(&messages, "call_195");
    // Every request began with the instruction.
    let requests = llm.requests.lock().expect("lock").clone();
    assert_eq!(requests.len(), 200);
    assert!(
        requests
            .iter()
            .all(|r| r.messages[0].text() == Some("You are a test bot."))
    );
}

#[tokio::test(start_paused = true)]
async fn reset_with_summary_answers_at_once_and_the_summary_joins_the_next_request() {
    use voxide::config::flow::{FunctionConfig, NodeConfig, StrategyConfig, TransitionConfig};
    let nodes = [
        NodeConfig {
            name: "take".into(),
            task: Some("Take the booking.".into()),
            respond_immediately: Some(false),
            functions: vec![FunctionConfig {
                name: "done".into(),
                description: Some("The booking is taken.".into()),
                transition_to: Some(TransitionConfig::Node("extras".into())),
                ..FunctionConfig::default()
            }],
            ..NodeConfig::default()
        },
        NodeConfig {
            name: "extras".into(),
            task: Some("Offer extras.".into()),
            context_strategy: Some(StrategyConfig::ResetWithSummary),
            ..NodeConfig::default()
        },
    ];
    let flow = Arc::new(Flow::new(&nodes, None, None, &[]).expect("flow"));
    assert!(flow.summarizes());
    let llm = ScriptedLlm::new(vec![
        vec![call("c1", "done", json!({}))],
        vec![say("Anything else?")],
        vec![say("A cake, noted.")],
    ]);
    let summaries = SlowSummaries::default();
    let session = FlowSession::new(
        flow,
        "You are a booking line.",
        FlowOptions {
            summaries: Some(Arc::new(summaries.clone())),
            realtime: false,
        },
    );
    let mut service = LlmService::new(llm.clone());
    session.register(service.functions());
    let context = ContextHandle::new(session.initial_context());
    let front = Pipeline::new()
        .then(service)
        .then(session.stage(context.clone()));
    let mut bot = Bot::start_in(front, context, AppResources::default());
    let started = tokio::time::Instant::now();
    bot.user_says("I'm Ada, a table for four.", 2).await;
    // The node's answer did not wait for the summary (it takes three seconds).
    assert_eq!(started.elapsed(), Duration::ZERO);
    tokio::time::sleep(Duration::from_secs(5)).await;
    bot.user_says("And a cake.", 1).await;
    bot.stop().await;

    let requests = llm.requests.lock().expect("lock").clone();
    assert_eq!(requests.len(), 3);
    // At once: the role and the new task only.
    let first = &requests[1].messages;
    assert_eq!(first.len(), 2, "{first:#?}");
    assert_eq!(
        system(&requests[1]),
        "You are a booking line.\nOffer extras."
    );
    // Then the summary of what came before, after the role and the task.
    let later = system(&requests[2]);
    assert!(
        later.contains("in summary: Summary 1, up to: User: I'm Ada, a table for four."),
        "{later}"
    );
    assert!(
        requests[2]
            .messages
            .iter()
            .any(|m| m.text() == Some("And a cake."))
    );
    assert!(
        !requests[2]
            .messages
            .iter()
            .any(|m| m.text() == Some("I'm Ada, a table for four."))
    );
}
