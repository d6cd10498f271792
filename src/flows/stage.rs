//! The flow's stage, after the LLM: what a node does besides its prompt and tools.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};

use super::Entered;
use crate::context::ContextHandle;
use crate::events::Event;
use crate::frames::{ControlFrame, DataFrame, EndFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

/// Says a node's pre-action lines as it is entered, then runs the LLM when the node answers at
/// once; after a node's answer (a response with words) whose post-actions end the call, ends it.
pub struct FlowStage {
    context: ContextHandle,
    first: Option<Entered>,
    entered: Option<mpsc::Receiver<Entered>>,
    after_answer: Arc<Mutex<AfterAnswer>>,
    /// Told when the session ends, so the stage's task ends with it.
    ended: Arc<Notify>,
}

/// The end armed by a node's post-actions, and how far its answer has come.
#[derive(Debug, Default)]
struct AfterAnswer {
    end: bool,
    words: bool,
}

impl FlowStage {
    pub(super) fn new(
        context: ContextHandle,
        first: Entered,
        entered: Option<mpsc::Receiver<Entered>>,
    ) -> Self {
        Self {
            context,
            first: Some(first),
            entered,
            after_answer: Arc::default(),
            ended: Arc::default(),
        }
    }
}

fn lock(m: &Mutex<AfterAnswer>) -> std::sync::MutexGuard<'_, AfterAnswer> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FrameProcessor for FlowStage {
    fn name(&self) -> &str {
        "FlowStage"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let starting = matches!(frame.body, FrameBody::System(SystemFrame::Start(_)));
        if matches!(
            frame.body,
            FrameBody::Control(ControlFrame::End(_))
                | FrameBody::System(SystemFrame::Cancel { .. })
        ) {
            self.ended.notify_one();
        }
        let mut ending = false;
        // Only an LLM response's words and end concern the armed end.
        let words = match &frame.body {
            FrameBody::Data(DataFrame::LlmText(text)) => Some(!text.trim().is_empty()),
            FrameBody::Control(ControlFrame::LlmFullResponseEnd) => None,
            _ => Some(false),
        };
        if direction == Direction::Downstream && words != Some(false) {
            let mut after = lock(&self.after_answer);
            match words {
                Some(_) if after.end => after.words = true,
                None if after.end && after.words => {
                    *after = AfterAnswer::default();
                    ending = true;
                }
                _ => {}
            }
        }
        cx.push(frame, direction);
        if ending {
            let end = EndFrame {
                reason: Some("the flow's node ends the conversation".into()),
            };
            cx.push(ControlFrame::End(end).into(), Direction::Downstream);
        }
        if starting && let Some(first) = self.first.take() {
            let pusher = cx.pusher();
            let context = self.context.clone();
            let after = self.after_answer.clone();
            let entered = self.entered.take();
            let ended = self.ended.clone();
            cx.spawn(async move {
                tokio::select! {
                    result = drive(first, entered, pusher, context, after) => result,
                    () = ended.notified() => Ok(()),
                }
            });
        }
        Ok(())
    }
}

/// Acts on each node as it is entered, the initial one first.
async fn drive(
    first: Entered,
    entered: Option<mpsc::Receiver<Entered>>,
    pusher: FramePusher,
    context: ContextHandle,
    after_answer: Arc<Mutex<AfterAnswer>>,
) -> Result<(), ProcessorError> {
    act(first, &pusher, &context, &after_answer).await;
    let Some(mut entered) = entered else {
        return Ok(());
    };
    while let Some(node) = entered.recv().await {
        act(node, &pusher, &context, &after_answer).await;
    }
    Ok(())
}

async fn act(
    node: Entered,
    pusher: &FramePusher,
    context: &ContextHandle,
    after_answer: &Mutex<AfterAnswer>,
) {
    pusher.emit(Event::FlowNode { node: node.node });
    for line in node.say {
        for frame in Frame::response(line) {
            let _ = pusher.push(frame, Direction::Downstream).await;
        }
    }
    *lock(after_answer) = AfterAnswer {
        end: node.end_after_answer,
        words: false,
    };
    if node.respond {
        let run = DataFrame::LlmContext(context.clone());
        let _ = pusher.push(run.into(), Direction::Upstream).await;
    }
}
