//! RTP for a telephone call (RFC 3550): reading the caller's packets, writing the bot's, and
//! the keys of RFC 4733 telephone-events, each heard once however often its packets repeat.

use super::SipError;

/// One RTP packet, read.
#[derive(Debug, Clone, PartialEq)]
pub struct Packet<'a> {
    /// The payload type.
    pub payload_type: u8,
    /// The marker bit (the first packet of a talkspurt, or of an event).
    pub marker: bool,
    /// The sequence number.
    pub sequence: u16,
    /// The media clock at the payload's first sample.
    pub timestamp: u32,
    /// The sender's source.
    pub ssrc: u32,
    /// The payload, without padding.
    pub payload: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Reads a packet: version 2, its CSRCs, extension and padding skipped.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, SipError> {
        let bad = |why: &str| Err(SipError::BadRtp(why.into()));
        if bytes.len() < 12 {
            return bad("shorter than an RTP header");
        }
        if bytes[0] >> 6 != 2 {
            return bad("not RTP version 2");
        }
        let padded = bytes[0] & 0x20 != 0;
        let extended = bytes[0] & 0x10 != 0;
        let csrcs = usize::from(bytes[0] & 0x0f);
        let mut start = 12 + 4 * csrcs;
        if extended {
            let Some(header) = bytes.get(start..start + 4) else {
                return bad("an extension past the packet");
            };
            start += 4 + 4 * usize::from(u16::from_be_bytes([header[2], header[3]]));
        }
        let mut end = bytes.len();
        if padded {
            let pad = usize::from(bytes[end - 1]);
            if pad == 0 || pad > end {
                return bad("bad padding");
            }
            end -= pad;
        }
        if start > end {
            return bad("the header runs past the payload");
        }
        Ok(Self {
            payload_type: bytes[1] & 0x7f,
            marker: bytes[1] & 0x80 != 0,
            sequence: u16::from_be_bytes([bytes[2], bytes[3]]),
            timestamp: u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            ssrc: u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
            payload: &bytes[start..end],
        })
    }
}

/// Writes one stream's packets: its source, sequence and clock.
#[derive(Debug)]
pub struct Sender {
    ssrc: u32,
    sequence: u16,
    timestamp: u32,
    payload_type: u8,
    /// The next packet starts a talkspurt.
    marker: bool,
}

impl Sender {
    /// A stream of `payload_type` from `ssrc`, its sequence and clock starting at `start`
    /// (random, as RFC 3550 asks).
    pub fn new(payload_type: u8, ssrc: u32, start: u32) -> Self {
        Self {
            ssrc,
            sequence: start as u16,
            timestamp: start,
            payload_type,
            marker: true,
        }
    }

