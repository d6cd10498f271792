//! Long calls that stay within the context: past the bot's budget, the oldest turns are folded
//! into a summary the LLM writes, in the background, never delaying a turn.
//!
//! The [`ContextSummarizer`] sits before the LLM service. Each run of the LLM passes it at once;
//! when the conversation is over budget and no summary is being written, it takes the turns that
//! trimming would drop (a tool call never leaves without its results and async updates, and a
//! turn whose async call still runs stays), asks its engine for a summary of them (the summary
//! before, too), and folds them into one system message. Should the engine fail, the turns are
//! dropped instead, as without a summarizer. Each fold is a `context_summarized` event.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;

use super::{LlmEngine, LlmEvent, LlmRequest};
use voxide_core::context::{ContextHandle, Message, ToolsSchema};
use voxide_core::events::Event;
use voxide_core::frames::{DataFrame, Frame, FrameBody};
use voxide_core::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

/// What the summary is asked to be.
pub const INSTRUCTION: &str = "You condense conversations between a user and a voice assistant. \
Write a short summary, in plain sentences, of what the user asked and told, what was decided \
and what tools returned, keeping names, numbers, dates and commitments. Reply with the summary \
only.";
/// The longest a summary may take before the turns are dropped instead.
const SUMMARY_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest summary kept, in characters.
const MAX_SUMMARY_CHARS: usize = 4_000;

/// Folds the oldest turns into a summary once the conversation passes `budget` tokens.
pub struct ContextSummarizer {
    engine: Arc<dyn LlmEngine>,
    context: ContextHandle,
    budget: usize,
    busy: Arc<AtomicBool>,
}

impl ContextSummarizer {
    /// A summarizer of `context` writing with `engine`, keeping it near `budget` tokens.
    pub fn new(engine: Arc<dyn LlmEngine>, context: ContextHandle, budget: usize) -> Self {
        Self {
            engine,
            context,
            budget,
            busy: Arc::default(),
        }
    }
}

impl FrameProcessor for ContextSummarizer {
    fn name(&self) -> &str {
        "ContextSummarizer"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let run = matches!(frame.body, FrameBody::Data(DataFrame::LlmContext(_)));
        cx.push(frame, direction);
        if run && !self.busy.load(Ordering::Acquire) {
            let folded = {
                let context = self.context.lock();
                if context.estimated_tokens() <= self.budget {
                    return Ok(());
                }
                // Down to three quarters of the budget, so that summaries are few.
                context.oldest_turns(self.budget / 4 * 3)
            };
            if folded.is_empty() {
                return Ok(());
            }
            self.busy.store(true, Ordering::Release);
            cx.spawn(summarize(
                self.engine.clone(),
                self.context.clone(),
                (folded, self.budget),
                self.busy.clone(),
                cx.pusher(),
            ));
        }
        Ok(())
    }
}

/// Writes the summary of `folded` and folds it in (or drops `folded`, should that fail).
async fn summarize(
    engine: Arc<dyn LlmEngine>,
    context: ContextHandle,
    (folded, budget): (Vec<Message>, usize),
    busy: Arc<AtomicBool>,
    pusher: FramePusher,
) -> Result<(), ProcessorError> {
    let earlier = context.lock().summary().map(str::to_owned);
    let written = write_summary(engine.as_ref(), INSTRUCTION, earlier.as_deref(), &folded).await;
    let mut context_now = context.lock();
    let before = context_now.estimated_tokens();
    match written {
        Ok(summary) => {
            if context_now.fold(&folded, summary.clone()) {
                let after = context_now.estimated_tokens();
                drop(context_now);
                tracing::info!(
                    messages = folded.len(),
                    before,
                    after,
                    "the conversation's oldest turns were summarised"
                );
                pusher.emit(Event::ContextSummarized {
                    messages: folded.len(),
                    tokens_before: before,
                    tokens_after: after,
                    summary,
                });
            }
        }
        Err(why) => {
            tracing::warn!(%why, "no summary of the oldest turns: they leave the conversation");
            context_now.trim(budget);
        }
    }
    busy.store(false, Ordering::Release);
    Ok(())
}

/// A summary of `messages` (after the summary `earlier`) that `engine` writes as `instruction`
/// asks; an error says why there is none.
pub async fn write_summary(
    engine: &dyn LlmEngine,
    instruction: &str,
    earlier: Option<&str>,
    messages: &[Message],
) -> Result<String, String> {
    let request = LlmRequest {
        messages: vec![
            Message::system(instruction),
            Message::user(transcript(earlier, messages)),
        ],
        tools: ToolsSchema::default(),
        tool_choice: None,
    };
    let mut stream = engine.generate(request);
    let text = tokio::time::timeout(SUMMARY_TIMEOUT, async {
        let mut text = String::new();
        while let Some(event) = stream.next().await {
            match event {
                Ok(LlmEvent::Text(piece)) => text.push_str(&piece),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(text)
    })
    .await
    .unwrap_or_else(|_| Err("no summary in time".into()))?;
    let text: String = text.trim().chars().take(MAX_SUMMARY_CHARS).collect();
    if text.is_empty() {
        return Err("an empty summary".into());
    }
    Ok(text)
}

/// The turns to summarise as plain lines, after the summary before them.
fn transcript(earlier: Option<&str>, folded: &[Message]) -> String {
    let mut out = String::new();
    if let Some(earlier) = earlier {
        out.push_str("Summary so far: ");
        out.push_str(earlier);
        out.push_str("\n\n");
    }
    out.push_str("Conversation:\n");
    for message in folded {
        let line = match message {
            Message::User(_) => message.text().map(|t| format!("User: {t}")),
            Message::Assistant(a) => {
                let mut parts: Vec<String> =
                    message.text().map(str::to_owned).into_iter().collect();
                for call in a.tool_calls.iter().flatten() {
                    parts.push(format!(
                        "(calls {} with {})",
                        call.function.name, call.function.arguments
                    ));
                }
                (!parts.is_empty()).then(|| format!("Assistant: {}", parts.join(" ")))
            }
            Message::Tool(t) => Some(format!("Tool result: {}", t.content.joined_text())),
            Message::System(_) | Message::Developer(_) => {
                message.text().map(|t| format!("Note: {t}"))
            }
            Message::ProviderSpecific(_) => None,
        };
        if let Some(line) = line {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transcript_has_each_speaker_the_calls_and_the_summary_before() {
        let text = transcript(
            Some("They booked for Friday."),
            &[
                Message::user("And a cake?"),
                Message::assistant("Yes, a cake."),
            ],
        );
        assert_eq!(
            text,
            "Summary so far: They booked for Friday.\n\nConversation:\nUser: And a cake?\n\
             Assistant: Yes, a cake.\n"
        );
    }
}
