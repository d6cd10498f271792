//! How fast a client may send its audio: in real time, with room for a burst after a stall.
//!
//! A token bucket of audio time: it holds [`AUDIO_BURST`] when full, refills at one second a
//! second, and each frame takes its own length. A client speaking in real time never empties it;
//! one sending at 10× real time empties it within a second and is told why it is closed. Time is
//! passed in, so the rule is tested without a clock.

use std::time::{Duration, Instant};

/// The audio a client may send ahead of real time: a network stall this long, then its backlog
/// at once, still passes.
pub const AUDIO_BURST: Duration = Duration::from_secs(5);

/// A client sent audio faster than real time.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "audio_too_fast: the client sent {audio:.1} s of audio in {wall:.1} s; audio must come in \
     real time (a burst of at most {burst} s)",
    burst = AUDIO_BURST.as_secs()
)]
pub struct TooFast {
    /// Seconds of audio received.
    pub audio: f64,
    /// Seconds since the first of it.
    pub wall: f64,
}

/// One client's bucket.
#[derive(Debug, Clone, Default)]
pub struct Pace {
    /// When the first audio came, and when the bucket was last filled.
    started: Option<(Instant, Instant)>,
    /// Seconds of audio the bucket still holds.
    left: f64,
    /// Seconds of audio received in all.
    received: f64,
}

impl Pace {
    /// Takes `samples` at `sample_rate` arriving at `now`; an error once the client is ahead of
    /// real time by more than [`AUDIO_BURST`].
    pub fn take(&mut self, samples: usize, sample_rate: u32, now: Instant) -> Result<(), TooFast> {
        let burst = AUDIO_BURST.as_secs_f64();
        let (first, filled) = self.started.get_or_insert_with(|| {
            self.left = burst;
            (now, now)
        });
        let first = *first;
        self.left = (self.left + now.saturating_duration_since(*filled).as_secs_f64()).min(burst);
        *filled = now;
        let length = samples as f64 / f64::from(sample_rate.max(1));
        self.received += length;
        self.left -= length;
        if self.left < 0.0 {
            return Err(TooFast {
                audio: self.received,
                wall: now.saturating_duration_since(first).as_secs_f64(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: usize = 320; // 20 ms at 16 kHz

    #[test]
    fn real_time_audio_passes_for_an_hour() {
        let (mut pace, start) = (Pace::default(), Instant::now());
        for k in 0..180_000u64 {
            let now = start + Duration::from_millis(20 * k);
            assert_eq!(pace.take(FRAME, 16_000, now), Ok(()), "frame {k}");
        }
    }

    #[test]
    fn ten_times_real_time_is_refused_within_a_second_of_wall_time() {
        let (mut pace, start) = (Pace::default(), Instant::now());
        let refused = (0..10_000u64)
            .map(|k| {
                (
                    k,
                    pace.take(FRAME, 16_000, start + Duration::from_millis(2 * k)),
                )
            })
            .find_map(|(k, taken)| taken.err().map(|e| (k, e)));
        let (k, error) = refused.expect("refused");
        assert!(k * 2 < 1_000, "refused only after {} ms", k * 2);
        assert!(error.audio > 5.0 && error.wall < 1.0, "{error}");
        assert!(error.to_string().starts_with("audio_too_fast"));
    }

    #[test]
    fn a_stall_then_its_backlog_at_once_passes_but_a_long_pause_earns_no_credit() {
        let (mut pace, start) = (Pace::default(), Instant::now());
        assert_eq!(pace.take(FRAME, 16_000, start), Ok(()));
        // Four seconds stalled, then the four seconds of audio it held, at once.
        let late = start + Duration::from_secs(4);
        assert_eq!(pace.take(64_000, 16_000, late), Ok(()));
        // A minute of silence from the client, then a minute of audio at once: refused.
        let later = late + Duration::from_secs(60);
        assert!(pace.take(16_000 * 60, 16_000, later).is_err());
    }
}
