//! The engine behind an LLM service: one streamed completion per request.

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

use voxide_core::context::{Message, ProviderMessage, StopReason, ToolChoice, ToolsSchema};
use voxide_core::frames::TokenUsage;

/// What the engine is asked to complete.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmRequest {
    /// The conversation, with the service's instructions already folded in.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: ToolsSchema,
    /// How it may use them.
    pub tool_choice: Option<ToolChoice>,
}

/// One piece of a streamed completion.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmEvent {
    /// Visible text.
    Text(String),
    /// A complete tool call (providers stream argument fragments; engines assemble them).
    ToolCall {
        /// The provider's id for this call.
        id: String,
        /// The tool's name.
        name: String,
        /// Arguments as the JSON string the model wrote.
        arguments: String,
    },
    /// Reasoning the model showed; kept in the context's metadata, never spoken.
    Thinking(String),
    /// Tokens used by this completion (several reports add up).
    Usage(TokenUsage),
    /// Why the completion ended, when the engine knows (e.g. the token limit).
    Finished(StopReason),
    /// A message for the context that only this provider reads, kept after the reply (Gemini's
    /// thought signatures, which must go back with their calls).
    ProviderMessage(ProviderMessage),
    /// The engine failed before it answered and the next one of a fallback list answers
    /// instead; its events follow.
    Fallback {
        /// The provider that failed.
        from: String,
        /// The provider that answers now.
        to: String,
        /// What went wrong.
        reason: String,
    },
}

impl LlmEvent {
    /// Whether this is part of the answer (text, reasoning, a call) rather than bookkeeping.
    pub fn is_content(&self) -> bool {
        matches!(
            self,
            LlmEvent::Text(_) | LlmEvent::ToolCall { .. } | LlmEvent::Thinking(_)
        )
    }
}

/// Why a completion failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LlmError {
    /// The engine cannot be set up as configured (a missing key names its variable).
    #[error("{0}")]
    Setup(String),
    /// The provider could not be reached or dropped the connection.
    #[error("connection to the LLM failed: {0}")]
    Connection(String),
    /// The provider answered with an error.
    #[error("the LLM answered with an error: {0}")]
    Provider(String),
    /// The provider is overloaded or rate-limited: a later attempt may succeed.
    #[error("the LLM is busy: {0}")]
    Busy(String),
    /// The provider's answer could not be understood.
    #[error("the LLM's answer could not be parsed: {0}")]
    Protocol(String),
    /// The context breaks a rule of the provider's API: found before anything was sent.
    #[error("the context cannot be sent: {0}")]
    Context(#[from] voxide_core::context::adapters::ContextError),
}

/// Something that completes conversations: a local model or a provider's API.
pub trait LlmEngine: Send + Sync + 'static {
    /// The model's name, for metrics and the context's metadata.
    fn model(&self) -> &str;

    /// The provider's name (e.g. `openai`, `local`).
    fn provider(&self) -> &str;

    /// Streams one completion. Dropping the stream abandons it (an interruption does that).
    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>>;

    /// Gets ready for the first request (a network engine opens its connection), so that the
    /// first turn pays no handshake. Called when a session starts; nothing to do by default.
    fn warm(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// A boxed engine is an engine: the bot picks its engine at run time.
impl LlmEngine for Box<dyn LlmEngine> {
    fn model(&self) -> &str {
        self.as_ref().model()
    }

    fn provider(&self) -> &str {
        self.as_ref().provider()
    }

    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        self.as_ref().generate(request)
    }

    fn warm(&self) -> BoxFuture<'static, ()> {
        self.as_ref().warm()
    }
}
