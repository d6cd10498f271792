//! Room tone: the noise floor a microphone in a room sends under the speech and in every gap
//! (`voxide loadtest --noise-dbfs N --noise brown|pink|babble|FILE`). A lab's recording has
//! digital zero between words; no microphone does.
//!
//! Levels are RMS in dB relative to full scale (an RMS of 32,768): a quiet room through a
//! laptop's microphone is about -55 dBFS, speech about -20.

use std::path::PathBuf;

/// What the room sounds like.
#[derive(Debug, Clone, PartialEq)]
pub enum Noise {
    /// Brown (red) noise, falling 6 dB an octave: a fan, a distant road, a room's rumble.
    Brown,
    /// Pink noise, falling 3 dB an octave: broadband hiss with a room's tilt.
    Pink,
    /// The talk around the speaker, as in a café: [`TALKERS`] people, each reading their own
    /// text at their own pace and pitch, made by the embedded Piper voice.
    Babble,
    /// A recording (café babble, an office), looped; any WAV, mixed to mono 16 kHz.
    File(PathBuf),
}

impl Noise {
    /// `brown`, `pink`, `babble` or a WAV's path.
    pub fn parse(text: &str) -> Self {
        match text {
            "brown" => Noise::Brown,
            "pink" => Noise::Pink,
            "babble" => Noise::Babble,
            path => Noise::File(PathBuf::from(path)),
        }
    }
}

/// People talking around the speaker in [`Noise::Babble`].
pub const TALKERS: usize = 4;

/// What the talkers say: everyday talk, none of it a question the load tester asks.
const TALK: [&str; 8] = [
    "We went to the coast last weekend and the weather held the whole time.",
    "She said the new office is closer to the station, which makes mornings easier.",
    "I think the second film was better, although the ending felt rushed.",
    "They are painting the kitchen a pale green, and the hallway white.",
    "My brother finally sold his old car after trying for three months.",
    "The bakery on the corner opens at seven and the bread goes quickly.",
    "If the train is late again we should take the bus from the square.",
    "He plays the piano every evening, mostly old songs his mother taught him.",
];

/// Each talker's speed and pitch: the voice's audio played this much faster.
const SPEEDS: [f64; TALKERS] = [0.88, 0.95, 1.04, 1.12];

/// A noise floor: its colour and its level.
#[derive(Debug, Clone, PartialEq)]
pub struct Room {
    /// The noise.
    pub noise: Noise,
    /// Its RMS level, dBFS.
    pub dbfs: f64,
}

impl std::fmt::Display for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.noise {
            Noise::Brown => f.write_str("brown noise")?,
            Noise::Pink => f.write_str("pink noise")?,
            Noise::Babble => write!(f, "babble of {TALKERS} talkers")?,
            Noise::File(path) => write!(f, "{}", path.display())?,
        }
        write!(f, " at {} dBFS", self.dbfs)
    }
}

impl Room {
    /// `len` samples of this room's tone at 16 kHz, at its level; seeded, so every run of the
    /// same seed sends the same noise.
    pub fn tone(&self, len: usize, seed: u64) -> Result<Vec<i16>, String> {
        if !(self.dbfs.is_finite() && self.dbfs < 0.0) {
            return Err(format!("--noise-dbfs {}: a level under 0 dBFS", self.dbfs));
        }
        let raw = match &self.noise {
            Noise::Brown => brown(len, seed),
            Noise::Pink => pink(len, seed),
            Noise::Babble => {
                let talk = babble()?;
                let start = (seed as usize).wrapping_mul(7_919) % talk.len();
                talk.iter().copied().cycle().skip(start).take(len).collect()
            }
            Noise::File(path) => {
                let looped = recording(path)?;
                looped.iter().copied().cycle().take(len).collect()
            }
        };
        Ok(at_level(&raw, self.dbfs))
    }
}

/// `speech` with `tone` under it (the tone looped if shorter), clipped to 16 bits.
pub fn mix(speech: &[i16], tone: &[i16]) -> Vec<i16> {
    if tone.is_empty() {
        return speech.to_vec();
    }
    speech
        .iter()
        .zip(tone.iter().cycle())
        .map(|(s, t)| s.saturating_add(*t))
        .collect()
}

