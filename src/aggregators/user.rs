//! The user side: transcripts in, user messages and LLM runs out.

use crate::context::{ContextHandle, Message};
use crate::frames::{DataFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// Collects final transcripts of a user turn, appends them as one user message and pushes the
/// context downstream to the LLM. Interim transcripts pass on for turn logic and UIs.
pub struct UserAggregator {
    context: ContextHandle,
    text: String,
    in_turn: bool,
}

impl UserAggregator {
    /// An aggregator writing to `context`.
    pub fn new(context: ContextHandle) -> Self {
        Self {
            context,
            text: String::new(),
            in_turn: false,
        }
    }

    fn commit(&mut self, cx: &mut FrameContext<'_>) {
        let text = std::mem::take(&mut self.text);
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        self.context.lock().messages.push(Message::user(text));
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
        match &frame.body {
            FrameBody::System(SystemFrame::UserStartedSpeaking) => self.in_turn = true,
            FrameBody::System(SystemFrame::UserStoppedSpeaking) => {
                self.in_turn = false;
                cx.push(frame, direction);
                self.commit(cx);
                return Ok(());
            }
            FrameBody::Data(DataFrame::Transcription(t)) => {
                if !self.text.is_empty() {
                    self.text.push(' ');
                }
                self.text.push_str(t.text.trim());
                cx.push(frame, direction);
                // Outside a turn (the transcript came after the turn ended), it is the turn.
                if !self.in_turn {
                    self.commit(cx);
                }
                return Ok(());
            }
            FrameBody::Data(DataFrame::LlmMessagesAppend { messages, run_llm }) => {
                self.context
                    .lock()
                    .messages
                    .extend(messages.iter().cloned());
                if *run_llm {
                    cx.push_downstream(DataFrame::LlmContext(self.context.clone()));
                }
                return Ok(());
            }
            FrameBody::Data(DataFrame::LlmMessagesUpdate { messages, run_llm }) => {
                self.context.lock().messages = messages.clone();
                if *run_llm {
                    cx.push_downstream(DataFrame::LlmContext(self.context.clone()));
                }
                return Ok(());
            }
            FrameBody::Data(DataFrame::LlmSetTools(tools)) => {
                self.context.lock().tools = (**tools).clone();
                return Ok(());
            }
            FrameBody::Data(DataFrame::LlmRun) => {
                cx.push_downstream(DataFrame::LlmContext(self.context.clone()));
                return Ok(());
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}
