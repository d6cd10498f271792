//! OpenAI-compatible chat completions over server-sent events: OpenAI itself and the servers
//! that speak its API (Ollama, vLLM, llama.cpp's server, LM Studio, Groq, OpenRouter).
//!
//! One request per completion, `stream: true` with usage included. The answer is read by
//! [`super::sse::SseDecoder`] and [`wire::Assembler`] (both sans-IO); this module is the thin
//! driver: it sends, retries what failed before the first token (429, 5xx, a refused
//! connection; `retry-after` honoured), and bounds the wait for the first chunk and between
//! chunks. Dropping the stream (an interruption) drops the response and frees the connection.

mod wire;

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::sse::SseDecoder;
use super::{LlmEngine, LlmError, LlmEvent, LlmRequest};
use crate::context::adapters::openai;

/// The model used when none is named: a current small one.
pub const DEFAULT_MODEL: &str = "gpt-4.1-mini";
/// OpenAI's API, when `OPENAI_BASE_URL` names no other.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// Events the stream may run ahead of its reader by.
const EVENT_QUEUE: usize = 64;

/// Where and how to ask.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiSettings {
    /// Up to and including `/v1`: `{base_url}/chat/completions` is called.
    pub base_url: String,
    /// Sent as a bearer token; none for servers that need no key (Ollama).
    pub api_key: Option<String>,
    /// The model.
    pub model: String,
    /// `max_completion_tokens` (OpenAI) and `max_tokens` (the servers that copy it).
    pub max_tokens: Option<u32>,
    /// Sampling temperature; the server's default when `None`.
    pub temperature: Option<f32>,
    /// How long the first chunk may take (the request included).
    pub first_chunk_timeout: Duration,
    /// How long the stream may go quiet between chunks.
    pub idle_timeout: Duration,
    /// Attempts after the first, before any token came.
    pub retries: u32,
}

impl Default for OpenAiSettings {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: None,
            model: DEFAULT_MODEL.to_owned(),
            max_tokens: None,
            temperature: None,
            first_chunk_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(20),
            retries: 2,
        }
    }
}

impl OpenAiSettings {
    /// From `OPENAI_API_KEY` and `OPENAI_BASE_URL`. A key is required for OpenAI's own API; a
    /// server at another base URL (Ollama) may need none.
    pub fn from_env() -> Result<Self, LlmError> {
        let api_key = std::env::var("OPENAI_API_KEY")
            .ok()
            .filter(|k| !k.is_empty());
        let base_url = std::env::var("OPENAI_BASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        if api_key.is_none() && base_url == DEFAULT_BASE_URL {
            return Err(LlmError::Provider(
                "--llm openai needs OPENAI_API_KEY (or OPENAI_BASE_URL for a server that needs no key)"
                    .into(),
            ));
        }
        Ok(Self {
            api_key,
            base_url,
            ..Self::default()
        })
    }
}

/// The engine.
pub struct OpenAiLlm {
    client: reqwest::Client,
    settings: OpenAiSettings,
    url: String,
}

impl OpenAiLlm {
    /// An engine for `settings`.
    pub fn new(settings: OpenAiSettings) -> Result<Self, LlmError> {
        // The process's TLS provider, as the realtime clients use it (a no-op once installed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| LlmError::Connection(format!("cannot build the HTTP client: {e}")))?;
        let url = format!(
            "{}/chat/completions",
            settings.base_url.trim_end_matches('/')
        );
        Ok(Self {
            client,
            settings,
            url,
        })
    }

    /// The request body for `request`.
    pub fn body(&self, request: &LlmRequest) -> Value {
        let mut body = openai::request(
            &request.messages,
            &request.tools,
            request.tool_choice.as_ref(),
        );
        body["model"] = json!(self.settings.model);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        if let Some(max) = self.settings.max_tokens {
            // OpenAI's reasoning models take only the first; the servers that copy the API
            // read the second.
            if self.settings.base_url == DEFAULT_BASE_URL {
                body["max_completion_tokens"] = json!(max);
            } else {
                body["max_tokens"] = json!(max);
            }
        }
        if let Some(t) = self.settings.temperature {
            body["temperature"] = json!(t);
        }
        body
    }
}

/// Why an attempt failed, and whether another may succeed.
enum Attempt {
    Retry {
        error: LlmError,
        after: Option<Duration>,
    },
    Fail(LlmError),
}

impl OpenAiLlm {
    /// Sends the request once; returns the streaming response.
    async fn send(&self, body: &Value) -> Result<reqwest::Response, Attempt> {
        let mut request = self.client.post(&self.url).json(body);
        if let Some(key) = &self.settings.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| Attempt::Retry {
            error: LlmError::Connection(e.to_string()),
            after: None,
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|s| Duration::from_secs_f64(s.clamp(0.0, 30.0)));
        let text = response.text().await.unwrap_or_default();
        let error = LlmError::Provider(format!("HTTP {status}: {}", clip(&text)));
        if status.as_u16() == 429 || status.is_server_error() {
            Err(Attempt::Retry { error, after })
        } else {
            Err(Attempt::Fail(error))
        }
    }

