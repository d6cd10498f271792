//! The machine's own microphone and speaker (cpal), for `voxide local`.
//!
//! cpal streams live on one dedicated thread (they are not `Send` on every platform). The
//! microphone callback hands its samples to the session through a channel; the speaker callback
//! plays from a buffer the [`SpeakerSink`] fills and an interruption empties.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use cpal::{Device, SampleFormat, StreamConfig};
use tokio::sync::mpsc;

use super::output::AudioSink;

/// Why the audio devices could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LocalAudioError {
    /// No such device, or none at all.
    #[error("no audio {direction} device{named}: {hint}")]
    NoDevice {
        /// `input` or `output`.
        direction: &'static str,
        /// ` named "…"` when one was asked for.
        named: String,
        /// What to do about it.
        hint: String,
    },
    /// The device refused the stream.
    #[error("the audio {direction} device {device:?} cannot be opened: {reason}")]
    Device {
        /// `input` or `output`.
        direction: &'static str,
        /// Its name.
        device: String,
        /// What cpal said.
        reason: String,
    },
}

/// One device, for `--list-devices`.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Its name, as `--input-device` / `--output-device` take it.
    pub name: String,
    /// It records.
    pub input: bool,
    /// It plays.
    pub output: bool,
    /// The host's default for recording.
    pub default_input: bool,
    /// The host's default for playing.
    pub default_output: bool,
}

/// Every device of the default host.
pub fn list_devices() -> Result<Vec<DeviceInfo>, LocalAudioError> {
    let host = cpal::default_host();
    let default_in = host.default_input_device().map(|d| d.to_string());
    let default_out = host.default_output_device().map(|d| d.to_string());
    let devices = host.devices().map_err(|e| LocalAudioError::NoDevice {
        direction: "input or output",
        named: String::new(),
        hint: e.to_string(),
    })?;
    Ok(devices
        .map(|d| {
            let name = d.to_string();
            DeviceInfo {
                input: d.supports_input(),
                output: d.supports_output(),
                default_input: default_in.as_deref() == Some(&name),
                default_output: default_out.as_deref() == Some(&name),
                name,
            }
        })
        .collect())
}

/// Audio from the microphone: mono samples at `sample_rate`.
pub struct Microphone {
    /// Chunks as the device delivers them.
    pub chunks: mpsc::UnboundedReceiver<Vec<i16>>,
    /// Their rate.
    pub sample_rate: u32,
}

/// Where the bot's voice goes: the speaker's buffer.
#[derive(Clone)]
pub struct SpeakerSink {
    buffer: Arc<Mutex<VecDeque<i16>>>,
    sample_rate: u32,
}

impl SpeakerSink {
    /// The rate the speaker plays at: the pipeline's output rate should be this.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }
}

impl AudioSink for SpeakerSink {
    fn write(&mut self, samples: &[i16], sample_rate: u32) {
        if sample_rate != self.sample_rate {
            tracing::warn!(
                sample_rate,
                speaker = self.sample_rate,
                "bot audio at the wrong rate; dropped"
            );
            return;
        }
        self.buffer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(samples);
    }

