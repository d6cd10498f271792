//! Google Gemini over server-sent events
//! (`POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse`).
//!
//! The request is the context through [`voxide_core::context::adapters::gemini`]: `systemInstruction`,
//! `functionCall` / `functionResponse` parts, each call sent back with its thought signature.
//! The reply is read by [`wire::Decoder`] on the shared HTTP driver ([`super::http`]).

#[doc(hidden)]
pub mod wire;

pub use wire::thought_signature;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::http::{Endpoint, Timing};
use super::{LlmEngine, LlmError, LlmEvent, LlmRequest};
use voxide_core::context::adapters::gemini;

/// The model used when none is named: Google's current small one.
pub const DEFAULT_MODEL: &str = "gemini-2.5-flash";
/// Google's API, when `GEMINI_BASE_URL` names no other.
pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com";

/// Where and how to ask.
#[derive(Debug, Clone, PartialEq)]
pub struct GeminiSettings {
    /// Scheme and host: `{base_url}/v1beta/models/…` is called.
    pub base_url: String,
    /// Sent as `x-goog-api-key`.
    pub api_key: voxide_core::secret::Secret,
    /// The model.
    pub model: String,
    /// `maxOutputTokens`; the API's default when `None`.
    pub max_tokens: Option<u32>,
    /// Sampling temperature; the API's default when `None`.
    pub temperature: Option<f32>,
    /// `thinkingBudget`. `None` turns thinking off on the Flash models, where a spoken answer
    /// should not wait for it, and leaves the others to their default.
    pub thinking_budget: Option<i32>,
    /// Deadlines and retries.
    pub timing: Timing,
}

impl GeminiSettings {
    /// Settings for `api_key` with the defaults.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: voxide_core::secret::Secret::new(api_key),
            model: DEFAULT_MODEL.to_owned(),
            max_tokens: None,
            temperature: None,
            thinking_budget: None,
            timing: Timing::default(),
        }
    }

    /// From `GEMINI_API_KEY` (required) and `GEMINI_BASE_URL`.
    pub fn from_env() -> Result<Self, LlmError> {
        let api_key = std::env::var("GEMINI_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| LlmError::Setup("--llm gemini needs GEMINI_API_KEY".into()))?;
        let mut settings = Self::new(api_key);
        if let Some(url) = std::env::var("GEMINI_BASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
        {
            settings.base_url = url;
        }
        Ok(settings)
    }
}

/// The engine.
pub struct GeminiLlm {
    settings: GeminiSettings,
    endpoint: Endpoint,
}

impl GeminiLlm {
    /// An engine for `settings`.
    pub fn new(settings: GeminiSettings) -> Result<Self, LlmError> {
        let base = settings.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1beta").unwrap_or(base);
        let url = format!(
            "{base}/v1beta/models/{}:streamGenerateContent?alt=sse",
            settings.model
        );
        let key = HeaderValue::from_str(settings.api_key.expose())
            .map_err(|_| LlmError::Setup("GEMINI_API_KEY is not a valid header".into()))?;
        let mut headers = HeaderMap::new();
        headers.insert(HeaderName::from_static("x-goog-api-key"), key);
        let endpoint = Endpoint::new(url, headers, settings.timing)?;
        Ok(Self { settings, endpoint })
    }

    /// The request body for `request`, or why the context cannot be sent.
    pub fn body(&self, request: &LlmRequest) -> Result<Value, LlmError> {
        let mut body = gemini::request(
            &request.messages,
            &request.tools,
            request.tool_choice.as_ref(),
        )?;
        let mut config = serde_json::Map::new();
        if let Some(max) = self.settings.max_tokens {
            config.insert("maxOutputTokens".into(), json!(max));
        }
        if let Some(t) = self.settings.temperature {
            config.insert("temperature".into(), json!(t));
        }
        let budget = self
            .settings
            .thinking_budget
            .or_else(|| self.settings.model.contains("flash").then_some(0));
        if let Some(budget) = budget {
            config.insert("thinkingConfig".into(), json!({"thinkingBudget": budget}));
        }
        if !config.is_empty() {
            body["generationConfig"] = Value::Object(config);
        }
        Ok(body)
    }
}

impl LlmEngine for GeminiLlm {
    fn model(&self) -> &str {
        &self.settings.model
    }

    fn provider(&self) -> &str {
        "gemini"
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
