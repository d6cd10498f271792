//! A bot's own tools, through the LLM service as a model calls them: HTTP tools against a local
//! HTTP server (JSON, NDJSON and SSE progress, errors, a dropped call), and MCP tools against
//! the reference MCP server from npm (`@modelcontextprotocol/server-everything`, installed by
//! `scripts/setup.sh --test` into `tests/mcp_everything`).

mod common;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use common::scripted::{Bot, ScriptedLlm, call, say};
use voxide::bot::{HttpTool, McpServer, SessionInfo};
use voxide::config::{HttpToolConfig, McpConfig};
use voxide::context::Message;
use voxide::context::async_tool_messages::{AsyncToolMessageKind, parse_message};
use voxide::frames::SystemFrame;
use voxide::pipeline::AppResources;
use voxide::services::llm::LlmService;

/// Told when `/hang` is asked, and when its handler is dropped (the client went away).
type HangSignals = (oneshot::Sender<()>, oneshot::Sender<()>);

/// What the backend saw.
#[derive(Clone, Default)]
struct Backend {
    requests: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
    hang: Arc<Mutex<Option<HangSignals>>>,
}

/// Said when dropped.
struct Dropped(Option<oneshot::Sender<()>>);

impl Drop for Dropped {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

fn streamed(kind: &'static str, text: &'static str) -> Response {
    let pieces: Vec<Result<Bytes, Infallible>> = text
        .as_bytes()
        .chunks(7)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    (
        [("content-type", kind)],
        Body::from_stream(futures_util::stream::iter(pieces)),
    )
        .into_response()
}

async fn backend() -> (String, Backend) {
    let seen = Backend::default();
    let app = axum::Router::new()
        .route(
            "/lookup",
            post(
                |State(seen): State<Backend>, headers: HeaderMap, Json(body): Json<Value>| async move {
                    seen.requests.lock().expect("lock").push((headers, body));
                    Json(json!({"order": "A7", "status": "shipped"}))
                },
            ),
        )
        .route(
            "/ndjson",
            post(|| async {
                streamed(
                    "application/x-ndjson",
                    "{\"step\": 1}\n{\"step\": 2}\n\n{\"done\": true, \"rows\": 42}\n",
                )
            }),
        )
        .route(
            "/sse",
            post(|| async {
                streamed(
                    "text/event-stream",
                    ": ping\n\ndata: {\"step\": 1}\n\ndata: {\"step\": 2}\r\n\r\ndata: {\"done\": true}\n\n",
                )
            }),
        )
        .route(
            "/fail",
            post(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "database down") }),
        )
        .route("/slow", post(std::future::pending::<&'static str>))
        .route("/garbled", post(|| async { ([("content-type", "application/json")], "{not json") }))
        .route(
            "/hang",
            post(|State(seen): State<Backend>| async move {
                let (arrived, gone) = seen.hang.lock().expect("lock").take().expect("armed");
                let _guard = Dropped(Some(gone));
                let _ = arrived.send(());
                std::future::pending::<&'static str>().await
            }),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

fn http_tool(base: &str, extra: &str) -> HttpTool {
    let config: HttpToolConfig =
        toml::from_str(&format!("description = \"A backend call.\"\n{extra}\n",))
            .expect("a tool config");
    let config = HttpToolConfig {
        url: format!("{base}{}", config.url),
        ..config
    };
    HttpTool::new(&config).expect("a valid tool")
}

/// The content of the tool message answering `id`.
fn tool_answer(messages: &[Message], id: &str) -> Value {
    let text = messages
        .iter()
        .find_map(|m| match m {
            Message::Tool(t) if t.tool_call_id == id => m.text(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no answer to {id}"));
    serde_json::from_str(text).unwrap_or(Value::String(text.to_owned()))
}

fn async_kinds(messages: &[Message]) -> Vec<AsyncToolMessageKind> {
    messages
        .iter()
        .filter_map(parse_message)
        .map(|p| p.kind)
        .collect()
}

#[tokio::test]
async fn a_json_answer_is_the_result_and_the_request_carries_the_call_and_the_session() {
    let (base, seen) = backend().await;
    let engine = ScriptedLlm::new(vec![
        vec![call("c1", "lookup_order", json!({"order": "A7"}))],
        vec![say("It has shipped.")],
    ]);
    let mut llm = LlmService::new(engine.clone());
    http_tool(
        &base,
        "name = \"lookup_order\"\nurl = \"/lookup\"\n\
         parameters = { type = \"object\", properties = { order = { type = \"string\" } }, required = [\"order\"] }\n\
         headers = { Authorization = \"Bearer t0k3n\" }",
    )
    .register(llm.functions());
    let session = SessionInfo {
        id: "session-9".into(),
        request_data: json!({"caller": "+15550100"}),
        placed: false,
    };
    let mut bot = Bot::start_with(llm, AppResources::new().with(session));
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, errors) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        tool_answer(&messages, "c1"),
        json!({"order": "A7", "status": "shipped"})
    );
    let requests = seen.requests.lock().expect("lock").clone();
    let (headers, body) = &requests[0];
    assert_eq!(
        body,
        &json!({"tool": "lookup_order", "arguments": {"order": "A7"}, "tool_call_id": "c1",
                "session_id": "session-9", "request_data": {"caller": "+15550100"}})
    );
    assert_eq!(headers["authorization"], "Bearer t0k3n");
    assert_eq!(headers["x-voxide-session-id"], "session-9");
    assert_eq!(headers["x-voxide-tool-call-id"], "c1");
    // The model was offered the schema the file gave.
    let offered = &engine.requests.lock().expect("lock")[0]
        .tools
        .standard_tools;
    let schema = offered
        .iter()
        .find(|s| s.name == "lookup_order")
        .expect("offered");
    assert_eq!(schema.required, ["order"]);
}

/// An async HTTP tool at `path`: its messages in the context once the bot has answered it.
async fn async_progress(path: &str) -> Vec<Message> {
    let (base, _) = backend().await;
    let engine = ScriptedLlm::new(vec![
        vec![call("j1", "run_report", json!({}))],
        vec![say("I started the report.")],
        vec![say("The report is done.")],
    ]);
    let mut llm = LlmService::new(engine);
    http_tool(
        &base,
        &format!("name = \"run_report\"\nurl = \"{path}\"\ncancel_on_interruption = false"),
    )
    .register(llm.functions());
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(3).await;
    bot.stop().await.0
}

#[tokio::test]
async fn ndjson_lines_are_an_async_tools_progress_and_the_last_its_result() {
    let messages = async_progress("/ndjson").await;
    assert_eq!(
        async_kinds(&messages),
        [
            AsyncToolMessageKind::Started,
            AsyncToolMessageKind::Intermediate,
            AsyncToolMessageKind::Intermediate,
            AsyncToolMessageKind::Final
        ]
    );
    let results: Vec<Option<String>> = messages
        .iter()
        .filter_map(parse_message)
        .map(|p| p.result)
        .collect();
    assert_eq!(
        results[1..],
        [
            Some("{\"step\": 1}".to_owned()),
            Some("{\"step\": 2}".to_owned()),
            Some("{\"done\": true, \"rows\": 42}".to_owned())
        ]
    );
}

#[tokio::test]
async fn server_sent_events_are_an_async_tools_progress_and_the_last_its_result() {
    let messages = async_progress("/sse").await;
    assert_eq!(
        async_kinds(&messages),
        [
            AsyncToolMessageKind::Started,
            AsyncToolMessageKind::Intermediate,
            AsyncToolMessageKind::Intermediate,
            AsyncToolMessageKind::Final
        ]
    );
}

#[tokio::test]
async fn a_redirect_to_another_host_is_not_followed_and_the_tools_headers_stay_home() {
    let (base, seen) = backend().await;
    let port = base.rsplit(':').next().expect("a port").to_owned();
    // The same backend under another host name: a different host to the client.
    let elsewhere = format!("http://localhost:{port}/lookup");
    let app = axum::Router::new()
        .route(
            "/moved",
            post(|| async { axum::response::Redirect::temporary("/lookup") }),
        )
        .route(
            "/away",
            post(move || async move { axum::response::Redirect::temporary(&elsewhere) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let redirector = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    // The redirector's "/moved" stays on its own host (which has no /lookup: a 404 there), and
    // its "/away" points at another host: refused before anything is sent.
    let engine = ScriptedLlm::new(vec![
        vec![
            call("r1", "away", json!({})),
            call("r2", "moved", json!({})),
        ],
        vec![say("Done.")],
    ]);
    let mut llm = LlmService::new(engine);
    for (name, path) in [("away", "/away"), ("moved", "/moved")] {
        http_tool(
            &format!("http://{redirector}"),
            &format!("name = \"{name}\"\nurl = \"{path}\"\nheaders = {{ X-Api-Key = \"k3y\" }}"),
        )
        .register(llm.functions());
    }
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let away = tool_answer(&messages, "r1")["error"].to_string();
    assert!(away.contains("another host"), "{away}");
    let moved = tool_answer(&messages, "r2")["error"].to_string();
    assert!(moved.contains("404"), "followed on its own host: {moved}");
    assert!(
        seen.requests.lock().expect("lock").is_empty(),
        "the other host saw no request, so no key"
    );
}

#[tokio::test]
async fn a_500_a_timeout_and_a_garbled_answer_are_failures_the_model_can_speak_about() {
    let (base, _) = backend().await;
    let engine = ScriptedLlm::new(vec![
        vec![
            call("f1", "failing", json!({})),
            call("f2", "slow", json!({})),
            call("f3", "garbled", json!({})),
        ],
        vec![say("Sorry, the systems are having trouble.")],
    ]);
    let mut llm = LlmService::new(engine);
    for (name, path) in [
        ("failing", "/fail"),
        ("slow", "/slow"),
        ("garbled", "/garbled"),
    ] {
        http_tool(
            &base,
            &format!("name = \"{name}\"\nurl = \"{path}\"\ntimeout_secs = 0.5"),
        )
        .register(llm.functions());
    }
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    bot.responses(2).await;
    let (messages, _) = bot.stop().await;
    let error = |id: &str| {
        tool_answer(&messages, id)["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{id} failed without an error"))
            .to_owned()
    };
    assert!(
        error("f1").contains("500") && error("f1").contains("database down"),
        "{}",
        error("f1")
    );
    assert!(
        error("f2").contains("did not answer within 0.5 s"),
        "{}",
        error("f2")
    );
    assert!(error("f3").contains("invalid JSON"), "{}", error("f3"));
}

#[tokio::test]
async fn an_interruption_drops_the_call_and_the_backend_sees_its_connection_close() {
    let (base, seen) = backend().await;
    let (arrived_tx, arrived) = oneshot::channel();
    let (gone_tx, gone) = oneshot::channel();
    *seen.hang.lock().expect("lock") = Some((arrived_tx, gone_tx));
    let engine = ScriptedLlm::new(vec![vec![call("h1", "hang", json!({}))]]);
    let mut llm = LlmService::new(engine);
    http_tool(&base, "name = \"hang\"\nurl = \"/hang\"").register(llm.functions());
    let mut bot = Bot::start(llm);
    bot.run_llm().await;
    arrived.await.expect("the request arrived");
    bot.handle
        .queue_frame(SystemFrame::Interruption)
        .await
        .expect("queued");
    tokio::time::timeout(Duration::from_secs(20), gone)
        .await
        .expect("the backend saw the connection close")
        .expect("said");
    bot.responses(1).await;
    let (messages, _) = bot.stop().await;
    assert_eq!(tool_answer(&messages, "h1"), json!("CANCELLED"));
}

mod mcp {
    use super::*;

    /// The reference server's entry point, installed by `scripts/setup.sh --test`.
    fn everything() -> PathBuf {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
            "tests/mcp_everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        );
        assert!(
            path.exists(),
            "{} is missing: run scripts/setup.sh --test",
            path.display()
        );
        path
    }

    fn scratch(name: &str) -> PathBuf {
        common::bot_run::scratch().join(name)
    }

    /// The server over stdio, every byte voxide sends it copied to `log`, its pid to `pid`.
    pub(super) fn stdio_server(log: &Path, pid: &Path, extra: &str) -> McpServer {
        let script = format!(
            "echo $$ > '{}'; exec node '{}' stdio < <(tee -a '{}')",
            pid.display(),
            everything().display(),
            log.display()
        );
        let config: McpConfig = toml::from_str(&format!(
            "name = \"everything\"\ncommand = \"bash\"\nargs = [\"-c\", {script:?}]\n{extra}"
        ))
        .expect("an mcp config");
        McpServer::new(&config).expect("a valid server")
    }

    #[tokio::test]
    async fn the_long_running_tool_streams_progress_as_an_async_tool_while_the_talk_goes_on() {
        let (log, pid) = (scratch("progress.log"), scratch("progress.pid"));
        let server = stdio_server(
            &log,
            &pid,
            "tools = [\"echo\", \"trigger-long-running-operation\"]\n\
             async_tools = [\"trigger-long-running-operation\"]",
        );
        server.start().await.expect("the server starts");
        let mut names = server.tool_names();
        names.sort();
        assert_eq!(names, ["echo", "trigger-long-running-operation"]);
        let engine = ScriptedLlm::new(vec![
            vec![call(
                "m1",
                "trigger-long-running-operation",
                json!({"duration": 1.5, "steps": 3}),
            )],
            vec![say("It is running.")],
            vec![call("e1", "echo", json!({"message": "still here"}))],
            vec![say("Still here.")],
            vec![say("The operation finished.")],
        ]);
        let mut llm = LlmService::new(engine.clone());
        server.register(llm.functions());
        let session = SessionInfo {
            id: "call-42".into(),
            request_data: json!({"caller": "+15550100"}),
            placed: false,
        };
        let mut bot = Bot::start_with(llm, AppResources::new().with(session));
        bot.run_llm().await;
        bot.responses(2).await;
        // The talk goes on while the operation runs: another turn, another (sync) tool.
        bot.user_says("Are you still there?", 2).await;
        let echoed = tool_answer(&bot.context.messages(), "e1");
        assert!(echoed.to_string().contains("still here"), "{echoed}");
        // Then the final result.
        bot.responses(1).await;
        let (messages, errors) = bot.stop().await;
        assert!(errors.is_empty(), "{errors:?}");
        let kinds = async_kinds(&messages);
        assert_eq!(kinds.first(), Some(&AsyncToolMessageKind::Started));
        assert_eq!(kinds.last(), Some(&AsyncToolMessageKind::Final));
        let intermediate = kinds
            .iter()
            .filter(|k| **k == AsyncToolMessageKind::Intermediate)
            .count();
        assert!(intermediate >= 2, "{kinds:?}");
        let last = messages
            .iter()
            .filter_map(parse_message)
            .next_back()
            .expect("final");
        assert!(
            last.result
                .as_deref()
                .is_some_and(|r| r.contains("Long running operation completed")),
            "{last:?}"
        );
        // The session went with the call.
        let sent = std::fs::read_to_string(&log).expect("the log");
        assert!(sent.contains("\"voxide/session_id\":\"call-42\""), "{sent}");
        assert!(sent.contains("\"caller\":\"+15550100\""), "{sent}");
    }

    #[tokio::test]
    async fn the_models_cancel_sends_notifications_cancelled() {
        let (log, pid) = (scratch("cancel.log"), scratch("cancel.pid"));
        let server = stdio_server(
            &log,
            &pid,
            "async_tools = [\"trigger-long-running-operation\"]",
        );
        server.start().await.expect("the server starts");
        let engine = ScriptedLlm::new(vec![
            vec![call(
                "m1",
                "trigger-long-running-operation",
                json!({"duration": 60, "steps": 2}),
            )],
            vec![say("It is running.")],
            vec![call(
                "x1",
                "cancel_trigger-long-running-operation",
                json!({}),
            )],
            vec![say("Cancelled it.")],
        ]);
        let mut llm = LlmService::new(engine);
        server.register(llm.functions());
        let mut bot = Bot::start(llm);
        bot.run_llm().await;
        bot.responses(2).await;
        bot.user_says("Stop that.", 2).await;
        let (messages, _) = bot.stop().await;
        assert!(tool_answer(&messages, "x1").to_string().contains("ancel"));
        let cancelled = wait_for(|| {
            std::fs::read_to_string(&log).is_ok_and(|sent| sent.contains("notifications/cancelled"))
        })
        .await;
        assert!(cancelled, "no notifications/cancelled went to the server");
    }

    #[tokio::test]
    async fn a_server_that_dies_is_started_again_and_its_tools_say_unavailable_meanwhile() {
        let (log, pid) = (scratch("restart.log"), scratch("restart.pid"));
        let server = stdio_server(&log, &pid, "tools = [\"echo\"]");
        server.start().await.expect("the server starts");
        let echo = || server.call_tool("echo", json!({"message": "ping"}));
        assert!(echo().await.to_string().contains("ping"));
        let first = std::fs::read_to_string(&pid).expect("the pid");
        let killed = std::process::Command::new("kill")
            .args(["-9", first.trim()])
            .status()
            .expect("kill");
        assert!(killed.success());
        let down = echo().await;
        assert!(
            down["error"]
                .as_str()
                .is_some_and(|e| e.contains("unavailable")),
            "{down}"
        );
        let back = wait_for_async(|| async { echo().await.to_string().contains("ping") }).await;
        assert!(back, "the server did not come back");
        let second = std::fs::read_to_string(&pid).expect("the pid");
        assert_ne!(first, second, "a new process answers");
    }

    #[tokio::test]
    async fn the_streamable_http_transport_lists_and_calls_tools() {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            probe.local_addr().expect("addr").port()
        };
        let mut child = tokio::process::Command::new("node")
            .arg(everything())
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let listening = wait_for_async(|| async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        assert!(listening, "the HTTP server did not listen");
        let config: McpConfig = toml::from_str(&format!(
            "name = \"everything-http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\ntools = [\"get-sum\"]"
        ))
        .expect("an mcp config");
        let server = McpServer::new(&config).expect("a valid server");
        server.start().await.expect("the server starts");
        assert_eq!(server.tool_names(), ["get-sum"]);
        let sum = server.call_tool("get-sum", json!({"a": 19, "b": 23})).await;
        assert!(sum.to_string().contains("42"), "{sum}");
        let _ = child.kill().await;
    }

    /// Polls `done` (every 50 ms, 20 s at most): for what another process does.
    async fn wait_for(done: impl Fn() -> bool) -> bool {
        wait_for_async(|| std::future::ready(done())).await
    }

    async fn wait_for_async<F: std::future::Future<Output = bool>>(done: impl Fn() -> F) -> bool {
        for _ in 0..400 {
            if done().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

/// The whole bot on a spoken conversation: the caller asks for the long-running MCP tool, the
/// bot runs it as an async tool and answers another question while it runs, then gives its
/// result. The LLM is a local stand-in of OpenAI's chat completions that answers by the context.
mod whole_bot {
    use super::*;
    use common::bot_run::run_bot;
    use common::llm_stand_in::{self, Reply};
    use voxide::audio::wav::{self, Wav};
    use voxide::bot::{BotOptions, LlmChoice, TextLlm, Voice};
    use voxide::services::llm::openai::OpenAiSettings;
    use voxide::services::tts::{PiperVoice, Synthesizer};

    /// `(text, seconds of silence after it)` in the Piper voice, after a second of silence.
    fn spoken(lines: &[(&str, usize)], name: &str) -> PathBuf {
        let voice = PiperVoice::shared().expect("the Piper voice loads; run scripts/setup.sh");
        let mut samples = Vec::new();
        let mut rate = 0;
        for (i, (text, pause)) in lines.iter().enumerate() {
            let speech = voice.synthesize(text).expect("speech");
            rate = speech.sample_rate as usize;
            if i == 0 {
                samples.extend(vec![0i16; rate]);
            }
            samples.extend(&speech.samples);
            samples.extend(vec![0i16; pause * rate]);
        }
        let path = common::bot_run::scratch().join(name);
        let wav = Wav {
            samples,
            sample_rate: rate as u32,
            channels: 1,
        };
        wav::write(&path, &wav).expect("write the conversation");
        path
    }

    fn sse(chunks: &[Value]) -> String {
        let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        out.push_str("data: [DONE]\n\n");
        out
    }

    fn words(text: &str) -> String {
        sse(&[
            json!({"choices": [{"delta": {"content": text}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
        ])
    }

    /// The async-tool payloads in an OpenAI request's messages.
    fn async_payloads(messages: &[Value]) -> Vec<Value> {
        messages
            .iter()
            .filter_map(|m| m["content"].as_str())
            .filter_map(|c| serde_json::from_str::<Value>(c).ok())
            .filter(|p| p["type"] == "async_tool")
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_spoken_request_runs_the_mcp_tool_as_an_async_tool_and_the_talk_goes_on() {
        let start_it = sse(&[
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_op", "type": "function",
                "function": {"name": "trigger-long-running-operation", "arguments": "{\"duration\": 20, \"steps\": 4}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let reply = Reply::With(Arc::new(move |body: &Value| {
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            let last = messages.last().cloned().unwrap_or_default();
            let text = last["content"].as_str().unwrap_or_default().to_lowercase();
            let payload = serde_json::from_str::<Value>(&text).unwrap_or_default();
            let called = messages.iter().any(|m| m["tool_calls"].is_array());
            match last["role"].as_str() {
                Some("tool") => Reply::Stream(words("I have started it."), 64),
                _ if payload["status"] == "finished" => {
                    Reply::Stream(words("The operation has finished."), 64)
                }
                Some("user") if !called && text.contains("operation") => {
                    Reply::Stream(start_it.clone(), 64)
                }
                Some("user") if text.contains("two") || text.contains("2") => {
                    Reply::Stream(words("Two plus two is four."), 64)
                }
                _ => Reply::Stream(words("Okay."), 64),
            }
        }));
        let (addr, stand_in) = llm_stand_in::start(vec![reply]).await;
        let (log, pid) = (mcp_scratch("spoken.log"), mcp_scratch("spoken.pid"));
        let server = super::mcp::stdio_server(
            &log,
            &pid,
            "tools = [\"trigger-long-running-operation\"]\n\
             async_tools = [\"trigger-long-running-operation\"]",
        );
        let bot = BotOptions {
            llm: LlmChoice::Text(vec![TextLlm::OpenAi(OpenAiSettings {
                base_url: format!("http://{addr}/v1"),
                model: "gpt-4.1-mini".into(),
                ..OpenAiSettings::default()
            })]),
            voice: Voice::Espeak,
            builtin: Vec::new(),
            mcp: vec![server],
            ..BotOptions::default()
        };
        bot.start_tools().await.expect("the MCP server starts");
        // The second question comes once the first is surely transcribed (an unoptimised
        // Whisper on a slow CPU takes seconds), and well before the operation's end.
        let input = spoken(
            &[
                ("Please start the long running operation.", 8),
                ("What is two plus two?", 12),
            ],
            "async_mcp_conversation.wav",
        );
        let ran = run_bot(bot, &input, "async_mcp").await;
        let summary = &ran.summary;
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(
            summary.tool_calls,
            ["trigger-long-running-operation"],
            "heard {:?}",
            summary.transcripts
        );
        let said = summary.bot_text.join(" ");
        let (four, finished) = (said.find("four"), said.find("has finished"));
        assert!(
            four.is_some() && finished.is_some() && four < finished,
            "the second question is answered while the tool runs, its result after: {said:?}"
        );
        let posts = stand_in.posts();
        let last = posts.last().expect("requests");
        let messages = last.body["messages"].as_array().expect("messages");
        let payloads = async_payloads(messages);
        let status = |p: &Value| {
            (
                p["status"].as_str().unwrap_or_default().to_owned(),
                p.get("result").is_some(),
            )
        };
        let kinds: Vec<(String, bool)> = payloads.iter().map(status).collect();
        assert_eq!(
            kinds.first(),
            Some(&("running".to_owned(), false)),
            "started: {payloads:?}"
        );
        assert_eq!(
            kinds.last(),
            Some(&("finished".to_owned(), true)),
            "final: {payloads:?}"
        );
        let intermediate = kinds
            .iter()
            .filter(|k| **k == ("running".to_owned(), true))
            .count();
        assert!(intermediate >= 2, "{payloads:?}");
        assert!(payloads.iter().all(|p| p["tool_call_id"] == "call_op"));
    }

    fn mcp_scratch(name: &str) -> PathBuf {
        common::bot_run::scratch().join(name)
    }
}
