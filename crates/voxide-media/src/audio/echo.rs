//! The echo guard: the bot's own voice coming back through a speaker must not count as the user.
//!
//! Where no acoustic echo canceller runs before voxide (a local microphone next to a speaker),
//! the input carries the bot's speech back, delayed and attenuated. The guard compares each input
//! chunk with what the output played in the last moments: while the bot is audible, input no
//! louder than the loudest echo the room could return (`max_echo_gain_db` below the played audio)
//! is taken for echo and silenced before the VAD and the STT hear it. The user talking over the
//! bot is louder than their echo and passes. It is a suppressor, not a canceller: what it lets
//! through still carries the echo underneath.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::AudioSink;
use crate::frames::{AudioFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// How the guard tells echo from the user.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EchoGuardParams {
    /// The loudest echo expected, relative to the played audio, in dB (negative: quieter).
    pub max_echo_gain_db: f32,
    /// How long played audio may take to come back (the speaker-to-mic path plus buffering).
    pub tail: Duration,
}

impl Default for EchoGuardParams {
    fn default() -> Self {
        Self {
            max_echo_gain_db: -6.0,
            tail: Duration::from_millis(300),
        }
    }
}

/// What the output played recently: the guard's and the canceller's reference.
#[derive(Debug, Clone, Default)]
pub struct EchoReference(Arc<Mutex<Played>>);

#[derive(Debug, Default)]
struct Played {
    /// Loudness of the last chunks, for the guard.
    blocks: VecDeque<(Instant, f32)>,
    /// The samples themselves, kept only once a canceller reads them.
    samples: Option<PlayedSamples>,
    /// Recorded by the device's own clock, silence included (a speaker's callback), rather
    /// than as the output wrote it.
    device_clocked: bool,
}

/// Played samples not yet read by the canceller.
#[derive(Debug, Default)]
struct PlayedSamples {
    rate: u32,
    queue: VecDeque<i16>,
}

/// How much played loudness the reference keeps, at most.
const MAX_BLOCKS: usize = 256;
/// Seconds of played samples kept for a canceller that has not read them.
const MAX_UNREAD_SECS: usize = 2;

impl EchoReference {
    /// An empty reference.
    pub fn new() -> Self {
        Self::default()
    }

    fn played_state(&self) -> std::sync::MutexGuard<'_, Played> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a chunk of mono audio at `rate` played now.
    pub fn played(&self, samples: &[i16], rate: u32) {
        if samples.is_empty() || rate == 0 {
            return;
        }
        let mut played = self.played_state();
        if played.blocks.len() == MAX_BLOCKS {
            played.blocks.pop_front();
        }
        played.blocks.push_back((Instant::now(), rms(samples)));
        if let Some(kept) = &mut played.samples {
            if kept.rate != rate {
                kept.queue.clear();
                kept.rate = rate;
            }
            kept.queue.extend(samples);
            let excess = kept
                .queue
                .len()
                .saturating_sub(MAX_UNREAD_SECS * rate as usize);
            kept.queue.drain(..excess);
        }
    }

    /// From now on, what is recorded comes from the device as it plays, silence included: the
    /// canceller can then take it as one unbroken stream.
    pub fn set_device_clocked(&self) {
        self.played_state().device_clocked = true;
    }

    /// Whether the device records what it plays (see [`set_device_clocked`](Self::set_device_clocked)).
    pub fn is_device_clocked(&self) -> bool {
        self.played_state().device_clocked
    }

    /// The loudest chunk played within `tail` before now.
    pub fn loudest_within(&self, tail: Duration) -> f32 {
        let now = Instant::now();
        self.played_state()
            .blocks
            .iter()
            .rev()
            .take_while(|(at, _)| now.duration_since(*at) <= tail)
            .map(|(_, level)| *level)
            .fold(0.0, f32::max)
    }

    /// The samples played since the last call, with their rate; the first call starts keeping
    /// them. `None` while nothing was played since the last call.
    pub fn take_samples(&self) -> Option<(u32, Vec<i16>)> {
        let mut played = self.played_state();
        match &mut played.samples {
            Some(kept) if kept.queue.is_empty() => None,
            Some(kept) => Some((kept.rate, kept.queue.drain(..).collect())),
            None => {
                played.samples = Some(PlayedSamples::default());
                None
            }
        }
    }

    /// A sink that records what it plays here: the device itself where the sink can record
    /// its playback ([`AudioSink::record_playback`]), else each chunk as it is written.
    pub fn tap<S: AudioSink>(&self, mut sink: S) -> EchoTap<S> {
        let reference = if sink.record_playback(self) {
            self.set_device_clocked();
            None
        } else {
            Some(self.clone())
        };
        EchoTap { sink, reference }
    }
}

/// An [`AudioSink`] that feeds an [`EchoReference`].
pub struct EchoTap<S> {
    sink: S,
    reference: Option<EchoReference>,
}

