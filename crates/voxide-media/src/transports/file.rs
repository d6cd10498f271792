//! Recorded audio as a transport: a WAV file is the user, another WAV file records the bot.
//!
//! The pieces `voxide run` (`voxide::bot::run`) is built of: the input's clock, a recorder
//! that writes the bot's audio time-aligned with the input, and the session's events as JSON
//! lines on the input's clock.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::output::AudioSink;
use crate::audio::wav::Wav;
use crate::events::SessionEvent;

/// How far the input has been fed, in microseconds of audio: the clock of a file run.
#[derive(Debug, Clone, Default)]
pub struct InputClock(Arc<AtomicU64>);

impl InputClock {
    /// The input's position.
    pub fn now(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::Relaxed))
    }

    /// Moves the input on by `by` (the feeder, after each piece).
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(
            u64::try_from(by.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// Records the bot's audio where it falls on the input's clock, with silence between.
#[derive(Clone)]
pub struct WavRecorder {
    clock: InputClock,
    recording: Arc<Mutex<Recording>>,
}

#[derive(Default)]
struct Recording {
    sample_rate: Option<u32>,
    samples: Vec<i16>,
}

impl WavRecorder {
    /// A recorder on `clock`.
    pub fn new(clock: InputClock) -> Self {
        Self {
            clock,
            recording: Arc::default(),
        }
    }

    /// What was recorded, padded with silence to `length` (`None` before any audio).
    pub fn finish(&self, length: Duration) -> Option<Wav> {
        let recording = self.recording.lock().unwrap_or_else(|p| p.into_inner());
        let rate = recording.sample_rate?;
        let mut samples = recording.samples.clone();
        let total = (length.as_secs_f64() * f64::from(rate)) as usize;
        if samples.len() < total {
            samples.resize(total, 0);
        }
        Some(Wav {
            samples,
            sample_rate: rate,
            channels: 1,
        })
    }
}

impl AudioSink for WavRecorder {
    fn write(&mut self, samples: &[i16], sample_rate: u32) {
        let mut recording = self.recording.lock().unwrap_or_else(|p| p.into_inner());
        let rate = *recording.sample_rate.get_or_insert(sample_rate);
        if rate != sample_rate {
            crate::warnings::warn(
                "recording_rate_changed",
                format_args!(
                    "bot audio changed rate ({rate} → {sample_rate} Hz); chunk not recorded"
                ),
            );
            return;
        }
        let at = (self.clock.now().as_secs_f64() * f64::from(rate)) as usize;
        if recording.samples.len() < at {
            recording.samples.resize(at, 0);
        }
        recording.samples.extend_from_slice(samples);
    }
}

/// Session events as JSON lines (`--events`): one object per line, with `type` and `t_ms`.
pub struct EventLog {
    file: tokio::io::BufWriter<tokio::fs::File>,
}

impl EventLog {
    /// Creates (or truncates) the file.
    pub async fn create(path: &Path) -> std::io::Result<Self> {
        let file = tokio::fs::File::create(path).await?;
        Ok(Self {
            file: tokio::io::BufWriter::new(file),
        })
    }

    /// Writes one event as happening `at` into the session.
    pub async fn write(&mut self, event: &SessionEvent, at: Duration) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&SessionEvent {
            elapsed: at,
            event: event.event.clone(),
        })
        .map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line).await?;
        // A reader may follow the file while the run goes on (`tail -f`).
        self.file.flush().await
    }

    /// Writes out what is buffered.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush().await
    }
}
