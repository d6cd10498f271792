//! OpenAI-compatible chat completions over server-sent events: OpenAI itself and the servers
//! that speak its API (Ollama, vLLM, llama.cpp's server, LM Studio, Groq, OpenRouter).
//!
//! One request per completion, `stream: true` with usage included. The answer is read by
//! [`wire::Assembler`] (sans-IO) on the driver every HTTP LLM shares ([`super::http`]).

#[doc(hidden)]
pub mod wire;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::http::{Endpoint, Timing};
use super::{LlmEngine, LlmError, LlmEvent, LlmRequest};
use voxide_core::context::adapters::openai;

/// The model used when none is named: a current small one.
pub const DEFAULT_MODEL: &str = "gpt-4.1-mini";
/// OpenAI's API, when `OPENAI_BASE_URL` names no other.
pub const DEFAULT_BASE_URL: &str = crate::OPENAI_BASE_URL;

/// Where and how to ask.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiSettings {
    /// Up to and including `/v1`: `{base_url}/chat/completions` is called.
    pub base_url: String,
    /// Sent as a bearer token; none for servers that need no key (Ollama).
    pub api_key: Option<voxide_core::secret::Secret>,
    /// The model.
    pub model: String,
    /// `max_completion_tokens` (OpenAI) and `max_tokens` (the servers that copy it).
    pub max_tokens: Option<u32>,
    /// Sampling temperature; the server's default when `None`.
    pub temperature: Option<f32>,
    /// Deadlines and retries.
    pub timing: Timing,
}

impl Default for OpenAiSettings {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: None,
            model: DEFAULT_MODEL.to_owned(),
            max_tokens: None,
            temperature: None,
            timing: Timing::default(),
        }
    }
}

impl OpenAiSettings {
    /// From `OPENAI_API_KEY` and `OPENAI_BASE_URL`. A key is required for OpenAI's own API; a
    /// server at another base URL (Ollama) may need none.
    pub fn from_env() -> Result<Self, LlmError> {
        let (base_url, api_key) =
            crate::openai_from_env("--llm openai").map_err(LlmError::Setup)?;
        Ok(Self {
            api_key,
            base_url,
            ..Self::default()
        })
    }
}

/// The engine.
pub struct OpenAiLlm {
    settings: OpenAiSettings,
    endpoint: Endpoint,
}

impl OpenAiLlm {
    /// An engine for `settings`.
    pub fn new(settings: OpenAiSettings) -> Result<Self, LlmError> {
        let url = format!(
            "{}/chat/completions",
            settings.base_url.trim_end_matches('/')
        );
        let mut headers = HeaderMap::new();
        if let Some(key) = &settings.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
                .map_err(|_| LlmError::Setup("OPENAI_API_KEY is not a valid header".into()))?;
            headers.insert(AUTHORIZATION, value);
        }
        let endpoint = Endpoint::new(url, headers, settings.timing)?;
        Ok(Self { settings, endpoint })
    }

    /// The request body for `request`, or why the context cannot be sent.
    pub fn body(&self, request: &LlmRequest) -> Result<Value, LlmError> {
        let mut body = openai::request(
            &request.messages,
            &request.tools,
            request.tool_choice.as_ref(),
        )?;
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
        Ok(body)
    }
}

impl LlmEngine for OpenAiLlm {
    fn model(&self) -> &str {
        &self.settings.model
    }

    fn provider(&self) -> &str {
        "openai"
    }

    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        match self.body(&request) {
            Ok(body) => self.endpoint.stream(body, wire::Assembler::new),
            Err(error) => futures_util::stream::iter([Err(error)]).boxed(),
        }
    }

    fn warm(&self) -> BoxFuture<'static, ()> {
        self.endpoint.warm()
    }
}
