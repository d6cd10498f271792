//! Acoustic echo cancellation: the bot's voice taken out of the microphone's signal.
//!
//! A microphone next to a speaker hears the bot, delayed and coloured by the room. The canceller
//! (WebRTC's AEC3, in the pure-Rust `aec3` port) learns that echo path from what the output
//! played, the [`EchoReference`], and subtracts its estimate of the echo from every 10 ms of
//! input, with a residual-echo suppressor behind it. Unlike the [`EchoGuard`](super::echo::EchoGuard),
//! the user's voice over the bot comes through whole, so barge-in works at normal loudness. It
//! finds the delay between playing and hearing by itself (device buffers included).

use std::collections::VecDeque;

use aec3::api::EchoCanceller3Config;
use aec3::voip::VoipAec3;

use super::echo::EchoReference;
use super::resample::StreamResampler;
use super::wav::to_f32;
use crate::frames::{AudioFrame, Frame, FrameBody, MetricsData, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// The input rates the canceller runs at.
const RATES: std::ops::RangeInclusive<u32> = 16_000..=48_000;
/// Played audio ahead of the input beyond this is dropped (the output ran ahead in a burst).
const MAX_RENDER_SECS: usize = 1;
/// Seconds of the bot's voice AEC3 listens to before it trusts its echo estimate.
const INITIAL_STATE_SECS: f32 = 0.4;
/// Seconds of input with the bot's voice in the reference behind each [`MetricsData::EchoCancellation`].
const REPORT_SECS: f64 = 1.0;
/// A reference frame quieter than this (RMS, full scale 1) counts as the bot being quiet.
const AUDIBLE_REFERENCE: f32 = 1e-3;
/// How long (10 ms frames) the input counts as carrying the bot's echo after an audible played
/// frame: the speaker-to-microphone delay and the room's tail.
const ECHO_TAIL_FRAMES: u32 = 30;

/// Removes the bot's echo from mono input audio. Place it first, before the VAD.
///
/// The canceller's state cannot move between threads, so it lives on a thread of its own; input
/// goes there in order and comes back cleaned, 10 ms frame by 10 ms frame.
pub struct EchoCanceller {
    reference: EchoReference,
    input: Option<std::sync::mpsc::SyncSender<AudioFrame>>,
}

impl EchoCanceller {
    /// A canceller using what `reference` recorded as played.
    pub fn new(reference: EchoReference) -> Self {
        // Start the reference keeping samples now, so none played before the first input is lost.
        let _ = reference.take_samples();
        Self {
            reference,
            input: None,
        }
    }
}

/// What the canceller's thread hands back.
enum Cancelled {
    Audio(AudioFrame),
    Report(MetricsData),
}

/// The canceller's side of the thread: input in, input with the echo taken out.
struct CancelState {
    reference: EchoReference,
    state: Option<Canceller>,
    /// An input the canceller cannot take (a rate or channel count) was passed on as it came.
    warned: bool,
}

impl CancelState {
    fn new(reference: EchoReference) -> Self {
        Self {
            reference,
            state: None,
            warned: false,
        }
    }

    /// A report of the last [`REPORT_SECS`] the bot was audible, once there are that many.
    fn report(&mut self, processor: &str) -> Option<MetricsData> {
        let state = self.state.as_mut()?;
        let levels = &mut state.levels;
        if levels.frames as f64 * 0.01 < REPORT_SECS {
            return None;
        }
        let db = |energy: f64| 10.0 * (energy / levels.frames as f64 + 1e-12).log10();
        let report = MetricsData::EchoCancellation {
            processor: processor.to_owned(),
            seconds: levels.frames as f64 * 0.01,
            input_db: db(levels.input),
            output_db: db(levels.output),
            delay_ms: state.aec.metrics().delay_ms,
        };
        *levels = Levels::default();
        Some(report)
    }

    fn warn_once(&mut self, why: &str) {
        if !self.warned {
            self.warned = true;
            tracing::warn!("{why}; passing the input through");
        }
    }

    /// The input with the echo taken out, or `None` when this input cannot be processed.
    fn cancel(&mut self, audio: &AudioFrame) -> Option<Vec<i16>> {
        if audio.channels != 1 || !RATES.contains(&audio.sample_rate) {
            self.warn_once(&format!(
                "the echo canceller takes mono input at 16-48 kHz, not {} channel(s) at {} Hz",
                audio.channels, audio.sample_rate
            ));
            return None;
        }
        if self
            .state
            .as_ref()
            .is_none_or(|s| s.rate != audio.sample_rate)
        {
            match Canceller::new(audio.sample_rate) {
                Ok(c) => self.state = Some(c),
                Err(e) => {
                    self.warn_once(&format!("the echo canceller is unavailable: {e}"));
                    return None;
                }
            }
        }
        let state = self.state.as_mut()?;
        if let Some((rate, played)) = self.reference.take_samples() {
            state.add_render(rate, &played);
        }
        Some(state.process(&audio.samples, self.reference.is_device_clocked()))
    }
}

/// Why a recording cannot be processed.
#[derive(Debug, thiserror::Error)]
pub enum AecError {
    /// The canceller runs at 16-48 kHz.
    #[error("the echo canceller takes 16-48 kHz audio, not {0} Hz")]
    Rate(u32),
    /// The canceller could not be set up.
    #[error("the echo canceller could not start: {0}")]
    Setup(String),
}

/// Cancels the echo of `played` in `captured` (both mono at `rate`, sample-aligned as played and
/// recorded), 20 ms at a time as a live session would; returns the cleaned capture.
pub fn cancel_recording(rate: u32, played: &[i16], captured: &[i16]) -> Result<Vec<i16>, AecError> {
    if !RATES.contains(&rate) {
        return Err(AecError::Rate(rate));
    }
    let mut canceller = Canceller::new(rate).map_err(AecError::Setup)?;
    let chunk = rate as usize / 50;
    let mut out = Vec::with_capacity(captured.len());
    for (k, capture) in captured.chunks(chunk).enumerate() {
        let start = (k * chunk).min(played.len());
        let end = (start + capture.len()).min(played.len());
        canceller.add_render(rate, &played[start..end]);
        out.extend(canceller.process(capture, false));
    }
    Ok(out)
}

/// What a microphone hears of `played` (mono at `rate`) in a small room: 60 ms later, through
/// four reflections, about 10 dB down. For benches and tests of the canceller.
pub fn simulated_room(played: &[i16], rate: u32) -> Vec<f32> {
    let ms = |n: usize| rate as usize * n / 1000;
    let taps = [(0, 0.25f32), (ms(2), 0.1), (ms(7), -0.06), (ms(16), 0.03)];
    let delay = ms(60);
    let mut heard = vec![0.0f32; played.len()];
    for (i, &p) in played.iter().enumerate() {
        for &(t, g) in &taps {
            if let Some(h) = heard.get_mut(i + delay + t) {
                *h += f32::from(p) * g;
            }
        }
    }
    heard
}

/// Mean-square levels over the 10 ms frames the bot was audible in.
#[derive(Debug, Default, Clone, Copy)]
struct Levels {
    frames: u64,
    input: f64,
    output: f64,
}

fn mean_square(samples: &[f32]) -> f64 {
    samples.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / samples.len().max(1) as f64
}

/// The canceller at one input rate.
struct Canceller {
    rate: u32,
    aec: VoipAec3,
    /// Samples per 10 ms.
    frame: usize,
    /// Input not yet a whole 10 ms frame.
    capture: Vec<f32>,
    /// Played audio at the input rate, not yet given to the canceller.
    render: VecDeque<f32>,
    resampler: Option<(u32, StreamResampler)>,
    out: Vec<f32>,
    render_frame: Vec<f32>,
    levels: Levels,
    /// Input frames still to count as the bot's echo since the last audible played frame.
    audible_frames: u32,
}

impl Canceller {
    fn new(rate: u32) -> Result<Self, String> {
        let mut config = EchoCanceller3Config::default();
        // AEC3 suppresses conservatively until it has heard this much of the far end (2.5 s by
        // default): a user who talks over the bot's first sentence would be taken for its echo.
        // The linear filter finds a speaker-to-microphone path within a few hundred ms.
        config.filter.initial_state_seconds = INITIAL_STATE_SECS;
        let aec = VoipAec3::builder(rate as usize, 1, 1)
            .with_config(config)
            .enable_high_pass(true)
            .build()
            .map_err(|e| format!("{e:?}"))?;
        let frame = rate as usize / 100;
        Ok(Self {
            rate,
            aec,
            frame,
            capture: Vec::with_capacity(frame * 2),
            render: VecDeque::new(),
            resampler: None,
            out: vec![0.0; frame],
            render_frame: vec![0.0; frame],
            levels: Levels::default(),
            audible_frames: 0,
        })
    }

    fn add_render(&mut self, rate: u32, played: &[i16]) {
        if played.is_empty() {
            return;
        }
        let samples = if rate == self.rate {
            played.to_vec()
        } else {
            if self.resampler.as_ref().is_none_or(|(r, _)| *r != rate) {
                match StreamResampler::new(rate, self.rate) {
                    Ok(r) => self.resampler = Some((rate, r)),
                    Err(e) => {
                        crate::warnings::warn(
                            "echo_reference_resample",
                            format_args!("cannot resample the echo reference: {e}"),
                        );
                        return;
                    }
                }
            }
            match &mut self.resampler {
                Some((_, r)) => r.process(played),
                None => return,
            }
        };
        self.render.extend(to_f32(&samples));
        let excess = self
            .render
            .len()
            .saturating_sub(MAX_RENDER_SECS * self.rate as usize);
        self.render.drain(..excess);
    }

    /// Cancels the echo in `samples`; returns the processed samples (whole 10 ms frames, so the
    /// length may differ from the input's by up to one frame).
    ///
    /// A device-clocked reference (`continuous`) is one unbroken stream, silence included: all
    /// of it goes to AEC3 as it arrives, and AEC3's render buffer absorbs the jitter between the
    /// speaker's and the microphone's callbacks. A reference recorded as the output wrote it has
    /// gaps while the bot is quiet: one 10 ms of it per 10 ms of input keeps the two in step,
    /// with silence in the gaps.
    fn process(&mut self, samples: &[i16], continuous: bool) -> Vec<i16> {
        self.capture.extend(to_f32(samples));
        let frames = self.capture.len() / self.frame;
        let mut out = Vec::with_capacity(frames * self.frame);
        if continuous {
            while self.render.len() >= self.frame {
                self.next_render_frame();
                if let Err(e) = self.aec.handle_render_frame(&self.render_frame) {
                    crate::warnings::warn(
                        "echo_canceller_frame",
                        format_args!("echo canceller refused a played frame ({e:?})"),
                    );
                }
            }
        }
        for k in 0..frames {
            if !continuous {
                self.next_render_frame();
            }
            let capture = &self.capture[k * self.frame..(k + 1) * self.frame];
            let processed = if continuous {
                self.aec
                    .process_capture_frame(capture, false, &mut self.out)
            } else {
                self.aec
                    .process(capture, Some(&self.render_frame), false, &mut self.out)
            };
            if self.audible_frames > 0 {
                self.audible_frames -= 1;
                self.levels.frames += 1;
                self.levels.input += mean_square(capture);
                self.levels.output += mean_square(&self.out);
            }
            match processed {
                Ok(_) => out.extend(self.out.iter().map(|&v| to_i16(v))),
                Err(e) => {
                    crate::warnings::warn(
                        "echo_canceller_frame",
                        format_args!("echo canceller failed on a frame ({e:?}); passed through"),
                    );
                    out.extend(capture.iter().map(|&v| to_i16(v)));
                }
            }
        }
        self.capture.drain(..frames * self.frame);
        out
    }

    /// Moves the next 10 ms of played audio into `render_frame` (silence where there is none)
    /// and notes whether the bot was audible in it.
    fn next_render_frame(&mut self) {
        for slot in &mut self.render_frame {
            *slot = self.render.pop_front().unwrap_or(0.0);
        }
        if mean_square(&self.render_frame).sqrt() > f64::from(AUDIBLE_REFERENCE) {
            self.audible_frames = ECHO_TAIL_FRAMES;
        }
    }
}

fn to_i16(v: f32) -> i16 {
    (v * 32_768.0).round().clamp(-32_768.0, 32_767.0) as i16
}

impl FrameProcessor for EchoCanceller {
    fn name(&self) -> &str {
        "EchoCanceller"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::System(SystemFrame::Start(_)) => {
                let (input, inputs) =
                    std::sync::mpsc::sync_channel::<AudioFrame>(crate::audio::AUDIO_QUEUE);
                let (output, mut outputs) = tokio::sync::mpsc::channel(crate::audio::AUDIO_QUEUE);
                let reference = self.reference.clone();
                let pusher = cx.pusher();
                let name = pusher.name().to_owned();
                std::thread::Builder::new()
                    .name("voxide-aec".into())
                    .spawn(move || {
                        let mut state = CancelState::new(reference);
                        // Ends when the stage drops its sender.
                        while let Ok(audio) = inputs.recv() {
                            let clean = match state.cancel(&audio) {
                                Some(samples) => AudioFrame::new(samples, audio.sample_rate, 1),
                                None => audio,
                            };
                            // Its own thread: waiting for room holds only the canceller, and a
                            // full input queue then drops and counts.
                            if output.blocking_send(Cancelled::Audio(clean)).is_err() {
                                break;
                            }
                            if let Some(report) = state.report(&name) {
                                tracing::debug!(?report, "echo canceller");
                                let _ = output.blocking_send(Cancelled::Report(report));
                            }
                        }
                    })
                    .map_err(|e| ProcessorError::fatal(format!("echo canceller thread: {e}")))?;
                self.input = Some(input);
                cx.spawn(async move {
                    while let Some(next) = outputs.recv().await {
                        let frame = match next {
                            Cancelled::Audio(audio) if audio.samples.is_empty() => continue,
                            Cancelled::Audio(audio) => SystemFrame::InputAudio(audio).into(),
                            Cancelled::Report(report) => SystemFrame::Metrics(vec![report]).into(),
                        };
                        if pusher.push(frame, Direction::Downstream).await.is_err() {
                            break;
                        }
                    }
                    Ok(())
                });
            }
            FrameBody::System(SystemFrame::InputAudio(audio))
                if direction == Direction::Downstream =>
            {
                if let Some(input) = &self.input {
                    match input.try_send(audio.clone()) {
                        Ok(()) => return Ok(()),
                        Err(std::sync::mpsc::TrySendError::Full(_)) => {
                            crate::warnings::audio_dropped("aec_in");
                            return Ok(());
                        }
                        // The canceller is gone: the audio goes on as it is.
                        Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {}
                    }
                }
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

    const RATE: u32 = 16_000;

    /// Speech-like test audio: noise shaped into syllables, reproducible.
    fn babble(seconds: f32, seed: u64) -> Vec<i16> {
        let mut state = seed;
        let n = (seconds * RATE as f32) as usize;
        let mut low = 0.0f32;
        (0..n)
            .map(|i| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let noise = ((state >> 33) as f32 / (1u64 << 31) as f32) - 0.5;
                // A low-passed noise, loudness going up and down four times a second.
                low += 0.3 * (noise - low);
                let t = i as f32 / RATE as f32;
                let envelope = (std::f32::consts::PI * 4.0 * t).sin().abs();
                (low * envelope * 40_000.0).clamp(-32_768.0, 32_767.0) as i16
            })
            .collect()
    }

    fn power(samples: &[i16]) -> f64 {
        let sum: f64 = samples.iter().map(|&s| f64::from(s).powi(2)).sum();
        sum / samples.len().max(1) as f64 + 1e-9
    }

    /// The mic hears the echo of `played` plus `near`; returns the mic's signal and the
    /// canceller's output.
    fn run(played: &[i16], near: &[i16]) -> (Vec<i16>, Vec<i16>) {
        let mic: Vec<i16> = simulated_room(played, RATE)
            .iter()
            .zip(near)
            .map(|(e, n)| (e + f32::from(*n)).clamp(-32_768.0, 32_767.0) as i16)
            .collect();
        let out = cancel_recording(RATE, played, &mic).expect("16 kHz is taken");
        (mic, out)
    }

    #[test]
    fn the_bots_echo_is_taken_out_of_the_input() {
        let played = babble(6.0, 1);
        let silence = vec![0; played.len()];
        let (mic, out) = run(&played, &silence);
        // After two seconds to learn the room.
        let (a, b) = (2 * RATE as usize, out.len());
        let erle = 10.0 * (power(&mic[a..b]) / power(&out[a..b])).log10();
        // Noise-like test audio is the hard case (espeak-ng speech loses ~37 dB); passing the
        // input through would lose 0 dB.
        assert!(erle > 12.0, "echo reduced by {erle:.1} dB");
    }

    #[test]
    fn the_user_talking_over_the_bot_comes_through() {
        let played = babble(6.0, 1);
        let mut near = vec![0i16; played.len()];
        let user = babble(2.0, 7);
        let at = 4 * RATE as usize;
        near[at..at + user.len()].copy_from_slice(&user);
        let (_, out) = run(&played, &near);
        let (a, b) = (at, at + user.len());
        // The user is 10 dB louder at the mic than the echo; the output keeps most of the voice.
        let kept = 10.0 * (power(&out[a..b]) / power(&near[a..b])).log10();
        assert!(kept > -6.0, "the user's voice lost {:.1} dB", -kept);
    }

    #[test]
    fn input_it_cannot_take_passes_through() {
        let mut canceller = CancelState::new(EchoReference::new());
        let stereo = AudioFrame::new(vec![1, 2, 3, 4], RATE, 2);
        assert!(canceller.cancel(&stereo).is_none());
        let odd_rate = AudioFrame::new(vec![1; 80], 8_000, 1);
        assert!(canceller.cancel(&odd_rate).is_none());
        assert!(matches!(
            cancel_recording(8_000, &[0; 160], &[0; 160]),
            Err(AecError::Rate(8_000))
        ));
    }

    #[test]
    fn played_audio_reaches_the_canceller_through_the_reference() {
        let reference = EchoReference::new();
        let mut canceller = CancelState::new(reference.clone());
        let _ = reference.take_samples();
        let played = babble(4.0, 3);
        let echo = simulated_room(&played, RATE);
        let mut out = Vec::new();
        for (k, chunk) in echo.chunks(320).enumerate() {
            reference.played(&played[k * 320..k * 320 + chunk.len()], RATE);
            let mic: Vec<i16> = chunk.iter().map(|&v| v as i16).collect();
            let frame = AudioFrame::new(mic, RATE, 1);
            out.extend(canceller.cancel(&frame).expect("16 kHz mono is taken"));
        }
        let mic: Vec<i16> = echo.iter().map(|&v| v as i16).collect();
        let (a, b) = (2 * RATE as usize, out.len());
        let erle = 10.0 * (power(&mic[a..b]) / power(&out[a..b])).log10();
        assert!(erle > 12.0, "echo reduced by {erle:.1} dB");
    }
}
