//! No dead air while a tool works: when the answer waits on a tool that has not answered within
//! a while, the bot says a filler line ("One moment.") or plays a short thinking sound, once
//! per wait. An async tool keeps nobody waiting (the talk goes on) and gets none; its progress
//! may be spoken as it comes instead.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::frames::{
    AudioFrame, ControlFrame, DataFrame, Frame, FrameBody, ResultKind, SystemFrame,
};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

/// When and how the bot fills a tool's silence.
#[derive(Debug, Clone, PartialEq)]
pub struct FillerParams {
    /// How long a tool may keep the caller waiting before the bot fills the silence.
    pub after: Duration,
    /// Said in turn, one per wait; none: a thinking sound.
    pub lines: Vec<String>,
    /// Speak an async tool's progress as it comes: an intermediate result that is text, or
    /// carries text under `"message"`.
    pub speak_progress: bool,
}

/// The calls the answer waits on, and whether this wait was filled.
#[derive(Debug, Default)]
struct Wait {
    pending: HashSet<String>,
    since: Option<Instant>,
    filled: bool,
    next_line: usize,
    rate: u32,
}

struct Shared {
    params: FillerParams,
    wait: Mutex<Wait>,
    wake: Notify,
}

/// The stage, after the LLM.
pub struct ToolFiller(Arc<Shared>);

impl ToolFiller {
    /// A filler with `params`.
    pub fn new(params: FillerParams) -> Self {
        Self(Arc::new(Shared {
            params,
            wait: Mutex::new(Wait {
                rate: 24_000,
                ..Wait::default()
            }),
            wake: Notify::new(),
        }))
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, Wait> {
    shared.wait.lock().unwrap_or_else(|p| p.into_inner())
}

impl FrameProcessor for ToolFiller {
    fn name(&self) -> &str {
        "ToolFiller"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let mut changed = true;
        let mut progress = None;
        match &frame.body {
            FrameBody::Data(DataFrame::FunctionCallResult(result))
                if matches!(result.kind, ResultKind::Intermediate)
                    && !result.cancel_on_interruption =>
            {
                changed = false;
                if self.0.params.speak_progress {
                    progress = spoken_progress(result.result.as_ref());
                }
            }
            FrameBody::System(SystemFrame::Start(start)) => {
                lock(&self.0).rate = start.params.audio_out_sample_rate;
                cx.spawn(drive(self.0.clone(), cx.pusher()));
            }
            FrameBody::Control(ControlFrame::FunctionCallInProgress(call))
                if call.cancel_on_interruption =>
            {
                let mut wait = lock(&self.0);
                if wait.pending.is_empty() {
                    wait.since = Some(Instant::now());
                    wait.filled = false;
                }
                wait.pending.insert(call.tool_call_id.clone());
            }
            FrameBody::Data(DataFrame::FunctionCallResult(result))
                if !matches!(result.kind, ResultKind::Intermediate) =>
            {
                let mut wait = lock(&self.0);
                wait.pending.remove(&result.tool_call_id);
                if wait.pending.is_empty() {
                    wait.since = None;
                }
            }
            FrameBody::System(SystemFrame::Interruption) => {
                let mut wait = lock(&self.0);
                wait.pending.clear();
                wait.since = None;
            }
            _ => changed = false,
        }
        cx.push(frame, direction);
        if let Some(line) = progress {
            // Text outside a response: spoken, and kept out of the conversation.
            cx.push(DataFrame::Text(line).into(), Direction::Downstream);
        }
        if changed {
            self.0.wake.notify_one();
        }
        Ok(())
    }
}

/// What of an async tool's intermediate result is said: text, or text under `"message"`.
fn spoken_progress(result: Option<&serde_json::Value>) -> Option<String> {
    let text = match result? {
        serde_json::Value::String(text) => text.as_str(),
        value => value.get("message")?.as_str()?,
    };
    let text = text.trim();
    (!text.is_empty() && text.chars().count() <= 300).then(|| text.to_owned())
}

/// What fills one wait.
enum Fill {
    Line(String),
    Sound(u32),
}

async fn drive(shared: Arc<Shared>, pusher: FramePusher) -> Result<(), ProcessorError> {
    loop {
        let deadline = {
            let wait = lock(&shared);
            wait.since
                .filter(|_| !wait.filled)
                .map(|since| since + shared.params.after)
        };
        tokio::select! {
            () = shared.wake.notified() => continue,
            () = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        let fill = {
            let mut wait = lock(&shared);
            if wait.pending.is_empty() || wait.filled {
                continue;
            }
            wait.filled = true;
            let lines = &shared.params.lines;
            if lines.is_empty() {
                Fill::Sound(wait.rate)
            } else {
                let line = lines[wait.next_line % lines.len()].clone();
                wait.next_line += 1;
                Fill::Line(line)
            }
        };
        tracing::debug!("a tool keeps the caller waiting: the bot fills the silence");
        match fill {
            // Text outside a response: spoken, and kept out of the conversation.
            Fill::Line(line) => {
                let _ = pusher
                    .push(DataFrame::Text(line).into(), Direction::Downstream)
                    .await;
            }
            Fill::Sound(rate) => {
                for chunk in thinking_sound(rate).chunks(rate as usize / 50) {
                    let audio = AudioFrame::new(chunk.to_vec(), rate, 1);
                    let _ = pusher
                        .push(DataFrame::OutputAudio(audio).into(), Direction::Downstream)
                        .await;
                }
            }
        }
    }
}

/// Three soft rising notes, 0.7 s in all, at -24 dBFS: a sound that says "working on it" and
/// is over before most tools answer.
pub fn thinking_sound(rate: u32) -> Vec<i16> {
    let rate_f = f64::from(rate);
    let note = (0.09 * rate_f) as usize;
    let gap = (0.16 * rate_f) as usize;
    let amplitude = 32_767.0 * 10f64.powf(-24.0 / 20.0);
    let mut out = Vec::with_capacity(3 * (note + gap));
    for hz in [523.25, 659.25, 783.99] {
        for i in 0..note {
            let t = i as f64 / rate_f;
            // A raised-cosine envelope: no click at either end.
            let envelope = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / note as f64).cos();
            let v = amplitude * envelope * (2.0 * std::f64::consts::PI * hz * t).sin();
            out.push(v as i16);
        }
        out.extend(std::iter::repeat_n(0, gap));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_said_when_it_is_text_or_carries_a_message() {
        use serde_json::json;
        assert_eq!(
            spoken_progress(Some(&json!("Half way."))).as_deref(),
            Some("Half way.")
        );
        assert_eq!(
            spoken_progress(Some(&json!({"message": " Two left. ", "n": 2}))).as_deref(),
            Some("Two left.")
        );
        assert_eq!(spoken_progress(Some(&json!({"progress": 50}))), None);
        assert_eq!(spoken_progress(Some(&json!(""))), None);
        assert_eq!(spoken_progress(None), None);
    }

    #[test]
    fn the_thinking_sound_is_short_quiet_and_starts_and_ends_silent() {
        let sound = thinking_sound(24_000);
        assert_eq!(sound.len(), 3 * (2_160 + 3_840));
        let peak = sound.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0);
        assert!((1_500..=2_100).contains(&peak), "{peak}");
        assert!(sound[0].unsigned_abs() < 10 && sound[sound.len() - 1] == 0);
    }
}
