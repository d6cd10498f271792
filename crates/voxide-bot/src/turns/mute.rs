//! Muting the user: at chosen moments the user's audio is not forwarded, so it neither starts a
//! turn nor interrupts the bot (a greeting that must be heard whole, a tool call under way).

use std::collections::HashSet;

use crate::frames::{ControlFrame, DataFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// When the user is muted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MuteStrategy {
    /// From the start of the session until the bot's first speech has ended.
    UntilFirstBotSpeechEnds,
    /// While the bot's first speech plays (the user may talk before it starts).
    FirstBotSpeech,
    /// While a sync function call (one an interruption would cancel) runs. Async calls run in
    /// the background and do not mute.
    FunctionCall,
    /// Whenever the bot speaks: no barge-in at all.
    BotSpeaking,
}

/// Drops the user's input audio while any of its strategies says so. Place it first, before
/// the VAD, so muted audio reaches no one.
pub struct UserMute {
    strategies: Vec<MuteStrategy>,
    bot_speaking: bool,
    /// The bot's speeches that have ended.
    speeches_ended: u64,
    calls: HashSet<String>,
    muted: bool,
}

impl UserMute {
    /// A filter muting by `strategies` (any one of them mutes).
    pub fn new(strategies: impl IntoIterator<Item = MuteStrategy>) -> Self {
        Self {
            strategies: strategies.into_iter().collect(),
            bot_speaking: false,
            speeches_ended: 0,
            calls: HashSet::new(),
            muted: false,
        }
    }

    fn should_mute(&self) -> bool {
        self.strategies.iter().any(|s| match s {
            MuteStrategy::UntilFirstBotSpeechEnds => self.speeches_ended == 0,
            MuteStrategy::FirstBotSpeech => self.bot_speaking && self.speeches_ended == 0,
            MuteStrategy::FunctionCall => !self.calls.is_empty(),
            MuteStrategy::BotSpeaking => self.bot_speaking,
        })
    }
}

impl UserMute {
    /// Follows the bot's speech and the function calls; true when the input is muted now.
    fn observe(&mut self, body: &FrameBody) -> bool {
        match body {
            FrameBody::System(SystemFrame::BotStartedSpeaking) => self.bot_speaking = true,
            FrameBody::System(SystemFrame::BotStoppedSpeaking) if self.bot_speaking => {
                self.bot_speaking = false;
                self.speeches_ended += 1;
            }
            FrameBody::Control(ControlFrame::FunctionCallInProgress(call))
                if call.cancel_on_interruption =>
            {
                self.calls.insert(call.tool_call_id.clone());
            }
            FrameBody::Data(DataFrame::FunctionCallResult(result)) if result.settles() => {
                self.calls.remove(&result.tool_call_id);
            }
            FrameBody::System(SystemFrame::FunctionCallCancel(cancel)) => {
                self.calls.remove(&cancel.tool_call_id);
            }
            _ => return self.muted,
        }
        let muted = self.should_mute();
        if muted != self.muted {
            self.muted = muted;
            tracing::debug!(muted, "user input");
        }
        muted
    }
}

impl FrameProcessor for UserMute {
    fn name(&self) -> &str {
        "UserMute"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if self.observe(&frame.body)
            && matches!(frame.body, FrameBody::System(SystemFrame::InputAudio(_)))
        {
            return Ok(());
        }
        cx.push(frame, direction);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::{FunctionCallInProgress, FunctionCallResult, ResultKind};

    /// Whether the input is muted after each frame.
    fn muted_after(strategies: &[MuteStrategy], frames: Vec<Frame>) -> Vec<bool> {
        let mut mute = UserMute::new(strategies.iter().copied());
        frames.iter().map(|f| mute.observe(&f.body)).collect()
    }

    #[test]
    fn until_the_first_speech_ends_the_user_is_not_heard() {
        let muted = muted_after(
            &[MuteStrategy::UntilFirstBotSpeechEnds],
            vec![
                SystemFrame::BotStartedSpeaking.into(),
                SystemFrame::BotStoppedSpeaking.into(),
                SystemFrame::BotStartedSpeaking.into(),
            ],
        );
        assert_eq!(muted, [true, false, false]);
        let first_only = muted_after(
            &[MuteStrategy::FirstBotSpeech],
            vec![
                SystemFrame::BotStartedSpeaking.into(),
                SystemFrame::BotStoppedSpeaking.into(),
                SystemFrame::BotStartedSpeaking.into(),
            ],
        );
        assert_eq!(first_only, [true, false, false]);
    }

    #[test]
    fn a_sync_call_mutes_until_its_result_and_an_async_one_does_not() {
        let call = |id: &str, sync: bool| -> Frame {
            ControlFrame::FunctionCallInProgress(Box::new(FunctionCallInProgress {
                function_name: "f".into(),
                tool_call_id: id.into(),
                arguments: serde_json::json!({}),
                cancel_on_interruption: sync,
                group_id: 1,
            }))
            .into()
        };
        let result = FunctionCallResult {
            function_name: "f".into(),
            tool_call_id: "a".into(),
            arguments: serde_json::json!({}),
            result: Some(serde_json::json!(1)),
            kind: ResultKind::Final,
            cancel_on_interruption: true,
            group_id: 1,
            properties: Default::default(),
        };
        let muted = muted_after(
            &[MuteStrategy::FunctionCall],
            vec![
                call("b", false),
                call("a", true),
                DataFrame::FunctionCallResult(Box::new(result)).into(),
            ],
        );
        assert_eq!(muted, [false, true, false]);
    }

    #[test]
    fn muted_audio_is_dropped_and_other_frames_pass() {
        use crate::frames::AudioFrame;
        let mut mute = UserMute::new([MuteStrategy::BotSpeaking]);
        let audio: Frame = SystemFrame::InputAudio(AudioFrame::new(vec![1; 320], 16_000, 1)).into();
        assert!(!mute.observe(&audio.body));
        assert!(mute.observe(&Frame::from(SystemFrame::BotStartedSpeaking).body));
        assert!(
            mute.observe(&audio.body),
            "audio while the bot speaks is dropped"
        );
    }
}
