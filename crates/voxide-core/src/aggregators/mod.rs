//! The aggregator pair around the LLM: the user side turns transcripts into user messages and asks
//! the LLM to run; the assistant side records what the bot said, its tool calls and their results,
//! and runs the LLM again when results call for it.

mod assistant;
mod user;

pub use assistant::AssistantAggregator;
pub use user::UserAggregator;
