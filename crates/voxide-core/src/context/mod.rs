//! The conversation context: typed messages, tools and the shared handle the aggregators and
//! LLM services work on.

pub mod adapters;
pub mod async_tool_messages;
mod llm_context;
mod message;
mod tools;
mod usage;

pub use llm_context::{
    ContextHandle, DEFAULT_MAX_CONTEXT_TOKENS, LlmContext, SUMMARY_PREFIX, ToolChoice, TurnUsage,
    UsageReport,
};
pub use message::{
    AssistantMessage, AssistantMeta, Content, ContentBlock, ContentPart, FunctionCall,
    InstructionMessage, KnownPart, Message, ProviderMessage, StopReason, ToolCall, ToolMessage,
    UserMessage,
};
pub use tools::{AdapterKind, FunctionSchema, ToolsSchema};
pub use usage::TokenUsage;

/// The placeholder content of a sync call's tool message until its result arrives.
pub const IN_PROGRESS: &str = "IN_PROGRESS";
