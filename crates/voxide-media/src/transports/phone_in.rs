//! One incoming telephone stream (a SIP call's RTP), from packets to PCM. Opus goes to
//! [`OpusInput`], with its FEC and its own concealment. G.711 and G.722 go to [`WaveformInput`]:
//! the [`JitterBuffer`] puts the packets in order and on the sender's timeline; it decodes them
//! and conceals what was lost by repeating the last audio heard as it fades, the attenuation of
//! G.711 Appendix I (whole for 10 ms, 20 % less each 10 ms after, silent from 60 ms) without its
//! pitch search.

use std::time::Instant;

use super::jitter::{JitterBuffer, NetworkStats, Playout, RtpAudio};
use super::opus_in::{Decoded, OpusInput};
use super::sip::sdp::{CLOCK, Codec};
use crate::audio::g722::G722Decoder;
use crate::audio::{alaw, mulaw};

/// The audio a concealment repeats: the last 20 ms heard, in ticks of the RTP clock.
const HISTORY: usize = 160;
/// Concealment plays whole for 10 ms, then fades to silence over 50 ms more (in ticks).
const WHOLE: usize = 80;
const FADE: usize = 400;
/// The longest payload taken: 200 ms (a packet is usually 20 ms), one byte a tick.
const LONGEST: usize = 1_600;

/// A telephone stream decoded at its codec's rate.
pub enum PhoneInput {
    /// G.711 or G.722.
    Waveform(Box<WaveformInput>),
    /// Opus, decoded in wideband.
    Opus(Box<OpusInput>),
}

impl PhoneInput {
    /// A stream in `codec`.
    pub fn new(codec: Codec) -> Self {
        match codec {
            Codec::Opus => Self::Opus(Box::new(
                OpusInput::new(codec.rate()).expect("16 kHz is one of Opus's rates"),
            )),
            waveform => Self::Waveform(Box::new(WaveformInput::new(waveform))),
        }
    }

    /// The rate of the audio [`pop`](Self::pop) returns.
    pub fn rate(&self) -> u32 {
        match self {
            Self::Waveform(input) => input.rate(),
            Self::Opus(input) => input.rate(),
        }
    }

    /// Takes a packet that arrived at `now`.
    pub fn push(&mut self, sequence_number: u16, timestamp: u32, payload: &[u8], now: Instant) {
        match self {
            Self::Waveform(input) => input.push(sequence_number, timestamp, payload, now),
            Self::Opus(input) => input.push(sequence_number, timestamp, payload, now),
        }
    }

    /// The next piece of audio due at `now`, decoded.
    pub fn pop(&mut self, now: Instant) -> Option<Decoded> {
        match self {
            Self::Waveform(input) => input.pop(now),
            Self::Opus(input) => input.pop(now),
        }
    }

    /// When a hole is given up for lost if nothing comes first; `None` before the first packet.
    pub fn deadline(&self) -> Option<Instant> {
        match self {
            Self::Waveform(input) => input.deadline(),
            Self::Opus(input) => input.deadline(),
        }
    }

    /// What the network did to the stream so far.
    pub fn stats(&self) -> NetworkStats {
        match self {
            Self::Waveform(input) => input.stats(),
            Self::Opus(input) => input.stats(),
        }
    }

    /// Payloads dropped as not the codec's.
    pub fn damaged(&self) -> u64 {
        match self {
            Self::Waveform(input) => input.damaged(),
            Self::Opus(input) => input.damaged(),
        }
    }
}

/// A stream in G.711 or G.722, decoded at its codec's rate.
pub struct WaveformInput {
    buffer: JitterBuffer,
    codec: Codec,
    /// G.722's decoder state, which runs on from packet to packet.
    wideband: Option<G722Decoder>,
    /// Samples a tick of the RTP clock: 1 for G.711, 2 for G.722.
    per_tick: usize,
    /// The last audio heard, oldest first.
    history: Vec<i16>,
    /// Samples concealed since the last audio heard.
    concealed: usize,
    /// Payloads too long to be a packet of speech.
    damaged: u64,
}

impl WaveformInput {
    /// A stream in `codec` (G.711 or G.722).
    pub fn new(codec: Codec) -> Self {
        let per_tick = (codec.rate() / CLOCK) as usize;
        Self {
            buffer: JitterBuffer::without_fec(CLOCK),
            codec,
            wideband: (codec == Codec::G722).then(G722Decoder::new),
            per_tick,
            history: Vec::with_capacity(HISTORY * per_tick),
            concealed: 0,
            damaged: 0,
        }
    }

