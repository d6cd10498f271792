//! Noise suppression on the user's audio: RNNoise (Valin, 2018) through the pure-Rust
//! `nnnoiseless` port, before the VAD and the STT hear it.
//!
//! RNNoise takes 10 ms of 48 kHz audio at a time and gives it back with the noise's bands
//! attenuated. `Denoiser` resamples each input chunk to 48 kHz, runs it through in 10 ms
//! frames, resamples the result back to the input's rate and sends out exactly as many samples
//! as came in: the stream keeps its timeline, and falls one frame (10 ms) plus the resamplers'
//! delay behind it.

use nnnoiseless::DenoiseState;

use super::resample::StreamResampler;
use crate::frames::{AudioFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// RNNoise's rate.
const RATE: u32 = 48_000;

/// One stream's RNNoise, at the stream's rate.
pub struct NoiseSuppressor {
    state: Box<DenoiseState<'static>>,
    rate: u32,
    up: StreamResampler,
    down: StreamResampler,
    /// 48 kHz input waiting for a whole frame.
    pending: Vec<f32>,
    /// Denoised audio at the stream's rate not yet sent, after the start's silence.
    ready: std::collections::VecDeque<i16>,
    frame_out: Vec<f32>,
}

impl NoiseSuppressor {
    /// A suppressor for mono audio at `rate`.
    pub fn new(rate: u32) -> Result<Self, String> {
        let resampler = |from, to| StreamResampler::new(from, to).map_err(|e| e.to_string());
        Ok(Self {
            state: DenoiseState::new(),
            rate,
            up: resampler(rate, RATE)?,
            down: resampler(RATE, rate)?,
            pending: Vec::with_capacity(2 * DenoiseState::FRAME_SIZE),
            ready: std::collections::VecDeque::new(),
            frame_out: vec![0.0; DenoiseState::FRAME_SIZE],
        })
    }

    /// `samples` denoised: as many as came in, the first of a stream silence while the frame
    /// fills.
    pub fn process(&mut self, samples: &[i16]) -> Vec<i16> {
        let wide = if self.rate == RATE {
            samples.to_vec()
        } else {
            self.up.process(samples)
        };
        self.pending.extend(wide.iter().map(|&s| f32::from(s)));
        let frames = self.pending.len() / DenoiseState::FRAME_SIZE;
        let mut cleaned = Vec::with_capacity(frames * DenoiseState::FRAME_SIZE);
        for frame in self.pending.chunks_exact(DenoiseState::FRAME_SIZE) {
            self.state.process_frame(&mut self.frame_out, frame);
            cleaned.extend(
                self.frame_out
                    .iter()
                    .map(|&s| s.round().clamp(-32_768.0, 32_767.0) as i16),
            );
        }
        self.pending.drain(..frames * DenoiseState::FRAME_SIZE);
        let narrow = if self.rate == RATE {
            cleaned
        } else {
            self.down.process(&cleaned)
        };
        self.ready.extend(narrow);
        // The stream's first chunks wait for the frame: silence keeps their length.
        let short = samples.len().saturating_sub(self.ready.len());
        let mut out = vec![0; short];
        out.extend(self.ready.drain(..samples.len() - short));
        out
    }
}

/// The input stage that suppresses noise in the user's audio (mono; other audio passes).
#[derive(Default)]
pub struct Denoiser {
    stream: Option<NoiseSuppressor>,
}

impl Denoiser {
    /// A stage that makes its suppressor at the first audio's rate.
    pub fn new() -> Self {
        Self::default()
    }
}

impl FrameProcessor for Denoiser {
    fn name(&self) -> &str {
        "Denoiser"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let FrameBody::System(SystemFrame::InputAudio(audio)) = &frame.body else {
            cx.push(frame, direction);
            return Ok(());
        };
        if audio.channels != 1 {
            cx.push(frame, direction);
            return Ok(());
        }
        if self
            .stream
            .as_ref()
            .is_none_or(|s| s.rate != audio.sample_rate)
        {
            match NoiseSuppressor::new(audio.sample_rate) {
                Ok(stream) => self.stream = Some(stream),
                Err(e) => {
                    crate::warnings::warn("denoise_rate", format_args!("no denoising: {e}"));
                    cx.push(frame, direction);
                    return Ok(());
                }
            }
        }
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        let cleaned = stream.process(&audio.samples);
        let out = AudioFrame::new(cleaned, audio.sample_rate, 1);
        cx.push(SystemFrame::InputAudio(out).into(), direction);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn power(samples: &[i16]) -> f64 {
        samples.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>() / samples.len().max(1) as f64
    }

    /// Seeded white noise at about -30 dBFS RMS.
    fn noise(n: usize, seed: u64) -> Vec<i16> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x % 2_001) as i64 - 1_000) as i16
            })
            .collect()
    }

    #[test]
    fn steady_noise_is_suppressed_and_the_stream_keeps_its_length() {
        let mut stream = NoiseSuppressor::new(16_000).expect("a suppressor");
        let input = noise(16_000 * 3, 7);
        let mut output = Vec::new();
        for chunk in input.chunks(320) {
            let out = stream.process(chunk);
            assert_eq!(out.len(), chunk.len(), "as many samples out as in");
            output.extend(out);
        }
        // After its first second, RNNoise has learned the noise and takes most of it out.
        let (before, after) = (power(&input[16_000..]), power(&output[16_000..]));
        assert!(
            after < before / 10.0,
            "{:.1} dB",
            10.0 * (after / before).log10()
        );
    }
}
