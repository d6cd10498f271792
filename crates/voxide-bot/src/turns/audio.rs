//! The user's audio as the turn model hears it: the open turn only, from just before its
//! onset, at 16 kHz, at most the model's window.
//!
//! pipecat sends Smart Turn the current turn from half a second before its speech (its
//! `pre_speech_ms`) and forgets it once the turn is complete; the model was trained on one turn
//! padded with silence in front. Fed the previous turn and the silence since, it hears far more
//! pauses as unfinished, and turns then end only at the timeout.

use std::collections::VecDeque;

use crate::audio::resample::StreamResampler;
use crate::audio::turn::smart_turn::WINDOW_SECS;
use crate::frames::AudioFrame;

/// The sample rate the turn model reads.
const MODEL_RATE: u32 = 16_000;
/// Samples kept: all the model reads.
const KEPT_SAMPLES: usize = WINDOW_SECS * MODEL_RATE as usize;
/// Audio before the onset that goes with the turn (pipecat's `pre_speech_ms`, 500 ms).
const PRE_SPEECH_SAMPLES: u64 = MODEL_RATE as u64 / 2;
/// Where a turn's speech began when no onset was heard: the VAD's default `start_secs` back.
const START_SAMPLES: u64 = MODEL_RATE as u64 / 5;

/// A ring of the user's last [`WINDOW_SECS`] of audio (it never grows past that: a session's
/// largest buffer) and where the open turn starts in it.
#[derive(Default)]
pub(super) struct TurnAudio {
    ring: VecDeque<i16>,
    /// Samples that ever went into the ring: positions in the user's audio.
    fed: u64,
    /// Where the VAD last heard an onset.
    onset_at: Option<u64>,
    /// Where the open turn's audio starts; `None`: no turn the VAD placed.
    turn_from: Option<u64>,
    resampler: Option<(u32, StreamResampler)>,
}

impl TurnAudio {
    /// Adds the user's audio, resampled for the model.
    pub(super) fn keep(&mut self, audio: &AudioFrame) {
        if self
            .resampler
            .as_ref()
            .is_none_or(|(rate, _)| *rate != audio.sample_rate)
        {
            match StreamResampler::new(audio.sample_rate, MODEL_RATE) {
                Ok(r) => self.resampler = Some((audio.sample_rate, r)),
                Err(e) => {
                    crate::warnings::warn(
                        "turn_input_resample",
                        format_args!("cannot resample the input for the turn model: {e}"),
                    );
                    return;
                }
            }
        }
        let Some((_, resampler)) = &mut self.resampler else {
            return;
        };
        let channels = usize::from(audio.channels.max(1));
        let mono: Vec<i16> = audio.samples.iter().step_by(channels).copied().collect();
        let fresh = resampler.process(&mono);
        self.fed += fresh.len() as u64;
        let fresh = &fresh[fresh.len().saturating_sub(KEPT_SAMPLES)..];
        // Make room first, so the ring never reallocates.
        let excess = (self.ring.len() + fresh.len()).saturating_sub(KEPT_SAMPLES);
        self.ring.drain(..excess);
        self.ring.extend(fresh);
    }

    /// The VAD heard what may be the start of speech, here.
    pub(super) fn onset(&mut self) {
        self.onset_at = Some(self.fed);
    }

    /// A turn starts (the VAD confirmed speech): its audio runs from before the last onset.
    pub(super) fn start_turn(&mut self) {
        let onset = self
            .onset_at
            .take()
            .unwrap_or(self.fed.saturating_sub(START_SAMPLES));
        self.turn_from = Some(onset.saturating_sub(PRE_SPEECH_SAMPLES));
    }

    /// The turn ended: the next one starts afresh.
    pub(super) fn end_turn(&mut self) {
        self.turn_from = None;
    }

    /// The open turn's audio, as far back as the ring goes (all of it for a turn the VAD did
    /// not place, such as one a transcript opened).
    pub(super) fn turn(&self) -> Vec<i16> {
        let ring_start = self.fed - self.ring.len() as u64;
        let skip = self
            .turn_from
            .map_or(0, |from| from.saturating_sub(ring_start));
        self.ring
            .iter()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ms` of 16 kHz audio whose every sample is `value`.
    fn chunk(value: i16, ms: usize) -> AudioFrame {
        AudioFrame::new(vec![value; 16 * ms], 16_000, 1)
    }

    #[test]
    fn the_model_hears_this_turn_from_half_a_second_before_its_onset() {
        let mut audio = TurnAudio::default();
        // A first turn, then two seconds of silence.
        audio.keep(&chunk(1, 200));
        audio.onset();
        audio.keep(&chunk(1, 1_000));
        audio.start_turn();
        audio.keep(&chunk(1, 500));
        assert_eq!(audio.turn().len(), 16 * 1_700, "all of the first turn");
        audio.end_turn();
        audio.keep(&chunk(0, 2_000));
        // The second: onset, then the VAD's confirmation 200 ms later.
        audio.onset();
        audio.keep(&chunk(2, 200));
        audio.start_turn();
        audio.keep(&chunk(2, 800));
        let turn = audio.turn();
        assert_eq!(turn.len(), 16 * (500 + 1_000));
        assert!(turn[..16 * 500].iter().all(|&s| s == 0), "the pre-speech");
        assert!(
            turn[16 * 500..].iter().all(|&s| s == 2),
            "nothing of turn one"
        );
    }

    #[test]
    fn a_long_turn_is_cut_to_the_window_and_a_turn_without_a_start_gets_the_ring() {
        let mut audio = TurnAudio::default();
        audio.onset();
        audio.start_turn();
        audio.keep(&chunk(3, 10_000));
        assert_eq!(audio.turn().len(), KEPT_SAMPLES);
        audio.end_turn();
        audio.keep(&chunk(4, 100));
        assert_eq!(audio.turn().len(), KEPT_SAMPLES);
        // No onset heard: the turn starts the VAD's start_secs back, less the pre-speech.
        audio.start_turn();
        assert_eq!(audio.turn().len(), 16 * (200 + 500));
    }
}
