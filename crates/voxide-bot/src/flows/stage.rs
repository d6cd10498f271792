//! The flow's stage, after the LLM: what a node does besides its prompt and tools.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};

use super::Entered;
use crate::context::ContextHandle;
use crate::events::Event;
use crate::frames::{
    ControlFrame, DataFrame, EndFrame, Frame, FrameBody, PhoneAction, SystemFrame,
};
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

/// What a node's post-actions do once its answer is out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AfterAct {
    /// End the call.
    End,
    /// Hand the phone call to this address.
    Transfer(String),
}

/// What a node's post-actions armed, and how far its answer has come.
#[derive(Debug, Default)]
struct AfterAnswer {
    act: Option<AfterAct>,
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
        let mut acting = None;
        // Only an LLM response's words and end concern what is armed.
        let words = match &frame.body {
            FrameBody::Data(DataFrame::LlmText(text)) => Some(!text.trim().is_empty()),
            FrameBody::Control(ControlFrame::LlmFullResponseEnd) => None,
            _ => Some(false),
        };
        if direction == Direction::Downstream && words != Some(false) {
            let mut after = lock(&self.after_answer);
            match words {
                Some(_) if after.act.is_some() => after.words = true,
                None if after.act.is_some() && after.words => {
                    acting = std::mem::take(&mut *after).act;
                }
                _ => {}
            }
        }
        cx.push(frame, direction);
        match acting {
            Some(AfterAct::End) => {
                let end = EndFrame {
                    reason: Some("the flow's node ends the conversation".into()),
                };
                cx.push(ControlFrame::End(end).into(), Direction::Downstream);
            }
            Some(AfterAct::Transfer(to)) => {
                let action = DataFrame::Phone(PhoneAction::Transfer(to));
                cx.push(action.into(), Direction::Downstream);
            }
            None => {}
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
        act: node.after_answer,
        words: false,
    };
    if node.respond {
        let run = DataFrame::LlmContext(context.clone());
        let _ = pusher.push(run.into(), Direction::Upstream).await;
    }
}