impl<S> EchoTap<S> {
    /// `sink` with nothing recorded: for a pipeline without a guard.
    pub fn untapped(sink: S) -> Self {
        Self {
            sink,
            reference: None,
        }
    }
}

impl<S: AudioSink> AudioSink for EchoTap<S> {
    fn write(&mut self, samples: &[i16], sample_rate: u32) {
        if let Some(reference) = &self.reference {
            reference.played(samples, sample_rate);
        }
        self.sink.write(samples, sample_rate);
    }

    fn clear(&mut self) {
        self.sink.clear();
    }

    fn phone(&mut self, action: &crate::frames::PhoneAction) -> bool {
        self.sink.phone(action)
    }
}

/// Silences input that is only the bot's echo. Place it first, before the VAD.
pub struct EchoGuard {
    reference: EchoReference,
    params: EchoGuardParams,
    /// The linear gain of the loudest expected echo.
    gain: f32,
    suppressed: u64,
}

impl EchoGuard {
    /// A guard comparing the input with `reference`.
    pub fn new(reference: EchoReference, params: EchoGuardParams) -> Self {
        Self {
            reference,
            params,
            gain: 10f32.powf(params.max_echo_gain_db / 20.0),
            suppressed: 0,
        }
    }

    /// True when `audio` is no louder than the echo of what was just played.
    fn is_echo(&self, audio: &AudioFrame) -> bool {
        let played = self.reference.loudest_within(self.params.tail);
        played > 0.0 && rms(&audio.samples) <= played * self.gain
    }
}

impl FrameProcessor for EchoGuard {
    fn name(&self) -> &str {
        "EchoGuard"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if let FrameBody::System(SystemFrame::InputAudio(audio)) = &frame.body
            && self.is_echo(audio)
        {
            self.suppressed += 1;
            if self.suppressed.is_power_of_two() {
                tracing::debug!(chunks = self.suppressed, "input taken for echo, silenced");
            }
            let silent = AudioFrame::new(
                vec![0; audio.samples.len()],
                audio.sample_rate,
                audio.channels,
            );
            cx.push(SystemFrame::InputAudio(silent).into(), direction);
            return Ok(());
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Root mean square of 16-bit samples, full scale 1.0.
fn rms(samples: &[i16]) -> f32 {
    if samples.is_empty() {
        return 0.0;
    }
    let sum: f64 = samples.iter().map(|&s| f64::from(s) * f64::from(s)).sum();
    ((sum / samples.len() as f64).sqrt() / 32_768.0) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::testing::run_processor;

    fn tone(amplitude: f32, n: usize) -> Vec<i16> {
        (0..n)
            .map(|i| (amplitude * 32_767.0 * (i as f32 * 0.1).sin()) as i16)
            .collect()
    }

    fn input(samples: Vec<i16>) -> (Frame, Direction) {
        let frame = SystemFrame::InputAudio(AudioFrame::new(samples, 16_000, 1));
        (frame.into(), Direction::Downstream)
    }

    fn levels(out: &crate::pipeline::testing::Output) -> Vec<f32> {
        out.down
            .iter()
            .filter_map(|f| match &f.body {
                FrameBody::System(SystemFrame::InputAudio(a)) => Some(rms(&a.samples)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_reference_gives_samples_only_once_something_was_played_at_a_real_rate() {
        let reference = EchoReference::new();
        assert_eq!(reference.take_samples(), None, "starts keeping");
        // Before the bot says anything there is no rate to speak of (the 0 Hz reference).
        assert_eq!(reference.take_samples(), None);
        reference.played(&[], 48_000);
        reference.played(&[1, 2], 0);
        assert_eq!(reference.take_samples(), None);
        reference.played(&[1, 2, 3], 48_000);
        assert_eq!(reference.take_samples(), Some((48_000, vec![1, 2, 3])));
        assert_eq!(reference.take_samples(), None, "drained");
    }

    #[tokio::test]
    async fn echo_of_what_was_played_is_silenced_and_louder_speech_passes() {
        let reference = EchoReference::new();
        reference.played(&tone(0.5, 320), 16_000);
        let guard = EchoGuard::new(reference, EchoGuardParams::default());
        // The echo at -10 dB, then the user at the bot's own level.
        let out = run_processor(guard, vec![input(tone(0.16, 320)), input(tone(0.5, 320))]).await;
        let levels = levels(&out);
        assert_eq!(levels.len(), 2);
        assert_eq!(levels[0], 0.0, "the echo is silenced");
        assert!(levels[1] > 0.3, "the user passes: {}", levels[1]);
    }

    #[tokio::test(start_paused = true)]
    async fn without_recent_playback_everything_passes() {
        let reference = EchoReference::new();
        reference.played(&tone(0.5, 320), 16_000);
        tokio::time::advance(Duration::from_secs(1)).await;
        let guard = EchoGuard::new(reference, EchoGuardParams::default());
        let out = run_processor(guard, vec![input(tone(0.05, 320))]).await;
        assert!(
            levels(&out)[0] > 0.02,
            "quiet speech passes once the bot is silent"
        );
    }
}
