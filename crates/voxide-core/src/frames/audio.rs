use std::sync::Arc;
use std::time::Duration;

/// Raw PCM audio: signed 16-bit samples, interleaved when there is more than one channel.
///
/// The samples are reference-counted, so cloning a frame (e.g. for a parallel pipeline) does not
/// copy audio.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioFrame {
    /// Interleaved PCM samples.
    pub samples: Arc<[i16]>,
    /// Samples per second, per channel.
    pub sample_rate: u32,
    /// Number of interleaved channels.
    pub channels: u16,
}

impl AudioFrame {
    /// Wraps `samples` recorded at `sample_rate` with `channels` interleaved channels.
    pub fn new(samples: impl Into<Arc<[i16]>>, sample_rate: u32, channels: u16) -> Self {
        Self {
            samples: samples.into(),
            sample_rate,
            channels,
        }
    }

    /// Number of samples per channel.
    pub fn frames(&self) -> usize {
        if self.channels == 0 {
            return 0;
        }
        self.samples.len() / usize::from(self.channels)
    }

    /// How long this audio plays.
    pub fn duration(&self) -> Duration {
        if self.sample_rate == 0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(self.frames() as f64 / f64::from(self.sample_rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_counts_frames_not_samples() {
        let stereo = AudioFrame::new(vec![0i16; 640], 16_000, 2);
        assert_eq!(stereo.frames(), 320);
        assert_eq!(stereo.duration(), Duration::from_millis(20));
    }

    #[test]
    fn odd_formats_do_not_divide_by_zero() {
        assert_eq!(
            AudioFrame::new(vec![1i16; 4], 0, 1).duration(),
            Duration::ZERO
        );
        assert_eq!(AudioFrame::new(vec![1i16; 4], 16_000, 0).frames(), 0);
    }
}