    /// The next packet, holding `payload` of `samples` samples.
    pub fn packet(&mut self, payload: &[u8], samples: u32) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(12 + payload.len());
        bytes.push(0x80);
        bytes.push(self.payload_type | if self.marker { 0x80 } else { 0 });
        bytes.extend_from_slice(&self.sequence.to_be_bytes());
        bytes.extend_from_slice(&self.timestamp.to_be_bytes());
        bytes.extend_from_slice(&self.ssrc.to_be_bytes());
        bytes.extend_from_slice(payload);
        self.sequence = self.sequence.wrapping_add(1);
        self.timestamp = self.timestamp.wrapping_add(samples);
        self.marker = false;
        bytes
    }

    /// RFC 4733 packets pressing `keys` as telephone-events of payload type `events`, to send
    /// one every 20 ms: each key held [`KEY_SAMPLES`], its end sent three times, the next key
    /// [`KEY_GAP_SAMPLES`] after. Durations count ticks of the events' clock, `clocks.0`; the
    /// stream's own clock, `clocks.1` (48 kHz on Opus), moves on past them. Keys that are not
    /// keypad keys are skipped.
    pub fn keys(&mut self, events: u8, clocks: (u32, u32), keys: &str) -> Vec<Vec<u8>> {
        let (events_clock, clock) = clocks;
        let in_events = |ticks: u32| ticks * (events_clock / CLOCK);
        let mut packets = Vec::new();
        for key in keys.chars() {
            let Some(event) = event_code(key) else {
                continue;
            };
            let start = self.timestamp;
            let mut duration = 0u32;
            let mut first = true;
            while duration < in_events(KEY_SAMPLES) {
                duration += in_events(PACKET_SAMPLES);
                packets.push(self.event(events, start, [event, VOLUME, 0, 0], duration, first));
                first = false;
            }
            for _ in 0..3 {
                let end = [event, 0x80 | VOLUME, 0, 0];
                packets.push(self.event(events, start, end, duration, false));
            }
            self.timestamp = start.wrapping_add((KEY_SAMPLES + KEY_GAP_SAMPLES) * (clock / CLOCK));
        }
        self.marker = true;
        packets
    }

    fn event(
        &mut self,
        events: u8,
        timestamp: u32,
        mut payload: [u8; 4],
        duration: u32,
        marker: bool,
    ) -> Vec<u8> {
        payload[2..].copy_from_slice(&(duration as u16).to_be_bytes());
        let mut bytes = Vec::with_capacity(16);
        bytes.push(0x80);
        bytes.push(events | if marker { 0x80 } else { 0 });
        bytes.extend_from_slice(&self.sequence.to_be_bytes());
        bytes.extend_from_slice(&timestamp.to_be_bytes());
        bytes.extend_from_slice(&self.ssrc.to_be_bytes());
        bytes.extend_from_slice(&payload);
        self.sequence = self.sequence.wrapping_add(1);
        bytes
    }

    /// The sender paused (the bot stopped speaking): the clock moves on by `samples`, and the
    /// next packet is marked as a talkspurt's first.
    pub fn pause(&mut self, samples: u32) {
        self.timestamp = self.timestamp.wrapping_add(samples);
        self.marker = true;
    }
}

/// The clock the lengths below count: 8 kHz.
const CLOCK: u32 = 8_000;
/// How long a key voxide presses is held: 100 ms at 8 kHz.
pub const KEY_SAMPLES: u32 = 800;
/// The silence after a key voxide presses: 60 ms.
pub const KEY_GAP_SAMPLES: u32 = 480;
/// The samples of a packet's 20 ms.
const PACKET_SAMPLES: u32 = 160;
/// The events' volume: -10 dBm0.
const VOLUME: u8 = 10;

/// A keypad key's RFC 4733 event code.
fn event_code(key: char) -> Option<u8> {
    match key {
        '0'..='9' => Some(key as u8 - b'0'),
        '*' => Some(10),
        '#' => Some(11),
        _ => None,
    }
}

/// RFC 4733 keys: an event is repeated in several packets (and its end three times); it is
/// heard once, at its first packet.
#[derive(Debug, Default)]
pub struct Keys {
    /// The timestamp of the last event heard: its packets all carry it.
    last: Option<u32>,
}

