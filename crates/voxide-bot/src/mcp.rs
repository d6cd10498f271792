//! MCP tools: a bot file's `[[mcp]]` is a Model Context Protocol server (over stdio or
//! streamable HTTP, through the official Rust SDK) whose tools the bot gets.
//!
//! The server starts once, with the bot: its tools are listed then (kept by name when the file
//! says which) and registered with their schemas in every session. A call carries the session
//! in its `_meta` (`voxide/session_id`, `voxide/tool_call_id`, `voxide/request_data`) and a
//! progress token; a tool the bot file marks async runs as an async tool, its
//! `notifications/progress` passed on as intermediate results. A call dropped before its answer
//! (an interruption, the model's `cancel_<name>`, a timeout) sends `notifications/cancelled`.
//! A server that dies is started again with backoff; meanwhile its tools answer that they are
//! unavailable.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification,
    CancelledNotificationParam, ClientConfig, ClientRequest, Implementation,
    ProgressNotificationParam, ProgressToken, RequestId, RequestMetaObject, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::SessionInfo;
use super::http_tool::header_map;
use crate::config::McpConfig;
use crate::config::expand_env;
use crate::context::FunctionSchema;
use crate::secret::Secret;
use crate::services::llm::{
    FunctionCallParams, FunctionOptions, FunctionRegistry, ResultProperties,
};

/// A sync MCP tool's default time limit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// An async MCP tool's default time limit.
pub const DEFAULT_ASYNC_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the first start may take (a package manager may fetch the server).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest wait between two restarts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Progress notifications kept for a call not yet known (the answer to its request is still
/// on its way to the caller).
const EARLY_PROGRESS: usize = 64;

/// One MCP server, shared by every session of the bot. Clones share it.
#[derive(Clone)]
pub struct McpServer(Arc<Shared>);

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.0.spec.name)
            .finish_non_exhaustive()
    }
}

struct Shared {
    spec: Spec,
    started: AtomicBool,
    /// The live connection; none while the server is restarting.
    live: Mutex<Option<Peer<RoleClient>>>,
    /// The tools kept, listed at the first start.
    tools: Mutex<Vec<Tool>>,
    progress: Progress,
}

#[derive(Debug, Clone)]
struct Spec {
    name: String,
    transport: Transport,
    keep: Option<Vec<String>>,
    async_tools: Vec<String>,
    timeout: Option<Duration>,
}

