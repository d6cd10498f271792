//! One incoming Opus stream, from RTP packets to PCM: the [`JitterBuffer`] puts the packets in
//! order and says what to play; this decodes it, rebuilding a lost packet from the next one's
//! in-band FEC and concealing the rest with Opus's own loss concealment (RFC 6716 §4.4).

use std::time::Instant;

use super::jitter::{JitterBuffer, NetworkStats, Playout, RtpAudio};

/// Opus's RTP clock.
const CLOCK: u32 = 48_000;
/// The decoder conceals in steps of 2.5 ms, at the RTP clock.
const CONCEAL_STEP: u32 = CLOCK / 400;
/// The longest Opus packet, 120 ms, at the RTP clock.
const LONGEST: usize = 5_760;

/// A piece of the stream's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Mono samples at the stream's rate.
    pub samples: Vec<i16>,
    /// Whether it is the sender's audio (a packet, or one rebuilt from FEC), not made up for
    /// time nothing came for (concealment, silence).
    pub sent: bool,
}

/// An Opus stream decoded at `rate`.
pub struct OpusInput {
    buffer: JitterBuffer,
    decoder: opus::Decoder,
    rate: u32,
    pcm: Vec<i16>,
    /// Payloads that do not parse as Opus.
    damaged: u64,
}

impl OpusInput {
    /// A stream decoded to mono at `rate` (8, 12, 16, 24 or 48 kHz).
    pub fn new(rate: u32) -> Result<Self, opus::Error> {
        Ok(Self {
            buffer: JitterBuffer::new(),
            decoder: opus::Decoder::new(rate, opus::Channels::Mono)?,
            rate,
            pcm: vec![0; LONGEST],
            damaged: 0,
        })
    }

    /// Takes a packet that arrived at `now`. One whose payload is not Opus is counted and
    /// dropped: its time is concealed like a lost packet's.
    pub fn push(&mut self, sequence_number: u16, timestamp: u32, payload: &[u8], now: Instant) {
        if payload.is_empty() {
            return;
        }
        let samples = match opus::packet::get_nb_samples(payload, CLOCK) {
            Ok(n) if n > 0 && n <= LONGEST => n as u32,
            _ => {
                self.damaged += 1;
                return;
            }
        };
        let packet = RtpAudio {
            sequence_number,
            timestamp,
            samples,
            payload: payload.to_vec(),
        };
        self.buffer.push(packet, now);
    }

    /// The next piece of audio due at `now`, decoded; `None` until [`deadline`](Self::deadline)
    /// or the next packet.
    pub fn pop(&mut self, now: Instant) -> Option<Decoded> {
        let playout = self.buffer.pop(now)?;
        let sent = matches!(playout, Playout::Packet { .. } | Playout::Fec { .. });
        Some(Decoded {
            samples: self.decode(playout),
            sent,
        })
    }

    /// The rate of the audio [`pop`](Self::pop) returns.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// When a hole is given up for lost if nothing comes first.
    pub fn deadline(&self) -> Option<Instant> {
        self.buffer.deadline()
    }

    /// What the network did to the stream so far.
    pub fn stats(&self) -> NetworkStats {
        self.buffer.stats()
    }

    /// Payloads that were not Opus.
    pub fn damaged(&self) -> u64 {
        self.damaged
    }

    fn at_rate(&self, samples: u32) -> usize {
        (u64::from(samples) * u64::from(self.rate) / u64::from(CLOCK)) as usize
    }

