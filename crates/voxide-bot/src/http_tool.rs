//! HTTP tools: a bot file's `[[tool]]` is a function the model calls and a URL that answers it.
//!
//! The request: `POST` (or `PUT`, `PATCH`) with the JSON body
//! `{"tool", "arguments", "tool_call_id", "session_id", "request_data"}`; `GET` and `DELETE`
//! carry the arguments in the query instead. Every request also has the headers
//! `x-voxide-session-id` and `x-voxide-tool-call-id`.
//!
//! The answer: a JSON body is the result. An `application/x-ndjson` body is read line by line
//! and a `text/event-stream` body event by event: each line or event is a JSON value, every one
//! but the last an intermediate result of an async tool (a slow job's progress), the last the
//! final result. A status of 400 or more, a timeout, a body that is not JSON or a stream that
//! ends with nothing are a failed result the model can speak about (`{"error": "…"}`). An
//! interruption (or the model's `cancel_<name>`) drops the call, which closes its connection.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::SessionInfo;
use crate::config::HttpToolConfig;
use crate::config::expand_env;
use crate::context::FunctionSchema;
use crate::services::llm::sse::SseDecoder;
use crate::services::llm::{
    FunctionCallParams, FunctionOptions, FunctionRegistry, ResultCallback, ResultProperties,
};

/// A sync tool's default time limit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// An async tool's default time limit.
pub const DEFAULT_ASYNC_TIMEOUT: Duration = Duration::from_secs(300);
/// The most of an error body quoted back to the model.
const ERROR_BODY_CHARS: usize = 300;

/// One HTTP tool, ready to register. Clones share the HTTP client.
#[derive(Debug, Clone)]
pub struct HttpTool(Arc<Spec>);

#[derive(Debug)]
struct Spec {
    schema: FunctionSchema,
    url: reqwest::Url,
    method: Method,
    headers: HeaderMap,
    timeout: Duration,
    asynchronous: bool,
    client: reqwest::Client,
}

impl HttpTool {
    /// The tool `config` describes; an error names what is wrong with it.
    pub fn new(config: &HttpToolConfig) -> Result<Self, String> {
        let name = &config.name;
        let what = format!("tool {name:?}");
        if !FunctionSchema::is_valid_name(name) {
            return Err(format!(
                "{what}: a tool name is letters, digits, _ and - only"
            ));
        }
        let schema = FunctionSchema::from_parameters(
            name.clone(),
            config.description.clone(),
            config.parameters.as_ref().unwrap_or(&Value::Null),
        )
        .map_err(|e| format!("{what}: {e}"))?;
        let url = reqwest::Url::parse(&config.url)
            .map_err(|e| format!("{what}: the url {:?} is invalid: {e}", config.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{what}: the url must be http or https"));
        }
        let method = match config.method.as_deref().unwrap_or("POST") {
            m if m.eq_ignore_ascii_case("post") => Method::POST,
            m if m.eq_ignore_ascii_case("put") => Method::PUT,
            m if m.eq_ignore_ascii_case("patch") => Method::PATCH,
            m if m.eq_ignore_ascii_case("get") => Method::GET,
            m if m.eq_ignore_ascii_case("delete") => Method::DELETE,
            other => {
                return Err(format!(
                    "{what}: method {other:?}: use POST, PUT, PATCH, GET or DELETE"
                ));
            }
        };
        let headers = header_map(&config.headers, &what)?;
        let asynchronous = !config.cancel_on_interruption.unwrap_or(true);
        let timeout = match config.timeout_secs {
            None if asynchronous => DEFAULT_ASYNC_TIMEOUT,
            None => DEFAULT_TIMEOUT,
            Some(secs) if secs > 0.0 && secs <= 86_400.0 => Duration::from_secs_f64(secs),
            Some(_) => return Err(format!("{what}: timeout_secs must be between 0 and a day")),
        };
        let client = client(&what)?;
        Ok(Self(Arc::new(Spec {
            schema,
            url,
            method,
            headers,
            timeout,
            asynchronous,
            client,
        })))
    }

    /// The name the model calls it by.
    pub fn name(&self) -> &str {
        &self.0.schema.name
    }

    /// Registers it, with its schema, on `registry`.
    pub fn register(&self, registry: &mut FunctionRegistry) {
        let spec = self.0.clone();
        let options = FunctionOptions {
            // The call keeps its own deadline, with a clearer result; this one is a backstop.
            timeout: Some(spec.timeout + Duration::from_secs(5)),
            cancellable_by_llm: spec.asynchronous,
            cancel_on_interruption: !spec.asynchronous,
        };
        registry.register_with_schema(
            self.0.schema.clone(),
            move |params| call(spec.clone(), params),
            options,
        );
    }
}

/// Redirects a tool's request may follow.
const MAX_REDIRECTS: usize = 5;

/// The HTTP client of a bot's tools (HTTP tools, MCP servers over HTTP). Their requests carry
/// the bot file's headers (keys, tokens), so a redirect is followed only to the same host and
/// port, never from https to http, and at most [`MAX_REDIRECTS`] times.
pub(crate) fn client(what: &str) -> Result<reqwest::Client, String> {
    // A no-op once installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        let Some(first) = attempt.previous().first() else {
            return attempt.follow();
        };
        let next = attempt.url();
        let why = if attempt.previous().len() > MAX_REDIRECTS {
            Some(format!("more than {MAX_REDIRECTS} redirects"))
        } else if first.scheme() == "https" && next.scheme() != "https" {
            Some(format!("a redirect from https to {}", next.scheme()))
        } else if first.host_str() != next.host_str()
            || first.port_or_known_default() != next.port_or_known_default()
        {
            Some(format!(
                "a redirect to another host ({}): the tool's headers go only to its own",
                next.host_str().unwrap_or_default()
            ))
        } else {
            None
        };
        match why {
            Some(why) => attempt.error(why),
            None => attempt.follow(),
        }
    });
    reqwest::Client::builder()
        .redirect(policy)
        .build()
        .map_err(|e| format!("{what}: cannot build the HTTP client: {e}"))
}