    /// The rate of the audio [`pop`](Self::pop) returns.
    pub fn rate(&self) -> u32 {
        self.codec.rate()
    }

    /// Takes a packet that arrived at `now`. An empty one is nothing; one longer than
    /// [`LONGEST`] is counted and dropped, its time concealed like a lost packet's.
    pub fn push(&mut self, sequence_number: u16, timestamp: u32, payload: &[u8], now: Instant) {
        if payload.is_empty() {
            return;
        }
        if payload.len() > LONGEST {
            self.damaged += 1;
            return;
        }
        let packet = RtpAudio {
            sequence_number,
            timestamp,
            // One byte a tick, in every codec here.
            samples: payload.len() as u32,
            payload: payload.to_vec(),
        };
        self.buffer.push(packet, now);
    }

    /// The next piece of audio due at `now`, decoded; `None` until [`deadline`](Self::deadline)
    /// or the next packet.
    pub fn pop(&mut self, now: Instant) -> Option<Decoded> {
        let playout = self.buffer.pop(now)?;
        let per_tick = self.per_tick;
        Some(match playout {
            Playout::Packet { payload, trim } => {
                let samples: Vec<i16> = match (&mut self.wideband, self.codec) {
                    // The decoder's state needs every byte, the trimmed ones too.
                    (Some(decoder), _) => {
                        let mut samples = decoder.decode(&payload);
                        samples.drain(..(trim as usize * per_tick).min(samples.len()));
                        samples
                    }
                    (None, Codec::Pcma) => payload
                        .iter()
                        .skip(trim as usize)
                        .map(|&b| alaw::decode(b))
                        .collect(),
                    (None, _) => payload
                        .iter()
                        .skip(trim as usize)
                        .map(|&b| mulaw::decode(b))
                        .collect(),
                };
                self.heard(&samples);
                Decoded {
                    samples,
                    sent: true,
                }
            }
            // No telephone codec here carries FEC; the buffer made for them asks for none.
            Playout::Fec { samples, .. } | Playout::Conceal { samples } => Decoded {
                samples: self.conceal(samples as usize * per_tick),
                sent: false,
            },
            Playout::Silence { samples } => Decoded {
                samples: vec![0; samples as usize * per_tick],
                sent: false,
            },
        })
    }

    /// When a hole is given up for lost if nothing comes first; `None` before the first packet.
    pub fn deadline(&self) -> Option<Instant> {
        self.buffer.deadline()
    }

    /// What the network did to the stream so far.
    pub fn stats(&self) -> NetworkStats {
        self.buffer.stats()
    }

    /// Payloads dropped as too long.
    pub fn damaged(&self) -> u64 {
        self.damaged
    }

    fn heard(&mut self, samples: &[i16]) {
        self.concealed = 0;
        let history = HISTORY * self.per_tick;
        let keep = history.min(samples.len());
        let drop = (self.history.len() + keep).saturating_sub(history);
        self.history.drain(..drop);
        self.history
            .extend_from_slice(&samples[samples.len() - keep..]);
    }

