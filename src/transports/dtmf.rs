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

#[cfg(test)]
mod tests {
    use super::*;

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
