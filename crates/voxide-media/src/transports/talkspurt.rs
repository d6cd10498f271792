//! The bot's voice as RTP talkspurts (RFC 3551 §4.1), sans-IO: when each 20 ms Opus packet goes
//! out and with which header.
//!
//! While the bot speaks, a packet goes every 20 ms. Once it has been quiet for [`TAIL_FRAMES`]
//! frames, nothing goes until it speaks again (what Opus DTX does; ICE's consent checks keep the
//! path open meanwhile). The next talkspurt starts the moment its first audio is queued: its
//! first packet is marked, and its timestamp moves on by the time that passed, so the caller's
//! jitter buffer plays it on arrival. A clock that ran on through the silence would hold the
//! first audio back to its next tick, 10 ms on average and up to 20.
//!
//! Sequence numbers run on without a gap across talkspurts: a quiet bot is not packet loss.

use std::time::{Duration, Instant};

/// One packet's length.
const FRAME_TIME: Duration = Duration::from_millis(20);
/// Opus's RTP clock.
const RTP_RATE: u32 = 48_000;
/// Samples of one packet at that clock.
const FRAME_SAMPLES: u32 = RTP_RATE / 50;
/// Quiet frames sent at the end of a talkspurt before the sending stops: the decoder's overlap
/// fades out on silence rather than on loss concealment, and a pause between two sentences
/// shorter than this stays inside one talkspurt.
const TAIL_FRAMES: u32 = 5;
/// How far behind the talkspurt's start the later packets' clock runs. The output stage writes
/// the audio 20 ms at a time from the moment the first piece came; half a frame later, each
/// piece is always in the queue when its packet is taken, however the two timers' wakes fall.
const TICK_OFFSET: Duration = Duration::from_millis(10);

/// The header fields of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The first packet of a talkspurt.
    pub marker: bool,
    /// One more than the last packet's, across talkspurts.
    pub sequence_number: u16,
    /// The sampling instant of the packet's first sample, at 48 kHz.
    pub timestamp: u32,
}

/// The sending state of one RTP stream.
#[derive(Debug)]
pub struct Talkspurts {
    sequence_number: u16,
    /// The next packet's timestamp, were it sent on the clock.
    timestamp: u32,
    /// While talking: when the next packet is due, and quiet frames sent in a row.
    talking: Option<(Instant, u32)>,
    /// When the audio of the last packet sent ends: the gap to the next talkspurt starts here.
    last_end: Option<Instant>,
}

impl Talkspurts {
    /// A quiet stream whose first packet will carry these numbers (random, per RFC 3550).
    pub fn new(sequence_number: u16, timestamp: u32) -> Self {
        Self {
            sequence_number,
            timestamp,
            talking: None,
            last_end: None,
        }
    }

    /// When the next packet is due; `None` while quiet (the next one goes when audio comes).
    pub fn due(&self) -> Option<Instant> {
        self.talking.map(|(due, _)| due)
    }

