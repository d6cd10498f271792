//! The speech state machine over model windows: QUIET → STARTING → SPEAKING → STOPPING → QUIET.
//!
//! A window counts as speech when the model's confidence and the smoothed loudness both pass
//! their thresholds. Speech must last `start_secs` to start a turn and silence `stop_secs` to end
//! one, so a click does not start a turn and a breath does not end it.

use std::sync::Arc;

use super::silero::{SileroState, SileroVad, window_size};
use crate::audio::resample::{ResampleError, StreamResampler};
use crate::models::ModelError;

/// Thresholds and delays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadParams {
    /// Model confidence a window needs to count as speech.
    pub confidence: f32,
    /// Seconds of speech before speaking starts.
    pub start_secs: f32,
    /// Seconds of silence before speaking stops.
    pub stop_secs: f32,
    /// Smoothed loudness (0 to 1) a window needs to count as speech.
    pub min_volume: f32,
}

impl Default for VadParams {
    fn default() -> Self {
        Self {
            confidence: 0.7,
            start_secs: 0.2,
            stop_secs: 0.2,
            min_volume: 0.6,
        }
    }
}

/// Where the speaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VadState {
    /// Silence.
    Quiet,
    /// Speech heard, not yet long enough.
    Starting,
    /// Speaking.
    Speaking,
    /// Silence heard while speaking, not yet long enough.
    Stopping,
}

/// A change of state worth telling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VadEvent {
    /// Speech heard in silence, not yet `start_secs` of it: a start may follow.
    Onset,
    /// The onset fell quiet before `start_secs`: no start (a click, a cough).
    OnsetFaded,
    /// Speech lasted `start_secs`.
    Started,
    /// Still speaking: a tick every [`SPEAKING_TICK_SECS`] of speech after the start.
    Speaking,
    /// Silence lasted `stop_secs`.
    Stopped,
}

/// Why analysis failed.
#[derive(Debug, thiserror::Error)]
pub enum VadError {
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The input rate cannot be converted.
    #[error(transparent)]
    Resample(#[from] ResampleError),
}

/// Smoothing of falling loudness between windows (weight of the newest window). Rising loudness
/// is taken at once: a symmetric average needs ~5 windows (160 ms) to lift speech over
/// `min_volume`, and that wait would add to every start and every barge-in.
const VOLUME_RELEASE: f32 = 0.2;

/// Loudness under which a window has no sound in it (its RMS under about -80 dBFS, 3 units of
/// 16-bit audio): digital silence or dither, under all but the quietest microphones' noise
/// floor, and far under any voice.
const SOUNDLESS: f32 = 0.3;

/// Seconds of speech between two [`VadEvent::Speaking`] ticks.
pub const SPEAKING_TICK_SECS: f32 = 0.2;

/// One stream's VAD: resampling to the model's rate, the model's state and the state machine.
pub struct VadAnalyzer {
    params: VadParams,
    model: Arc<SileroVad>,
    model_state: SileroState,
    resampler: StreamResampler,
    buffer: Vec<f32>,
    window: usize,
    state: VadState,
    count: u32,
    start_windows: u32,
    stop_windows: u32,
    tick_windows: u32,
    /// Speaking windows since the start or the last tick.
    since_tick: u32,
    volume: f32,
}

impl VadAnalyzer {
    /// An analyzer for mono audio at `sample_rate` (resampled to 16 kHz for the model, or used
    /// as it is at 8 or 16 kHz).
    pub fn new(
        model: Arc<SileroVad>,
        sample_rate: u32,
        params: VadParams,
    ) -> Result<Self, VadError> {
        let model_rate = if sample_rate == 8_000 { 8_000 } else { 16_000 };
        let window = window_size(model_rate);
        let windows_for =
            |secs: f32| ((secs * model_rate as f32 / window as f32).round() as u32).max(1);
        Ok(Self {
            model_state: model.new_state(model_rate),
            model,
            resampler: StreamResampler::new(sample_rate, model_rate)?,
            buffer: Vec::with_capacity(window * 2),
            window,
            state: VadState::Quiet,
            count: 0,
            start_windows: windows_for(params.start_secs),
            stop_windows: windows_for(params.stop_secs),
            tick_windows: windows_for(SPEAKING_TICK_SECS),
            since_tick: 0,
            params,
            volume: 0.0,
        })
    }

    /// The current state.
    pub fn state(&self) -> VadState {
        self.state
    }

    /// Feeds audio; returns the changes it saw, in order.
    pub fn analyze(&mut self, audio: &[i16]) -> Result<Vec<VadEvent>, VadError> {
        let mut events = Vec::new();
        for window in self.windows(audio) {
            let confidence = self.model.probability(&mut self.model_state, &window)?;
            events.extend(self.apply(confidence, &window));
        }
        Ok(events)
    }

