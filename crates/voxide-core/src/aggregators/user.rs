//! The user side: transcripts in, user messages and LLM runs out.

use crate::context::{ContextHandle, DEFAULT_MAX_CONTEXT_TOKENS, Message};
use crate::frames::{DataFrame, Frame, FrameBody};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// Commits each user turn the turn stage hands on ([`DataFrame::UserTurn`]) as one user message
/// and pushes the context downstream to the LLM. When a turn ends, whether all its transcripts
/// are in, and whether a turn without words still asks for an answer, is the turn machine's to
/// say (`voxide::turns::TurnMachine`); transcripts pass on for UIs and observers.
///
/// Messages and tools from the app (appended, replaced, run) land here too. Before each LLM
/// run the conversation is held to its token budget ([`LlmContext::trim`]): a long call, or a
/// client typing for an hour, cannot grow it without end.
///
/// [`LlmContext::trim`]: crate::context::LlmContext::trim
pub struct UserAggregator {
    context: ContextHandle,
    max_tokens: usize,
}

impl UserAggregator {
    /// An aggregator writing to `context`, within [`DEFAULT_MAX_CONTEXT_TOKENS`].
    pub fn new(context: ContextHandle) -> Self {
        Self {
            context,
            max_tokens: DEFAULT_MAX_CONTEXT_TOKENS,
        }
    }

    /// The conversation's budget, in estimated tokens.
    pub fn with_max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    fn run_llm(&self, cx: &mut FrameContext<'_>) {
        let dropped = self.context.lock().trim(self.max_tokens);
        if dropped > 0 {
            tracing::debug!(
                dropped,
                max_tokens = self.max_tokens,
                "the conversation's oldest turns left it"
            );
        }
        cx.push_downstream(DataFrame::LlmContext(self.context.clone()));
    }
}

impl FrameProcessor for UserAggregator {
    fn name(&self) -> &str {
        "UserAggregator"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let FrameBody::Data(data) = &frame.body else {
            cx.push(frame, direction);
            return Ok(());
        };
        match data {
            DataFrame::UserTurn(text) => {
                let text = text.trim();
                if text.is_empty() {
                    tracing::debug!("a turn without words cut off the answer: the LLM runs again");
                } else {
                    self.context.lock().messages.push(Message::user(text));
                }
                self.run_llm(cx);
            }
            DataFrame::UserTurnGuess { id, text } => {
                // What the context will be if the turn ends with these words, as `UserTurn`
                // would make it.
                let mut guess = self.context.snapshot();
                guess.messages.push(Message::user(text.trim()));
                cx.push_downstream(DataFrame::LlmGuess {
                    id: *id,
                    context: Box::new(guess),
                });
            }
            DataFrame::LlmMessagesAppend { messages, run_llm } => {
                self.context
                    .lock()
                    .messages
                    .extend(messages.iter().cloned());
                if *run_llm {
                    self.run_llm(cx);
                }
            }
            DataFrame::LlmMessagesUpdate { messages, run_llm } => {
                self.context.lock().messages = messages.clone();
                if *run_llm {
                    self.run_llm(cx);
                }
            }
            DataFrame::LlmSetTools(tools) => self.context.lock().tools = (**tools).clone(),
            DataFrame::LlmRun => self.run_llm(cx),
            _ => cx.push(frame, direction),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::LlmContext;
    use crate::frames::{SystemFrame, Transcription};
    use crate::pipeline::testing::run_processor;

    fn transcript(text: &str) -> (Frame, Direction) {
        let t = Transcription::new(text, "user");
        (
            Frame::new(DataFrame::Transcription(Box::new(t))),
            Direction::Downstream,
        )
    }

    fn turn(text: &str) -> (Frame, Direction) {
        (
            Frame::new(DataFrame::UserTurn(text.to_owned())),
            Direction::Downstream,
        )
    }

    fn system(frame: SystemFrame) -> (Frame, Direction) {
        (Frame::new(frame), Direction::Downstream)
    }

    /// The texts of the context's messages.
    fn user_texts(context: &ContextHandle) -> Vec<String> {
        context
            .lock()
            .messages
            .iter()
            .filter_map(|m| m.text().map(str::to_owned))
            .collect()
    }

    /// The user messages and the number of LLM runs after `frames`.
    async fn aggregate(frames: Vec<(Frame, Direction)>) -> (Vec<String>, usize) {
        let context = ContextHandle::new(LlmContext::new(Vec::new()));
        let out = run_processor(UserAggregator::new(context.clone()), frames).await;
        let runs = out
            .down
            .iter()
            .filter(|f| matches!(f.body, FrameBody::Data(DataFrame::LlmContext(_))))
            .count();
        (user_texts(&context), runs)
    }

    #[tokio::test]
    async fn a_turn_handed_on_is_one_user_message_and_one_llm_run() {
        let (users, runs) = aggregate(vec![
            transcript("What is the weather like in,"),
            transcript("Paris?"),
            turn("What is the weather like in, Paris?"),
        ])
        .await;
        assert_eq!(users, ["What is the weather like in, Paris?"]);
        assert_eq!(runs, 1);
    }

    #[tokio::test]
    async fn transcripts_alone_run_nothing() {
        let (users, runs) = aggregate(vec![
            system(SystemFrame::UserStartedSpeaking),
            transcript("Hello."),
            system(SystemFrame::UserStoppedSpeaking),
        ])
        .await;
        assert!(users.is_empty());
        assert_eq!(runs, 0);
    }

    #[tokio::test]
    async fn a_turn_without_words_runs_the_llm_on_the_context_as_it_stands() {
        let (users, runs) = aggregate(vec![turn("What time is it?"), turn("")]).await;
        assert_eq!(users, ["What time is it?"]);
        assert_eq!(runs, 2);
    }
}
