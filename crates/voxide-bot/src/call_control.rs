//! The built-in tools that act on the call itself, carried out behind the answer that called
//! them: the model says its goodbye (or "I'll put you through") and calls the tool in the same
//! reply, and the stage, after the LLM, sends what the tool asks for once that answer has
//! streamed. The output plays the words first, then acts:
//! - `end_call`: an `EndFrame`; the session ends (on a phone line, voxide's BYE).
//! - `transfer_call`: a `PhoneAction::Transfer` to one of the bot file's `[transfer]`
//!   destinations, by name; the phone line hands the call over (SIP's REFER).
//! - `send_dtmf`: a `PhoneAction::SendKeys`; the phone line presses them (RFC 4733 events, or
//!   the keypad's tones in the audio).
//!
//! A user who interrupts those words keeps the call: they had more to say.

use crate::frames::{
    ControlFrame, DataFrame, EndFrame, Frame, FrameBody, FunctionCallResult, PhoneAction,
    ResultKind, SystemFrame,
};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// The tool that hangs up.
pub const END_CALL: &str = "end_call";
/// The tool that hands the call over.
pub const TRANSFER_CALL: &str = "transfer_call";
/// The tool that presses keys.
pub const SEND_DTMF: &str = "send_dtmf";

/// What the stage does once the answer has streamed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Act {
    End,
    Phone(PhoneAction),
}

/// The stage, after the LLM.
#[derive(Debug, Default)]
pub struct CallControl {
    /// The `[transfer]` destinations: name, then number or SIP URI.
    destinations: Vec<(String, String)>,
    /// What a tool asked for while its answer still streams.
    armed: Option<Act>,
    /// Inside an answer (between its start and its end).
    answering: bool,
}

impl CallControl {
    /// A stage for `end_call` and for `transfer_call` to `destinations` (name, address).
    pub fn new(destinations: Vec<(String, String)>) -> Self {
        Self {
            destinations,
            ..Self::default()
        }
    }

    /// What a settled call of one of the tools asks for.
    fn act(&self, result: &FunctionCallResult) -> Option<Act> {
        if !matches!(result.kind, ResultKind::Final) {
            return None;
        }
        match result.function_name.as_str() {
            END_CALL => Some(Act::End),
            TRANSFER_CALL => {
                let name = result.arguments.get("destination")?.as_str()?;
                let (_, to) = self.destinations.iter().find(|(n, _)| n == name)?;
                Some(Act::Phone(PhoneAction::Transfer(to.clone())))
            }
            // The tool refused bad keys with an error; pressed ones it reports as a status.
            SEND_DTMF
                if result
                    .result
                    .as_ref()
                    .is_some_and(|r| r.get("status").is_some()) =>
            {
                let keys = result.arguments.get("keys")?.as_str()?;
                let keys = keys.chars().filter(|c| !c.is_whitespace()).collect();
                Some(Act::Phone(PhoneAction::SendKeys(keys)))
            }
            _ => None,
        }
    }
}

impl FrameProcessor for CallControl {
    fn name(&self) -> &str {
        "CallControl"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let mut now = None;
        if direction == Direction::Downstream {
            match &frame.body {
                FrameBody::Control(ControlFrame::LlmFullResponseStart) => self.answering = true,
                FrameBody::Control(ControlFrame::LlmFullResponseEnd) => {
                    self.answering = false;
                    now = self.armed.take();
                }
                FrameBody::Data(DataFrame::FunctionCallResult(result)) => {
                    if let Some(act) = self.act(result) {
                        if self.answering {
                            self.armed = Some(act);
                        } else {
                            now = Some(act);
                        }
                    }
                }
                FrameBody::System(SystemFrame::Interruption) => {
                    self.armed = None;
                    self.answering = false;
                }
                _ => {}
            }
        }
        cx.push(frame, direction);
        match now {
            Some(Act::End) => {
                let end = EndFrame {
                    reason: Some("the bot ended the call (end_call)".into()),
                };
                cx.push(ControlFrame::End(end).into(), Direction::Downstream);
            }
            Some(Act::Phone(action)) => {
                cx.push(DataFrame::Phone(action).into(), Direction::Downstream);
            }
            None => {}
        }
        Ok(())
    }
}