#[derive(Debug, Clone)]
enum Transport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, Secret)>,
    },
    Http {
        url: String,
        headers: HashMap<HeaderName, HeaderValue>,
    },
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl McpServer {
    /// The server `config` describes, not started; an error names what is wrong with it.
    pub fn new(config: &McpConfig) -> Result<Self, String> {
        let what = format!("mcp server {:?}", config.name);
        let transport = match (&config.command, &config.url) {
            (Some(command), None) => Transport::Stdio {
                command: command.clone(),
                args: config.args.clone(),
                env: config
                    .env
                    .iter()
                    .map(|(k, v)| {
                        let value = expand_env(v, &format!("{what}'s env {k}"))?;
                        Ok((k.clone(), Secret::new(value)))
                    })
                    .collect::<Result<_, String>>()?,
            },
            (None, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!("{what}: the url must be http or https"));
                }
                Transport::Http {
                    url: url.clone(),
                    headers: header_map(&config.headers, &what)?
                        .into_iter()
                        .filter_map(|(k, v)| Some((k?, v)))
                        .collect(),
                }
            }
            _ => {
                return Err(format!(
                    "{what}: give a command (stdio) or a url (HTTP), one of them"
                ));
            }
        };
        let timeout = match config.timeout_secs {
            None => None,
            Some(secs) if secs > 0.0 && secs <= 86_400.0 => Some(Duration::from_secs_f64(secs)),
            Some(_) => return Err(format!("{what}: timeout_secs must be between 0 and a day")),
        };
        Ok(Self(Arc::new(Shared {
            spec: Spec {
                name: config.name.clone(),
                transport,
                keep: config.tools.clone(),
                async_tools: config.async_tools.clone(),
                timeout,
            },
            started: AtomicBool::new(false),
            live: Mutex::new(None),
            tools: Mutex::new(Vec::new()),
            progress: Progress::default(),
        })))
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.0.spec.name
    }

    /// Starts the server and lists its tools (once; later calls return at once). From then on
    /// a server that dies is started again with backoff.
    pub async fn start(&self) -> Result<(), String> {
        if self.0.started.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let spec = &self.0.spec;
        let what = format!("mcp server {:?}", spec.name);
        let first = async {
            let running = connect(spec, self.0.progress.clone()).await?;
            let tools = running
                .peer()
                .list_all_tools()
                .await
                .map_err(|e| format!("cannot list its tools: {e}"))?;
            Ok::<_, String>((running, tools))
        };
        let (running, listed) = match tokio::time::timeout(START_TIMEOUT, first).await {
            Ok(Ok(started)) => started,
            Ok(Err(e)) => {
                self.0.started.store(false, Ordering::SeqCst);
                return Err(format!("{what}: {e}"));
            }
            Err(_) => {
                self.0.started.store(false, Ordering::SeqCst);
                return Err(format!(
                    "{what} did not start within {} s",
                    START_TIMEOUT.as_secs()
                ));
            }
        };
        let names: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
        for wanted in spec.keep.iter().flatten().chain(&spec.async_tools) {
            if !names.contains(&wanted.as_str()) {
                return Err(format!(
                    "{what} has no tool {wanted:?} (it has: {})",
                    names.join(", ")
                ));
            }
        }
        let kept: Vec<Tool> = listed
            .into_iter()
            .filter(|t| {
                spec.keep
                    .as_ref()
                    .is_none_or(|keep| keep.iter().any(|k| k == t.name.as_ref()))
            })
            .collect();
        tracing::info!(server = %spec.name, tools = kept.len(), "MCP server started");
        *lock(&self.0.tools) = kept;
        *lock(&self.0.live) = Some(running.peer().clone());
        tokio::spawn(supervise(self.0.clone(), running));
        Ok(())
    }

    /// The names of the tools it gives the bot (empty before [`McpServer::start`]).
    pub fn tool_names(&self) -> Vec<String> {
        lock(&self.0.tools)
            .iter()
            .map(|t| t.name.to_string())
            .collect()
    }

    /// Calls `tool` outside a conversation (no session, progress dropped): its answer as the
    /// model would read it.
    pub async fn call_tool(&self, tool: &str, arguments: Value) -> Value {
        let call = Call {
            shared: self.0.clone(),
            tool: tool.to_owned(),
            asynchronous: false,
            timeout: self.0.spec.timeout.unwrap_or(DEFAULT_TIMEOUT),
        };
        call.answer(&SessionInfo::default(), "direct", &arguments, &mut |_| {})
            .await
    }

    /// Registers its tools on `registry`.
    pub fn register(&self, registry: &mut FunctionRegistry) {
        let tools = lock(&self.0.tools).clone();
        for tool in tools {
            let name = tool.name.to_string();
            let parameters = Value::Object((*tool.input_schema).clone());
            let description = tool.description.as_deref().unwrap_or_default().to_owned();
            let schema = match FunctionSchema::from_parameters(&name, description, &parameters) {
                Ok(schema) => schema,
                Err(e) => {
                    tracing::warn!(server = %self.0.spec.name, error = %e, "MCP tool skipped");
                    continue;
                }
            };
            let asynchronous = self.0.spec.async_tools.contains(&name);
            let timeout = self.0.spec.timeout.unwrap_or(if asynchronous {
                DEFAULT_ASYNC_TIMEOUT
            } else {
                DEFAULT_TIMEOUT
            });
            let options = FunctionOptions {
                timeout: Some(timeout + Duration::from_secs(5)),
                cancellable_by_llm: asynchronous,
                cancel_on_interruption: !asynchronous,
            };
            let shared = self.0.clone();
            registry.register_with_schema(
                schema,
                move |params| {
                    let call = Call {
                        shared: shared.clone(),
                        tool: name.clone(),
                        asynchronous,
                        timeout,
                    };
                    call.run(params)
                },
                options,
            );
        }
    }
}

