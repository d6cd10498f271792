//! Anthropic's Messages API over server-sent events (`POST {base}/v1/messages`, `stream: true`).
//!
//! The request is the context through [`voxide_core::context::adapters::anthropic`]: instructions in
//! the top-level `system`, calls and results as `tool_use` and `tool_result` blocks, roles
//! merged so that they alternate. The async-tool messages keep Anthropic's rule that a
//! `tool_use` is answered by the next user turn: *started* is that turn's `tool_result`, and the
//! later *intermediate* and *final* messages are user text. The reply is read by
//! [`wire::Decoder`] on the shared HTTP driver ([`super::http`]).

#[doc(hidden)]
pub mod wire;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::http::{Endpoint, Timing};
use super::{LlmEngine, LlmError, LlmEvent, LlmRequest};
use voxide_core::context::adapters::anthropic;

/// The model used when none is named: Anthropic's current small one.
pub const DEFAULT_MODEL: &str = "claude-haiku-4-5";
/// Anthropic's API, when `ANTHROPIC_BASE_URL` names no other.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The API version every request names.
pub const API_VERSION: &str = "2023-06-01";
/// `max_tokens` is required; a spoken answer needs far less.
pub const DEFAULT_MAX_TOKENS: u32 = 1024;

/// Where and how to ask.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicSettings {
    /// Scheme and host: `{base_url}/v1/messages` is called.
    pub base_url: String,
    /// Sent as `x-api-key`.
    pub api_key: voxide_core::secret::Secret,
    /// The model.
    pub model: String,
    /// The reply's token limit.
    pub max_tokens: u32,
    /// Sampling temperature; the API's default when `None`.
    pub temperature: Option<f32>,
    /// Deadlines and retries.
    pub timing: Timing,
}

impl AnthropicSettings {
    /// Settings for `api_key` with the defaults.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: voxide_core::secret::Secret::new(api_key),
            model: DEFAULT_MODEL.to_owned(),
            max_tokens: DEFAULT_MAX_TOKENS,
            temperature: None,
            timing: Timing::default(),
        }
    }

    /// From `ANTHROPIC_API_KEY` (required) and `ANTHROPIC_BASE_URL`.
    pub fn from_env() -> Result<Self, LlmError> {
        let api_key = std::env::var("ANTHROPIC_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| LlmError::Setup("--llm anthropic needs ANTHROPIC_API_KEY".into()))?;
        let mut settings = Self::new(api_key);
        if let Some(url) = std::env::var("ANTHROPIC_BASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
        {
            settings.base_url = url;
        }
        Ok(settings)
    }
}

/// The engine.
pub struct AnthropicLlm {
    settings: AnthropicSettings,
    endpoint: Endpoint,
}

impl AnthropicLlm {
    /// An engine for `settings`.
    pub fn new(settings: AnthropicSettings) -> Result<Self, LlmError> {
        let base = settings.base_url.trim_end_matches('/');
        // The SDKs take the host; a base that already names the version is taken as it is.
        let url = if base.ends_with("/v1") {
            format!("{base}/messages")
        } else {
            format!("{base}/v1/messages")
        };
        let key = HeaderValue::from_str(settings.api_key.expose())
            .map_err(|_| LlmError::Setup("ANTHROPIC_API_KEY is not a valid header".into()))?;
        let mut headers = HeaderMap::new();
        headers.insert(HeaderName::from_static("x-api-key"), key);
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(API_VERSION),
        );
        let endpoint = Endpoint::new(url, headers, settings.timing)?;
        Ok(Self { settings, endpoint })
    }

    /// The request body for `request`, or why the context cannot be sent.
    pub fn body(&self, request: &LlmRequest) -> Result<Value, LlmError> {
        let mut body = anthropic::request(
            &request.messages,
            &request.tools,
            request.tool_choice.as_ref(),
        )?;
        body["model"] = json!(self.settings.model);
        body["max_tokens"] = json!(self.settings.max_tokens);
        body["stream"] = json!(true);
        if let Some(t) = self.settings.temperature {
            body["temperature"] = json!(t);
        }
        Ok(body)
    }
}

impl LlmEngine for AnthropicLlm {
    fn model(&self) -> &str {
        &self.settings.model
    }

    fn provider(&self) -> &str {
        "anthropic"
    }

    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        match self.body(&request) {
            Ok(body) => self.endpoint.stream(body, wire::Decoder::new),
            Err(error) => futures_util::stream::iter([Err(error)]).boxed(),
        }
    }

    fn warm(&self) -> BoxFuture<'static, ()> {
        self.endpoint.warm()
    }
}