/// `raw` scaled to an RMS of `dbfs`.
fn at_level(raw: &[f64], dbfs: f64) -> Vec<i16> {
    let rms = (raw.iter().map(|x| x * x).sum::<f64>() / raw.len().max(1) as f64).sqrt();
    let target = 32_768.0 * 10f64.powf(dbfs / 20.0);
    let gain = if rms > 0.0 { target / rms } else { 0.0 };
    raw.iter()
        .map(|x| (x * gain).round().clamp(-32_768.0, 32_767.0) as i16)
        .collect()
}

/// A seeded white-noise source in [-1, 1) (xorshift64*).
struct White(u64);

impl White {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        bits as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// Brown noise: white noise integrated with a leak, so it has no DC and does not wander off
/// (the leak puts its corner near 20 Hz at 16 kHz).
fn brown(len: usize, seed: u64) -> Vec<f64> {
    let mut white = White::new(seed);
    let mut level = 0.0;
    (0..len)
        .map(|_| {
            level = 0.992 * level + 0.1 * white.next();
            level
        })
        .collect()
}

/// Pink noise: white noise through Paul Kellet's economy filter (within 0.5 dB of -3 dB an
/// octave above 40 Hz at 16 kHz).
fn pink(len: usize, seed: u64) -> Vec<f64> {
    let mut white = White::new(seed);
    let (mut b0, mut b1, mut b2) = (0.0, 0.0, 0.0);
    (0..len)
        .map(|_| {
            let w = white.next();
            b0 = 0.99765 * b0 + w * 0.099_046;
            b1 = 0.963 * b1 + w * 0.296_516_4;
            b2 = 0.57 * b2 + w * 1.052_691_3;
            b0 + b1 + b2 + w * 0.1848
        })
        .collect()
}

/// The talk of [`TALKERS`] people at 16 kHz, made once a process: each reads the sentences of
/// [`TALK`] from a different one, at its speed, with a second or so between sentences, and the
/// talkers are added up. About 30 s, looped by its user.
fn babble() -> Result<Vec<f64>, String> {
    static TALK_MIX: std::sync::OnceLock<Result<Vec<f64>, String>> = std::sync::OnceLock::new();
    TALK_MIX
        .get_or_init(|| {
            use crate::services::tts::Synthesizer;
            let voice = crate::services::tts::piper::PiperVoice::load_default()
                .map_err(|e| format!("--noise babble needs the embedded Piper voice: {e}"))?
                .deterministic();
            let sentences = TALK
                .iter()
                .map(|text| {
                    voice
                        .synthesize(text)
                        .map_err(|e| format!("--noise babble: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut gaps = White::new(TALKERS as u64);
            let mut talkers = Vec::new();
            for (talker, speed) in SPEEDS.iter().enumerate() {
                // Played faster (or slower): the rate the voice's samples are taken to be at.
                let from = (f64::from(voice.sample_rate()) * speed).round() as u32;
                let mut resampler = crate::audio::resample::StreamResampler::new(from, 16_000)
                    .map_err(|e| format!("--noise babble: {e}"))?;
                let mut said = Vec::new();
                for i in 0..TALK.len() {
                    let sentence = &sentences[(talker * 3 + i) % TALK.len()];
                    said.extend(resampler.process(&sentence.samples));
                    let gap = (0.6 + 0.5 * (gaps.next() + 1.0)) * 16_000.0;
                    said.extend(std::iter::repeat_n(0i16, gap as usize));
                }
                talkers.push(said);
            }
            let len = talkers.iter().map(Vec::len).min().unwrap_or(0);
            // Each talker starts at its own point of its talk, so their pauses do not line up.
            Ok((0..len)
                .map(|n| {
                    talkers
                        .iter()
                        .enumerate()
                        .map(|(t, said)| f64::from(said[(n + t * len / TALKERS) % len]))
                        .sum()
                })
                .collect())
        })
        .clone()
}

/// A recording as mono 16 kHz samples.
fn recording(path: &PathBuf) -> Result<Vec<f64>, String> {
    let wav =
        crate::audio::wav::read(path).map_err(|e| format!("--noise {}: {e}", path.display()))?;
    let mono = wav.to_mono();
    let samples = if wav.sample_rate == 16_000 {
        mono
    } else {
        crate::audio::resample::StreamResampler::new(wav.sample_rate, 16_000)
            .map_err(|e| format!("--noise {}: {e}", path.display()))?
            .process(&mono)
    };
    if samples.iter().all(|s| *s == 0) {
        return Err(format!(
            "--noise {}: the recording is silent",
            path.display()
        ));
    }
    Ok(samples.into_iter().map(f64::from).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signal::rms;

    fn dbfs(samples: &[i16]) -> f64 {
        20.0 * (rms(samples) / 32_768.0).log10()
    }

    #[test]
    fn a_rooms_tone_has_the_level_asked_for_and_the_same_seed_gives_the_same_noise() {
        for noise in [Noise::Brown, Noise::Pink] {
            let room = Room {
                noise: noise.clone(),
                dbfs: -55.0,
            };
            let tone = room.tone(16_000 * 5, 7).expect("a tone");
            assert!(
                (dbfs(&tone) + 55.0).abs() < 0.1,
                "{noise:?}: {}",
                dbfs(&tone)
            );
            assert_eq!(tone, room.tone(16_000 * 5, 7).expect("a tone"));
            assert_ne!(tone, room.tone(16_000 * 5, 8).expect("a tone"));
            // Every 10 ms of it is sound: no piece falls to digital silence.
            assert!(tone.chunks(160).all(|piece| rms(piece) > 3.0), "{noise:?}");
        }
    }

    #[test]
    fn brown_noise_is_darker_than_pink() {
        // The share of power in the sample-to-sample differences (high frequencies).
        let edge = |tone: &[i16]| {
            let diff: f64 = tone
                .windows(2)
                .map(|w| (f64::from(w[1]) - f64::from(w[0])).powi(2))
                .sum();
            diff / tone.iter().map(|s| f64::from(*s).powi(2)).sum::<f64>()
        };
        let tone = |noise| {
            Room { noise, dbfs: -30.0 }
                .tone(16_000 * 2, 1)
                .expect("a tone")
        };
        assert!(edge(&tone(Noise::Brown)) < edge(&tone(Noise::Pink)) / 4.0);
    }

    #[test]
    fn speech_keeps_its_samples_with_the_tone_added_under_it() {
        let speech = [1000i16, -1000, 32_767, 0];
        let mixed = mix(&speech, &[10, 10]);
        assert_eq!(mixed, [1010, -990, 32_767, 10]);
        assert_eq!(mix(&speech, &[]), speech);
    }

    #[test]
    fn a_level_at_or_over_full_scale_is_refused() {
        let room = Room {
            noise: Noise::Brown,
            dbfs: 3.0,
        };
        assert!(room.tone(10, 1).is_err());
    }

    #[test]
    fn babble_is_talk_at_the_level_asked_for_that_rises_and_falls_like_speech() {
        let room = Room {
            noise: Noise::Babble,
            dbfs: -35.0,
        };
        let talk = room
            .tone(16_000 * 10, 3)
            .expect("babble (the embedded Piper voice)");
        assert!((dbfs(&talk) + 35.0).abs() < 0.1, "{}", dbfs(&talk));
        assert_eq!(talk, room.tone(16_000 * 10, 3).expect("babble"));
        assert_ne!(talk, room.tone(16_000 * 10, 4).expect("babble"));
        // Speech comes and goes with syllables: its 50 ms levels vary far more than a steady
        // noise's do.
        let spread = |tone: &[i16]| {
            let levels: Vec<f64> = tone.chunks(800).map(rms).collect();
            let mean = levels.iter().sum::<f64>() / levels.len() as f64;
            (levels.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / levels.len() as f64).sqrt()
                / mean
        };
        let steady = Room {
            noise: Noise::Pink,
            dbfs: -35.0,
        }
        .tone(16_000 * 10, 3)
        .expect("pink");
        assert!(
            spread(&talk) > 3.0 * spread(&steady),
            "{} vs {}",
            spread(&talk),
            spread(&steady)
        );
    }
}