/// What a stdio server's process sees: `PATH` and `HOME` from voxide's environment, then what
/// the bot file lists for it; never the rest (provider keys, tokens).
fn child_environment(
    parent: impl Iterator<Item = (String, String)>,
    listed: &[(String, Secret)],
) -> Vec<(String, String)> {
    parent
        .filter(|(k, _)| k == "PATH" || k == "HOME")
        .chain(
            listed
                .iter()
                .map(|(k, v)| (k.clone(), v.expose().to_owned())),
        )
        .collect()
}

/// Connects to the server: spawns it (stdio) or opens its endpoint (HTTP), and initialises.
async fn connect(
    spec: &Spec,
    progress: Progress,
) -> Result<RunningService<RoleClient, Handler>, String> {
    let handler = Handler { progress };
    match &spec.transport {
        Transport::Stdio { command, args, env } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args)
                .env_clear()
                .envs(child_environment(std::env::vars(), env))
                .kill_on_drop(true);
            let (transport, stderr) = TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot run {command:?}: {e}"))?;
            if let Some(stderr) = stderr {
                tokio::spawn(log_stderr(spec.name.clone(), stderr));
            }
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("it did not initialise: {e}"))
        }
        Transport::Http { url, headers } => {
            // The client's TLS runs on the process's ring provider (a no-op once installed).
            let _ = rustls::crypto::ring::default_provider().install_default();
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(headers.clone());
            let client = super::http_tool::client(&format!("mcp server at {url}"))?;
            handler
                .serve(StreamableHttpClientTransport::with_client(client, config))
                .await
                .map_err(|e| format!("it did not initialise at {url}: {e}"))
        }
    }
}

/// The server's stderr, into the log.
async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(server = %server, "{line}");
    }
}

/// Waits for the connection to end, then starts the server again, with backoff.
async fn supervise(shared: Arc<Shared>, mut running: RunningService<RoleClient, Handler>) {
    loop {
        let reason = running.waiting().await;
        *lock(&shared.live) = None;
        tracing::warn!(server = %shared.spec.name, ?reason, "MCP server gone; starting it again");
        crate::warnings::warn(
            "mcp_server_gone",
            format_args!(
                "the MCP server {} ended; starting it again",
                shared.spec.name
            ),
        );
        let mut backoff = Duration::from_secs(1);
        running = loop {
            tokio::time::sleep(backoff).await;
            match connect(&shared.spec, shared.progress.clone()).await {
                Ok(running) => break running,
                Err(e) => {
                    tracing::warn!(server = %shared.spec.name, error = %e, "MCP server restart failed");
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        };
        tracing::info!(server = %shared.spec.name, "MCP server started again");
        *lock(&shared.live) = Some(running.peer().clone());
    }
}

/// The client side of the connection: it takes the server's progress notifications.
struct Handler {
    progress: Progress,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.dispatch(params);
    }

    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.client_info = Implementation::new("voxide", env!("CARGO_PKG_VERSION"));
        info
    }
}

/// Progress notifications, routed to the call whose token they carry.
#[derive(Clone, Default)]
struct Progress(Arc<Mutex<Routes>>);

#[derive(Default)]
struct Routes {
    calls: HashMap<ProgressToken, mpsc::UnboundedSender<ProgressNotificationParam>>,
    early: VecDeque<ProgressNotificationParam>,
}

impl Progress {
    fn dispatch(&self, params: ProgressNotificationParam) {
        let mut routes = lock(&self.0);
        match routes.calls.get(&params.progress_token) {
            Some(call) => {
                let _ = call.send(params);
            }
            None => {
                if routes.early.len() == EARLY_PROGRESS {
                    routes.early.pop_front();
                }
                routes.early.push_back(params);
            }
        }
    }

    /// The call with `token` takes its notifications from now on (and any that came early).
    fn subscribe(
        &self,
        token: ProgressToken,
    ) -> mpsc::UnboundedReceiver<ProgressNotificationParam> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut routes = lock(&self.0);
        let early = std::mem::take(&mut routes.early);
        for params in early {
            if params.progress_token == token {
                let _ = tx.send(params);
            } else {
                routes.early.push_back(params);
            }
        }
        routes.calls.insert(token, tx);
        rx
    }

    fn unsubscribe(&self, token: &ProgressToken) {
        lock(&self.0).calls.remove(token);
    }
}