    /// The whole completion, events into `out`; returns when it ends or the reader left.
    async fn run(
        &self,
        body: Value,
        out: mpsc::Sender<Result<LlmEvent, LlmError>>,
    ) -> Result<(), LlmError> {
        let mut attempt = 0;
        loop {
            let started = tokio::time::Instant::now();
            let first = tokio::time::timeout(self.settings.first_chunk_timeout, async {
                let response = self.send(&body).await?;
                first_events(response).await
            })
            .await;
            let outcome = match first {
                Ok(outcome) => outcome,
                Err(_) => Err(Attempt::Retry {
                    error: LlmError::Connection(format!(
                        "no answer within {:?}",
                        self.settings.first_chunk_timeout
                    )),
                    after: None,
                }),
            };
            match outcome {
                Ok(stream) => return self.stream(stream, out).await,
                Err(Attempt::Fail(error)) => return Err(error),
                Err(Attempt::Retry { error, after }) => {
                    if attempt >= self.settings.retries {
                        return Err(error);
                    }
                    attempt += 1;
                    let wait = after.unwrap_or(Duration::from_millis(250 << attempt));
                    tracing::warn!(attempt, wait_ms = wait.as_millis() as u64, %error, elapsed_ms = started.elapsed().as_millis() as u64, "LLM request failed before its first token; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Reads the rest of a stream whose first events came.
    async fn stream(
        &self,
        mut stream: Started,
        out: mpsc::Sender<Result<LlmEvent, LlmError>>,
    ) -> Result<(), LlmError> {
        for event in stream.pending.drain(..) {
            if out.send(Ok(event)).await.is_err() {
                return Ok(());
            }
        }
        loop {
            let next = tokio::time::timeout(self.settings.idle_timeout, stream.bytes.next()).await;
            let bytes = match next {
                Err(_) => {
                    return Err(LlmError::Connection(format!(
                        "the stream stalled for {:?}",
                        self.settings.idle_timeout
                    )));
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(LlmError::Connection(e.to_string())),
                Ok(Some(Ok(bytes))) => bytes,
            };
            let (events, done) = stream.decode(&bytes)?;
            for event in events {
                if out.send(Ok(event)).await.is_err() {
                    return Ok(());
                }
            }
            if done {
                break;
            }
        }
        for event in stream.assembler.end()? {
            if out.send(Ok(event)).await.is_err() {
                break;
            }
        }
        Ok(())
    }
}

/// A response whose first events came.
struct Started {
    bytes: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    decoder: SseDecoder,
    assembler: wire::Assembler,
    pending: Vec<LlmEvent>,
    /// `[DONE]` came.
    done: bool,
}

impl Started {
    /// Decodes a piece of the body; says whether `[DONE]` came.
    fn decode(&mut self, bytes: &[u8]) -> Result<(Vec<LlmEvent>, bool), LlmError> {
        let mut events = Vec::new();
        let sse = self
            .decoder
            .push(bytes)
            .map_err(|e| LlmError::Protocol(e.to_string()))?;
        for event in sse {
            if event.data.trim() == "[DONE]" {
                self.done = true;
            }
            events.extend(self.assembler.data(&event.data)?);
        }
        Ok((events, self.done))
    }
}

/// Reads until the first events (or the end): what the first-chunk deadline covers.
async fn first_events(response: reqwest::Response) -> Result<Started, Attempt> {
    let mut started = Started {
        bytes: response.bytes_stream().boxed(),
        decoder: SseDecoder::new(),
        assembler: wire::Assembler::new(),
        pending: Vec::new(),
        done: false,
    };
    loop {
        match started.bytes.next().await {
            None => return Ok(started),
            Some(Err(e)) => {
                return Err(Attempt::Retry {
                    error: LlmError::Connection(e.to_string()),
                    after: None,
                });
            }
            Some(Ok(bytes)) => {
                let (events, done) = started.decode(&bytes).map_err(Attempt::Fail)?;
                started.pending.extend(events);
                if !started.pending.is_empty() || done {
                    return Ok(started);
                }
            }
        }
    }
}

fn clip(text: &str) -> String {
    text.chars().take(300).collect()
}

impl LlmEngine for OpenAiLlm {
    fn model(&self) -> &str {
        &self.settings.model
    }

    fn provider(&self) -> &str {
        "openai"
    }

    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        let body = self.body(&request);
        let engine = Self {
            client: self.client.clone(),
            settings: self.settings.clone(),
            url: self.url.clone(),
        };
        let (tx, mut rx) = mpsc::channel(EVENT_QUEUE);
        // The task ends with the completion, or as soon as the reader drops the stream (its
        // next send fails), dropping the response and with it the connection.
        tokio::spawn(async move {
            if let Err(error) = engine.run(body, tx.clone()).await {
                let _ = tx.send(Err(error)).await;
            }
        });
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
    }
}
