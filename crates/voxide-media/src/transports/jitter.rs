//! A jitter buffer for one incoming RTP audio stream, sans-IO: packets go in as they arrive
//! ([`JitterBuffer::push`]), and what to play comes out in the sender's order and on the
//! sender's timeline ([`JitterBuffer::pop`]), so the VAD, Smart Turn and the STT hear audio as
//! long as what was said.
//!
//! - **No added delay on a good path.** The next packet in sequence plays the moment it
//!   arrives. Only a hole waits, and at most the buffer's depth past when the missing audio
//!   should have come ([`JitterBuffer::deadline`]); the depth follows the measured jitter
//!   (RFC 3550 §6.4.1), between [`MIN_DEPTH`] and [`MAX_DEPTH`], and grows when packets come
//!   too late to play.
//! - **A hole is filled, never skipped.** A lost packet whose copy came inside a later one (RED,
//!   RFC 2198: [`JitterBuffer::push_redundant`]) plays from the copy; one whose successor (or
//!   the successor's copy) is here is rebuilt from the successor's in-band FEC
//!   ([`Playout::Fec`]); the rest is concealed by the decoder ([`Playout::Conceal`]). When
//!   nothing comes at all, the timeline still moves on at the deadline, concealed and then
//!   silent, so a speaker whose network stalls at the end of a
//!   sentence still ends their turn.
//! - **Sender silence is silence.** A jump of the timestamp with no gap in the sequence is DTX
//!   (RFC 7587 §3.1.3): it plays as [`Playout::Silence`] of its exact length.
//! - Duplicates are dropped; a packet whose time has been played (concealed) already is late
//!   and dropped, or trimmed to the part not yet played.
//!
//! Times are in the stream's RTP clock: 48 kHz for Opus ([`JitterBuffer::new`]), 8 kHz for
//! G.711, which has no FEC ([`JitterBuffer::without_fec`]). [`NetworkStats`] counts all of it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The buffer's least depth: what a hole waits at least for its packet. Two packets' time,
/// so a packet overtaken by the next still plays in its place.
pub const MIN_DEPTH: Duration = Duration::from_millis(40);
/// Its greatest depth: no hole waits longer than this.
pub const MAX_DEPTH: Duration = Duration::from_millis(120);
/// The RTP clock of Opus.
const OPUS_CLOCK: u32 = 48_000;
/// Frames a second: a stalled stream is concealed in steps of 20 ms.
const FRAMES_PER_SECOND: u32 = 50;
/// Frames concealed in a row before the rest of a stall plays as silence (the decoder's
/// concealment has faded out by then).
const MAX_CONCEALED_RUN: u32 = 5;
/// The depth is this many times the interarrival jitter.
const JITTER_TIMES: f64 = 4.0;
/// What a late packet adds to the depth, and how much of that is forgotten per packet.
const LATE_STEP: f64 = 0.020;
const LATE_DECAY: f64 = 0.995;
/// How fast the fastest path the buffer expects packets on is forgotten (seconds per packet),
/// so a path that slows for good is followed.
const FASTEST_CREEP: f64 = 0.000_05;
/// Packets held at most; one further than this ahead of the next to play is dropped.
const MAX_HELD: u64 = 256;
/// Sequence numbers remembered to tell a duplicate from a late packet.
const SEEN: u64 = 512;

/// One packet as it came off the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtpAudio {
    /// Its RTP sequence number.
    pub sequence_number: u16,
    /// Its RTP timestamp.
    pub timestamp: u32,
    /// Its duration in samples of the RTP clock (from the payload: an Opus packet's TOC).
    pub samples: u32,
    /// The codec's payload.
    pub payload: Vec<u8>,
}

/// What to play next, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Playout {
    /// Decode this packet, leaving out its first `trim` samples (played already, concealed).
    Packet {
        /// The payload.
        payload: Vec<u8>,
        /// Samples of the RTP clock to leave out at its start.
        trim: u32,
    },
    /// A packet was lost and the next one is here: decode the lost one's `samples` from the next
    /// one's in-band FEC.
    Fec {
        /// The next packet's payload.
        next: Vec<u8>,
        /// Samples of the RTP clock to rebuild.
        samples: u32,
    },
    /// Audio was lost: let the decoder conceal `samples`.
    Conceal {
        /// Samples of the RTP clock.
        samples: u32,
    },
    /// The sender sent nothing for `samples`: silence.
    Silence {
        /// Samples of the RTP clock.
        samples: u32,
    },
}

