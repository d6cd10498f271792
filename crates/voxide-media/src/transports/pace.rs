//! How fast a client may send its audio (in real time, with room for a burst after a stall)
//! and its typed text (a person's typing pace, each message a person's length).
//!
//! A token bucket of audio time: it starts with [`AUDIO_START`], holds [`AUDIO_BURST`] when
//! full, refills at one second a second, and each frame takes its own length. A client speaking
//! in real time never empties it; one sending at 10× real time from its first frame empties it
//! within 0.2 s (about a second of audio) and is told why it is closed. Time is passed in, so
//! the rule is tested without a clock.

use std::time::{Duration, Instant};

/// The audio a client may send ahead of real time: a network stall this long, then its backlog
/// at once, still passes.
pub const AUDIO_BURST: Duration = Duration::from_secs(5);
/// What a new client may send ahead at first: the rest of the burst is earned by time, so a
/// client that floods from its first frame is refused after this much audio (and the decoding
/// and listening it costs), while a stall refills what its backlog needs.
pub const AUDIO_START: Duration = Duration::from_secs(1);

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
            self.left = AUDIO_START.as_secs_f64();
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

/// The longest message a user may type, in characters.
pub const MAX_TYPED_CHARS: usize = 2_000;
/// Typed messages a client may send at once; then one every [`TYPED_EVERY`].
pub const TYPED_BURST: u32 = 5;
/// How often a typed message is allowed once the burst is spent.
pub const TYPED_EVERY: Duration = Duration::from_secs(3);

/// Why a typed message was not taken (it is dropped; the session goes on).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TextRefused {
    /// Longer than [`MAX_TYPED_CHARS`].
    #[error("text_too_long: {0} characters; a typed message has at most {MAX_TYPED_CHARS}")]
    TooLong(usize),
    /// Faster than a person types.
    #[error(
        "text_too_fast: at most {TYPED_BURST} typed messages at once, then one every {} s",
        TYPED_EVERY.as_secs()
    )]
    TooFast,
}

/// A burst of `burst` uses, then one every `every`: a token bucket on a clock that is passed
/// in.
#[derive(Debug, Clone)]
pub struct Allowance {
    burst: u32,
    every: Duration,
    left: f64,
    filled: Option<Instant>,
}

impl Allowance {
    /// A full allowance.
    pub fn new(burst: u32, every: Duration) -> Self {
        Self {
            burst,
            every,
            left: f64::from(burst),
            filled: None,
        }
    }

    /// Takes one use at `now`, if one is left.
    pub fn take(&mut self, now: Instant) -> bool {
        if let Some(filled) = self.filled {
            let earned = now.saturating_duration_since(filled).as_secs_f64()
                / self.every.as_secs_f64().max(f64::EPSILON);
            self.left = (self.left + earned).min(f64::from(self.burst));
        }
        self.filled = Some(now);
        if self.left < 1.0 {
            return false;
        }
        self.left -= 1.0;
        true
    }
}

/// One client's typed-text allowance: each message starts an LLM run, so a script cannot
/// send a thousand a second or a book in one.
#[derive(Debug, Clone)]
pub struct TextPace(Allowance);

impl Default for TextPace {
    fn default() -> Self {
        Self(Allowance::new(TYPED_BURST, TYPED_EVERY))
    }
}

impl TextPace {
    /// Takes a message of `text` typed at `now`.
    pub fn take(&mut self, text: &str, now: Instant) -> Result<(), TextRefused> {
        let chars = text.chars().count();
        if chars > MAX_TYPED_CHARS {
            return Err(TextRefused::TooLong(chars));
        }
        if self.0.take(now) {
            Ok(())
        } else {
            Err(TextRefused::TooFast)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_text_gets_a_burst_then_a_persons_pace_and_a_persons_length() {
        let (mut pace, start) = (TextPace::default(), Instant::now());
        for _ in 0..TYPED_BURST {
            assert_eq!(pace.take("hello", start), Ok(()));
        }
        assert_eq!(pace.take("hello", start), Err(TextRefused::TooFast));
        assert_eq!(pace.take("hello", start + TYPED_EVERY), Ok(()));
        assert_eq!(
            pace.take("hello", start + TYPED_EVERY),
            Err(TextRefused::TooFast)
        );
        let book = "a".repeat(MAX_TYPED_CHARS + 1);
        let later = start + TYPED_EVERY * 10;
        assert_eq!(
            pace.take(&book, later),
            Err(TextRefused::TooLong(MAX_TYPED_CHARS + 1))
        );
        assert_eq!(
            pace.take(&"é".repeat(MAX_TYPED_CHARS), later),
            Ok(()),
            "characters, not bytes"
        );
    }

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
    fn ten_times_real_time_from_the_first_frame_is_refused_after_about_a_second_of_audio() {
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
        assert!(k * 2 < 200, "refused only after {} ms", k * 2);
        assert!(
            error.audio > 1.0 && error.audio < 1.5 && error.wall < 0.2,
            "{error}"
        );
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