    /// `samples` of the last audio heard, repeated and fading.
    fn conceal(&mut self, samples: usize) -> Vec<i16> {
        let (whole, fade) = (WHOLE * self.per_tick, FADE * self.per_tick);
        let out = (0..samples)
            .map(|i| {
                let at = self.concealed + i;
                if self.history.is_empty() || at >= whole + fade {
                    return 0;
                }
                let gain = 1.0 - at.saturating_sub(whole) as f32 / fade as f32;
                let sample = self.history[at % self.history.len()];
                (f32::from(sample) * gain) as i16
            })
            .collect();
        self.concealed += samples;
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::audio::g722::G722Encoder;

    fn tone(n: u16) -> Vec<u8> {
        (0..160)
            .map(|i| mulaw::encode(((f32::from(i + n * 160) * 0.3).sin() * 8_000.0) as i16))
            .collect()
    }

    fn drain(input: &mut PhoneInput, now: Instant) -> Vec<Decoded> {
        std::iter::from_fn(|| input.pop(now)).collect()
    }

    #[test]
    fn packets_out_of_order_play_in_order_and_a_duplicate_once() {
        let start = Instant::now();
        let mut input = PhoneInput::new(Codec::Pcmu);
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut played = Vec::new();
        for (n, ms) in [(0u16, 0), (2, 40), (1, 45), (1, 46), (3, 60)] {
            input.push(n, u32::from(n) * 160, &tone(n), at(ms));
            played.extend(drain(&mut input, at(ms)));
        }
        let expected: Vec<i16> = (0..4)
            .flat_map(|n| tone(n).into_iter().map(mulaw::decode))
            .collect();
        let heard: Vec<i16> = played.iter().flat_map(|d| d.samples.clone()).collect();
        assert_eq!(heard, expected);
        assert!(played.iter().all(|d| d.sent));
        let stats = input.stats();
        assert_eq!((stats.reordered, stats.duplicated, stats.lost), (1, 1, 0));
    }

    #[test]
    fn a_lost_packet_keeps_the_timeline_whole_with_the_last_audio_fading_out() {
        let start = Instant::now();
        let mut input = PhoneInput::new(Codec::Pcma);
        let packet = |n: u16| -> Vec<u8> {
            tone(n)
                .into_iter()
                .map(|b| alaw::encode(mulaw::decode(b)))
                .collect()
        };
        input.push(0, 0, &packet(0), start);
        let first = drain(&mut input, start);
        input.push(5, 800, &packet(5), start + Duration::from_millis(100));
        // Packet 4 is given up at 120 ms (due at 80, the buffer 40 ms deep); 6 is not due yet.
        let played = drain(&mut input, start + Duration::from_millis(130));
        // Packets 1 to 4 are concealed, 20 ms each, then 5 plays: 100 ms in all.
        let lengths: Vec<(usize, bool)> =
            played.iter().map(|d| (d.samples.len(), d.sent)).collect();
        assert_eq!(
            lengths,
            vec![
                (160, false),
                (160, false),
                (160, false),
                (160, false),
                (160, true)
            ]
        );
        // The concealment starts as the last audio heard and is silent from 60 ms.
        assert_eq!(played[0].samples[..80], first[0].samples[..80]);
        let concealed: Vec<i16> = played[..4].iter().flat_map(|d| d.samples.clone()).collect();
        assert!(concealed[480..].iter().all(|&s| s == 0));
        let loud = |s: &[i16]| s.iter().map(|&v| i32::from(v).abs()).max().unwrap_or(0);
        assert!(loud(&concealed[400..480]) < loud(&concealed[..80]));
        assert_eq!(input.stats().lost, 4);
    }

    #[test]
    fn an_oversized_payload_is_counted_and_dropped() {
        let mut input = PhoneInput::new(Codec::Pcmu);
        input.push(0, 0, &vec![0xff; LONGEST + 1], Instant::now());
        assert_eq!(input.damaged(), 1);
        assert_eq!(input.stats().received, 0);
        assert!(input.deadline().is_none());
    }

    #[test]
    fn a_wideband_call_plays_two_samples_a_tick_and_conceals_at_its_rate() {
        let start = Instant::now();
        let speech: Vec<i16> = (0..1_920)
            .map(|i| ((i as f32 * 0.7).sin() * 6_000.0) as i16)
            .collect();
        let mut encoder = G722Encoder::new();
        // 20 ms a packet: 320 samples in 160 bytes, 160 ticks of the clock.
        let packets: Vec<Vec<u8>> = speech.chunks(320).map(|c| encoder.encode(c)).collect();
        let mut input = PhoneInput::new(Codec::G722);
        assert_eq!(input.rate(), 16_000);
        input.push(0, 0, &packets[0], start);
        let first = drain(&mut input, start);
        assert_eq!(first[0].samples, G722Decoder::new().decode(&packets[0]));
        input.push(5, 800, &packets[5], start + Duration::from_millis(100));
        let played = drain(&mut input, start + Duration::from_millis(130));
        let lengths: Vec<(usize, bool)> =
            played.iter().map(|d| (d.samples.len(), d.sent)).collect();
        assert_eq!(
            lengths,
            vec![
                (320, false),
                (320, false),
                (320, false),
                (320, false),
                (320, true)
            ]
        );
        let concealed: Vec<i16> = played[..4].iter().flat_map(|d| d.samples.clone()).collect();
        assert_eq!(concealed[..160], first[0].samples[..160]);
        assert!(concealed[960..].iter().all(|&s| s == 0));
    }
}