/// `headers` with `${NAME}` expanded, as a header map; their values are marked sensitive, so
/// `Debug` never shows them.
pub(crate) fn header_map(
    headers: &std::collections::BTreeMap<String, String>,
    what: &str,
) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let value = expand_env(value, &format!("{what}'s header {name}"))?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{what}: {name:?} is not a header name"))?;
        let mut value = HeaderValue::from_str(&value)
            .map_err(|_| format!("{what}: the header {name} has a value no header can hold"))?;
        value.set_sensitive(true);
        map.insert(name, value);
    }
    Ok(map)
}

/// One call: the request, then its answer delivered as the tool's results.
async fn call(spec: Arc<Spec>, params: FunctionCallParams) {
    let callback = params.result_callback.clone();
    let outcome = tokio::time::timeout(spec.timeout, exchange(&spec, &params)).await;
    let failure = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(failure)) => failure,
        Err(_) => format!(
            "{} did not answer within {} s",
            spec.schema.name,
            spec.timeout.as_secs_f64()
        ),
    };
    // The model reads the failure; the backend's URL stays in the log.
    tracing::warn!(tool = %spec.schema.name, url = %spec.url, error = %failure, "HTTP tool failed");
    callback.done(json!({ "error": failure }));
}

/// Sends the request and delivers what comes back; an error says why there is no result.
async fn exchange(spec: &Spec, params: &FunctionCallParams) -> Result<(), String> {
    let response = request(spec, params).send().await.map_err(|e| {
        format!(
            "the request to {} failed: {}",
            backend(spec),
            without_url(&e)
        )
    })?;
    let status = response.status();
    if status.as_u16() >= 400 {
        let body = response.text().await.unwrap_or_default();
        let body: String = body.chars().take(ERROR_BODY_CHARS).collect();
        return Err(format!(
            "{} answered HTTP {status}: {}",
            backend(spec),
            body.trim()
        ));
    }
    let kind = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let framing =
        if kind.starts_with("application/x-ndjson") || kind.starts_with("application/jsonl") {
            Framing::Lines
        } else if kind.starts_with("text/event-stream") {
            Framing::Events
        } else {
            let body = response.bytes().await.map_err(|e| broke_off(spec, &e))?;
            let result = if body.iter().all(u8::is_ascii_whitespace) {
                json!({ "ok": true })
            } else {
                serde_json::from_slice(&body)
                    .map_err(|e| format!("{} answered with invalid JSON: {e}", backend(spec)))?
            };
            params.result_callback.done(result);
            return Ok(());
        };
    let mut results = Streamed::new(params.result_callback.clone(), spec.asynchronous);
    let mut splitter = Splitter::new(framing);
    let mut body = response.bytes_stream();
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(|e| broke_off(spec, &e))?;
        for item in splitter.push(&piece)? {
            results.push(&item, &backend(spec))?;
        }
    }
    for item in splitter.finish()? {
        results.push(&item, &backend(spec))?;
    }
    results.finish(&backend(spec))
}

