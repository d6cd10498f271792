//! Keypad entries: keys pressed on a phone's keypad (Twilio's `dtmf` events, RTVI `dtmf`
//! messages) gathered into one entry, as pipecat's DTMF aggregator gathers them: the entry ends
//! at `#` or after [`IDLE`] without a key, and reaches the conversation as `DTMF: 123#`.
//!
//! Sans-IO: keys and time are passed in; the driver sleeps to [`KeypadEntry::deadline`].

use std::time::{Duration, Instant};

/// How long after its last key an entry without `#` ends.
pub const IDLE: Duration = Duration::from_secs(2);
/// The most keys one entry holds; a longer one ends there.
pub const MAX_KEYS: usize = 64;
/// The key that ends an entry at once.
pub const TERMINATOR: char = '#';

/// Whether `key` is a keypad key.
pub fn is_key(key: char) -> bool {
    key.is_ascii_digit() || key == '*' || key == '#'
}

/// What a key press did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pressed {
    /// The first key of an entry: the bot is interrupted.
    pub first: bool,
    /// The entry ended with this key: its text for the conversation.
    pub entry: Option<String>,
}

/// One caller's entry in progress.
#[derive(Debug, Default)]
pub struct KeypadEntry {
    keys: String,
    last: Option<Instant>,
}

impl KeypadEntry {
    /// Takes `key` pressed at `now` (a key that is not a keypad key is ignored).
    pub fn press(&mut self, key: char, now: Instant) -> Pressed {
        if !is_key(key) {
            return Pressed {
                first: false,
                entry: None,
            };
        }
        let first = self.keys.is_empty();
        self.keys.push(key);
        self.last = Some(now);
        let entry = (key == TERMINATOR || self.keys.len() >= MAX_KEYS).then(|| self.take());
        Pressed { first, entry }
    }

    /// When the entry in progress ends by itself.
    pub fn deadline(&self) -> Option<Instant> {
        self.last.map(|last| last + IDLE)
    }

    /// The entry, if it has ended by `now`.
    pub fn due(&mut self, now: Instant) -> Option<String> {
        (self.deadline()? <= now).then(|| self.take())
    }

    fn take(&mut self) -> String {
        self.last = None;
        format!("DTMF: {}", std::mem::take(&mut self.keys))
    }
}

/// A key's two frequencies (ITU-T Q.23): its row's and its column's.
fn frequencies(key: char) -> Option<(f32, f32)> {
    const ROWS: [f32; 4] = [697.0, 770.0, 852.0, 941.0];
    const COLUMNS: [f32; 3] = [1209.0, 1336.0, 1477.0];
    let at = "123456789*0#".find(key)?;
    Some((ROWS[at / 3], COLUMNS[at % 3]))
}

/// Keys pressed as a phone's keypad sounds them, for a line that carries no telephone-events:
/// each key's two tones for 100 ms, then 60 ms of silence, at `rate`. Keys that are not keypad
/// keys are skipped.
pub fn tones(keys: &str, rate: u32) -> Vec<i16> {
    let held = rate as usize / 10;
    let gap = rate as usize * 6 / 100;
    let mut out = Vec::new();
    for (low, high) in keys.chars().filter_map(frequencies) {
        let step = std::f32::consts::TAU / rate as f32;
        out.extend((0..held).map(|n| {
            let t = n as f32 * step;
            // Each tone near -10 dBm0, the sum well inside full scale.
            (7_000.0 * ((low * t).sin() + (high * t).sin())) as i16
        }));
        out.resize(out.len() + gap, 0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The power of `frequency` in `samples` (Goertzel).
    fn power(samples: &[i16], frequency: f32, rate: u32) -> f32 {
        let coefficient = 2.0 * (std::f32::consts::TAU * frequency / rate as f32).cos();
        let (mut s1, mut s2) = (0.0f32, 0.0f32);
        for &x in samples {
            let s0 = f32::from(x) + coefficient * s1 - s2;
            s2 = s1;
            s1 = s0;
        }
        s1 * s1 + s2 * s2 - coefficient * s1 * s2
    }

    #[test]
    fn a_keys_tones_are_its_row_and_column_and_nothing_between() {
        let tones = tones("5#z", 8_000);
        assert_eq!(tones.len(), 2 * (800 + 480), "two keys; z is none");
        let five = &tones[..800];
        let strongest = [697.0, 770.0, 852.0, 941.0, 1209.0, 1336.0, 1477.0]
            .map(|f| (power(five, f, 8_000), f));
        let mut ranked = strongest.to_vec();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
        let top: Vec<f32> = ranked[..2].iter().map(|(_, f)| *f).collect();
        assert!(top.contains(&770.0) && top.contains(&1336.0), "{ranked:?}");
        assert!(ranked[1].0 > 100.0 * ranked[2].0, "{ranked:?}");
        assert!(
            tones[800..1_280].iter().all(|s| *s == 0),
            "a gap after each key"
        );
    }

    #[test]
    fn an_entry_ends_at_the_pound_key_or_after_the_idle_time() {
        let t0 = Instant::now();
        let mut entry = KeypadEntry::default();
        assert_eq!(
            entry.press('1', t0),
            Pressed {
                first: true,
                entry: None
            }
        );
        assert!(!entry.press('2', t0 + Duration::from_millis(300)).first);
        assert_eq!(
            entry.press('#', t0 + Duration::from_millis(600)).entry,
            Some("DTMF: 12#".into())
        );
        assert_eq!(entry.deadline(), None);
        // Without '#': the entry ends 2 s after its last key, not before.
        assert!(entry.press('5', t0 + Duration::from_secs(5)).first);
        entry.press('*', t0 + Duration::from_secs(6));
        assert_eq!(entry.deadline(), Some(t0 + Duration::from_secs(8)));
        assert_eq!(entry.due(t0 + Duration::from_millis(7_900)), None);
        assert_eq!(
            entry.due(t0 + Duration::from_secs(8)),
            Some("DTMF: 5*".into())
        );
        assert_eq!(entry.due(t0 + Duration::from_secs(20)), None);
    }

    #[test]
    fn what_is_not_a_key_is_ignored_and_an_entry_is_bounded() {
        let t0 = Instant::now();
        let mut entry = KeypadEntry::default();
        assert_eq!(entry.press('A', t0).entry, None);
        assert_eq!(entry.deadline(), None);
        let mut ended = None;
        for _ in 0..MAX_KEYS {
            ended = entry.press('9', t0).entry;
        }
        assert_eq!(ended.map(|e| e.len()), Some("DTMF: ".len() + MAX_KEYS));
    }
}