/// What one stream's network did, for the session's metrics and `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct NetworkStats {
    /// Packets received (duplicates included).
    pub received: u64,
    /// Packets never received in time to play.
    pub lost: u64,
    /// Lost packets decoded from the next packet's in-band FEC (where that packet carries
    /// none, the decoder conceals instead).
    pub recovered: u64,
    /// Lost packets played from a copy a later packet carried (RED, RFC 2198).
    pub redundant: u64,
    /// Packets that came in RED, carrying copies of earlier ones (counted by the decoder that
    /// takes them apart, not by the buffer).
    pub red: u64,
    /// 20 ms frames the decoder concealed for lost audio (a stall counts once the sender's next
    /// packet shows it lost some; one that was its quiet does not).
    pub concealed: u64,
    /// Packets that came after their time was played.
    pub late: u64,
    /// Packets that came before one sent earlier.
    pub reordered: u64,
    /// Packets received twice.
    pub duplicated: u64,
    /// Interarrival jitter (RFC 3550), in seconds.
    pub jitter: f64,
    /// The buffer's depth now, in seconds.
    pub depth: f64,
}

impl NetworkStats {
    /// Adds `other`'s counts to these; the jitter and depth become `other`'s.
    pub fn add(&mut self, other: &Self) {
        self.received += other.received;
        self.lost += other.lost;
        self.recovered += other.recovered;
        self.redundant += other.redundant;
        self.red += other.red;
        self.concealed += other.concealed;
        self.late += other.late;
        self.reordered += other.reordered;
        self.duplicated += other.duplicated;
        self.jitter = other.jitter;
        self.depth = other.depth;
    }

    /// The counts since `earlier`, a report of the same stream; the jitter and depth now.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            received: self.received.saturating_sub(earlier.received),
            lost: self.lost.saturating_sub(earlier.lost),
            recovered: self.recovered.saturating_sub(earlier.recovered),
            redundant: self.redundant.saturating_sub(earlier.redundant),
            red: self.red.saturating_sub(earlier.red),
            concealed: self.concealed.saturating_sub(earlier.concealed),
            late: self.late.saturating_sub(earlier.late),
            reordered: self.reordered.saturating_sub(earlier.reordered),
            duplicated: self.duplicated.saturating_sub(earlier.duplicated),
            jitter: self.jitter,
            depth: self.depth,
        }
    }
}

/// What one step of [`JitterBuffer::pop`] came to.
enum Step {
    /// This plays next.
    Play(Playout),
    /// Nothing is due yet.
    Wait,
    /// A packet with nothing left to play was passed over: look again.
    Again,
}

/// A packet held until its turn.
#[derive(Debug)]
struct Held {
    timestamp: u64,
    samples: u32,
    payload: Vec<u8>,
}

/// The receiving state of one stream.
#[derive(Debug)]
pub struct JitterBuffer {
    /// The stream's RTP clock, samples a second.
    clock: u32,
    /// Whether a packet carries the one before it (Opus's in-band FEC).
    fec: bool,
    /// Packets received and not yet played, by extended sequence number.
    held: BTreeMap<u64, Held>,
    /// Copies of earlier packets that later ones carried (RED), by extended timestamp, until
    /// their time is played.
    spares: BTreeMap<u64, Held>,
    /// The next sequence number to play, extended; `None` before the first packet.
    next: Option<u64>,
    /// The extended timestamp the timeline has been played up to.
    played_to: u64,
    /// The highest extended sequence number and timestamp received.
    highest: u64,
    highest_timestamp: u64,
    /// Received sequence numbers, extended, each in slot `sequence % SEEN`.
    seen: Vec<u64>,
    /// The first packet's arrival and extended timestamp: where transit times count from.
    origin: Option<(Instant, u64)>,
    /// The fastest transit so far, in seconds relative to the first packet's, slowly forgotten.
    fastest: f64,
    /// The last packet's transit, for the jitter (seconds).
    last_transit: Option<f64>,
    /// What late packets added to the depth (seconds).
    late_depth: f64,
    /// Frames concealed in a row at a stall.
    stalled: u32,
    stats: NetworkStats,
}

impl Default for JitterBuffer {
    fn default() -> Self {
        Self::new()
    }
}

impl JitterBuffer {
    /// An empty buffer for Opus: a 48 kHz clock, and in-band FEC to rebuild a lost packet.
    pub fn new() -> Self {
        Self::with(OPUS_CLOCK, true)
    }

    /// An empty buffer for a codec without FEC at `clock` (G.711: 8,000): every lost packet is
    /// concealed.
    pub fn without_fec(clock: u32) -> Self {
        Self::with(clock, false)
    }

