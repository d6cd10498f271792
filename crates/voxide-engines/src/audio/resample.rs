//! Streaming sample-rate conversion (rubato's FFT resampler), for mono audio arriving in chunks
//! of any size.
//!
//! The FFT's block sets the anti-aliasing filter's length, and so how much of the band survives:
//! rubato's cutoff falls steeply below ~64 points. Blocks of 10 ms keep speech whole at every
//! rate voxide meets (flat to 3 kHz from 8 kHz, to 7 kHz from 48 kHz into 16 kHz) for a delay of
//! 5 ms; 2 ms blocks cut a telephone call's audio above 1.5 kHz.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler as _, WindowFunction};

/// Why a resampler could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot resample from {from} Hz to {to} Hz: {reason}")]
pub struct ResampleError {
    from: u32,
    to: u32,
    reason: String,
}

/// Converts a mono stream from one rate to another, 20 ms of input at a time.
pub struct StreamResampler {
    inner: Option<Fft<f32>>,
    /// Input waiting for a whole chunk.
    pending: Vec<f32>,
    chunk: usize,
    out: Vec<f32>,
}

impl StreamResampler {
    /// A resampler from `from` Hz to `to` Hz; equal rates pass audio through untouched.
    pub fn new(from: u32, to: u32) -> Result<Self, ResampleError> {
        let error = |reason: String| ResampleError { from, to, reason };
        if from == 0 || to == 0 {
            return Err(error("rates must be positive".into()));
        }
        // 20 ms a call to the FFT, in two blocks of 10 ms.
        let chunk = (from as usize / 50).max(1);
        let inner = if from == to {
            None
        } else {
            let fft = Fft::new_custom(
                from as usize,
                to as usize,
                chunk,
                2,
                1,
                WindowFunction::Blackman2,
                FixedSync::Input,
            )
            .map_err(|e| error(e.to_string()))?;
            Some(fft)
        };
        let capacity = inner.as_ref().map_or(0, |r| r.output_frames_max());
        Ok(Self {
            inner,
            pending: Vec::with_capacity(chunk),
            chunk,
            out: vec![0.0; capacity],
        })
    }

    /// Resamples `input`; returns what is ready (whole 20 ms input chunks), keeping the rest.
    pub fn process(&mut self, input: &[i16]) -> Vec<i16> {
        let Some(inner) = &mut self.inner else {
            return input.to_vec();
        };
        self.pending
            .extend(input.iter().map(|&s| f32::from(s) / 32768.0));
        let mut result = Vec::new();
        let mut start = 0;
        while self.pending.len() - start >= self.chunk {
            let chunk = &self.pending[start..start + self.chunk];
            start += self.chunk;
            let (Ok(input), Ok(mut output)) = (
                InterleavedSlice::new(chunk, 1, self.chunk),
                InterleavedSlice::new_mut(&mut self.out, 1, inner.output_frames_max()),
            ) else {
                continue;
            };
            match inner.process_into_buffer(&input, &mut output, None) {
                Ok((_, written)) => result.extend(
                    self.out[..written]
                        .iter()
                        .map(|&s| (s.clamp(-1.0, 1.0) * 32767.0) as i16),
                ),
                Err(e) => voxide_core::warnings::warn(
                    "resample_chunk",
                    format_args!("resampling failed for one chunk: {e}"),
                ),
            }
        }
        self.pending.drain(..start);
        result
    }

    /// Output samples the resampler delays its input by.
    pub fn delay(&self) -> usize {
        self.inner.as_ref().map_or(0, |r| r.output_delay())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, hz: f32, samples: usize) -> Vec<i16> {
        (0..samples)
            .map(|i| {
                ((2.0 * std::f32::consts::PI * hz * i as f32 / rate as f32).sin() * 16_000.0) as i16
            })
            .collect()
    }

    #[test]
    fn converts_48k_to_16k_in_odd_sized_pieces_and_keeps_the_tone() {
        let mut r = StreamResampler::new(48_000, 16_000).expect("resampler");
        let input = tone(48_000, 440.0, 48_000);
        let mut out = Vec::new();
        for piece in input.chunks(333) {
            out.extend(r.process(piece));
        }
        assert_eq!(out.len(), 16_000, "whole chunks: 48,000 in, 16,000 out");
        // Past the delay, the output is the same tone at the new rate.
        let delay = r.delay();
        let expected = tone(16_000, 440.0, out.len());
        let err: f64 = out[delay..]
            .iter()
            .zip(&expected)
            .map(|(&a, &b)| f64::from(i32::from(a) - i32::from(b)).abs())
            .sum::<f64>()
            / (out.len() - delay) as f64;
        assert!(err < 200.0, "mean error {err}");
    }

    /// The level of a `hz` tone after resampling, in dB against what went in.
    fn gain_db(from: u32, to: u32, hz: f32) -> f64 {
        let mut r = StreamResampler::new(from, to).expect("resampler");
        let out = r.process(&tone(from, hz, from as usize));
        let rms = |s: &[i16]| {
            (s.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / s.len() as f64).sqrt()
        };
        let input = tone(from, hz, from as usize);
        20.0 * (rms(&out[out.len() / 2..]) / rms(&input)).log10()
    }

    #[test]
    fn a_telephone_call_keeps_its_whole_band_when_widened_to_16k() {
        for hz in [300.0, 1_000.0, 2_000.0, 3_000.0] {
            let g = gain_db(8_000, 16_000, hz);
            assert!(g.abs() < 0.5, "{hz} Hz comes out at {g:.1} dB");
        }
        // Narrowed for the phone: the band stays, what cannot fit in 8 kHz goes.
        let g = gain_db(16_000, 8_000, 3_000.0);
        assert!(g.abs() < 0.5, "3 kHz comes out at {g:.1} dB");
        let alias = gain_db(16_000, 8_000, 5_000.0);
        assert!(alias < -50.0, "5 kHz folds back at {alias:.1} dB");
    }

    #[test]
    fn webrtc_audio_keeps_speech_up_to_7khz_when_narrowed_to_16k() {
        for hz in [500.0, 4_000.0, 6_000.0, 7_000.0] {
            let g = gain_db(48_000, 16_000, hz);
            assert!(g.abs() < 0.5, "{hz} Hz comes out at {g:.1} dB");
        }
        let alias = gain_db(48_000, 16_000, 9_000.0);
        assert!(alias < -50.0, "9 kHz folds back at {alias:.1} dB");
    }

    #[test]
    fn equal_rates_pass_through_and_zero_is_refused() {
        let mut r = StreamResampler::new(16_000, 16_000).expect("resampler");
        assert_eq!(r.process(&[1, 2, 3]), vec![1, 2, 3]);
        assert!(StreamResampler::new(0, 16_000).is_err());
    }
}
