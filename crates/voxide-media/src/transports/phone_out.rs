//! The bot's audio on a telephone stream (a SIP call's RTP): PCM at the codec's rate to its
//! bytes, a packet's 20 ms at a time.

use super::sip::sdp::Codec;
use crate::audio::g722::G722Encoder;
use crate::audio::{alaw, mulaw};

/// The most bytes an Opus packet of voxide's takes: far above what 20 ms of wideband speech
/// needs (about 60 bytes at 24 kb/s).
const OPUS_MAX_PACKET: usize = 1_275;

/// Encodes a call's outgoing audio; G.722 and Opus keep their state from packet to packet.
pub enum PhoneEncoder {
    /// G.711 μ-law, a byte a sample.
    Pcmu,
    /// G.711 A-law, a byte a sample.
    Pcma,
    /// G.722, a byte two samples.
    G722(Box<G722Encoder>),
    /// Opus in wideband, with in-band FEC so that the caller's decoder can rebuild a lost
    /// packet from the next.
    Opus(Box<opus::Encoder>),
}

impl PhoneEncoder {
    /// An encoder at the start of a stream in `codec`.
    pub fn new(codec: Codec) -> Self {
        match codec {
            Codec::Pcmu => Self::Pcmu,
            Codec::Pcma => Self::Pcma,
            Codec::G722 => Self::G722(Box::default()),
            Codec::Opus => {
                let mut encoder =
                    opus::Encoder::new(codec.rate(), opus::Channels::Mono, opus::Application::Voip)
                        .expect("16 kHz mono is an Opus encoder's setting");
                // Both are settings every encoder takes; a refusal would leave Opus's defaults.
                let _ = encoder.set_inband_fec(true);
                let _ = encoder.set_packet_loss_perc(EXPECTED_LOSS);
                Self::Opus(Box::new(encoder))
            }
        }
    }

    /// The bytes of `samples` (at the codec's rate; for Opus one packet's 20 ms). Opus refuses
    /// only a length it has no frame for, and then nothing is sent.
    pub fn encode(&mut self, samples: &[i16]) -> Vec<u8> {
        match self {
            Self::Pcmu => samples.iter().map(|s| mulaw::encode(*s)).collect(),
            Self::Pcma => samples.iter().map(|s| alaw::encode(*s)).collect(),
            Self::G722(encoder) => encoder.encode(samples),
            Self::Opus(encoder) => encoder.encode_vec(samples, OPUS_MAX_PACKET).unwrap_or_else(
                |e| {
                    tracing::debug!(error = %e, samples = samples.len(), "Opus refused a frame");
                    Vec::new()
                },
            ),
        }
    }
}

/// The loss Opus's FEC is sized for on a call: a telephone network reports none back to
/// voxide (no RTCP is read), so a typical mobile line's.
const EXPECTED_LOSS: i32 = 5;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transports::phone_in::PhoneInput;
    use std::time::{Duration, Instant};

    #[test]
    fn opus_packets_of_the_bot_decode_back_to_its_voice_on_a_48_khz_clock() {
        let mut encoder = PhoneEncoder::new(Codec::Opus);
        let mut input = PhoneInput::new(Codec::Opus);
        let start = Instant::now();
        let tone: Vec<i16> = (0..16_000)
            .map(|i| ((i as f32 * 440.0 * std::f32::consts::TAU / 16_000.0).sin() * 8_000.0) as i16)
            .collect();
        let mut heard = Vec::new();
        for (n, frame) in tone.chunks(320).enumerate() {
            let payload = encoder.encode(frame);
            assert!(
                !payload.is_empty() && payload.len() < 200,
                "{}",
                payload.len()
            );
            let at = start + Duration::from_millis(20 * n as u64);
            input.push(n as u16, n as u32 * 960, &payload, at);
            while let Some(piece) = input.pop(at) {
                heard.extend(piece.samples);
            }
        }
        assert_eq!(input.rate(), 16_000);
        assert!(heard.len() >= 15_000, "{}", heard.len());
        // Past the codec's start, the tone comes back at its level.
        let energy = |s: &[i16]| {
            (s.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / s.len() as f64).sqrt()
        };
        let level = energy(&heard[4_000..12_000]);
        assert!((4_000.0..7_000.0).contains(&level), "{level}");
        assert_eq!(input.stats().lost, 0);
    }
}