    fn with(clock: u32, fec: bool) -> Self {
        Self {
            clock,
            fec,
            held: BTreeMap::new(),
            spares: BTreeMap::new(),
            next: None,
            played_to: 0,
            highest: 0,
            highest_timestamp: 0,
            seen: vec![0; SEEN as usize],
            origin: None,
            fastest: 0.0,
            last_transit: None,
            late_depth: 0.0,
            stalled: 0,
            stats: NetworkStats {
                depth: MIN_DEPTH.as_secs_f64(),
                ..NetworkStats::default()
            },
        }
    }

    /// What the stream's network has done so far.
    pub fn stats(&self) -> NetworkStats {
        self.stats
    }

    /// How long a hole waits now.
    pub fn depth(&self) -> Duration {
        Duration::from_secs_f64(self.stats.depth)
    }

    /// Takes a packet that arrived at `now`.
    pub fn push(&mut self, packet: RtpAudio, now: Instant) {
        self.stats.received += 1;
        let Some(next) = self.next else {
            let timestamp = u64::from(packet.timestamp) + (1 << 32);
            let sequence = u64::from(packet.sequence_number) + (1 << 16);
            self.next = Some(sequence);
            self.played_to = timestamp;
            self.highest = sequence;
            self.highest_timestamp = timestamp;
            self.origin = Some((now, timestamp));
            self.mark_seen(sequence);
            self.held.insert(sequence, held(packet, timestamp));
            return;
        };
        let sequence = unwrap(self.highest, u64::from(packet.sequence_number), 16);
        let timestamp = unwrap(self.highest_timestamp, u64::from(packet.timestamp), 32);
        if self.was_seen(sequence) {
            self.stats.duplicated += 1;
            return;
        }
        if self.stalled > MAX_CONCEALED_RUN
            && sequence >= next
            && timestamp + u64::from(packet.samples) <= self.played_to
        {
            self.resume(timestamp, now);
        }
        self.observe_transit(timestamp, now);
        if sequence < self.highest {
            self.stats.reordered += 1;
        }
        if sequence < next || timestamp + u64::from(packet.samples) <= self.played_to {
            // Its time has been played: concealed or skipped.
            self.stats.late += 1;
            self.late_depth = (self.stats.depth + LATE_STEP).min(MAX_DEPTH.as_secs_f64());
            self.update_depth();
            if sequence >= next {
                self.mark_seen(sequence);
                self.held.insert(sequence, held(packet, timestamp));
            }
            return;
        }
        if sequence >= next + MAX_HELD {
            // Far ahead of anything playable: a sender that jumped; start again from it.
            self.stats.lost += sequence - next;
            self.held.clear();
            self.next = Some(sequence);
            self.played_to = timestamp;
        }
        if self.stalled > 0 {
            // The stall is over: the sender's quiet if the sequence runs on, else loss. Loss
            // that outlasted the depth (a burst) deepens the buffer as a late packet does: the
            // packet that ends a burst carries what rebuilds its last packets (FEC, RED), and
            // only a hole still open when it comes can use it.
            if sequence > next {
                self.stats.concealed += u64::from(self.stalled.min(MAX_CONCEALED_RUN));
                self.late_depth = (self.stats.depth + LATE_STEP).min(MAX_DEPTH.as_secs_f64());
                self.update_depth();
            }
            self.stalled = 0;
        }
        self.mark_seen(sequence);
        if sequence > self.highest {
            self.highest = sequence;
            self.highest_timestamp = timestamp;
        }
        self.held.insert(sequence, held(packet, timestamp));
    }

    /// Takes a copy of an earlier packet (its timestamp, duration and payload) that a later
    /// one carried (RED, RFC 2198), after that later packet. It plays only if its packet has
    /// not come when the hole's deadline passes; a copy of audio held or played already, or
    /// before the stream's first packet, is dropped.
    pub fn push_redundant(&mut self, timestamp: u32, samples: u32, payload: Vec<u8>) {
        if self.next.is_none() || samples == 0 || self.spares.len() as u64 >= MAX_HELD {
            return;
        }
        let timestamp = unwrap(self.highest_timestamp, u64::from(timestamp), 32);
        if timestamp < self.played_to
            || timestamp > self.highest_timestamp
            || self.held.values().any(|held| held.timestamp == timestamp)
        {
            return;
        }
        self.spares.insert(
            timestamp,
            Held {
                timestamp,
                samples,
                payload,
            },
        );
    }