    fn clear(&mut self) {
        self.buffer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// The open devices; dropping it closes them.
pub struct LocalAudio {
    /// The microphone's audio.
    pub microphone: Microphone,
    /// The speaker.
    pub speaker: SpeakerSink,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LocalAudio {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn find(host: &cpal::Host, name: Option<&str>, input: bool) -> Result<Device, LocalAudioError> {
    let direction = if input { "input" } else { "output" };
    let none = |hint: String| LocalAudioError::NoDevice {
        direction,
        named: name.map(|n| format!(" named {n:?}")).unwrap_or_default(),
        hint,
    };
    let device = match name {
        Some(name) => {
            let devices = if input {
                host.input_devices().map(|d| d.collect::<Vec<_>>())
            } else {
                host.output_devices().map(|d| d.collect::<Vec<_>>())
            }
            .map_err(|e| none(e.to_string()))?;
            devices.into_iter().find(|d| d.to_string() == name)
        }
        None if input => host.default_input_device(),
        None => host.default_output_device(),
    };
    let device = device.ok_or_else(|| {
        none("see `voxide local --list-devices` for what this machine has".into())
    })?;
    // ALSA lists a "null" device on machines without a sound card: it neither records nor
    // keeps time, so it is no device at all.
    if device.to_string() == "null" {
        return Err(none(
            "this machine has no sound card (only ALSA's null device)".into(),
        ));
    }
    Ok(device)
}

fn open_error(direction: &'static str, device: &Device, e: impl ToString) -> LocalAudioError {
    LocalAudioError::Device {
        direction,
        device: device.to_string(),
        reason: e.to_string(),
    }
}

/// Opens the named devices (or the defaults) and starts both streams.
pub fn open(input: Option<&str>, output: Option<&str>) -> Result<LocalAudio, LocalAudioError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (input, output) = (input.map(str::to_owned), output.map(str::to_owned));
    let thread = std::thread::Builder::new()
        .name("voxide-audio".into())
        .spawn(move || {
            let host = cpal::default_host();
            let opened = (|| {
                let mic = find(&host, input.as_deref(), true)?;
                let speaker = find(&host, output.as_deref(), false)?;
                let (chunks_tx, chunks) = mpsc::unbounded_channel();
                let (in_stream, in_rate) = start_input(&mic, chunks_tx)?;
                let buffer = Arc::new(Mutex::new(VecDeque::new()));
                let (out_stream, out_rate) = start_output(&speaker, buffer.clone())?;
                Ok((in_stream, out_stream, chunks, in_rate, buffer, out_rate))
            })();
            match opened {
                Ok((in_stream, out_stream, chunks, in_rate, buffer, out_rate)) => {
                    let _ = ready_tx.send(Ok((chunks, in_rate, buffer, out_rate)));
                    // Keep the streams alive until the owner is dropped.
                    let _ = stop_rx.recv();
                    drop((in_stream, out_stream));
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| LocalAudioError::NoDevice {
            direction: "input or output",
            named: String::new(),
            hint: format!("cannot start the audio thread: {e}"),
        })?;
    let (chunks, in_rate, buffer, out_rate) =
        ready_rx.recv().map_err(|_| LocalAudioError::NoDevice {
            direction: "input or output",
            named: String::new(),
            hint: "the audio thread stopped".into(),
        })??;
    Ok(LocalAudio {
        microphone: Microphone {
            chunks,
            sample_rate: in_rate,
        },
        speaker: SpeakerSink {
            buffer,
            sample_rate: out_rate,
        },
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

fn start_input(
    device: &Device,
    tx: mpsc::UnboundedSender<Vec<i16>>,
) -> Result<(cpal::Stream, u32), LocalAudioError> {
    let supported = device
        .default_input_config()
        .map_err(|e| open_error("input", device, e))?;
    let config: StreamConfig = supported.config();
    let channels = usize::from(config.channels.max(1));
    let err = |e: cpal::Error| tracing::warn!(error = %e, "microphone stream error");
    let stream = match supported.sample_format() {
        SampleFormat::F32 => device.build_input_stream(
            config,
            move |data: &[f32], _: &_| {
                let mono = data
                    .chunks(channels)
                    .map(|frame| (frame[0].clamp(-1.0, 1.0) * 32767.0) as i16)
                    .collect();
                let _ = tx.send(mono);
            },
            err,
            None,
        ),
        SampleFormat::I16 => device.build_input_stream(
            config,
            move |data: &[i16], _: &_| {
                let _ = tx.send(data.chunks(channels).map(|frame| frame[0]).collect());
            },
            err,
            None,
        ),
        other => {
            return Err(open_error(
                "input",
                device,
                format!("sample format {other:?} (voxide takes f32 or i16)"),
            ));
        }
    }
    .map_err(|e| open_error("input", device, e))?;
    stream.play().map_err(|e| open_error("input", device, e))?;
    Ok((stream, config.sample_rate))
}

fn start_output(
    device: &Device,
    buffer: Arc<Mutex<VecDeque<i16>>>,
) -> Result<(cpal::Stream, u32), LocalAudioError> {
    let supported = device
        .default_output_config()
        .map_err(|e| open_error("output", device, e))?;
    let config: StreamConfig = supported.config();
    let channels = usize::from(config.channels.max(1));
    let err = |e: cpal::Error| tracing::warn!(error = %e, "speaker stream error");
    // The callback never waits: whatever the bot has not said yet plays as silence.
    let next = move |frames: usize| -> Vec<i16> {
        let mut buffer = buffer.lock().unwrap_or_else(|p| p.into_inner());
        let take = frames.min(buffer.len());
        let mut out: Vec<i16> = buffer.drain(..take).collect();
        out.resize(frames, 0);
        out
    };
    let stream = match supported.sample_format() {
        SampleFormat::F32 => device.build_output_stream(
            config,
            move |data: &mut [f32], _: &_| {
                let samples = next(data.len() / channels);
                for (frame, s) in data.chunks_mut(channels).zip(samples) {
                    frame.fill(f32::from(s) / 32768.0);
                }
            },
            err,
            None,
        ),
        SampleFormat::I16 => device.build_output_stream(
            config,
            move |data: &mut [i16], _: &_| {
                let samples = next(data.len() / channels);
                for (frame, s) in data.chunks_mut(channels).zip(samples) {
                    frame.fill(s);
                }
            },
            err,
            None,
        ),
        other => {
            return Err(open_error(
                "output",
                device,
                format!("sample format {other:?} (voxide plays f32 or i16)"),
            ));
        }
    }
    .map_err(|e| open_error("output", device, e))?;
    stream.play().map_err(|e| open_error("output", device, e))?;
    Ok((stream, config.sample_rate))
}
