//! RTP payloads for redundant audio data (RED, RFC 2198), sans-IO: a packet that carries, beside
//! its own audio (the primary), copies of the audio sent just before it. Chrome sends Opus this
//! way when the answer puts `red/48000/2` first (one earlier packet per packet), so a packet the
//! network lost arrives again inside the next one.
//!
//! ```text
//! |F|  block PT (7) |  timestamp offset (14)  | block length (10) |   F = 1: one per earlier block
//! |0|  block PT (7) |                                               the primary's header, last
//! earlier blocks' data, in the headers' order, then the primary's
//! ```

use std::collections::VecDeque;

/// The most earlier blocks one packet may carry (libwebrtc's limit, too).
pub const MAX_EARLIER: usize = 32;
/// The longest earlier block the format can say (10 bits).
const MAX_BLOCK: usize = 0x3ff;
/// The largest timestamp offset the format can say (14 bits).
const MAX_OFFSET: u32 = 0x3fff;

/// One block of audio: a payload of one codec, at one RTP timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block<'a> {
    /// Its codec's payload type.
    pub payload_type: u8,
    /// Its RTP timestamp.
    pub timestamp: u32,
    /// The codec's payload.
    pub payload: &'a [u8],
}

/// A RED packet, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redundant<'a> {
    /// Copies of earlier audio, the oldest first.
    pub earlier: Vec<Block<'a>>,
    /// The packet's own audio.
    pub primary: Block<'a>,
}

/// Why a payload is not RED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RedError {
    /// The headers or the blocks they announce run past the payload's end.
    #[error("the RED payload ends inside its headers or blocks")]
    Truncated,
    /// More earlier blocks than [`MAX_EARLIER`].
    #[error("the RED payload announces more than {MAX_EARLIER} earlier blocks")]
    TooManyBlocks,
}

/// Takes apart the payload of a RED packet sent at `timestamp`.
pub fn parse(timestamp: u32, payload: &[u8]) -> Result<Redundant<'_>, RedError> {
    let mut headers = Vec::new();
    let mut at = 0;
    let primary_type = loop {
        let first = *payload.get(at).ok_or(RedError::Truncated)?;
        if first & 0x80 == 0 {
            at += 1;
            break first & 0x7f;
        }
        let header = payload.get(at..at + 4).ok_or(RedError::Truncated)?;
        if headers.len() == MAX_EARLIER {
            return Err(RedError::TooManyBlocks);
        }
        let offset = (u32::from(header[1]) << 6) | u32::from(header[2] >> 2);
        let length = (usize::from(header[2] & 0x03) << 8) | usize::from(header[3]);
        headers.push((first & 0x7f, offset, length));
        at += 4;
    };
    let mut earlier = Vec::with_capacity(headers.len());
    for (payload_type, offset, length) in headers {
        let block = payload.get(at..at + length).ok_or(RedError::Truncated)?;
        at += length;
        earlier.push(Block {
            payload_type,
            timestamp: timestamp.wrapping_sub(offset),
            payload: block,
        });
    }
    Ok(Redundant {
        earlier,
        primary: Block {
            payload_type: primary_type,
            timestamp,
            payload: &payload[at..],
        },
    })
}

