//! Whether a WebSocket client still reads what the server sends: the server pings it every
//! [`PING_EVERY`], and every client that reads answers at once (browsers, Twilio and WebSocket
//! libraries answer pings by themselves).
//!
//! A client whose ping has gone unanswered for [`PONG_WITHIN`] is not hearing the bot, so it is
//! not listened to either: its audio is dropped where it arrives, before it costs decoding, the
//! VAD, the STT or an answer nobody takes. One unanswered for the give-up time is closed. A ping
//! that is due but cannot even be written (the socket's buffer is full of audio the client has
//! not read) counts as unanswered from when it was due.
//!
//! Sans-IO: the driver sends what [`Heartbeat::ping`] hands it, reports pongs, and asks
//! [`Heartbeat::listening`] and [`Heartbeat::given_up`]; time is passed in.

use std::time::{Duration, Instant};

/// How often a client is pinged once it has answered.
pub const PING_EVERY: Duration = Duration::from_secs(2);
/// How long a ping may go unanswered before the client's audio is dropped: a round trip on
/// any network a conversation survives is well under this.
pub const PONG_WITHIN: Duration = Duration::from_secs(1);

/// One client's pings.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    /// When the next ping is due, while none is outstanding.
    due: Instant,
    /// The ping sent and not yet answered: its payload and when it left.
    outstanding: Option<(u64, Instant)>,
    /// Payloads are numbered, so a stale or unsolicited pong answers nothing.
    sent: u64,
    give_up: Duration,
}

impl Heartbeat {
    /// A client met at `now`: its first ping is due at once; it is closed once a ping has gone
    /// unanswered for `give_up`.
    pub fn new(now: Instant, give_up: Duration) -> Self {
        Self {
            due: now,
            outstanding: None,
            sent: 0,
            give_up,
        }
    }

    /// When the driver should next call [`Heartbeat::ping`].
    pub fn next_ping(&self) -> Option<Instant> {
        match self.outstanding {
            Some(_) => None,
            None => Some(self.due),
        }
    }

    /// The ping's payload to send now, if one is due and none is outstanding.
    pub fn ping(&mut self, now: Instant) -> Option<[u8; 8]> {
        if self.outstanding.is_some() || now < self.due {
            return None;
        }
        self.sent += 1;
        // Counted from when it was due: a ping that waited behind a full socket was already late.
        self.outstanding = Some((self.sent, self.due.min(now)));
        Some(self.sent.to_be_bytes())
    }

    /// A pong arrived at `now`; one that answers the outstanding ping clears it.
    pub fn pong(&mut self, payload: &[u8], now: Instant) {
        if let Some((number, _)) = self.outstanding
            && payload == number.to_be_bytes()
        {
            self.outstanding = None;
            self.due = now + PING_EVERY;
        }
    }

    /// Since when the client has owed an answer (`None`: it owes none yet).
    fn owed_since(&self, now: Instant) -> Option<Instant> {
        match self.outstanding {
            Some((_, sent)) => Some(sent),
            None => (now >= self.due).then_some(self.due),
        }
    }

    /// Whether the client's audio is taken at `now`.
    pub fn listening(&self, now: Instant) -> bool {
        self.owed_since(now)
            .is_none_or(|since| now.saturating_duration_since(since) < PONG_WITHIN)
    }

    /// When the client is given up on, if it answers nothing before.
    pub fn give_up_at(&self) -> Instant {
        match self.outstanding {
            Some((_, sent)) => sent + self.give_up,
            None => self.due + self.give_up,
        }
    }

    /// Whether the client has owed an answer for the give-up time at `now`.
    pub fn given_up(&self, now: Instant) -> bool {
        now >= self.give_up_at()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIVE_UP: Duration = Duration::from_secs(15);

    fn answered(beat: &mut Heartbeat, now: Instant) {
        let payload = beat.ping(now).expect("a ping is due");
        beat.pong(&payload, now + Duration::from_millis(30));
    }

    #[test]
    fn a_client_that_answers_its_pings_is_always_listened_to() {
        let start = Instant::now();
        let mut beat = Heartbeat::new(start, GIVE_UP);
        let mut now = start;
        for _ in 0..100 {
            answered(&mut beat, now);
            assert!(beat.listening(now + Duration::from_millis(30)));
            now = beat.next_ping().expect("the next ping is due later");
            assert!(beat.listening(now), "a ping not yet sent is owed nothing");
            assert!(!beat.given_up(now));
        }
    }

    #[test]
    fn a_client_that_does_not_answer_is_not_listened_to_after_a_second_and_given_up_on_later() {
        let start = Instant::now();
        let mut beat = Heartbeat::new(start, GIVE_UP);
        assert!(beat.ping(start).is_some());
        assert!(beat.listening(start + Duration::from_millis(999)));
        assert!(!beat.listening(start + PONG_WITHIN));
        assert!(
            beat.ping(start + PING_EVERY).is_none(),
            "one ping outstanding at a time"
        );
        assert_eq!(beat.give_up_at(), start + GIVE_UP);
        assert!(!beat.given_up(start + GIVE_UP - Duration::from_millis(1)));
        assert!(beat.given_up(start + GIVE_UP));
    }

    #[test]
    fn a_late_answer_lets_the_client_be_heard_again() {
        let start = Instant::now();
        let mut beat = Heartbeat::new(start, GIVE_UP);
        let payload = beat.ping(start).expect("due");
        let late = start + Duration::from_secs(4);
        assert!(!beat.listening(late));
        beat.pong(&payload, late);
        assert!(beat.listening(late));
        assert_eq!(beat.next_ping(), Some(late + PING_EVERY));
    }

    #[test]
    fn a_pong_that_answers_no_ping_of_ours_counts_for_nothing() {
        let start = Instant::now();
        let mut beat = Heartbeat::new(start, GIVE_UP);
        let payload = beat.ping(start).expect("due");
        beat.pong(b"unsolicited", start);
        beat.pong(&(u64::from_be_bytes(payload) + 1).to_be_bytes(), start);
        assert!(!beat.listening(start + PONG_WITHIN));
    }

    #[test]
    fn a_ping_that_could_not_be_sent_counts_as_unanswered_from_when_it_was_due() {
        // The writer was stuck behind audio the client never read: the ping due at 2 s leaves
        // only at 5 s, and the client owes it since 2 s.
        let start = Instant::now();
        let mut beat = Heartbeat::new(start, GIVE_UP);
        answered(&mut beat, start);
        let due = beat.next_ping().expect("due later");
        assert!(!beat.listening(due + PONG_WITHIN), "owed since it was due");
        assert!(beat.ping(due + Duration::from_secs(3)).is_some());
        assert!(!beat.listening(due + Duration::from_secs(3)));
        assert_eq!(beat.give_up_at(), due + GIVE_UP);
    }
}