/// One tool call.
struct Call {
    shared: Arc<Shared>,
    tool: String,
    asynchronous: bool,
    timeout: Duration,
}

impl Call {
    async fn run(self, params: FunctionCallParams) {
        let session = params
            .app_resources
            .get::<SessionInfo>()
            .cloned()
            .unwrap_or_default();
        let callback = params.result_callback.clone();
        let asynchronous = self.asynchronous;
        let mut progress = move |step: Value| {
            if asynchronous {
                // Progress goes into the conversation; the bot speaks when the job is done.
                callback.deliver(
                    step,
                    ResultProperties {
                        run_llm: Some(false),
                        ..ResultProperties::intermediate()
                    },
                );
            }
        };
        let result = self
            .answer(
                &session,
                &params.tool_call_id,
                &params.arguments,
                &mut progress,
            )
            .await;
        params.result_callback.done(result);
    }

    /// The call's answer as the model reads it, or why there is none as `{"error": …}`.
    async fn answer(
        &self,
        session: &SessionInfo,
        tool_call_id: &str,
        arguments: &Value,
        progress: &mut (dyn FnMut(Value) + Send),
    ) -> Value {
        let exchange = self.exchange(session, tool_call_id, arguments, progress);
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => {
                tracing::warn!(tool = %self.tool, error = %e, "MCP tool failed");
                json!({ "error": e })
            }
            Err(_) => json!({
                "error": format!("{} did not answer within {} s", self.tool, self.timeout.as_secs_f64()),
            }),
        }
    }

    /// Sends the call and waits for its answer, passing progress on; an error says why there
    /// is no result.
    async fn exchange(
        &self,
        session: &SessionInfo,
        tool_call_id: &str,
        arguments: &Value,
        on_progress: &mut (dyn FnMut(Value) + Send),
    ) -> Result<Value, String> {
        let server = &self.shared.spec.name;
        let Some(peer) = lock(&self.shared.live).clone() else {
            return Err(format!(
                "{} is unavailable for now: its MCP server {server} is starting again",
                self.tool
            ));
        };
        let mut meta = RequestMetaObject::new();
        meta.0
            .0
            .insert("voxide/session_id".into(), session.id.clone().into());
        meta.0
            .0
            .insert("voxide/tool_call_id".into(), tool_call_id.into());
        meta.0
            .0
            .insert("voxide/request_data".into(), session.request_data.clone());
        let mut call = CallToolRequestParams::new(self.tool.clone());
        if let Value::Object(arguments) = arguments {
            call = call.with_arguments(arguments.clone());
        }
        let handle = peer
            .send_request_with_option(
                ClientRequest::CallToolRequest(CallToolRequest::new(call)),
                PeerRequestOptions::no_options().with_meta(meta),
            )
            .await
            .map_err(|e| format!("{} is unavailable: {e}", self.tool))?;
        let mut progress = self
            .shared
            .progress
            .subscribe(handle.progress_token.clone());
        let mut pending = Pending {
            peer: peer.clone(),
            id: Some(handle.id.clone()),
            token: handle.progress_token.clone(),
            progress: self.shared.progress.clone(),
        };
        let answer = handle.await_response();
        tokio::pin!(answer);
        let answer = loop {
            tokio::select! {
                answer = &mut answer => break answer,
                Some(step) = progress.recv() => on_progress(
                    json!({"progress": step.progress, "total": step.total, "message": step.message}),
                ),
            }
        };
        pending.answered();
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(tool_result(result)),
            Ok(_) => Err(format!(
                "{server} answered the call to {} with something else",
                self.tool
            )),
            Err(e) => Err(format!(
                "{} is unavailable: the call failed: {e}",
                self.tool
            )),
        }
    }
}

/// A call under way: dropped before its answer, it tells the server to stop.
struct Pending {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
    token: ProgressToken,
    progress: Progress,
}