    /// Woken at `now`, with audio waiting or not: the header of the packet to send now, if one
    /// goes. A packet while talking takes the next 20 ms of the queue, padded with silence.
    pub fn poll(&mut self, now: Instant, audio_waiting: bool) -> Option<Header> {
        let marker = match self.talking {
            None if !audio_waiting => return None,
            None => {
                if let Some(end) = self.last_end {
                    let gap = now.saturating_duration_since(end).as_secs_f64();
                    let samples = (gap * f64::from(RTP_RATE)).round() as u64;
                    self.timestamp = self.timestamp.wrapping_add(samples as u32);
                }
                self.talking = Some((now + FRAME_TIME + TICK_OFFSET, 0));
                true
            }
            Some((due, _)) if now < due => return None,
            Some((due, quiet)) => {
                let quiet = if audio_waiting { 0 } else { quiet + 1 };
                if quiet > TAIL_FRAMES {
                    self.talking = None;
                    return None;
                }
                // A clock that fell behind (a stalled task) goes on from now, not in a burst.
                let next = (due + FRAME_TIME).max(now + FRAME_TIME / 2);
                self.talking = Some((next, quiet));
                false
            }
        };
        let header = Header {
            marker,
            sequence_number: self.sequence_number,
            timestamp: self.timestamp,
        };
        self.sequence_number = self.sequence_number.wrapping_add(1);
        self.timestamp = self.timestamp.wrapping_add(FRAME_SAMPLES);
        self.last_end = Some(now + FRAME_TIME);
        Some(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_audio_goes_at_once_and_marked() {
        let t0 = Instant::now();
        let mut spurts = Talkspurts::new(7, 1000);
        assert_eq!(spurts.poll(t0, false), None, "nothing to say");
        assert_eq!(spurts.due(), None);
        let first = spurts.poll(t0 + ms(3), true).expect("sent at once");
        assert_eq!(
            first,
            Header {
                marker: true,
                sequence_number: 7,
                timestamp: 1000
            }
        );
    }

    #[test]
    fn while_talking_a_packet_goes_every_20_ms_half_a_frame_behind_the_writes() {
        let t0 = Instant::now();
        let mut spurts = Talkspurts::new(0, 0);
        spurts.poll(t0, true);
        assert_eq!(spurts.due(), Some(t0 + ms(30)));
        assert_eq!(spurts.poll(t0 + ms(25), true), None, "not due yet");
        let second = spurts.poll(t0 + ms(30), true).expect("due");
        assert_eq!((second.marker, second.sequence_number), (false, 1));
        assert_eq!(second.timestamp, 960);
        assert_eq!(spurts.due(), Some(t0 + ms(50)));
    }

    #[test]
    fn a_talkspurt_ends_after_its_quiet_tail_and_the_next_is_timestamped_by_the_gap() {
        let t0 = Instant::now();
        let mut spurts = Talkspurts::new(100, 0);
        spurts.poll(t0, true);
        let mut at = t0 + ms(30);
        let mut sent = 1;
        while spurts.poll(at, false).is_some() {
            sent += 1;
            at += ms(20);
        }
        assert_eq!(sent, 1 + TAIL_FRAMES, "the tail is sent, then nothing");
        assert_eq!(spurts.due(), None);
        // The last packet went at t0 + 110 ms and its audio ended 20 ms later; the bot speaks
        // again a second after that.
        let last_end = t0 + ms(30 + 20 * (u64::from(TAIL_FRAMES) - 1) + 20);
        let next = spurts.poll(last_end + ms(1000), true).expect("at once");
        assert!(next.marker);
        assert_eq!(next.sequence_number, 100 + 1 + TAIL_FRAMES as u16, "no gap");
        assert_eq!(next.timestamp, (1 + TAIL_FRAMES) * 960 + 48_000);
    }

    #[test]
    fn audio_in_the_tail_keeps_the_talkspurt_going() {
        let t0 = Instant::now();
        let mut spurts = Talkspurts::new(0, 0);
        spurts.poll(t0, true);
        let mut at = t0 + ms(30);
        for _ in 0..TAIL_FRAMES {
            assert!(spurts.poll(at, false).is_some());
            at += ms(20);
        }
        let more = spurts.poll(at, true).expect("still talking");
        assert!(!more.marker);
        for _ in 0..TAIL_FRAMES {
            at += ms(20);
            assert!(spurts.poll(at, false).is_some(), "a fresh tail");
        }
    }

    #[test]
    fn a_stalled_clock_resumes_from_now_without_a_burst() {
        let t0 = Instant::now();
        let mut spurts = Talkspurts::new(0, 0);
        spurts.poll(t0, true);
        assert!(spurts.poll(t0 + ms(200), true).is_some());
        assert_eq!(spurts.due(), Some(t0 + ms(210)));
    }
}
