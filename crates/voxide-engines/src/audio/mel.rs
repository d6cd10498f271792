//! Whisper's log-mel front end (16 kHz, 400-point FFT, hop 160, 80 Slaney mel bands), shared by
//! Smart Turn and the Whisper STT.

use std::sync::{Arc, OnceLock};

use realfft::{RealFftPlanner, RealToComplex};

/// Samples per second the front end expects.
pub const SAMPLE_RATE: u32 = 16_000;
/// FFT size.
pub const N_FFT: usize = 400;
/// Samples between frames (10 ms).
pub const HOP: usize = 160;
/// Mel bands.
pub const N_MELS: usize = 80;
/// Frequency bins of the FFT.
pub(crate) const BINS: usize = N_FFT / 2 + 1;

/// The log-mel extractor: filters, window and FFT plan, built once per process.
pub struct LogMel {
    /// `[N_MELS][BINS]`, row-major; each row holds one triangular filter.
    filters: Vec<f64>,
    /// The non-zero range of each filter.
    ranges: Vec<(usize, usize)>,
    window: Vec<f64>,
    fft: Arc<dyn RealToComplex<f64>>,
}

static SHARED: OnceLock<LogMel> = OnceLock::new();

impl LogMel {
    /// The process-wide extractor.
    pub fn shared() -> &'static LogMel {
        SHARED.get_or_init(LogMel::new)
    }

    fn new() -> Self {
        let filters = mel_filters(N_MELS);
        let ranges = (0..N_MELS)
            .map(|m| {
                let row = &filters[m * BINS..(m + 1) * BINS];
                let first = row.iter().position(|&w| w > 0.0).unwrap_or(0);
                let last = row.iter().rposition(|&w| w > 0.0).map_or(0, |i| i + 1);
                (first, last.max(first))
            })
            .collect();
        // Periodic Hann, as torch.hann_window.
        let window = (0..N_FFT)
            .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64).cos())
            .collect();
        Self {
            filters,
            ranges,
            window,
            fft: RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT),
        }
    }

    /// Log-mel features of `audio` (16 kHz, in [-1, 1]) as `[N_MELS][frames]`, row-major, with
    /// `frames = audio.len() / HOP`: centred frames with reflect padding, the last one dropped,
    /// floored 8 below the maximum and scaled to about [-1, 1], as Whisper computes them.
    /// `normalize` first scales the waveform to zero mean and unit variance (Smart Turn does).
    pub fn features(&self, audio: &[f32], normalize: bool) -> Vec<f32> {
        let mut x: Vec<f64> = audio.iter().map(|&s| f64::from(s)).collect();
        if normalize && !x.is_empty() {
            let n = x.len() as f64;
            let mean = x.iter().sum::<f64>() / n;
            let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            let scale = 1.0 / (var + 1e-7).sqrt();
            x.iter_mut().for_each(|v| *v = (*v - mean) * scale);
        }
        let frames = x.len() / HOP;
        let padded = reflect_pad(&x, N_FFT / 2);
        let mut out = vec![0.0f64; N_MELS * frames];
        let mut input = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut power = vec![0.0f64; BINS];
        for f in 0..frames {
            let start = f * HOP;
            for (i, slot) in input.iter_mut().enumerate() {
                *slot = padded[start + i] * self.window[i];
            }
            if self.fft.process(&mut input, &mut spectrum).is_err() {
                continue;
            }
            for (p, c) in power.iter_mut().zip(&spectrum) {
                *p = c.norm_sqr();
            }
            for m in 0..N_MELS {
                let (lo, hi) = self.ranges[m];
                let row = &self.filters[m * BINS..(m + 1) * BINS];
                let energy: f64 = (lo..hi).map(|b| row[b] * power[b]).sum();
                out[m * frames + f] = energy.max(1e-10).log10();
            }
        }
        let max = out.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        out.iter()
            .map(|&v| ((v.max(max - 8.0) + 4.0) / 4.0) as f32)
            .collect()
    }
}

