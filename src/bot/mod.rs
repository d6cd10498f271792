//! The default bot: a short instruction and three built-in tools that exercise the whole
//! function-calling path (a sync tool, a sync tool with checked input, an async tool).

pub mod calculator;
pub mod tools;

use crate::context::{LlmContext, Message};
use crate::models::ModelError;
use crate::services::llm::LlmService;
use crate::services::llm::local::{LocalLlm, LocalLlmOptions, LocalModel};

/// The default bot's system instruction: short, because the embedded model is small.
pub const INSTRUCTIONS: &str = "You are voxide, a friendly voice assistant. Your replies are \
spoken aloud, so answer in one or two short sentences of plain words, without lists or symbols.";

/// A fresh conversation with the default instruction.
pub fn context() -> LlmContext {
    LlmContext::new(vec![Message::system(INSTRUCTIONS)])
}

/// The embedded LLM for one conversation, taught the default tools.
pub fn local_llm() -> Result<LocalLlm, ModelError> {
    Ok(LocalLlm::new(
        LocalModel::shared()?,
        LocalLlmOptions {
            tool_examples: tools::local_examples(),
            ..LocalLlmOptions::default()
        },
    ))
}

/// Registers the default bot's tools on `llm`.
pub fn register_tools(llm: &mut LlmService) {
    tools::register(llm.functions());
}