/// How failures name the backend to the model (never by its URL, which may be internal).
fn backend(spec: &Spec) -> String {
    format!("the backend of {}", spec.schema.name)
}

/// The call's request: the arguments in the body (or the query), with who is calling.
fn request(spec: &Spec, params: &FunctionCallParams) -> reqwest::RequestBuilder {
    let session = params
        .app_resources
        .get::<SessionInfo>()
        .cloned()
        .unwrap_or_default();
    let bodiless = matches!(spec.method, Method::GET | Method::DELETE);
    let mut url = spec.url.clone();
    if bodiless {
        url.query_pairs_mut().extend_pairs(query(&params.arguments));
    }
    let request = spec
        .client
        .request(spec.method.clone(), url)
        .headers(spec.headers.clone())
        .header("x-voxide-session-id", &session.id)
        .header("x-voxide-tool-call-id", &params.tool_call_id);
    if bodiless {
        return request;
    }
    request.json(&json!({
        "tool": spec.schema.name,
        "arguments": params.arguments,
        "tool_call_id": params.tool_call_id,
        "session_id": session.id,
        "request_data": session.request_data,
    }))
}

fn broke_off(spec: &Spec, e: &reqwest::Error) -> String {
    format!(
        "the answer from {} broke off: {}",
        backend(spec),
        without_url(e)
    )
}

/// A reqwest error's text without the URL it repeats.
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(&format!(" for url ({url})"), "");
    }
    match std::error::Error::source(e) {
        Some(source) => format!("{text}: {source}"),
        None => text,
    }
}

