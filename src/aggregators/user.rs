//! The user side: transcripts in, user messages and LLM runs out.

use crate::context::{ContextHandle, Message};
use crate::frames::{ControlFrame, DataFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// Collects final transcripts of a user turn, appends them as one user message and pushes the
/// context downstream to the LLM. Interim transcripts pass on for turn logic and UIs.
///
/// The turn can end (the turn model is quick) before the STT has the final transcript of its
/// last words; the message waits for every final the STT announced, so a turn is one message.
pub struct UserAggregator {
    context: ContextHandle,
    text: String,
    in_turn: bool,
    /// Final transcripts announced by the STT and not yet delivered.
    owed: usize,
}

impl UserAggregator {
    /// An aggregator writing to `context`.
    pub fn new(context: ContextHandle) -> Self {
        Self {
            context,
            text: String::new(),
            in_turn: false,
            owed: 0,
        }
    }

    /// Commits the turn's words once the turn is over and all its transcripts are in.
    fn commit(&mut self, cx: &mut FrameContext<'_>) {
        if self.in_turn || self.owed > 0 {
            return;
        }
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
            FrameBody::System(SystemFrame::TranscriptionPending) => self.owed += 1,
            FrameBody::Control(ControlFrame::TranscriptionDone) => {
                self.owed = self.owed.saturating_sub(1);
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
                self.commit(cx);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::LlmContext;
    use crate::frames::Transcription;
    use crate::pipeline::testing::run_processor;

    fn transcript(text: &str) -> (Frame, Direction) {
        let t = Transcription::new(text, "user");
        (
            Frame::new(DataFrame::Transcription(Box::new(t))),
            Direction::Downstream,
        )
    }

    fn system(frame: SystemFrame) -> (Frame, Direction) {
        (Frame::new(frame), Direction::Downstream)
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
        let users = context
            .lock()
            .messages
            .iter()
            .filter_map(|m| m.text().map(str::to_owned))
            .collect();
        (users, runs)
    }

    #[tokio::test]
    async fn a_turn_that_ends_before_its_last_transcript_is_still_one_message() {
        let (users, runs) = aggregate(vec![
            system(SystemFrame::UserStartedSpeaking),
            transcript("What is the weather like in,"),
            system(SystemFrame::TranscriptionPending),
            // Smart Turn ends the turn before Whisper has the last words.
            system(SystemFrame::UserStoppedSpeaking),
            transcript("Paris?"),
            (
                Frame::new(ControlFrame::TranscriptionDone),
                Direction::Downstream,
            ),
        ])
        .await;
        assert_eq!(users, ["What is the weather like in, Paris?"]);
        assert_eq!(runs, 1);
    }

    #[tokio::test]
    async fn a_final_with_no_words_does_not_hold_the_turn() {
        let (users, runs) = aggregate(vec![
            system(SystemFrame::UserStartedSpeaking),
            transcript("Hello."),
            system(SystemFrame::TranscriptionPending),
            system(SystemFrame::UserStoppedSpeaking),
            // The last decode found no words: only the done marker comes.
            (
                Frame::new(ControlFrame::TranscriptionDone),
                Direction::Downstream,
            ),
        ])
        .await;
        assert_eq!(users, ["Hello."]);
        assert_eq!(runs, 1);
    }

    #[tokio::test]
    async fn a_transcript_with_nothing_announced_is_a_turn_of_its_own() {
        // An STT that announces nothing: its transcripts are taken as they come.
        let (users, runs) = aggregate(vec![
            system(SystemFrame::UserStartedSpeaking),
            system(SystemFrame::UserStoppedSpeaking),
            transcript("Bye."),
        ])
        .await;
        assert_eq!(users, ["Bye."]);
        assert_eq!(runs, 1);
    }
}
