//! Speech in audio, as a caller hears it: where a recorded turn's speech ends (so its send time
//! is the end of the user's speech) and when the bot's audio, arriving in chunks, starts and
//! stops. Both judge 10 ms windows by their RMS level against one threshold.

/// A window is voiced at or above this RMS level (about −45 dBFS).
pub const VOICED_RMS: f64 = 180.0;

/// Where the speech of `samples` (mono at `rate`) starts and ends, in samples: the first and the
/// last 10 ms window that is voiced. `None` for silence.
pub fn speech_bounds(samples: &[i16], rate: u32) -> Option<(usize, usize)> {
    let window = (rate as usize / 100).max(1);
    let voiced: Vec<usize> = samples
        .chunks(window)
        .enumerate()
        .filter(|(_, w)| rms(w) >= VOICED_RMS)
        .map(|(i, _)| i)
        .collect();
    let (first, last) = (*voiced.first()?, *voiced.last()?);
    Some((first * window, ((last + 1) * window).min(samples.len())))
}

/// The RMS level of `samples`.
pub fn rms(samples: &[i16]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let sum: f64 = samples.iter().map(|s| f64::from(*s).powi(2)).sum();
    (sum / samples.len() as f64).sqrt()
}

/// A change in the bot's audio.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// Voiced audio began, at this many seconds into the stream.
    Onset(f64),
    /// The audio went quiet at this many seconds (the end of its last voiced window), and has
    /// stayed quiet for the hangover.
    Offset(f64),
}

/// Follows received audio and says when the bot starts and stops speaking. Time is the stream's
/// own: a chunk's samples are placed at its arrival time, or right after the previous chunk's
/// samples if that is later (audio that came in a burst plays one piece after another).
#[derive(Debug)]
pub struct Voice {
    rate: u32,
    /// Quiet for this long after voiced audio is an offset.
    hangover: f64,
    /// Where the stream's next sample plays, in seconds.
    cursor: f64,
    speaking: bool,
    /// The end of the last voiced window.
    last_voiced: f64,
}

impl Voice {
    /// A follower of audio at `rate`, ending speech after `hangover_secs` of quiet.
    pub fn new(rate: u32, hangover_secs: f64) -> Self {
        Self {
            rate: rate.max(1),
            hangover: hangover_secs,
            cursor: 0.0,
            speaking: false,
            last_voiced: 0.0,
        }
    }

    /// A chunk that arrived at `at` seconds; what changed in it.
    pub fn feed(&mut self, samples: &[i16], at: f64) -> Vec<Change> {
        let mut changes = Vec::new();
        // Nothing came for a while: the gap was quiet.
        changes.extend(self.quiet_until(at));
        self.cursor = self.cursor.max(at);
        let window = (self.rate as usize / 100).max(1);
        for piece in samples.chunks(window) {
            let start = self.cursor;
            self.cursor += piece.len() as f64 / f64::from(self.rate);
            if rms(piece) >= VOICED_RMS {
                if !self.speaking {
                    self.speaking = true;
                    changes.push(Change::Onset(start));
                }
                self.last_voiced = self.cursor;
            } else if self.speaking && self.cursor - self.last_voiced >= self.hangover {
                self.speaking = false;
                changes.push(Change::Offset(self.last_voiced));
            }
        }
        changes
    }

    /// Time passed with no audio (a server that sends nothing between replies): an offset if
    /// the hangover ran out by `now`.
    pub fn quiet_until(&mut self, now: f64) -> Option<Change> {
        if self.speaking && now.max(self.cursor) - self.last_voiced >= self.hangover {
            self.speaking = false;
            return Some(Change::Offset(self.last_voiced));
        }
        None
    }

    /// Whether the bot is speaking now.
    pub fn speaking(&self) -> bool {
        self.speaking
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(n: usize, level: f64) -> Vec<i16> {
        (0..n)
            .map(|i| (level * (i as f64 * 0.3).sin()) as i16)
            .collect()
    }

    #[test]
    fn a_turns_speech_is_bounded_by_its_first_and_last_voiced_window() {
        let mut audio = vec![0i16; 3_200];
        audio.extend(tone(8_000, 3_000.0));
        audio.extend(vec![5i16; 4_800]);
        assert_eq!(speech_bounds(&audio, 16_000), Some((3_200, 11_200)));
        assert_eq!(speech_bounds(&vec![3i16; 16_000], 16_000), None);
        assert_eq!(speech_bounds(&[], 16_000), None);
    }

    #[test]
    fn the_bots_audio_starts_at_its_first_voiced_window_and_stops_after_the_hangover() {
        let mut voice = Voice::new(16_000, 0.5);
        // 100 ms of silence, then 300 ms of speech in one chunk arriving at 1 s.
        let mut chunk = vec![0i16; 1_600];
        chunk.extend(tone(4_800, 2_000.0));
        assert_eq!(voice.feed(&chunk, 1.0), vec![Change::Onset(1.1)]);
        assert!(voice.speaking());
        // Quiet chunks arriving late do not move the speech's end.
        assert_eq!(voice.feed(&vec![0i16; 4_000], 1.45), vec![]);
        let changes = voice.feed(&vec![0i16; 8_000], 1.7);
        assert_eq!(changes.len(), 1);
        let Change::Offset(end) = changes[0] else {
            panic!("{changes:?}")
        };
        assert!((end - 1.4).abs() < 1e-9, "{end}");
    }

    #[test]
    fn speech_after_a_silent_gap_is_a_new_onset() {
        let mut voice = Voice::new(16_000, 0.8);
        assert_eq!(
            voice.feed(&tone(1_600, 3_000.0), 1.0),
            vec![Change::Onset(1.0)]
        );
        // The server sent nothing for five seconds, then speech again.
        let changes = voice.feed(&tone(1_600, 3_000.0), 6.1);
        assert_eq!(changes, vec![Change::Offset(1.1), Change::Onset(6.1)]);
    }

    #[test]
    fn a_server_that_falls_silent_ends_the_speech_on_the_clock() {
        let mut voice = Voice::new(24_000, 0.5);
        voice.feed(&tone(2_400, 5_000.0), 2.0);
        assert_eq!(voice.quiet_until(2.3), None);
        let Some(Change::Offset(end)) = voice.quiet_until(2.7) else {
            panic!("an offset")
        };
        assert!((end - 2.1).abs() < 1e-9, "{end}");
        assert!(!voice.speaking());
    }
}
