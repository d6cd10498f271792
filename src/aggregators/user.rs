//! The user side: transcripts in, user messages and LLM runs out.

use crate::context::{ContextHandle, Message};
use crate::frames::{ControlFrame, DataFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// Collects final transcripts of a user turn, appends them as one user message and pushes the
/// context downstream to the LLM. Interim transcripts pass on for turn logic and UIs.
///
/// The turn can end (the turn model is quick) before the STT has the final transcript of its
/// last words; the message waits for every final the STT announced, so a turn is one message.
///
/// A new turn interrupts an answer still being worked out (the user went on). Should that turn
/// bring no words (a cough, a door), the LLM runs again on the context as it stands, so noise
/// never costs the user the answer to their question.
pub struct UserAggregator {
    context: ContextHandle,
    text: String,
    in_turn: bool,
    /// Final transcripts announced by the STT and not yet delivered.
    owed: usize,
    /// The LLM was run for the user's words and the bot has not started speaking since.
    answer_owed: bool,
    /// An interruption cancelled that answer before the bot said any of it.
    answer_cut: bool,
}

impl UserAggregator {
    /// An aggregator writing to `context`.
    pub fn new(context: ContextHandle) -> Self {
        Self {
            context,
            text: String::new(),
            in_turn: false,
            owed: 0,
            answer_owed: false,
            answer_cut: false,
        }
    }

    /// Commits the turn's words once the turn is over and all its transcripts are in; a turn
    /// without words that cut off an answer asks for it again.
    fn commit(&mut self, cx: &mut FrameContext<'_>) {
        if self.in_turn || self.owed > 0 {
            return;
        }
        let text = std::mem::take(&mut self.text);
        let text = text.trim();
        if !text.is_empty() {
            self.context.lock().messages.push(Message::user(text));
        } else if self.answer_cut {
            tracing::debug!("a turn without words cut off the answer: the LLM runs again");
        } else {
            return;
        }
        self.answer_owed = true;
        self.answer_cut = false;
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
            FrameBody::System(SystemFrame::BotStartedSpeaking) => self.answer_owed = false,
            FrameBody::System(SystemFrame::Interruption) if self.answer_owed => {
                self.answer_cut = true;
            }
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

    /// Counts the LLM runs that leave the aggregator.
    #[derive(Clone, Default)]
    struct Runs(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl FrameProcessor for Runs {
        fn process(
            &mut self,
            frame: Frame,
            direction: Direction,
            cx: &mut FrameContext<'_>,
        ) -> Result<(), ProcessorError> {
            if matches!(frame.body, FrameBody::Data(DataFrame::LlmContext(_))) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            cx.push(frame, direction);
            Ok(())
        }
    }

    /// A question, then a turn with no words (a cough) that interrupts the answer in the making,
    /// with `bot_spoke` saying whether the bot had begun the answer by then; one frame at a time,
    /// as system frames overtake data frames. Returns the user messages and the LLM runs.
    async fn question_then_wordless_turn(bot_spoke: bool) -> (Vec<String>, usize) {
        use crate::pipeline::{Pipeline, Session};
        let context = ContextHandle::new(LlmContext::new(Vec::new()));
        let runs = Runs::default();
        let pipeline = Pipeline::new()
            .then(UserAggregator::new(context.clone()))
            .then(runs.clone());
        let session = Session::builder(pipeline).idle_timeout(None).spawn();
        let handle = session.handle();
        let mut frames = vec![
            system(SystemFrame::UserStartedSpeaking),
            transcript("What time is it?"),
            system(SystemFrame::UserStoppedSpeaking),
        ];
        if bot_spoke {
            frames.push(system(SystemFrame::BotStartedSpeaking));
        }
        frames.extend([
            system(SystemFrame::Interruption),
            system(SystemFrame::UserStartedSpeaking),
            system(SystemFrame::TranscriptionPending),
            system(SystemFrame::UserStoppedSpeaking),
            (
                Frame::new(ControlFrame::TranscriptionDone),
                Direction::Downstream,
            ),
        ]);
        for (frame, _) in frames {
            handle.queue_frame(frame).await.expect("queued");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        handle.cancel();
        let _ = session.join().await;
        (
            user_texts(&context),
            runs.0.load(std::sync::atomic::Ordering::SeqCst),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_cough_that_cut_off_the_answer_in_the_making_asks_for_it_again() {
        let (users, runs) = question_then_wordless_turn(false).await;
        assert_eq!(users, ["What time is it?"]);
        assert_eq!(runs, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cough_over_an_answer_the_bot_had_begun_to_speak_asks_for_nothing() {
        let (users, runs) = question_then_wordless_turn(true).await;
        assert_eq!(users, ["What time is it?"]);
        assert_eq!(runs, 1);
    }

    #[tokio::test]
    async fn a_turn_without_words_and_nothing_cut_off_runs_nothing() {
        let (_, runs) = aggregate(vec![
            system(SystemFrame::UserStartedSpeaking),
            system(SystemFrame::UserStoppedSpeaking),
        ])
        .await;
        assert_eq!(runs, 0);
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
