//! The bot's audio on a telephone stream (a SIP call's RTP): PCM at the codec's rate to its
//! bytes, one byte a tick of the 8 kHz RTP clock in every codec here.

use super::sip::sdp::Codec;
use crate::audio::g722::G722Encoder;
use crate::audio::{alaw, mulaw};

/// Encodes a call's outgoing audio; G.722 keeps its state from packet to packet.
#[derive(Debug, Clone)]
pub enum PhoneEncoder {
    /// G.711 μ-law, a byte a sample.
    Pcmu,
    /// G.711 A-law, a byte a sample.
    Pcma,
    /// G.722, a byte two samples.
    G722(Box<G722Encoder>),
}

impl PhoneEncoder {
    /// An encoder at the start of a stream in `codec`.
    pub fn new(codec: Codec) -> Self {
        match codec {
            Codec::Pcmu => Self::Pcmu,
            Codec::Pcma => Self::Pcma,
            Codec::G722 => Self::G722(Box::default()),
        }
    }

    /// The bytes of `samples` (at the codec's rate).
    pub fn encode(&mut self, samples: &[i16]) -> Vec<u8> {
        match self {
            Self::Pcmu => samples.iter().map(|s| mulaw::encode(*s)).collect(),
            Self::Pcma => samples.iter().map(|s| alaw::encode(*s)).collect(),
            Self::G722(encoder) => encoder.encode(samples),
        }
    }
}