    /// Feeds audio; returns the whole model windows it completed (at the model's rate), for a
    /// caller that runs the model itself (e.g. batched with other streams) and then calls
    /// [`apply`](Self::apply) with each window's confidence, in order.
    pub fn windows(&mut self, audio: &[i16]) -> Vec<Vec<f32>> {
        let resampled = self.resampler.process(audio);
        self.buffer
            .extend(resampled.iter().map(|&s| f32::from(s) / 32768.0));
        let windows: Vec<Vec<f32>> = self
            .buffer
            .chunks_exact(self.window)
            .map(<[f32]>::to_vec)
            .collect();
        self.buffer.drain(..windows.len() * self.window);
        windows
    }

    /// Advances the state machine by one window whose speech confidence is `confidence`.
    pub fn apply(&mut self, confidence: f32, window: &[f32]) -> Option<VadEvent> {
        let loudness = loudness(window);
        self.volume = if loudness >= self.volume {
            loudness
        } else {
            VOLUME_RELEASE * loudness + (1.0 - VOLUME_RELEASE) * self.volume
        };
        // A window with no sound in it holds no speech, whatever the model's state still says
        // (Silero's confidence can lag the voice's end by two windows).
        let sound = loudness >= SOUNDLESS;
        let speech =
            sound && confidence >= self.params.confidence && self.volume >= self.params.min_volume;
        self.step(speech)
    }

    /// The model's rate (the windows' rate).
    pub fn model_rate(&self) -> u32 {
        if self.window == window_size(8_000) {
            8_000
        } else {
            16_000
        }
    }

    /// Forces silence (the audio stopped arriving mid-speech); returns the stop, or the faded
    /// onset, that this makes.
    pub fn force_stop(&mut self) -> Option<VadEvent> {
        let event = match self.state {
            VadState::Speaking | VadState::Stopping => Some(VadEvent::Stopped),
            VadState::Starting => Some(VadEvent::OnsetFaded),
            VadState::Quiet => None,
        };
        self.state = VadState::Quiet;
        self.count = 0;
        self.buffer.clear();
        self.model_state.reset();
        event
    }

    fn step(&mut self, speech: bool) -> Option<VadEvent> {
        use VadState::*;
        self.state = match (self.state, speech) {
            (Quiet, true) => {
                self.count = 1;
                Starting
            }
            (Starting, true) | (Stopping, false) => {
                self.count += 1;
                self.state
            }
            (Starting, false) => {
                self.state = Quiet;
                return Some(VadEvent::OnsetFaded);
            }
            (Speaking, false) => {
                self.count = 1;
                Stopping
            }
            (Stopping, true) => Speaking,
            (state, _) => state,
        };
        match self.state {
            Starting if self.count >= self.start_windows => {
                self.state = Speaking;
                self.since_tick = 0;
                Some(VadEvent::Started)
            }
            Speaking => {
                self.since_tick += 1;
                (self.since_tick >= self.tick_windows).then(|| {
                    self.since_tick = 0;
                    VadEvent::Speaking
                })
            }
            Stopping if self.count >= self.stop_windows => {
                self.state = Quiet;
                Some(VadEvent::Stopped)
            }
            Starting if self.count == 1 => Some(VadEvent::Onset),
            _ => None,
        }
    }
}

/// Loudness from 0 (-20 dB) to 1 (+80 dB), in dB of the window's RMS in 16-bit units: the scale
/// pipecat's thresholds are written for, without the K-weighting (close enough for speech).
fn loudness(window: &[f32]) -> f32 {
    let power = window.iter().map(|s| s * s).sum::<f32>() / window.len().max(1) as f32;
    let db = 10.0 * (power * 32768.0 * 32768.0).max(1e-10).log10() - 0.691;
    ((db + 20.0) / 100.0).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_without_sound_is_silence_whatever_the_model_says() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        let speech: Vec<f32> = (0..512).map(|i| ((i as f32) * 0.3).sin() * 0.1).collect();
        let mut events = Vec::new();
        for _ in 0..10 {
            events.extend(vad.apply(1.0, &speech));
        }
        assert_eq!(vad.state(), VadState::Speaking, "{events:?}");
        // The model is still sure, and the loudness smoothed over windows is still high.
        assert_eq!(vad.apply(1.0, &[0.0; 512]), None);
        assert_eq!(vad.state(), VadState::Stopping);
        let quiet: Vec<f32> = (0..512)
            .map(|i| ((i as f32) * 1.7).sin() * 0.0003)
            .collect();
        assert!(loudness(&quiet) > SOUNDLESS, "a noise floor is sound");
    }

    #[test]
    fn loudness_scale_puts_speech_above_and_hiss_below_the_default_threshold() {
        let speech: Vec<f32> = (0..512).map(|i| ((i as f32) * 0.3).sin() * 0.1).collect();
        let hiss: Vec<f32> = (0..512).map(|i| ((i as f32) * 1.7).sin() * 0.001).collect();
        assert!(loudness(&speech) > 0.6, "{}", loudness(&speech));
        assert!(loudness(&hiss) < 0.6, "{}", loudness(&hiss));
        assert_eq!(loudness(&[0.0; 512]), 0.0);
    }
}