/// The arguments as query pairs: strings as they are, anything else as JSON.
fn query(arguments: &Value) -> Vec<(String, String)> {
    arguments
        .as_object()
        .map(|object| {
            object
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (k.clone(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// For the fuzz targets (`voxide::fuzz`): a backend's answer, as one JSON body and streamed as lines and as
/// events (in chunks split at `0xff`), each item read as JSON.
#[doc(hidden)]
pub fn fuzz_answer(bytes: &[u8]) {
    let _ = serde_json::from_slice::<Value>(bytes);
    for framing in [Framing::Lines, Framing::Events] {
        let mut splitter = Splitter::new(framing);
        let mut items = Vec::new();
        for chunk in bytes.split(|b| *b == 0xff) {
            match splitter.push(chunk) {
                Ok(more) => items.extend(more),
                Err(_) => break,
            }
        }
        items.extend(splitter.finish().unwrap_or_default());
        for item in items {
            let _ = serde_json::from_str::<Value>(&item);
        }
    }
}

/// How a streamed answer is cut into results.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// One JSON value a line.
    Lines,
    /// One JSON value an event's data.
    Events,
}

/// Cuts a streamed body into items: lines or events' data.
struct Splitter {
    framing: Framing,
    line: Vec<u8>,
    sse: SseDecoder,
}

impl Splitter {
    fn new(framing: Framing) -> Self {
        Self {
            framing,
            line: Vec::new(),
            sse: SseDecoder::new(),
        }
    }

    fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        match self.framing {
            Framing::Events => Ok(self
                .sse
                .push(bytes)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|event| event.data)
                .collect()),
            Framing::Lines => {
                let mut items = Vec::new();
                for &b in bytes {
                    if b == b'\n' {
                        items.extend(self.take_line()?);
                    } else {
                        if self.line.len() >= crate::services::llm::sse::MAX_LINE_BYTES {
                            return Err("a line of the answer is too long".into());
                        }
                        self.line.push(b);
                    }
                }
                Ok(items)
            }
        }
    }

    /// What the end of the body completes: a last line with no newline.
    fn finish(&mut self) -> Result<Vec<String>, String> {
        match self.framing {
            Framing::Lines => Ok(self.take_line()?.into_iter().collect()),
            Framing::Events => Ok(Vec::new()),
        }
    }

    fn take_line(&mut self) -> Result<Option<String>, String> {
        let line = std::mem::take(&mut self.line);
        let line = String::from_utf8(line).map_err(|_| "a line of the answer is not UTF-8")?;
        let line = line.trim();
        Ok((!line.is_empty()).then(|| line.to_owned()))
    }
}

/// A streamed answer's results: each item holds back until the next comes, so the last is
/// the final one.
struct Streamed {
    callback: ResultCallback,
    asynchronous: bool,
    held: Option<Value>,
}

impl Streamed {
    fn new(callback: ResultCallback, asynchronous: bool) -> Self {
        Self {
            callback,
            asynchronous,
            held: None,
        }
    }

    fn push(&mut self, item: &str, backend: &str) -> Result<(), String> {
        let value: Value = serde_json::from_str(item).map_err(|e| {
            format!("{backend} streamed a value that is not JSON ({e}): {item:.80}")
        })?;
        if let Some(before) = self.held.replace(value)
            && self.asynchronous
        {
            // Progress goes into the conversation; the bot speaks when the job is done.
            self.callback.deliver(
                before,
                ResultProperties {
                    run_llm: Some(false),
                    ..ResultProperties::intermediate()
                },
            );
        }
        Ok(())
    }

    fn finish(self, backend: &str) -> Result<(), String> {
        let last = self
            .held
            .ok_or_else(|| format!("the stream from {backend} ended with no result"))?;
        self.callback.done(last);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn config(extra: &str) -> HttpToolConfig {
        toml::from_str(&format!(
            "name = \"lookup\"\ndescription = \"Looks up.\"\nurl = \"http://127.0.0.1:9/x\"\n{extra}"
        ))
        .expect("a tool config")
    }

    #[test]
    fn a_tool_is_checked_where_it_is_described() {
        assert!(HttpTool::new(&config("")).is_ok());
        let e = HttpTool::new(&config("method = \"TRACE\"")).expect_err("TRACE");
        assert!(e.contains("TRACE"), "{e}");
        let e = HttpTool::new(&config(
            "parameters = { type = \"object\", required = [\"id\"] }",
        ))
        .expect_err("required but undescribed");
        assert!(e.contains("\"id\""), "{e}");
        let e = HttpTool::new(&config(
            "headers = { Authorization = \"Bearer ${VOXIDE_TEST_UNSET_TOKEN}\" }",
        ))
        .expect_err("unset variable");
        assert!(e.contains("VOXIDE_TEST_UNSET_TOKEN"), "{e}");
    }

    #[test]
    fn headers_name_environment_variables() {
        // PATH is set wherever tests run.
        let path = std::env::var("PATH").expect("PATH");
        let headers = BTreeMap::from([("X-Path".to_owned(), "p=${PATH};".to_owned())]);
        let map = header_map(&headers, "tool").expect("headers");
        assert_eq!(map["x-path"], format!("p={path};").as_str());
    }

    #[test]
    fn lines_and_events_are_cut_however_the_bytes_come() {
        let mut lines = Splitter::new(Framing::Lines);
        let mut got = lines.push(b"{\"a\":1}\n{\"a\"").expect("lines");
        got.extend(lines.push(b":2}\n\n{\"a\":3}").expect("lines"));
        got.extend(lines.finish().expect("end"));
        assert_eq!(got, ["{\"a\":1}", "{\"a\":2}", "{\"a\":3}"]);
        let mut events = Splitter::new(Framing::Events);
        let mut got = events
            .push(b"data: {\"p\":1}\n\n: ping\n\ndata: {\"p\"")
            .expect("sse");
        got.extend(events.push(b":2}\n\n").expect("sse"));
        assert_eq!(got, ["{\"p\":1}", "{\"p\":2}"]);
    }
}