fn reflect_pad(x: &[f64], pad: usize) -> Vec<f64> {
    let n = x.len();
    let mut out = Vec::with_capacity(n + 2 * pad);
    if n <= pad {
        // Too short to reflect: zero padding keeps the frame count right.
        out.resize(pad, 0.0);
        out.extend_from_slice(x);
        out.resize(n + 2 * pad, 0.0);
        return out;
    }
    out.extend((1..=pad).rev().map(|i| x[i]));
    out.extend_from_slice(x);
    out.extend((0..pad).map(|i| x[n - 2 - i]));
    out
}

fn hz_to_mel(hz: f64) -> f64 {
    let logstep = 27.0 / 6.4f64.ln();
    if hz >= 1000.0 {
        15.0 + (hz / 1000.0).ln() * logstep
    } else {
        3.0 * hz / 200.0
    }
}

fn mel_to_hz(mel: f64) -> f64 {
    let logstep = 6.4f64.ln() / 27.0;
    if mel >= 15.0 {
        1000.0 * (logstep * (mel - 15.0)).exp()
    } else {
        200.0 * mel / 3.0
    }
}

/// `n_mels` Slaney-normalised triangular filters from 0 Hz to 8 kHz, `[n_mels][BINS]`.
pub(crate) fn mel_filters(n_mels: usize) -> Vec<f64> {
    let (lo, hi) = (hz_to_mel(0.0), hz_to_mel(f64::from(SAMPLE_RATE) / 2.0));
    let points: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let nyquist = f64::from(SAMPLE_RATE / 2);
    let mut filters = vec![0.0; n_mels * BINS];
    for m in 0..n_mels {
        let enorm = 2.0 / (points[m + 2] - points[m]);
        for b in 0..BINS {
            let freq = nyquist * b as f64 / (BINS - 1) as f64;
            let down = (freq - points[m]) / (points[m + 1] - points[m]);
            let up = (points[m + 2] - freq) / (points[m + 2] - points[m + 1]);
            filters[m * BINS + b] = down.min(up).max(0.0) * enorm;
        }
    }
    filters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_match_the_python_reference() {
        // Reference: pipecat 1.14's vendored WhisperFeatureExtractor (numpy) on the shipped test
        // file placed at the end of an 8 s window, normalised, as Smart Turn feeds it.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/test/hello_16k.wav"
        );
        let audio = crate::audio::wav::to_f32(&crate::audio::wav::read(path).expect("wav").samples);
        let mut window = vec![0.0f32; 128_000 - audio.len()];
        window.extend_from_slice(&audio);
        let features = LogMel::shared().features(&window, true);
        assert_eq!(features.len(), N_MELS * 800);
        let sum: f64 = features.iter().map(|&v| f64::from(v)).sum();
        assert!((sum - 11_036.945_979).abs() < 0.05, "sum {sum}");
        for (band, frame, expected) in [
            (0, 450, 0.265_470_03),
            (10, 500, 1.818_246_6),
            (40, 550, 0.724_320_1),
            (79, 600, 0.232_275_9),
            (20, 620, 0.829_948_5),
        ] {
            let got = features[band * 800 + frame];
            assert!(
                (got - expected).abs() < 1e-4,
                "[{band}, {frame}]: {got} vs {expected}"
            );
        }
    }

    #[test]
    fn frames_follow_the_hop_and_values_stay_in_range() {
        let tone: Vec<f32> = (0..16_000)
            .map(|i| (2.0 * std::f32::consts::PI * 440.0 * i as f32 / 16_000.0).sin() * 0.5)
            .collect();
        let features = LogMel::shared().features(&tone, false);
        assert_eq!(features.len(), N_MELS * 100);
        let max = features.iter().copied().fold(f32::MIN, f32::max);
        let min = features.iter().copied().fold(f32::MAX, f32::min);
        assert!(max <= 1.5 && min >= max - 2.0 - 1e-6, "{min}..{max}");
        // 440 Hz lands in a low band: the band holding it is the loudest of frame 50.
        let frame: Vec<f32> = (0..N_MELS).map(|m| features[m * 100 + 50]).collect();
        let loudest = frame
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i);
        assert!(matches!(loudest, Some(8..=12)), "{loudest:?}");
    }
}
