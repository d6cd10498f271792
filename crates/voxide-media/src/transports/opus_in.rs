//! One incoming Opus stream, from RTP packets to PCM: the [`JitterBuffer`] puts the packets in
//! order and says what to play; this decodes it, playing a lost packet from a later one's
//! redundant copy (RED, RFC 2198) or rebuilding it from the next one's in-band FEC, and
//! concealing the rest with Opus's own loss concealment (RFC 6716 §4.4).

use std::time::Instant;

use super::jitter::{JitterBuffer, NetworkStats, Playout, RtpAudio};
use super::red;

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
    /// Payloads that do not parse as Opus (or as RED).
    damaged: u64,
    /// Packets that came in RED.
    red: u64,
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
            red: 0,
        })
    }

    /// Takes a packet that arrived at `now`. One whose payload is not Opus is counted and
    /// dropped: its time is concealed like a lost packet's.
    pub fn push(&mut self, sequence_number: u16, timestamp: u32, payload: &[u8], now: Instant) {
        if payload.is_empty() {
            return;
        }
        let Some(samples) = self.samples(payload) else {
            return;
        };
        let packet = RtpAudio {
            sequence_number,
            timestamp,
            samples,
            payload: payload.to_vec(),
        };
        self.buffer.push(packet, now);
    }

    /// Takes a packet in RED (RFC 2198) that arrived at `now`, its blocks Opus of payload type
    /// `opus`: its own audio as [`push`](Self::push) takes it, the copies it carries kept for
    /// the holes they fill. A payload that is not RED, or whose own audio is not Opus, is counted
    /// and dropped; a copy in another codec is left out.
    pub fn push_red(
        &mut self,
        sequence_number: u16,
        timestamp: u32,
        payload: &[u8],
        opus: u8,
        now: Instant,
    ) {
        let Ok(packet) = red::parse(timestamp, payload) else {
            self.damaged += 1;
            return;
        };
        self.red += 1;
        if packet.primary.payload_type != opus {
            self.damaged += 1;
            return;
        }
        self.push(sequence_number, timestamp, packet.primary.payload, now);
        for copy in packet.earlier {
            if copy.payload_type != opus || copy.payload.is_empty() {
                continue;
            }
            if let Some(samples) = self.samples(copy.payload) {
                self.buffer
                    .push_redundant(copy.timestamp, samples, copy.payload.to_vec());
            }
        }
    }

    /// The duration of an Opus payload at the RTP clock; `None`, counted, when it is not Opus.
    fn samples(&mut self, payload: &[u8]) -> Option<u32> {
        match opus::packet::get_nb_samples(payload, CLOCK) {
            Ok(n) if n > 0 && n <= LONGEST => Some(n as u32),
            _ => {
                self.damaged += 1;
                None
            }
        }
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
        NetworkStats {
            red: self.red,
            ..self.buffer.stats()
        }
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

    /// The stream sent in RED with `distance` earlier packets in each, decoded at 16 kHz with the
    /// packets `lost` never arriving; and what the stream counted.
    fn decoded_red(
        packets: &[Vec<u8>],
        distance: usize,
        lost: &[usize],
    ) -> (Vec<i16>, NetworkStats) {
        let mut input = OpusInput::new(16_000).expect("a decoder");
        let start = Instant::now();
        let mut heard = Vec::new();
        let mut payload = Vec::new();
        for n in 0..packets.len() {
            let block = |k: usize| red::Block {
                payload_type: 111,
                timestamp: k as u32 * 960,
                payload: &packets[k],
            };
            let earlier: Vec<_> = (n.saturating_sub(distance)..n).map(block).collect();
            red::write(block(n), &earlier, &mut payload);
            if lost.contains(&n) {
                continue;
            }
            let now = start + Duration::from_millis(n as u64 * 20);
            input.push_red(n as u16, n as u32 * 960, &payload, 111, now);
            while let Some(piece) = input.pop(now) {
                heard.extend(piece.samples);
            }
        }
        (heard, input.stats())
    }

    #[test]
    fn a_burst_of_three_lost_packets_plays_from_the_copies_red_carries_and_their_fec() {
        let packets = gliding_packets(40);
        let clean = decoded(&packets, &[]);
        let burst = [20, 21, 22];
        let plain = decoded(&packets, &burst);
        let (one, one_stats) = decoded_red(&packets, 1, &burst);
        let (two, two_stats) = decoded_red(&packets, 2, &burst);
        // Chrome's one copy: 22 from the copy in 23, 21 from that copy's FEC, 20 concealed.
        assert_eq!(
            (
                one_stats.lost,
                one_stats.redundant,
                one_stats.recovered,
                one_stats.concealed
            ),
            (3, 1, 1, 1),
            "{one_stats:?}"
        );
        assert_eq!(one_stats.red, 37);
        // Two copies: 21 and 22 from copies, 20 from the FEC in 21's copy; nothing concealed.
        assert_eq!(
            (
                two_stats.lost,
                two_stats.redundant,
                two_stats.recovered,
                two_stats.concealed
            ),
            (3, 2, 1, 0),
            "{two_stats:?}"
        );
        let burst_audio = |audio: &[i16]| audio[20 * 320..23 * 320].to_vec();
        assert_eq!(burst_audio(&two).len(), 3 * 320);
        let plain_error = error(&burst_audio(&plain), &burst_audio(&clean));
        let one_error = error(&burst_audio(&one), &burst_audio(&clean));
        let two_error = error(&burst_audio(&two), &burst_audio(&clean));
        assert!(
            one_error * 2.0 < plain_error && two_error * 4.0 < plain_error,
            "concealed {plain_error:.0}, one copy {one_error:.0}, two {two_error:.0}"
        );
    }

    #[test]
    fn a_red_payload_that_does_not_parse_or_is_not_opus_is_counted_and_its_time_filled() {
        let packets = tone_packets(3);
        let mut input = OpusInput::new(16_000).expect("a decoder");
        let now = Instant::now();
        let mut payload = Vec::new();
        let block = |n: usize, payload_type| red::Block {
            payload_type,
            timestamp: n as u32 * 960,
            payload: &packets[n],
        };
        red::write(block(0, 111), &[], &mut payload);
        input.push_red(1, 0, &payload, 111, now);
        // A header announcing a block longer than the payload.
        input.push_red(2, 960, &[0xef, 0x0f, 0x00, 0xff, 0x6f, 1], 111, now);
        // Its own audio in another codec (payload type 0), a copy of 1 in Opus.
        red::write(block(2, 0), &[block(1, 111)], &mut payload);
        input.push_red(3, 1920, &payload, 111, now);
        let mut heard = Vec::new();
        let later = now + Duration::from_millis(100);
        while let Some(piece) = input.pop(later) {
            heard.extend(piece.samples);
        }
        assert_eq!(input.damaged(), 2);
        assert_eq!(input.stats().red, 2);
        assert!(heard.len() >= 320, "{}", heard.len());
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
