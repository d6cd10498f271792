//! The answering machine's beep: a steady pure tone, found in the callee's audio.
//!
//! A voicemail greeting ends with a tone (most often near 1 kHz, some 400 Hz to 2 kHz), a tenth
//! of a second to a second long, after which the machine records. Each 10 ms window is fitted
//! with the one recursion a sinusoid obeys, `x[n] = 2 cos ω · x[n-1] - x[n-2]`: the share of
//! the window's energy the fit leaves over tells a pure tone (under 1 %) from speech, whose
//! harmonics and formants a single frequency cannot predict, from noise and from a DTMF key's
//! two tones; `ω` is the tone's frequency. A run of tonal windows at one frequency, long enough
//! and loud enough, is a beep once it stops: the machine records from then on.
//!
//! Sans-IO: [`BeepDetector::push`] takes samples at the call's rate and answers with the beep
//! when one has just ended; times are the audio's own, counted from the first sample.

use std::time::Duration;

/// The shortest run of tone that is a beep.
pub const SHORTEST: Duration = Duration::from_millis(120);
/// The longest: a tone that goes on is a dial tone, a fax or an alarm, not a beep.
pub const LONGEST: Duration = Duration::from_millis(2_500);
/// The lowest frequency a beep has.
pub const LOWEST_HZ: f32 = 300.0;
/// The highest.
pub const HIGHEST_HZ: f32 = 3_000.0;
/// The share of a window's energy the tone's recursion may leave unpredicted (-17 dB).
const RESIDUE: f32 = 0.02;
/// The quietest a beep's window may be: -45 dBFS RMS, as a share of full scale squared.
const QUIETEST: f32 = 3.2e-5;
/// How far a window's frequency may stray from the run's first, as a share.
const DRIFT: f32 = 0.04;

/// A beep the callee's audio held.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Beep {
    /// Where the tone began, from the first sample pushed.
    pub start: Duration,
    /// Where it ended: the machine records from here.
    pub end: Duration,
    /// Its frequency, Hz (within a few percent: noise pulls a quiet tone's estimate down).
    pub hz: f32,
}

/// Finds beeps in one stream of audio.
#[derive(Debug)]
pub struct BeepDetector {
    rate: u32,
    window: Vec<f32>,
    /// Windows seen, each 10 ms.
    windows: u64,
    run: Option<Run>,
}

/// Tonal windows in a row.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: u64,
    count: u64,
    hz: f32,
}

impl BeepDetector {
    /// A detector for audio at `rate` Hz (8 kHz and up: a beep sits under 3 kHz).
    pub fn new(rate: u32) -> Self {
        Self {
            rate,
            window: Vec::with_capacity(Self::window_len(rate)),
            windows: 0,
            run: None,
        }
    }

    fn window_len(rate: u32) -> usize {
        (rate / 100).max(1) as usize
    }

    /// Takes the next samples; a beep that ended in them comes back (at most one per 10 ms of
    /// audio, so one per call is all a 20 ms packet can hold but the rare two windows' worth).
    pub fn push(&mut self, samples: &[i16]) -> Option<Beep> {
        let len = Self::window_len(self.rate);
        let mut found = None;
        for &sample in samples {
            self.window.push(f32::from(sample) / 32_768.0);
            if self.window.len() == len {
                if let Some(beep) = self.close_window() {
                    found = Some(beep);
                }
                self.window.clear();
            }
        }
        found
    }

    fn close_window(&mut self) -> Option<Beep> {
        let index = self.windows;
        self.windows += 1;
        let tone = tone_of(&self.window, self.rate);
        match (tone, self.run) {
            (Some(hz), Some(mut run)) if (hz - run.hz).abs() <= run.hz * DRIFT => {
                run.count += 1;
                self.run = Some(run);
                None
            }
            (tone, run) => {
                self.run = tone.map(|hz| Run {
                    first: index,
                    count: 1,
                    hz,
                });
                run.and_then(|run| self.beep(run))
            }
        }
    }

    /// The run that just ended, if it was a beep.
    fn beep(&self, run: Run) -> Option<Beep> {
        let tens = |n: u64| Duration::from_millis(n * 10);
        let long = tens(run.count);
        (SHORTEST..=LONGEST).contains(&long).then(|| Beep {
            start: tens(run.first),
            end: tens(run.first + run.count),
            hz: run.hz,
        })
    }
}