    fn decode(&mut self, playout: Playout) -> Vec<i16> {
        match playout {
            Playout::Packet { payload, trim } => {
                let n = match self.decoder.decode(&payload, &mut self.pcm, false) {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::debug!(error = %e, "undecodable Opus packet; concealed");
                        let samples = opus::packet::get_nb_samples(&payload, CLOCK).unwrap_or(0);
                        return self.conceal(samples as u32);
                    }
                };
                let skip = self.at_rate(trim).min(n);
                self.pcm[skip..n].to_vec()
            }
            Playout::Fec { next, samples } => {
                let n = self.at_rate(samples).min(self.pcm.len());
                match self.decoder.decode(&next, &mut self.pcm[..n], true) {
                    Ok(n) => self.pcm[..n].to_vec(),
                    Err(_) => self.conceal(samples),
                }
            }
            Playout::Conceal { samples } => self.conceal(samples),
            Playout::Silence { samples } => vec![0; self.at_rate(samples)],
        }
    }

    /// `samples` concealed by the decoder, in its 2.5 ms steps; a remainder shorter than a
    /// step is silence.
    fn conceal(&mut self, samples: u32) -> Vec<i16> {
        let concealed = (samples / CONCEAL_STEP * CONCEAL_STEP).min(LONGEST as u32);
        let mut out = Vec::with_capacity(self.at_rate(samples));
        if concealed > 0 {
            let n = self.at_rate(concealed);
            if let Ok(n) = self.decoder.decode(&[], &mut self.pcm[..n], false) {
                out.extend_from_slice(&self.pcm[..n]);
            }
        }
        out.resize(self.at_rate(samples), 0);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A 440 Hz tone as 20 ms Opus packets at 48 kHz, with in-band FEC.
    fn tone_packets(count: usize) -> Vec<Vec<u8>> {
        let mut encoder = opus::Encoder::new(CLOCK, opus::Channels::Mono, opus::Application::Voip)
            .expect("an encoder");
        encoder.set_inband_fec(true).expect("FEC");
        encoder.set_packet_loss_perc(10).expect("a loss");
        let mut out = vec![0u8; 1500];
        (0..count)
            .map(|p| {
                let frame: Vec<i16> = (0..960)
                    .map(|i| {
                        let t = (p * 960 + i) as f32 / CLOCK as f32;
                        (8000.0 * (t * 440.0 * std::f32::consts::TAU).sin()) as i16
                    })
                    .collect();
                let n = encoder.encode(&frame, &mut out).expect("encoded");
                out[..n].to_vec()
            })
            .collect()
    }

    /// A tone whose pitch moves every 20 ms (as a voice's does), as Opus packets with FEC.
    fn gliding_packets(count: usize) -> Vec<Vec<u8>> {
        let mut encoder = opus::Encoder::new(CLOCK, opus::Channels::Mono, opus::Application::Voip)
            .expect("an encoder");
        encoder.set_inband_fec(true).expect("FEC");
        encoder.set_packet_loss_perc(20).expect("a loss");
        let mut out = vec![0u8; 1500];
        let mut phase = 0.0f32;
        (0..count)
            .map(|p| {
                let pitch = 180.0 + 70.0 * (p % 4) as f32;
                let frame: Vec<i16> = (0..960)
                    .map(|_| {
                        phase += pitch * std::f32::consts::TAU / CLOCK as f32;
                        (9000.0 * phase.sin()) as i16
                    })
                    .collect();
                let n = encoder.encode(&frame, &mut out).expect("encoded");
                out[..n].to_vec()
            })
            .collect()
    }

    /// The stream decoded at 16 kHz with the packets `lost` never arriving.
    fn decoded(packets: &[Vec<u8>], lost: &[usize]) -> Vec<i16> {
        let mut input = OpusInput::new(16_000).expect("a decoder");
        let start = Instant::now();
        let mut heard = Vec::new();
        for (n, packet) in packets.iter().enumerate() {
            if lost.contains(&n) {
                continue;
            }
            let now = start + Duration::from_millis(n as u64 * 20);
            input.push(n as u16, n as u32 * 960, packet, now);
            while let Some(piece) = input.pop(now) {
                heard.extend(piece.samples);
            }
        }
        heard
    }

    fn error(a: &[i16], b: &[i16]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
            .sum::<f64>()
            / a.len() as f64
    }

    #[test]
    fn a_lost_packet_rebuilt_from_fec_is_closer_to_what_was_said_than_concealment() {
        let packets = gliding_packets(40);
        let clean = decoded(&packets, &[]);
        // One packet lost, its successor here: FEC. Two in a row: the first is concealed.
        let with_fec = decoded(&packets, &[21]);
        let concealed = decoded(&packets, &[20, 21]);
        let frame = |audio: &[i16]| audio[20 * 320..21 * 320].to_vec();
        let slot = |audio: &[i16]| audio[21 * 320..22 * 320].to_vec();
        assert_eq!(with_fec.len(), clean.len());
        let fec_error = error(&slot(&with_fec), &slot(&clean));
        let plc_error = error(&frame(&concealed), &frame(&clean));
        assert!(
            fec_error * 4.0 < plc_error,
            "FEC {fec_error:.0}, concealment {plc_error:.0}"
        );
    }

    fn energy(samples: &[i16]) -> f64 {
        samples.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>() / samples.len() as f64
    }

    #[test]
    fn a_stream_with_a_lost_packet_and_a_stall_decodes_to_the_senders_length_with_the_hole_rebuilt()
    {
        let packets = tone_packets(30);
        let mut input = OpusInput::new(16_000).expect("a decoder");
        let start = Instant::now();
        let mut heard = Vec::new();
        let mut pieces = Vec::new();
        for (n, packet) in packets.iter().enumerate() {
            // Packet 10 is lost; 20 to 29 never come (the sender's network stalls).
            if n == 10 || n >= 20 {
                continue;
            }
            let now = start + Duration::from_millis(n as u64 * 20);
            input.push(1000 + n as u16, 5 + n as u32 * 960, packet, now);
            while let Some(piece) = input.pop(now) {
                pieces.push(piece.samples.len());
                heard.extend(piece.samples);
            }
        }
        // The stall is concealed as time passes: by 600 ms plus the depth, all 30 frames.
        let mut now = start;
        while let Some(deadline) = input.deadline()
            && deadline
                < start + Duration::from_millis(600) + Duration::from_secs_f64(input.stats().depth)
        {
            now = deadline;
            let piece = input.pop(now).expect("due");
            assert!(!piece.sent, "a stall is made up");
            heard.extend(piece.samples);
        }
        assert!(now > start);
        assert_eq!(heard.len(), 30 * 320, "{pieces:?}");
        let stats = input.stats();
        assert_eq!((stats.lost, stats.recovered), (1, 1), "{stats:?}");
        // The rebuilt frame carries the tone, not silence.
        let rebuilt = &heard[10 * 320..11 * 320];
        assert!(energy(rebuilt) > 0.25 * energy(&heard[8 * 320..10 * 320]));
    }

    #[test]
    fn a_payload_that_is_not_opus_is_counted_and_its_time_filled() {
        let packets = tone_packets(3);
        let mut input = OpusInput::new(16_000).expect("a decoder");
        let now = Instant::now();
        input.push(1, 0, &packets[0], now);
        // A TOC byte announcing an impossible frame count.
        input.push(2, 960, &[0x03, 0xff], now);
        input.push(3, 1920, &packets[2], now);
        let mut heard = Vec::new();
        let later = now + Duration::from_millis(50);
        while let Some(piece) = input.pop(later) {
            assert!(
                piece.sent,
                "a packet, or one rebuilt from the next one's FEC"
            );
            heard.extend(piece.samples);
        }
        assert_eq!(input.damaged(), 1);
        assert_eq!(input.stats().recovered, 1);
        assert_eq!(heard.len(), 3 * 320);
    }
}
