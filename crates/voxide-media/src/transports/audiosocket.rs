//! Asterisk's AudioSocket (`AudioSocket(uuid,host:port)` in a dialplan, or the channel driver):
//! a call's audio over one TCP connection that Asterisk opens, sans-IO. Each message is a type
//! byte, a big-endian 16-bit length, and the payload: `0x00` hang-up, `0x01` the call's UUID
//! (16 bytes), `0x03` a key (one ASCII byte), `0x10` to `0x16` 16-bit little-endian mono PCM
//! at 8, 12, 16, 24, 32, 44.1 or 48 kHz, `0xff` an error (an optional code byte).

use super::socket::FramingError;

/// One AudioSocket message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// The call hung up (or is to be hung up).
    Hangup,
    /// The call's UUID: the first message.
    Uuid([u8; 16]),
    /// A key the caller pressed.
    Dtmf(char),
    /// Audio, mono, at a rate.
    Audio {
        /// The samples.
        samples: Vec<i16>,
        /// Their rate.
        sample_rate: u32,
    },
    /// Asterisk reports an error (its code, if it gave one).
    Error(Option<u8>),
}

/// The rates of the audio types, from `0x10` on.
const RATES: [u32; 7] = [8_000, 12_000, 16_000, 24_000, 32_000, 44_100, 48_000];
const AUDIO: u8 = 0x10;
/// Reads messages from the bytes as they come, in any pieces. What it holds between pushes is
/// at most one incomplete message: 3 + 65,535 bytes.
#[derive(Debug, Default)]
pub struct Reader {
    pending: Vec<u8>,
}

impl Reader {
    /// Takes `bytes`; returns the messages they complete. An unknown type is an error, and the
    /// connection should end: the stream cannot be trusted past it.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Message>, FramingError> {
        self.pending.extend_from_slice(bytes);
        let mut messages = Vec::new();
        let mut at = 0;
        while let Some(header) = self.pending.get(at..at + 3) {
            let kind = header[0];
            let length = usize::from(u16::from_be_bytes([header[1], header[2]]));
            let Some(payload) = self.pending.get(at + 3..at + 3 + length) else {
                break;
            };
            messages.push(message(kind, payload)?);
            at += 3 + length;
        }
        self.pending.drain(..at);
        Ok(messages)
    }
}

fn message(kind: u8, payload: &[u8]) -> Result<Message, FramingError> {
    match kind {
        0x00 => Ok(Message::Hangup),
        0x01 => payload
            .try_into()
            .map(Message::Uuid)
            .map_err(|_| FramingError::Malformed(format!("a UUID of {} bytes", payload.len()))),
        0x03 => match payload {
            [key] if super::dtmf::is_key(char::from(*key)) => Ok(Message::Dtmf(char::from(*key))),
            _ => Err(FramingError::Malformed(
                "a key must be one keypad character".into(),
            )),
        },
        AUDIO..=0x16 => {
            if !payload.len().is_multiple_of(2) {
                return Err(FramingError::OddAudio(payload.len()));
            }
            Ok(Message::Audio {
                samples: payload
                    .chunks_exact(2)
                    .map(|b| i16::from_le_bytes([b[0], b[1]]))
                    .collect(),
                sample_rate: RATES[usize::from(kind - AUDIO)],
            })
        }
        0xff => Ok(Message::Error(payload.first().copied())),
        other => Err(FramingError::Unknown(format!(
            "AudioSocket type {other:#04x}"
        ))),
    }
}

/// The audio type of `rate`, if AudioSocket has one.
pub fn audio_type(rate: u32) -> Option<u8> {
    RATES
        .iter()
        .position(|r| *r == rate)
        .map(|i| AUDIO + i as u8)
}

/// `samples` at `rate` as audio messages of at most 20 ms each, as Asterisk plays them.
pub fn audio(samples: &[i16], rate: u32) -> Vec<u8> {
    let Some(kind) = audio_type(rate) else {
        return Vec::new();
    };
    let per_message = (rate as usize / 50).max(1);
    let mut out = Vec::with_capacity(samples.len() * 2 + 3 * (samples.len() / per_message + 1));
    for chunk in samples.chunks(per_message) {
        out.push(kind);
        out.extend_from_slice(&((chunk.len() * 2) as u16).to_be_bytes());
        out.extend(chunk.iter().flat_map(|s| s.to_le_bytes()));
    }
    out
}

/// The hang-up message.
pub const HANGUP: [u8; 3] = [0, 0, 0];

/// A UUID as its standard text (`8-4-4-4-12` hex digits).
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_whole_from_pieces_of_any_size() {
        let mut bytes = vec![0x01, 0, 16];
        bytes.extend(1..=16u8);
        bytes.extend_from_slice(&[0x10, 0, 4, 0x02, 0x01, 0xff, 0xff]);
        bytes.extend_from_slice(&[0x03, 0, 1, b'#']);
        bytes.extend_from_slice(&[0x12, 0, 2, 5, 0]);
        bytes.extend_from_slice(&[0xff, 0, 1, 4]);
        bytes.extend_from_slice(&HANGUP);
        for piece in [1, 2, 3, 5, 7, 64] {
            let mut reader = Reader::default();
            let messages: Vec<Message> = bytes
                .chunks(piece)
                .flat_map(|c| reader.push(c).expect("readable"))
                .collect();
            let mut uuid = [0u8; 16];
            uuid.iter_mut().zip(1..).for_each(|(b, n)| *b = n);
            assert_eq!(
                messages,
                [
                    Message::Uuid(uuid),
                    Message::Audio {
                        samples: vec![0x0102, -1],
                        sample_rate: 8_000
                    },
                    Message::Dtmf('#'),
                    Message::Audio {
                        samples: vec![5],
                        sample_rate: 16_000
                    },
                    Message::Error(Some(4)),
                    Message::Hangup,
                ],
                "in pieces of {piece}"
            );
        }
    }

    #[test]
    fn the_bots_audio_goes_out_20_ms_a_message_at_its_rate() {
        let bytes = audio(&[7; 400], 16_000);
        let mut reader = Reader::default();
        let messages = reader.push(&bytes).expect("readable");
        assert_eq!(messages.len(), 2);
        assert!(
            matches!(&messages[0], Message::Audio { samples, sample_rate: 16_000 } if samples.len() == 320)
        );
        assert!(matches!(&messages[1], Message::Audio { samples, .. } if samples.len() == 80));
        assert!(audio(&[7; 10], 11_025).is_empty());
    }

    #[test]
    fn what_is_not_audiosocket_is_refused() {
        for bad in [
            &[0x01u8, 0, 2, 1, 2][..],
            &[0x10, 0, 3, 1, 2, 3],
            &[0x03, 0, 1, b'x'],
            &[0x42, 0, 0],
        ] {
            assert!(Reader::default().push(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_uuid_reads_in_its_standard_form() {
        let uuid = [
            0x12, 0x3e, 0x45, 0x67, 0xe8, 0x9b, 0x12, 0xd3, 0xa4, 0x56, 0x42, 0x66, 0x14, 0x17,
            0x40, 0x00,
        ];
        assert_eq!(uuid_text(&uuid), "123e4567-e89b-12d3-a456-426614174000");
    }
}