    /// What to play at `now`, one piece at a time; `None` when nothing is due (ask again at
    /// [`deadline`](Self::deadline) or when the next packet comes).
    pub fn pop(&mut self, now: Instant) -> Option<Playout> {
        // Each pass either plays something or moves past a packet that has nothing to play:
        // at most as many passes as packets held, and the sequence's holes before them.
        loop {
            match self.step(now) {
                Step::Play(playout) => return Some(playout),
                Step::Wait => return None,
                Step::Again => {}
            }
        }
    }

    /// One step of [`pop`](Self::pop).
    fn step(&mut self, now: Instant) -> Step {
        let Some(next) = self.next else {
            return Step::Wait;
        };
        // Copies of audio whose time has been played are no use any more.
        while let Some(entry) = self.spares.first_entry()
            && entry.key() < &self.played_to
        {
            entry.remove();
        }
        if let Some(packet) = self.held.get(&next) {
            if packet.timestamp > self.played_to {
                // The sequence runs on but time jumped: the sender was quiet (DTX).
                let samples = (packet.timestamp - self.played_to).min(self.max_gap()) as u32;
                self.played_to = packet.timestamp;
                self.stalled = 0;
                return Step::Play(Playout::Silence { samples });
            }
            let packet = self.held.remove(&next).expect("held");
            self.next = Some(next + 1);
            let end = packet.timestamp + u64::from(packet.samples);
            if end <= self.played_to {
                // Concealed over before it came.
                self.stats.lost += 1;
                return Step::Again;
            }
            let trim = (self.played_to - packet.timestamp) as u32;
            self.played_to = end;
            self.stalled = 0;
            return Step::Play(Playout::Packet {
                payload: packet.payload,
                trim,
            });
        }
        if let Some((&after, packet)) = self.held.first_key_value()
            && packet.timestamp <= self.played_to
        {
            // The time of the packets before it has been played (from a copy, or concealed
            // through a stall): they are lost, and it plays now.
            self.stats.lost += after - next;
            self.next = Some(after);
            return Step::Again;
        }
        if self.deadline().is_none_or(|deadline| now < deadline) {
            return Step::Wait;
        }
        // The next packet is overdue past the depth.
        let playout = match self.held.first_key_value() {
            Some((&after, packet)) => {
                if let Some(copy) = self.spares.remove(&self.played_to) {
                    // Lost, and a later packet carried a copy of it.
                    self.stats.lost += 1;
                    self.stats.redundant += 1;
                    self.next = Some(next + 1);
                    self.played_to += u64::from(copy.samples);
                    self.stalled = 0;
                    return Step::Play(Playout::Packet {
                        payload: copy.payload,
                        trim: 0,
                    });
                }
                // Lost: the packets from `next` to `after`, sharing the time up to `after`'s.
                let missing = after - next;
                let span = packet.timestamp.saturating_sub(self.played_to);
                // A stall played the time of the first ones already: as many packets of
                // `after`'s length as the time left holds are still to come.
                let left = span.div_ceil(u64::from(packet.samples.max(1))).max(1);
                if left < missing {
                    self.stats.lost += missing - left;
                    self.next = Some(after - left);
                    return Step::Again;
                }
                let samples = (span / missing).min(self.max_gap()) as u32;
                self.stats.lost += 1;
                self.next = Some(next + 1);
                // The packet after this one, for its FEC: `after`, or a copy that came.
                let successor = match missing {
                    _ if !self.fec => None,
                    1 => Some(packet.payload.clone()),
                    _ => {
                        let at = self.played_to + u64::from(samples);
                        self.spares.get(&at).map(|copy| copy.payload.clone())
                    }
                };
                self.played_to += u64::from(samples);
                if samples == 0 {
                    return Step::Again;
                }
                match successor {
                    Some(next) => {
                        self.stats.recovered += 1;
                        Playout::Fec { next, samples }
                    }
                    _ => {
                        self.stats.concealed += 1;
                        Playout::Conceal { samples }
                    }
                }
            }
            None => {
                // Nothing at all: the timeline moves on without the sender.
                let samples = self.clock / FRAMES_PER_SECOND;
                self.played_to += u64::from(samples);
                self.stalled += 1;
                if self.stalled <= MAX_CONCEALED_RUN {
                    // Counted once the stall's end tells loss from the sender's quiet.
                    Playout::Conceal { samples }
                } else {
                    Playout::Silence { samples }
                }
            }
        };
        Step::Play(playout)
    }

