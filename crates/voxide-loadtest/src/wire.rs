//! The caller's audio as each protocol carries it: 20 ms frames of PCM, μ-law, G.722 or Opus,
//! encoded once for every session.

use crate::Protocol;
use crate::audio::g722::G722Encoder;
use crate::audio::mulaw;
use crate::audio::resample::StreamResampler;

/// Samples of one 20 ms frame at 16 kHz.
pub(super) const FRAME: usize = 320;

/// `samples` (mono 16 kHz) as the 20 ms frames `protocol` carries: PCM bytes, μ-law bytes for
/// Twilio and SIP, G.722 bytes for wideband SIP, Opus packets for WebRTC and SIP in Opus.
pub(super) fn encode(samples: &[i16], protocol: Protocol) -> Option<Vec<Vec<u8>>> {
    Some(match protocol {
        Protocol::Ws => samples
            .chunks(FRAME)
            .map(|c| {
                let mut frame: Vec<u8> = c.iter().flat_map(|s| s.to_le_bytes()).collect();
                frame.resize(FRAME * 2, 0);
                frame
            })
            .collect(),
        Protocol::WebRtc | Protocol::WebRtcStart | Protocol::SipOpus => opus_frames(samples)?,
        Protocol::SipWideband => {
            let mut encoder = quiet_g722();
            samples
                .chunks(FRAME)
                .map(|c| {
                    let mut frame = c.to_vec();
                    frame.resize(FRAME, 0);
                    encoder.encode(&frame)
                })
                .collect()
        }
        Protocol::Twilio | Protocol::Sip => {
            let narrow = StreamResampler::new(16_000, 8_000)
                .map(|mut r| r.process(samples))
                .unwrap_or_default();
            narrow
                .chunks(FRAME / 2)
                .map(|c| {
                    let mut frame: Vec<u8> = c.iter().map(|s| mulaw::encode(*s)).collect();
                    frame.resize(FRAME / 2, mulaw::encode(0));
                    frame
                })
                .collect()
        }
    })
}

/// A G.722 encoder as a caller's is after a pause: each turn is encoded on its own, once for
/// every session, from the state silence leaves, so that it follows the silence frames
/// ([`g722_silence`]) as one stream would.
fn quiet_g722() -> G722Encoder {
    let mut encoder = G722Encoder::new();
    encoder.encode(&[0; FRAME * 10]);
    encoder
}

/// One 20 ms frame of silence in G.722, as a caller's encoder sends it in a pause.
pub(super) fn g722_silence() -> Vec<u8> {
    quiet_g722().encode(&[0; FRAME])
}

/// Samples of one 20 ms Opus frame at 48 kHz.
pub(super) const OPUS_FRAME: usize = 960;

/// The loss the callers' encoders prepare for: a browser sizes its Opus in-band FEC from the
/// loss its receiver reports tell; the frames here are encoded once for every session, so
/// they carry FEC for a lossy path whatever the run's network.
const FEC_LOSS_PERCENT: i32 = 10;

/// `samples` (16 kHz mono) as 20 ms Opus packets at 48 kHz with in-band FEC, encoded once for
/// every session.
pub(super) fn opus_frames(samples: &[i16]) -> Option<Vec<Vec<u8>>> {
    let wide = StreamResampler::new(16_000, 48_000).ok()?.process(samples);
    let mut encoder =
        opus::Encoder::new(48_000, opus::Channels::Mono, opus::Application::Voip).ok()?;
    encoder.set_inband_fec(true).ok()?;
    encoder.set_packet_loss_perc(FEC_LOSS_PERCENT).ok()?;
    let mut packet = vec![0u8; 1500];
    wide.chunks(OPUS_FRAME)
        .map(|chunk| {
            let mut frame = chunk.to_vec();
            frame.resize(OPUS_FRAME, 0);
            let n = encoder.encode(&frame, &mut packet).ok()?;
            Some(packet[..n].to_vec())
        })
        .collect()
}

/// 20 ms of silence as an Opus packet.
pub(super) fn opus_silence() -> Vec<u8> {
    opus_frames(&[0; 320])
        .and_then(|frames| frames.into_iter().next())
        .unwrap_or_default()
}