/// Writes a RED payload for a packet sent at `primary.timestamp`: the `earlier` blocks (oldest
/// first) that the format can carry, then the primary. An earlier block longer than 1,023 bytes,
/// more than 16,383 ticks old or not older than the primary is left out.
pub fn write(primary: Block<'_>, earlier: &[Block<'_>], out: &mut Vec<u8>) {
    out.clear();
    let carried: Vec<(u32, &Block<'_>)> = earlier
        .iter()
        .filter_map(|block| {
            let offset = primary.timestamp.wrapping_sub(block.timestamp);
            (offset > 0 && offset <= MAX_OFFSET && block.payload.len() <= MAX_BLOCK)
                .then_some((offset, block))
        })
        .take(MAX_EARLIER)
        .collect();
    for (offset, block) in &carried {
        let length = block.payload.len();
        out.push(0x80 | (block.payload_type & 0x7f));
        out.push((offset >> 6) as u8);
        out.push((((offset & 0x3f) << 2) as u8) | (length >> 8) as u8);
        out.push(length as u8);
    }
    out.push(primary.payload_type & 0x7f);
    for (_, block) in &carried {
        out.extend_from_slice(block.payload);
    }
    out.extend_from_slice(primary.payload);
}

/// The sending side of one stream: each frame goes out with copies of the frames sent before
/// it (those the format can still say: a talkspurt's first frame carries none of the last one's).
#[derive(Debug, Default)]
pub struct Sender {
    /// Copies of earlier frames in each packet.
    copies: usize,
    /// The last frames sent, the oldest first, with their timestamps.
    earlier: VecDeque<(u32, Vec<u8>)>,
    /// The packet being written.
    packet: Vec<u8>,
}

impl Sender {
    /// A stream whose packets carry `copies` earlier frames each (at most [`MAX_EARLIER`]).
    pub fn new(copies: usize) -> Self {
        Self {
            copies: copies.min(MAX_EARLIER),
            ..Self::default()
        }
    }

    /// Carries `copies` earlier frames from the next packet on.
    pub fn set_copies(&mut self, copies: usize) {
        self.copies = copies.min(MAX_EARLIER);
    }

    /// Copies of earlier frames each packet carries now.
    pub fn copies(&self) -> usize {
        self.copies
    }

    /// The RED payload for `frame`, of payload type `payload_type`, sent at `timestamp`.
    pub fn wrap(&mut self, payload_type: u8, timestamp: u32, frame: &[u8]) -> &[u8] {
        while self.earlier.len() > self.copies {
            self.earlier.pop_front();
        }
        let earlier: Vec<Block<'_>> = self
            .earlier
            .iter()
            .map(|(timestamp, payload)| Block {
                payload_type,
                timestamp: *timestamp,
                payload,
            })
            .collect();
        let primary = Block {
            payload_type,
            timestamp,
            payload: frame,
        };
        write(primary, &earlier, &mut self.packet);
        if self.copies > 0 {
            if self.earlier.len() == self.copies {
                self.earlier.pop_front();
            }
            self.earlier.push_back((timestamp, frame.to_vec()));
        }
        &self.packet
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_with_two_earlier_blocks_comes_apart_as_it_was_written() {
        let (a, b, c) = (vec![1u8; 40], vec![2u8; 700], vec![3u8; 90]);
        let earlier = [
            Block {
                payload_type: 111,
                timestamp: 1_000,
                payload: &a,
            },
            Block {
                payload_type: 111,
                timestamp: 1_960,
                payload: &b,
            },
        ];
        let primary = Block {
            payload_type: 111,
            timestamp: 2_920,
            payload: &c,
        };
        let mut out = Vec::new();
        write(primary, &earlier, &mut out);
        assert_eq!(out.len(), 4 + 4 + 1 + 40 + 700 + 90);
        let parsed = parse(2_920, &out).expect("RED");
        assert_eq!(parsed.earlier, earlier);
        assert_eq!(parsed.primary, primary);
    }

    #[test]
    fn chromes_header_for_one_earlier_opus_packet_reads_as_rfc_2198_says() {
        // F=1, PT 111; offset 960; length 3; then F=0, PT 111.
        let payload = [0xef, 0x0f, 0x00, 0x03, 0x6f, 7, 8, 9, 10, 11];
        let parsed = parse(5_000, &payload).expect("RED");
        assert_eq!(
            parsed.earlier,
            vec![Block {
                payload_type: 111,
                timestamp: 4_040,
                payload: &[7, 8, 9],
            }]
        );
        assert_eq!(parsed.primary.payload, &[10, 11]);
        // No earlier block at all: the primary's one-byte header.
        let alone = parse(5_000, &[0x6f, 1, 2]).expect("RED");
        assert!(alone.earlier.is_empty());
        assert_eq!(alone.primary.payload, &[1, 2]);
    }

    #[test]
    fn a_payload_that_runs_out_or_announces_too_many_blocks_is_refused() {
        assert_eq!(parse(0, &[]), Err(RedError::Truncated));
        assert_eq!(parse(0, &[0xef, 0x0f]), Err(RedError::Truncated));
        // A block of 3 bytes announced, 2 there.
        assert_eq!(
            parse(0, &[0xef, 0x0f, 0x00, 0x03, 0x6f, 1, 2]),
            Err(RedError::Truncated)
        );
        let many: Vec<u8> = std::iter::repeat_n([0xef, 0, 0, 0], MAX_EARLIER + 1)
            .flatten()
            .chain([0x6f])
            .collect();
        assert_eq!(parse(0, &many), Err(RedError::TooManyBlocks));
    }

    #[test]
    fn a_sender_carries_the_frames_before_within_a_talkspurt_and_as_many_as_it_is_told() {
        let mut sender = Sender::new(1);
        let first = sender.wrap(111, 0, &[1]).to_vec();
        assert!(parse(0, &first).expect("RED").earlier.is_empty());
        let second = sender.wrap(111, 960, &[2]).to_vec();
        let parsed = parse(960, &second).expect("RED");
        assert_eq!(parsed.earlier.len(), 1);
        assert_eq!(
            (parsed.earlier[0].timestamp, parsed.earlier[0].payload),
            (0, &[1u8][..])
        );
        // After a second of quiet the last talkspurt's frames are too old to say.
        let next = sender.wrap(111, 960 + 48_000, &[3]).to_vec();
        assert!(parse(960 + 48_000, &next).expect("RED").earlier.is_empty());
        sender.set_copies(2);
        sender.wrap(111, 49_920, &[4]);
        let fifth = sender.wrap(111, 50_880, &[5]).to_vec();
        let parsed = parse(50_880, &fifth).expect("RED");
        let carried: Vec<&[u8]> = parsed.earlier.iter().map(|b| b.payload).collect();
        assert_eq!(carried, [&[3u8][..], &[4u8][..]]);
        sender.set_copies(0);
        let plain = sender.wrap(111, 51_840, &[6]).to_vec();
        assert_eq!(plain, [111, 6], "the primary's header alone");
    }

    #[test]
    fn blocks_the_format_cannot_say_are_left_out() {
        let (long, short, primary) = (vec![0u8; 1_024], vec![1u8; 5], vec![2u8; 5]);
        let earlier = [
            Block {
                payload_type: 111,
                timestamp: 0,
                payload: &short,
            },
            Block {
                payload_type: 111,
                timestamp: 90_000,
                payload: &long,
            },
            Block {
                payload_type: 111,
                timestamp: 99_040,
                payload: &short,
            },
        ];
        let mut out = Vec::new();
        write(
            Block {
                payload_type: 111,
                timestamp: 100_000,
                payload: &primary,
            },
            &earlier,
            &mut out,
        );
        let parsed = parse(100_000, &out).expect("RED");
        assert_eq!(parsed.earlier.len(), 1, "too old and too long left out");
        assert_eq!(parsed.earlier[0].timestamp, 99_040);
    }
}