    /// A sender that fell quiet long enough to be played as silence, and comes back behind the
    /// timeline: it paused without moving its clock on (webrtc-rs and aiortc do, for a paused
    /// track). Its pause was played already, so the timeline restarts at the packet that came,
    /// and transit times count from there; else every packet after the pause would be late.
    fn resume(&mut self, timestamp: u64, now: Instant) {
        self.played_to = timestamp;
        self.origin = Some((now, timestamp));
        self.fastest = 0.0;
        self.last_transit = None;
    }

    /// When the audio at the timeline's end, not yet here, is given up for lost: when it would
    /// have come on the fastest path, plus the depth. `None` before the first packet.
    pub fn deadline(&self) -> Option<Instant> {
        let (origin, start) = self.origin?;
        let due = self.played_to.saturating_sub(start) as f64 / f64::from(self.clock)
            + self.fastest
            + self.stats.depth;
        Some(origin + Duration::from_secs_f64(due.max(0.0)))
    }

    /// Follows the transit time of a packet (arrival less its timestamp): the fastest path,
    /// and the jitter (RFC 3550 §6.4.1: J += (|D| - J) / 16).
    fn observe_transit(&mut self, timestamp: u64, now: Instant) {
        let Some((origin, start)) = self.origin else {
            return;
        };
        let transit = now.saturating_duration_since(origin).as_secs_f64()
            - (timestamp as f64 - start as f64) / f64::from(self.clock);
        self.fastest = (self.fastest + FASTEST_CREEP).min(transit);
        if let Some(last) = self.last_transit {
            let d = (transit - last).abs();
            self.stats.jitter += (d - self.stats.jitter) / 16.0;
        }
        self.last_transit = Some(transit);
        self.late_depth *= LATE_DECAY;
        self.update_depth();
    }

    fn update_depth(&mut self) {
        let wanted = (self.stats.jitter * JITTER_TIMES).max(self.late_depth);
        self.stats.depth = wanted.clamp(MIN_DEPTH.as_secs_f64(), MAX_DEPTH.as_secs_f64());
    }

    /// The most silence one jump of the sender's clock plays: a second (a clock that jumps
    /// further is a sender that restarted, not one that was quiet).
    fn max_gap(&self) -> u64 {
        u64::from(self.clock)
    }

    fn mark_seen(&mut self, sequence: u64) {
        self.seen[(sequence % SEEN) as usize] = sequence;
    }

    fn was_seen(&self, sequence: u64) -> bool {
        self.seen[(sequence % SEEN) as usize] == sequence
    }
}

fn held(packet: RtpAudio, timestamp: u64) -> Held {
    Held {
        timestamp,
        samples: packet.samples,
        payload: packet.payload,
    }
}