impl Keys {
    /// The key a telephone-event packet starts, if it starts one.
    pub fn take(&mut self, packet: &Packet<'_>) -> Option<char> {
        let event = *packet.payload.first()?;
        if packet.payload.len() < 4 || self.last == Some(packet.timestamp) {
            return None;
        }
        self.last = Some(packet.timestamp);
        match event {
            0..=9 => char::from_digit(u32::from(event), 10),
            10 => Some('*'),
            11 => Some('#'),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_packet_reads_back_and_the_clock_moves_by_its_samples() {
        let mut sender = Sender::new(8, 0xdead_beef, 65_535);
        let first = sender.packet(&[0xd5; 160], 160);
        let second = sender.packet(&[0x55; 160], 160);
        let a = Packet::parse(&first).expect("first");
        let b = Packet::parse(&second).expect("second");
        assert_eq!((a.payload_type, a.marker, a.ssrc), (8, true, 0xdead_beef));
        assert_eq!((a.sequence, b.sequence), (65_535, 0));
        assert_eq!(b.timestamp.wrapping_sub(a.timestamp), 160);
        assert!(!b.marker);
        assert_eq!(b.payload, &[0x55; 160][..]);
        sender.pause(800);
        let third = sender.packet(&[0; 160], 160);
        let c = Packet::parse(&third).expect("third");
        assert!(c.marker);
        assert_eq!(c.timestamp.wrapping_sub(b.timestamp), 960);
    }

    #[test]
    fn csrcs_extensions_and_padding_are_skipped_and_bad_packets_refused() {
        let mut bytes = vec![0xb1, 0x00, 0, 1, 0, 0, 0, 160, 0, 0, 0, 9];
        bytes.extend_from_slice(&[1, 2, 3, 4]); // one CSRC
        bytes.extend_from_slice(&[0xbe, 0xde, 0, 1, 9, 9, 9, 9]); // a one-word extension
        bytes.extend_from_slice(&[7, 7, 0, 2]); // payload, then two bytes of padding
        let packet = Packet::parse(&bytes).expect("packet");
        assert_eq!(packet.payload, &[7, 7][..]);
        for bad in [
            &[0x80u8; 11][..],
            &[0x40; 12],
            &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert!(Packet::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_key_repeated_over_its_packets_is_heard_once() {
        let event = |ts: u32, key: u8, end: bool| {
            let mut bytes = vec![0x80, 101, 0, 0];
            bytes.extend_from_slice(&ts.to_be_bytes());
            bytes.extend_from_slice(&[0, 0, 0, 1, key, if end { 0x8a } else { 0x0a }, 0, 160]);
            bytes
        };
        let mut keys = Keys::default();
        let heard: Vec<char> = [
            event(8_000, 1, false),
            event(8_000, 1, false),
            event(8_000, 1, true),
            event(8_000, 1, true),
            event(9_600, 11, false),
            event(11_200, 14, false),
        ]
        .iter()
        .filter_map(|bytes| keys.take(&Packet::parse(bytes).expect("event")))
        .collect();
        assert_eq!(heard, ['1', '#']);
    }

    #[test]
    fn keys_pressed_are_heard_back_once_each_in_order_and_the_audio_resumes_past_them() {
        let mut sender = Sender::new(0, 7, 1_000);
        let packets = sender.keys(101, (8_000, 8_000), "1*9#x");
        // Five packets a key as it is held, three ends; the stray `x` is skipped.
        assert_eq!(packets.len(), 4 * 8);
        let mut keys = Keys::default();
        let heard: String = packets
            .iter()
            .filter_map(|bytes| keys.take(&Packet::parse(bytes).expect("event")))
            .collect();
        assert_eq!(heard, "1*9#");
        let first = Packet::parse(&packets[0]).expect("first");
        let end = Packet::parse(&packets[7]).expect("an end");
        assert!(first.marker && !end.marker);
        assert_eq!((first.payload_type, end.payload_type), (101, 101));
        assert_eq!(
            end.payload,
            &[1, 0x8a, 0x03, 0x20][..],
            "the end, 800 samples long"
        );
        let sequences: Vec<u16> = packets
            .iter()
            .map(|b| Packet::parse(b).expect("packet").sequence)
            .collect();
        assert!(sequences.windows(2).all(|w| w[1] == w[0].wrapping_add(1)));
        let audio = sender.packet(&[0; 160], 160);
        let audio = Packet::parse(&audio).expect("audio");
        assert_eq!(audio.timestamp, 1_000 + 4 * (KEY_SAMPLES + KEY_GAP_SAMPLES));
        assert!(audio.marker, "a new talkspurt");
    }

    #[test]
    fn keys_on_an_opus_call_last_as_long_on_their_own_clock_and_move_the_48_khz_stream_on() {
        let mut sender = Sender::new(96, 7, 1_000);
        let on_8k = sender.keys(101, (8_000, 48_000), "5");
        let end = Packet::parse(&on_8k[7]).expect("an end");
        assert_eq!(end.payload[2..], 800u16.to_be_bytes(), "100 ms at 8 kHz");
        let on_48k = sender.keys(102, (48_000, 48_000), "5");
        let start = Packet::parse(&on_48k[0]).expect("a start");
        let end = Packet::parse(&on_48k[7]).expect("an end");
        assert_eq!(end.payload[2..], 4_800u16.to_be_bytes(), "100 ms at 48 kHz");
        assert_eq!(start.timestamp, 1_000 + 6 * (KEY_SAMPLES + KEY_GAP_SAMPLES));
        let audio = sender.packet(&[0; 40], 960);
        let audio = Packet::parse(&audio).expect("audio");
        assert_eq!(
            audio.timestamp,
            1_000 + 12 * (KEY_SAMPLES + KEY_GAP_SAMPLES)
        );
    }
}