impl Pending {
    fn answered(&mut self) {
        self.id = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.progress.unsubscribe(&self.token);
        let Some(id) = self.id.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let cancel = CancelledNotification::new(CancelledNotificationParam::new(
                Some(id),
                Some("the voice session no longer needs it".into()),
            ));
            if let Err(e) = peer.send_notification(cancel.into()).await {
                tracing::debug!(error = %e, "could not send notifications/cancelled");
            }
        });
    }
}

/// For the fuzz targets (`voxide::fuzz`): a server's answer to a call, and a progress notification, read as
/// the bot reads them.
#[doc(hidden)]
pub fn fuzz_results(bytes: &[u8]) {
    if let Ok(result) = serde_json::from_slice::<CallToolResult>(bytes) {
        let _ = tool_result(result);
    }
    if let Ok(step) = serde_json::from_slice::<rmcp::model::ProgressNotificationParam>(bytes) {
        let _ = json!({"progress": step.progress, "total": step.total, "message": step.message});
    }
}

/// A tool's answer as the model reads it: its structured content, else its text (JSON when it
/// is JSON); an error result as `{"error": …}`.
fn tool_result(result: CallToolResult) -> Value {
    let text: Vec<String> = result
        .content
        .iter()
        .map(|block| match block.as_text() {
            Some(text) => text.text.clone(),
            None => "[non-text content]".to_owned(),
        })
        .collect();
    let text = text.join("\n");
    if result.is_error == Some(true) {
        return json!({ "error": text });
    }
    if let Some(structured) = result.structured_content {
        return structured;
    }
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;

    #[test]
    fn a_stdio_server_sees_path_home_and_its_own_env_never_voxides_secrets() {
        let parent = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/v"),
            ("OPENAI_API_KEY", "sk-secret"),
            ("VOXIDE_AUTH_TOKEN", "t0ken"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let listed = vec![("WEATHER_KEY".to_owned(), Secret::new("w"))];
        let seen = child_environment(parent.into_iter(), &listed);
        let names: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "HOME", "WEATHER_KEY"]);
    }

    fn step(token: i64, progress: f64) -> ProgressNotificationParam {
        ProgressNotificationParam::new(ProgressToken(NumberOrString::Number(token)), progress)
    }

    #[test]
    fn progress_reaches_its_call_even_when_it_comes_before_the_call_listens() {
        let progress = Progress::default();
        progress.dispatch(step(1, 1.0));
        progress.dispatch(step(2, 1.0));
        let mut first = progress.subscribe(ProgressToken(NumberOrString::Number(1)));
        progress.dispatch(step(1, 2.0));
        assert_eq!(first.try_recv().map(|p| p.progress), Ok(1.0));
        assert_eq!(first.try_recv().map(|p| p.progress), Ok(2.0));
        assert!(first.try_recv().is_err());
        let mut second = progress.subscribe(ProgressToken(NumberOrString::Number(2)));
        assert_eq!(second.try_recv().map(|p| p.progress), Ok(1.0));
    }

    #[test]
    fn a_server_is_described_by_a_command_or_a_url() {
        let both: McpConfig =
            toml::from_str("name = \"x\"\ncommand = \"node\"\nurl = \"http://127.0.0.1:1/mcp\"")
                .expect("config");
        assert!(
            McpServer::new(&both)
                .expect_err("both")
                .contains("one of them")
        );
        let stdio: McpConfig = toml::from_str("name = \"x\"\ncommand = \"node\"").expect("config");
        assert_eq!(McpServer::new(&stdio).expect("stdio").name(), "x");
    }

    #[test]
    fn an_answer_reads_as_json_when_it_is_json() {
        let text = |t: &str| CallToolResult::success(vec![rmcp::model::ContentBlock::text(t)]);
        assert_eq!(tool_result(text("{\"a\": 1}")), json!({"a": 1}));
        assert_eq!(tool_result(text("done")), json!("done"));
        let failed = CallToolResult::error(vec![rmcp::model::ContentBlock::text("no such file")]);
        assert_eq!(tool_result(failed), json!({"error": "no such file"}));
    }
}