/// The frequency of the pure tone `window` holds, if it holds one loud enough.
fn tone_of(window: &[f32], rate: u32) -> Option<f32> {
    let energy = window.iter().map(|x| x * x).sum::<f32>();
    if energy < QUIETEST * window.len() as f32 {
        return None;
    }
    // The best `c = 2 cos ω` for x[n] + x[n-2] = c x[n-1], by least squares.
    let (mut cross, mut middle) = (0.0f32, 0.0f32);
    for w in window.windows(3) {
        cross += w[1] * (w[0] + w[2]);
        middle += w[1] * w[1];
    }
    if middle <= 0.0 {
        return None;
    }
    let c = (cross / middle).clamp(-2.0, 2.0);
    let residue = window
        .windows(3)
        .map(|w| {
            let e = w[2] - c * w[1] + w[0];
            e * e
        })
        .sum::<f32>();
    // Each residual holds the noise of three samples: compare it with the energy they carry.
    if residue > RESIDUE * 3.0 * energy {
        return None;
    }
    let hz = (c / 2.0).acos() * rate as f32 / std::f32::consts::TAU;
    (LOWEST_HZ..=HIGHEST_HZ).contains(&hz).then_some(hz)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::wav;

    const RATE: u32 = 8_000;

    fn tone(hz: f32, ms: u64, dbfs: f32) -> Vec<i16> {
        let amplitude = 32_767.0 * 10f32.powf(dbfs / 20.0) * std::f32::consts::SQRT_2;
        (0..RATE as u64 * ms / 1_000)
            .map(|n| {
                (amplitude * (std::f32::consts::TAU * hz * n as f32 / RATE as f32).sin()) as i16
            })
            .collect()
    }

    fn silence(ms: u64) -> Vec<i16> {
        vec![0; (RATE as u64 * ms / 1_000) as usize]
    }

    /// Brown noise at `dbfs` RMS, from a fixed seed, added to `audio`.
    fn under_noise(mut audio: Vec<i16>, dbfs: f32) -> Vec<i16> {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut level = 0.0f32;
        let mut noise: Vec<f32> = (0..audio.len())
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let white = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                level = 0.98 * level + white;
                level
            })
            .collect();
        let rms = (noise.iter().map(|x| x * x).sum::<f32>() / noise.len() as f32).sqrt();
        let gain = 32_767.0 * 10f32.powf(dbfs / 20.0) / rms;
        for (sample, n) in audio.iter_mut().zip(noise.iter_mut()) {
            *sample = (f32::from(*sample) + *n * gain).clamp(-32_768.0, 32_767.0) as i16;
        }
        audio
    }

    /// Every beep in `audio`, fed 20 ms at a time as packets come.
    fn beeps(audio: &[i16]) -> Vec<Beep> {
        let mut detector = BeepDetector::new(RATE);
        audio
            .chunks(160)
            .filter_map(|packet| detector.push(packet))
            .collect()
    }

    /// A recorded clip of `assets/test/`, narrowed to 8 kHz.
    fn clip_at_8k(name: &str) -> Vec<i16> {
        let path = format!("{}/../../assets/test/{name}", env!("CARGO_MANIFEST_DIR"));
        let clip = wav::read(path).expect("test audio").to_mono();
        crate::audio::resample::StreamResampler::new(16_000, RATE)
            .expect("resampler")
            .process(&clip)
    }

    fn speech_at_8k() -> Vec<i16> {
        clip_at_8k("hello_16k.wav")
    }

    #[test]
    fn a_beep_after_a_greeting_in_room_noise_is_found_where_it_ends() {
        let mut audio = speech_at_8k();
        audio.extend(silence(300));
        let beep_at = audio.len() as u64 * 1_000 / RATE as u64;
        audio.extend(tone(1_000.0, 500, -20.0));
        audio.extend(silence(1_000));
        let found = beeps(&under_noise(audio, -55.0));
        assert_eq!(found.len(), 1, "{found:?}");
        let beep = found[0];
        assert!((beep.hz - 1_000.0).abs() < 10.0, "{beep:?}");
        let ms = |d: Duration| d.as_millis() as i64;
        assert!(
            (ms(beep.start) - beep_at as i64).abs() <= 20,
            "{beep:?} at {beep_at}"
        );
        assert!(
            (ms(beep.end) - (beep_at as i64 + 500)).abs() <= 20,
            "{beep:?}"
        );
    }

    #[test]
    fn beeps_of_other_pitches_and_lengths_are_found_quiet_or_loud() {
        for (hz, ms, dbfs) in [
            (440.0, 300, -30.0),
            (850.0, 150, -12.0),
            (1_400.0, 1_000, -40.0),
            (2_000.0, 200, -6.0),
        ] {
            let mut audio = silence(200);
            audio.extend(tone(hz, ms, dbfs));
            audio.extend(silence(200));
            let found = beeps(&under_noise(audio, -60.0));
            assert_eq!(found.len(), 1, "{hz} Hz, {ms} ms, {dbfs} dBFS: {found:?}");
            // Room noise pulls a quiet tone's estimate a little towards its own low pitch.
            assert!((found[0].hz - hz).abs() < hz * 0.03, "{found:?}");
        }
    }

    #[test]
    fn speech_noise_a_click_and_a_dtmf_key_are_not_beeps() {
        assert_eq!(beeps(&under_noise(speech_at_8k(), -55.0)), []);
        assert_eq!(beeps(&clip_at_8k("frog_and_toad_16k.wav")), []);
        assert_eq!(beeps(&under_noise(silence(2_000), -30.0)), []);
        // Shorter than a beep.
        let mut click = silence(100);
        click.extend(tone(1_000.0, 60, -20.0));
        click.extend(silence(100));
        assert_eq!(beeps(&click), []);
        // The key 5: 770 Hz and 1336 Hz together.
        let key: Vec<i16> = tone(770.0, 200, -20.0)
            .iter()
            .zip(tone(1_336.0, 200, -20.0))
            .map(|(a, b)| a / 2 + b / 2)
            .collect();
        assert_eq!(beeps(&key), []);
    }

    #[test]
    fn a_tone_that_goes_on_is_a_dial_tone_not_a_beep() {
        let mut audio = tone(425.0, 4_000, -20.0);
        audio.extend(silence(200));
        assert_eq!(beeps(&audio), []);
    }

    #[test]
    fn wideband_audio_finds_the_same_beep() {
        let mut detector = BeepDetector::new(16_000);
        let samples: Vec<i16> = (0..16_000 * 4 / 10)
            .map(|n| {
                (8_000.0 * (std::f32::consts::TAU * 1_000.0 * n as f32 / 16_000.0).sin()) as i16
            })
            .chain(std::iter::repeat_n(0, 3_200))
            .collect();
        let found: Vec<Beep> = samples
            .chunks(320)
            .filter_map(|p| detector.push(p))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].end, Duration::from_millis(400));
    }
}
