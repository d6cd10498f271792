//! The conversation context: typed messages, tools and the shared handle the aggregators and
//! LLM services work on.

pub mod adapters;
pub mod async_tool_messages;
mod llm_context;
mod message;
mod tools;

pub use llm_context::{
    ContextHandle, DEFAULT_MAX_CONTEXT_TOKENS, LlmContext, ToolChoice, TurnUsage, UsageReport,
};
pub use message::{
    AssistantMessage, AssistantMeta, Content, ContentBlock, ContentPart, FunctionCall,
    InstructionMessage, KnownPart, Message, ProviderMessage, StopReason, ToolCall, ToolMessage,
    UserMessage,
};
pub use tools::{AdapterKind, FunctionSchema, ToolsSchema};