/// `value`, a counter of `bits` that wraps, as the extended counter nearest `reference`.
fn unwrap(reference: u64, value: u64, bits: u32) -> u64 {
    let cycle = 1u64 << bits;
    let base = reference & !(cycle - 1);
    let candidates = [base.wrapping_sub(cycle), base, base + cycle].map(|b| b.wrapping_add(value));
    candidates
        .into_iter()
        .filter(|&c| c < u64::MAX / 2)
        .min_by_key(|&c| c.abs_diff(reference))
        .unwrap_or(base + value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A scripted stream: packet `n` is 20 ms, sent at `n * 20 ms`.
    struct Script {
        buffer: JitterBuffer,
        start: Instant,
        first_sequence: u16,
        first_timestamp: u32,
    }

    impl Script {
        fn new(first_sequence: u16, first_timestamp: u32) -> Self {
            Self {
                buffer: JitterBuffer::new(),
                start: Instant::now(),
                first_sequence,
                first_timestamp,
            }
        }

        fn packet(&self, n: u16) -> RtpAudio {
            RtpAudio {
                sequence_number: self.first_sequence.wrapping_add(n),
                timestamp: self.first_timestamp.wrapping_add(u32::from(n) * 960),
                samples: 960,
                payload: vec![n as u8],
            }
        }

        fn at(&self, ms: u64) -> Instant {
            self.start + Duration::from_millis(ms)
        }

        /// Packet `n` arrives `late_ms` after it was sent; what plays then.
        fn arrive(&mut self, n: u16, late_ms: u64) -> Vec<Playout> {
            let now = self.at(u64::from(n) * 20 + late_ms);
            self.buffer.push(self.packet(n), now);
            self.drain(now)
        }

        fn drain(&mut self, now: Instant) -> Vec<Playout> {
            std::iter::from_fn(|| self.buffer.pop(now)).collect()
        }
    }

    fn packet(n: u8) -> Playout {
        Playout::Packet {
            payload: vec![n],
            trim: 0,
        }
    }

    #[test]
    fn packets_in_order_play_the_moment_they_arrive() {
        let mut s = Script::new(65_530, u32::MAX - 2_000);
        for n in 0..12 {
            assert_eq!(s.arrive(n, 5), vec![packet(n as u8)], "packet {n}");
        }
        let stats = s.buffer.stats();
        assert_eq!((stats.received, stats.lost, stats.late), (12, 0, 0));
        assert!(stats.jitter < 0.001, "{stats:?}");
        assert_eq!(s.buffer.depth(), MIN_DEPTH);
    }

    #[test]
    fn a_packet_overtaken_by_the_next_plays_first_when_it_comes_within_the_depth() {
        let mut s = Script::new(100, 0);
        assert_eq!(s.arrive(0, 0), vec![packet(0)]);
        assert_eq!(s.arrive(2, 0), vec![], "2 waits for 1");
        assert_eq!(s.arrive(1, 25), vec![packet(1), packet(2)]);
        let stats = s.buffer.stats();
        assert_eq!((stats.reordered, stats.lost, stats.late), (1, 0, 0));
    }

    #[test]
    fn one_lost_packet_is_rebuilt_from_the_next_ones_fec_once_the_depth_has_passed() {
        let mut s = Script::new(7, 1_000);
        assert_eq!(s.arrive(0, 0), vec![packet(0)]);
        assert_eq!(s.arrive(2, 0), vec![]);
        let deadline = s.buffer.deadline().expect("a deadline");
        assert_eq!(deadline, s.at(20) + MIN_DEPTH, "1 was due at 20 ms");
        assert_eq!(s.drain(deadline - MS), vec![]);
        assert_eq!(
            s.drain(deadline),
            vec![
                Playout::Fec {
                    next: vec![2],
                    samples: 960
                },
                packet(2)
            ]
        );
        assert_eq!(s.arrive(1, 60), vec![], "too late: dropped");
        let stats = s.buffer.stats();
        assert_eq!(
            (stats.lost, stats.recovered, stats.late, stats.concealed),
            (1, 1, 1, 0)
        );
        assert!(
            s.buffer.depth() > MIN_DEPTH,
            "a late packet deepens the buffer"
        );
    }

    #[test]
    fn a_copy_plays_only_for_a_packet_still_missing_at_its_deadline() {
        let mut s = Script::new(7, 1_000);
        let copy = |s: &mut Script, n: u16| {
            let timestamp = s.first_timestamp.wrapping_add(u32::from(n) * 960);
            s.buffer.push_redundant(timestamp, 960, vec![100 + n as u8]);
        };
        assert_eq!(s.arrive(0, 0), vec![packet(0)]);
        // 1 is lost; 2 carries its copy, kept until 1's deadline.
        assert_eq!(s.arrive(2, 0), vec![]);
        copy(&mut s, 1);
        // A copy of what has played already is dropped.
        copy(&mut s, 0);
        let deadline = s.buffer.deadline().expect("a deadline");
        assert_eq!(s.drain(deadline - MS), vec![]);
        assert_eq!(
            s.drain(deadline),
            vec![
                Playout::Packet {
                    payload: vec![101],
                    trim: 0
                },
                packet(2)
            ]
        );
        // 4 is only late: it comes before its deadline, and its copy in 5 is not used.
        assert_eq!(s.arrive(3, 0), vec![packet(3)]);
        assert_eq!(s.arrive(5, 0), vec![]);
        copy(&mut s, 4);
        assert_eq!(s.arrive(4, 30), vec![packet(4), packet(5)]);
        let stats = s.buffer.stats();
        assert_eq!(
            (
                stats.lost,
                stats.redundant,
                stats.recovered,
                stats.concealed
            ),
            (1, 1, 0, 0)
        );
    }

    #[test]
    fn without_fec_a_lost_packet_is_concealed_on_its_own_clock() {
        // G.711: 160 samples a packet at 8 kHz.
        let start = Instant::now();
        let mut buffer = JitterBuffer::without_fec(8_000);
        let packet = |n: u16| RtpAudio {
            sequence_number: n,
            timestamp: u32::from(n) * 160,
            samples: 160,
            payload: vec![n as u8; 160],
        };
        buffer.push(packet(0), start);
        assert!(buffer.pop(start).is_some());
        buffer.push(packet(2), start + 40 * MS);
        let deadline = buffer.deadline().expect("a deadline");
        assert_eq!(deadline, start + 20 * MS + MIN_DEPTH, "1 was due at 20 ms");
        let played: Vec<_> = std::iter::from_fn(|| buffer.pop(deadline)).collect();
        assert_eq!(
            played,
            vec![
                Playout::Conceal { samples: 160 },
                Playout::Packet {
                    payload: vec![2; 160],
                    trim: 0
                }
            ]
        );
        // Then the sender stalls: the timeline moves on in 20 ms steps of its clock.
        let stalled = buffer.deadline().expect("a deadline");
        assert_eq!(buffer.pop(stalled), Some(Playout::Conceal { samples: 160 }));
        let stats = buffer.stats();
        assert_eq!((stats.lost, stats.recovered, stats.concealed), (1, 0, 1));
    }

    #[test]
    fn a_burst_of_losses_is_concealed_frame_by_frame_and_the_last_from_fec() {
        let mut s = Script::new(0, 0);
        s.arrive(0, 0);
        let mut played = s.arrive(4, 0);
        played.extend(s.drain(s.at(100)));
        assert_eq!(
            played,
            vec![
                Playout::Conceal { samples: 960 },
                Playout::Conceal { samples: 960 },
                Playout::Fec {
                    next: vec![4],
                    samples: 960
                },
                packet(4)
            ]
        );
        assert_eq!(s.buffer.stats().lost, 3);
    }

    #[test]
    fn a_copy_after_a_stall_fills_the_time_the_stall_left_and_the_buffer_deepens() {
        let mut s = Script::new(0, 0);
        s.arrive(0, 0);
        // 1, 2 and 3 are lost: 1 and 2 are concealed as a stall, on the clock.
        assert_eq!(s.drain(s.at(60)), vec![Playout::Conceal { samples: 960 }]);
        assert_eq!(s.drain(s.at(80)), vec![Playout::Conceal { samples: 960 }]);
        // 4 comes a little late, with a copy of 3.
        let now = s.at(85);
        s.buffer.push(s.packet(4), now);
        s.buffer.push_redundant(3 * 960, 960, vec![103]);
        assert!(s.buffer.depth() > MIN_DEPTH, "a burst deepens the buffer");
        let mut played = s.drain(now);
        played.extend(s.drain(s.at(140)));
        assert_eq!(
            played,
            vec![
                Playout::Packet {
                    payload: vec![103],
                    trim: 0
                },
                packet(4)
            ]
        );
        let stats = s.buffer.stats();
        assert_eq!(
            (stats.lost, stats.redundant, stats.concealed),
            (3, 1, 2),
            "{stats:?}"
        );
    }

    #[test]
    fn duplicates_are_dropped() {
        let mut s = Script::new(10, 0);
        s.arrive(0, 0);
        s.arrive(1, 0);
        assert_eq!(s.arrive(1, 3), vec![]);
        assert_eq!(s.arrive(0, 30), vec![]);
        assert_eq!(s.arrive(2, 0), vec![packet(2)]);
        let stats = s.buffer.stats();
        assert_eq!((stats.duplicated, stats.late, stats.received), (2, 0, 5));
    }

    #[test]
    fn a_sender_quiet_without_a_sequence_gap_plays_as_silence_of_the_exact_length() {
        let mut s = Script::new(0, 0);
        s.arrive(0, 0);
        // Packet 1 carries the timestamp of 300 ms: DTX from 20 to 300 ms, nothing played
        // meanwhile.
        let now = s.at(300);
        s.buffer.push(
            RtpAudio {
                sequence_number: 1,
                timestamp: 300 * 48,
                samples: 960,
                payload: vec![1],
            },
            now,
        );
        assert_eq!(
            s.drain(now),
            vec![Playout::Silence { samples: 280 * 48 }, packet(1)]
        );
        assert_eq!(s.buffer.stats().lost, 0);
    }

    #[test]
    fn a_stall_is_concealed_as_it_goes_then_silent_and_the_next_talkspurt_plays_on_time() {
        let mut s = Script::new(0, 0);
        s.arrive(0, 0);
        let mut played = Vec::new();
        while let Some(deadline) = s.buffer.deadline()
            && deadline < s.at(300)
        {
            played.extend(s.drain(deadline));
        }
        let conceal = Playout::Conceal { samples: 960 };
        let silence = Playout::Silence { samples: 960 };
        assert_eq!(played[..5], vec![conceal; 5][..]);
        assert!(played[5..].iter().all(|p| *p == silence), "{played:?}");
        // Played up to 260 ms, the last piece at 300 ms; the talkspurt from 260 ms plays whole.
        assert_eq!(played.len(), 12);
        let now = s.at(300);
        s.buffer.push(
            RtpAudio {
                sequence_number: 1,
                timestamp: 260 * 48,
                samples: 960,
                payload: vec![1],
            },
            now,
        );
        assert_eq!(s.drain(now), vec![packet(1)]);
        assert_eq!(
            s.buffer.stats().concealed,
            0,
            "the sender was quiet, nothing was lost"
        );
    }

    #[test]
    fn a_sender_that_pauses_without_moving_its_clock_on_is_heard_whole_when_it_resumes() {
        let mut s = Script::new(0, 0);
        for n in 0..10 {
            s.arrive(n, 0);
        }
        // A second of nothing, played as concealment and then silence.
        let mut played = Vec::new();
        while let Some(deadline) = s.buffer.deadline()
            && deadline < s.at(1_200)
        {
            played.extend(s.drain(deadline));
        }
        assert!(played.len() > MAX_CONCEALED_RUN as usize, "{played:?}");
        // Then packets 10 to 59 with the timestamps they would have had without the pause.
        for n in 10..60u16 {
            let now = s.at(1_200 + u64::from(n - 10) * 20);
            s.buffer.push(s.packet(n), now);
            assert_eq!(s.drain(now), vec![packet(n as u8)], "packet {n}");
        }
        let stats = s.buffer.stats();
        assert_eq!(
            (stats.late, stats.lost, stats.concealed),
            (0, 0, 0),
            "{stats:?}"
        );
        assert_eq!(s.buffer.depth(), MIN_DEPTH, "the pause is not jitter");
    }

    #[test]
    fn a_talkspurt_after_a_short_pause_is_preceded_by_silence_of_the_pause() {
        let mut s = Script::new(0, 0);
        s.arrive(0, 0);
        // 10 ms after packet 0's end, earlier than any deadline.
        let now = s.at(30);
        s.buffer.push(
            RtpAudio {
                sequence_number: 1,
                timestamp: 30 * 48,
                samples: 960,
                payload: vec![1],
            },
            now,
        );
        assert_eq!(
            s.drain(now),
            vec![Playout::Silence { samples: 480 }, packet(1)]
        );
    }

    #[test]
    fn a_stalled_stream_moves_on_at_the_deadline_and_a_packet_half_played_is_trimmed() {
        let mut s = Script::new(0, 0);
        s.arrive(0, 0);
        assert_eq!(s.drain(s.at(59)), vec![]);
        assert_eq!(s.drain(s.at(60)), vec![Playout::Conceal { samples: 960 }]);
        // Packet 1 comes with its 20 ms played: late, dropped. Packet 2 overlaps nothing.
        assert_eq!(s.arrive(1, 45), vec![]);
        assert_eq!(s.arrive(2, 30), vec![packet(2)]);
        assert_eq!(s.buffer.stats().late, 1);
        // A packet half covered by concealment plays its second half.
        let mut s = Script::new(0, 0);
        s.arrive(0, 0);
        s.drain(s.at(60));
        let now = s.at(65);
        s.buffer.push(
            RtpAudio {
                sequence_number: 1,
                timestamp: 10 * 48,
                samples: 1920,
                payload: vec![9],
            },
            now,
        );
        assert_eq!(
            s.drain(now),
            vec![Playout::Packet {
                payload: vec![9],
                trim: 30 * 48
            }]
        );
    }

    #[test]
    fn the_depth_follows_the_jitter_within_its_bounds() {
        let mut s = Script::new(0, 0);
        for n in 0..200u16 {
            // 0 to 30 ms late, in a fixed pattern.
            s.arrive(n, u64::from(n * 7 % 31));
        }
        let stats = s.buffer.stats();
        assert!(
            (0.005..0.02).contains(&stats.jitter),
            "30 ms of jitter: {stats:?}"
        );
        assert!(
            s.buffer.depth() > MIN_DEPTH && s.buffer.depth() <= MAX_DEPTH,
            "{:?}",
            s.buffer.depth()
        );
        assert_eq!(stats.lost + stats.late, 0, "{stats:?}");
    }

    #[test]
    fn sequence_and_timestamp_wrap_around() {
        assert_eq!(unwrap(65_535 + 65_536, 0, 16), 2 * 65_536);
        assert_eq!(unwrap(2 * 65_536, 65_535, 16), 65_536 + 65_535);
        assert_eq!(unwrap(5 + 65_536, 3, 16), 3 + 65_536);
    }
}
