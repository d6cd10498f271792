//! The machine's own microphone and speaker (cpal), for `voxide local`.
//!
//! cpal streams live on one dedicated thread (they are not `Send` on every platform). The
//! microphone callback hands its samples to the session through a bounded channel; the speaker
//! callback plays from a buffer the [`SpeakerSink`] fills and an interruption empties.
//!
//! A device is opened at its default configuration, or, when the device refuses that, at the
//! first one it lists that works (any sample format, mixed down or spread to mono). Errors that
//! a device reports on every callback are counted, not logged each time ([`crate::warnings`]);
//! a device that goes away is a [`DeviceLost`] for the session to end on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use cpal::{
    Device, FromSample, SampleFormat, SizedSample, StreamConfig, SupportedStreamConfig,
    SupportedStreamConfigRange,
};
use tokio::sync::mpsc;

use super::output::AudioSink;
use crate::audio::echo::EchoReference;

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

/// Microphone chunks the session may fall behind by before new ones are dropped (and counted):
/// about a second at the usual 10-20 ms callbacks.
pub const MICROPHONE_QUEUE: usize = 64;

/// Audio from the microphone: mono samples at `sample_rate`.
pub struct Microphone {
    /// Chunks as the device delivers them, once [`listen`](Self::listen) was called.
    pub chunks: mpsc::Receiver<Vec<i16>>,
    /// Their rate.
    pub sample_rate: u32,
    /// Off until the session is there to take the chunks: the device opens first, so a bad
    /// one fails fast, and what it records while the models load is nobody's to hear.
    listening: Arc<AtomicBool>,
}

impl Microphone {
    /// Starts handing over what the microphone records.
    pub fn listen(&self) {
        self.listening.store(true, Ordering::Release);
    }
}

/// A device stopped working mid-session (unplugged, or its sound server went away).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audio {direction} device {device:?} went away: {reason}")]
pub struct DeviceLost {
    /// `input` or `output`.
    pub direction: &'static str,
    /// Its name.
    pub device: String,
    /// What the backend said.
    pub reason: String,
}

/// Where the bot's voice goes: the speaker's buffer.
#[derive(Clone)]
pub struct SpeakerSink {
    buffer: Arc<Mutex<VecDeque<i16>>>,
    sample_rate: u32,
    /// Where the speaker's callback records what it plays, for the echo canceller.
    played: Arc<Mutex<Option<EchoReference>>>,
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
            crate::warnings::warn(
                "speaker_rate",
                format_args!(
                    "bot audio at {sample_rate} Hz, the speaker plays {} Hz; dropped",
                    self.sample_rate
                ),
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

    fn record_playback(&mut self, reference: &EchoReference) -> bool {
        *self.played.lock().unwrap_or_else(|p| p.into_inner()) = Some(reference.clone());
        true
    }
}

/// How long a stream may go without a callback before its device counts as gone: a stream
/// delivers (or asks for) audio every few ms, silence included, while its device lives.
pub const STALL: Duration = Duration::from_secs(2);

/// When a stream's callback last ran, for [`LocalAudio::stalled`].
#[derive(Debug, Clone)]
struct Heartbeat {
    origin: Instant,
    /// Milliseconds after `origin`.
    last_ms: Arc<AtomicU64>,
}

impl Heartbeat {
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn beat(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How long since the last beat (or since the start, before any), at `now`.
    fn silent_for(&self, now: Instant) -> Duration {
        let last = self.origin + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(last)
    }
}

/// The open devices; dropping it closes them.
pub struct LocalAudio {
    /// The microphone's audio.
    pub microphone: Microphone,
    /// The speaker.
    pub speaker: SpeakerSink,
    /// Devices that went away.
    pub lost: mpsc::UnboundedReceiver<DeviceLost>,
    /// The configurations the devices run at, for the log.
    pub description: String,
    /// The microphone's and the speaker's callbacks.
    beats: [(&'static str, String, Heartbeat); 2],
    /// Closes the streams when dropped; the receiver hears when they are closed.
    stop: Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LocalAudio {
    /// A device whose stream has not called back for [`STALL`] at `now`: its sound server
    /// died, or it went away without the backend saying so (ALSA's pulse plugin reports only
    /// I/O errors then).
    pub fn stalled(&self, now: Instant) -> Option<DeviceLost> {
        self.beats.iter().find_map(|(direction, device, beat)| {
            let silent = beat.silent_for(now);
            (silent >= STALL).then(|| DeviceLost {
                direction,
                device: device.clone(),
                reason: format!("its stream has not run for {:.1} s", silent.as_secs_f64()),
            })
        })
    }
}

/// How long closing the streams may take. A backend whose server died can block in its close
/// for good (ALSA's pulse plugin does): the streams' thread is then left behind, and ends with
/// the process.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

impl Drop for LocalAudio {
    fn drop(&mut self) {
        let Some((stop, closed)) = self.stop.take() else {
            return;
        };
        drop(stop);
        if closed.recv_timeout(CLOSE_TIMEOUT).is_ok() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        } else {
            tracing::warn!("the audio devices did not close within {CLOSE_TIMEOUT:?}; left open");
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

/// What the audio thread hands back once both streams run.
type Opened = (
    Microphone,
    SpeakerSink,
    mpsc::UnboundedReceiver<DeviceLost>,
    String,
    [(&'static str, String, Heartbeat); 2],
);

/// Finds the devices and starts both streams (on the audio thread: cpal's streams stay there).
fn open_streams(
    input: Option<&str>,
    output: Option<&str>,
) -> Result<(cpal::Stream, cpal::Stream, Opened), LocalAudioError> {
    let host = cpal::default_host();
    let mic = find(&host, input, true)?;
    let speaker = find(&host, output, false)?;
    let (lost_tx, lost) = mpsc::unbounded_channel();
    let (chunks_tx, chunks) = mpsc::channel(MICROPHONE_QUEUE);
    let listening = Arc::new(AtomicBool::new(false));
    let (mic_beat, speaker_beat) = (Heartbeat::new(), Heartbeat::new());
    let input = Input {
        tx: chunks_tx,
        listening: listening.clone(),
        beat: mic_beat.clone(),
    };
    let (in_stream, in_config) = start_input(&mic, input, lost_tx.clone())?;
    let buffer = Arc::new(Mutex::new(VecDeque::new()));
    let played = Arc::new(Mutex::new(None));
    let (out_stream, out_config) = start_output(
        &speaker,
        buffer.clone(),
        played.clone(),
        speaker_beat.clone(),
        lost_tx,
    )?;
    let beats = [
        ("input", mic.to_string(), mic_beat),
        ("output", speaker.to_string(), speaker_beat),
    ];
    let description = format!(
        "{} host; microphone {:?} at {}; speaker {:?} at {}",
        host.id().name(),
        mic.to_string(),
        describe(&in_config),
        speaker.to_string(),
        describe(&out_config),
    );
    let speaker = SpeakerSink {
        buffer,
        sample_rate: out_config.sample_rate(),
        played,
    };
    let microphone = Microphone {
        chunks,
        sample_rate: in_config.sample_rate(),
        listening,
    };
    let audio = (microphone, speaker, lost, description, beats);
    Ok((in_stream, out_stream, audio))
}

/// Opens the named devices (or the defaults) and starts both streams.
pub fn open(input: Option<&str>, output: Option<&str>) -> Result<LocalAudio, LocalAudioError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (closed_tx, closed_rx) = std::sync::mpsc::channel::<()>();
    let (input, output) = (input.map(str::to_owned), output.map(str::to_owned));
    let thread = std::thread::Builder::new()
        .name("voxide-audio".into())
        .spawn(move || {
            let opened = open_streams(input.as_deref(), output.as_deref());
            match opened {
                Ok((in_stream, out_stream, audio)) => {
                    let _ = ready_tx.send(Ok(audio));
                    // Keep the streams alive until the owner is dropped.
                    let _ = stop_rx.recv();
                    drop((in_stream, out_stream));
                    let _ = closed_tx.send(());
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
    let (microphone, speaker, lost, description, beats) =
        ready_rx.recv().map_err(|_| LocalAudioError::NoDevice {
            direction: "input or output",
            named: String::new(),
            hint: "the audio thread stopped".into(),
        })??;
    Ok(LocalAudio {
        microphone,
        speaker,
        lost,
        description,
        beats,
        stop: Some((stop_tx, closed_rx)),
        thread: Some(thread),
    })
}

fn describe(config: &SupportedStreamConfig) -> String {
    format!(
        "{} Hz, {} channel(s), {:?}",
        config.sample_rate(),
        config.channels(),
        config.sample_format()
    )
}

/// The rates worth asking a device for when its default does not work, best first.
const FALLBACK_RATES: [u32; 5] = [48_000, 44_100, 32_000, 24_000, 16_000];

/// The configurations to try, in order: the device's default, then what it lists, each at the
/// best rate it allows, fewest channels and formats voxide converts best first.
fn candidates(
    default: Option<SupportedStreamConfig>,
    mut listed: Vec<SupportedStreamConfigRange>,
) -> Vec<SupportedStreamConfig> {
    let format_rank = |f: SampleFormat| match f {
        SampleFormat::F32 => 0,
        SampleFormat::I16 => 1,
        _ => 2,
    };
    listed.sort_by_key(|r| (r.channels(), format_rank(r.sample_format())));
    let mut out: Vec<SupportedStreamConfig> = default.into_iter().collect();
    for range in listed {
        if !converts(range.sample_format()) {
            continue;
        }
        let rate = FALLBACK_RATES
            .iter()
            .copied()
            .find(|&r| range.min_sample_rate() <= r && r <= range.max_sample_rate())
            .unwrap_or_else(|| range.max_sample_rate());
        if let Some(config) = range.try_with_sample_rate(rate)
            && !out.contains(&config)
        {
            out.push(config);
        }
    }
    out
}

/// `$body` with `$t` the sample type of `$format`, for every format voxide converts (see
/// [`converts`]); any other is an error.
macro_rules! by_format {
    ($format:expr, |$t:ident| $body:expr) => {
        match $format {
            SampleFormat::I8 => {
                type $t = i8;
                $body
            }
            SampleFormat::I16 => {
                type $t = i16;
                $body
            }
            SampleFormat::I32 => {
                type $t = i32;
                $body
            }
            SampleFormat::U8 => {
                type $t = u8;
                $body
            }
            SampleFormat::U16 => {
                type $t = u16;
                $body
            }
            SampleFormat::U32 => {
                type $t = u32;
                $body
            }
            SampleFormat::F32 => {
                type $t = f32;
                $body
            }
            SampleFormat::F64 => {
                type $t = f64;
                $body
            }
            other => Err(format!("sample format {other:?} is not supported")),
        }
    };
}

/// Whether voxide converts this sample format.
fn converts(format: SampleFormat) -> bool {
    matches!(
        format,
        SampleFormat::I8
            | SampleFormat::I16
            | SampleFormat::I32
            | SampleFormat::U8
            | SampleFormat::U16
            | SampleFormat::U32
            | SampleFormat::F32
            | SampleFormat::F64
    )
}

/// Tries each candidate configuration until a stream builds and plays.
fn start_first<F>(
    direction: &'static str,
    device: &Device,
    candidates: Vec<SupportedStreamConfig>,
    mut build: F,
) -> Result<(cpal::Stream, SupportedStreamConfig), LocalAudioError>
where
    F: FnMut(&SupportedStreamConfig) -> Result<cpal::Stream, String>,
{
    let mut refused = Vec::new();
    for config in candidates {
        let started = build(&config).and_then(|stream| {
            stream.play().map_err(|e| e.to_string())?;
            Ok(stream)
        });
        match started {
            Ok(stream) => {
                if !refused.is_empty() {
                    tracing::info!(
                        direction,
                        device = %device,
                        config = describe(&config),
                        "the default configuration did not work; using this one"
                    );
                }
                return Ok((stream, config));
            }
            Err(e) => refused.push(format!("{}: {e}", describe(&config))),
        }
    }
    Err(LocalAudioError::Device {
        direction,
        device: device.to_string(),
        reason: if refused.is_empty() {
            "it offers no configuration voxide can use".into()
        } else {
            format!("no configuration worked ({})", refused.join("; "))
        },
    })
}

/// The error callback of one stream: a device that went away is reported once; other errors
/// (some backends fail a timing query on every callback) are counted.
fn on_error(
    direction: &'static str,
    device: &Device,
    lost: mpsc::UnboundedSender<DeviceLost>,
) -> impl FnMut(cpal::Error) + Send + 'static {
    let name = device.to_string();
    let kind = if direction == "input" {
        "microphone_stream_error"
    } else {
        "speaker_stream_error"
    };
    let mut reported = false;
    move |e: cpal::Error| {
        if matches!(
            e.kind(),
            cpal::ErrorKind::DeviceNotAvailable | cpal::ErrorKind::HostUnavailable
        ) {
            if !reported {
                reported = true;
                let _ = lost.send(DeviceLost {
                    direction,
                    device: name.clone(),
                    reason: e.to_string(),
                });
            }
        } else {
            crate::warnings::warn(
                kind,
                format_args!("{direction} stream error on {name:?}: {e}"),
            );
        }
    }
}

/// The microphone callback's side: where its chunks go, whether anyone listens yet, its beat.
#[derive(Clone)]
struct Input {
    tx: mpsc::Sender<Vec<i16>>,
    listening: Arc<AtomicBool>,
    beat: Heartbeat,
}

fn start_input(
    device: &Device,
    input: Input,
    lost: mpsc::UnboundedSender<DeviceLost>,
) -> Result<(cpal::Stream, SupportedStreamConfig), LocalAudioError> {
    let listed = device
        .supported_input_configs()
        .map(Iterator::collect)
        .unwrap_or_default();
    let candidates = candidates(device.default_input_config().ok(), listed);
    start_first("input", device, candidates, |config| {
        let format = config.sample_format();
        let channels = usize::from(config.channels().max(1));
        let (input, err) = (input.clone(), on_error("input", device, lost.clone()));
        let stream_config = config.config();
        by_format!(format, |T| build_input::<T>(
            device,
            stream_config,
            channels,
            input,
            err
        ))
    })
}

fn build_input<T>(
    device: &Device,
    config: StreamConfig,
    channels: usize,
    input: Input,
    err: impl FnMut(cpal::Error) + Send + 'static,
) -> Result<cpal::Stream, String>
where
    T: SizedSample,
    f32: FromSample<T>,
{
    device
        .build_input_stream(
            config,
            move |data: &[T], _: &_| {
                input.beat.beat();
                if !input.listening.load(Ordering::Acquire) {
                    return;
                }
                let mono = data
                    .chunks(channels)
                    .map(|frame| {
                        let sum: f32 = frame.iter().map(|s| s.to_sample::<f32>()).sum();
                        to_i16(sum / frame.len() as f32)
                    })
                    .collect();
                if input.tx.try_send(mono).is_err() {
                    crate::warnings::warn(
                        "microphone_queue_full",
                        "the session fell behind the microphone; a chunk was dropped",
                    );
                }
            },
            err,
            None,
        )
        .map_err(|e| e.to_string())
}

fn to_i16(v: f32) -> i16 {
    (v.clamp(-1.0, 1.0) * 32_767.0) as i16
}

fn start_output(
    device: &Device,
    buffer: Arc<Mutex<VecDeque<i16>>>,
    played: Arc<Mutex<Option<EchoReference>>>,
    beat: Heartbeat,
    lost: mpsc::UnboundedSender<DeviceLost>,
) -> Result<(cpal::Stream, SupportedStreamConfig), LocalAudioError> {
    let listed = device
        .supported_output_configs()
        .map(Iterator::collect)
        .unwrap_or_default();
    let candidates = candidates(device.default_output_config().ok(), listed);
    start_first("output", device, candidates, |config| {
        let format = config.sample_format();
        let channels = usize::from(config.channels().max(1));
        let err = on_error("output", device, lost.clone());
        let playback = Playback {
            buffer: buffer.clone(),
            reference: played.clone(),
            rate: config.sample_rate(),
            frame: Vec::new(),
            beat: beat.clone(),
        };
        let stream_config = config.config();
        by_format!(format, |T| build_output::<T>(
            device,
            stream_config,
            channels,
            playback,
            err
        ))
    })
}

/// The speaker callback's side: the bot's queued voice in, what was played recorded.
struct Playback {
    buffer: Arc<Mutex<VecDeque<i16>>>,
    reference: Arc<Mutex<Option<EchoReference>>>,
    rate: u32,
    /// The samples of one callback, reused.
    frame: Vec<i16>,
    beat: Heartbeat,
}

impl Playback {
    /// The next `frames` samples to play; whatever the bot has not said yet plays as silence.
    /// The callback never waits on the session.
    fn next(&mut self, frames: usize) -> &[i16] {
        self.beat.beat();
        self.frame.clear();
        {
            let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
            let take = frames.min(buffer.len());
            self.frame.extend(buffer.drain(..take));
        }
        self.frame.resize(frames, 0);
        if let Some(reference) = &*self.reference.lock().unwrap_or_else(|p| p.into_inner()) {
            reference.played(&self.frame, self.rate);
        }
        &self.frame
    }
}

fn build_output<T>(
    device: &Device,
    config: StreamConfig,
    channels: usize,
    mut playback: Playback,
    err: impl FnMut(cpal::Error) + Send + 'static,
) -> Result<cpal::Stream, String>
where
    T: SizedSample + FromSample<f32>,
{
    device
        .build_output_stream(
            config,
            move |data: &mut [T], _: &_| {
                let samples = playback.next(data.len() / channels);
                for (frame, &s) in data.chunks_mut(channels).zip(samples) {
                    frame.fill(T::from_sample(f32::from(s) / 32_768.0));
                }
            },
            err,
            None,
        )
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpal::{Sample, SupportedBufferSize};

    fn range(
        channels: u16,
        min: u32,
        max: u32,
        format: SampleFormat,
    ) -> SupportedStreamConfigRange {
        SupportedStreamConfigRange::new(channels, min, max, SupportedBufferSize::Unknown, format)
    }

    #[test]
    fn the_default_configuration_is_tried_first_then_what_the_device_lists() {
        let default = range(2, 44_100, 44_100, SampleFormat::I16).with_sample_rate(44_100);
        let listed = vec![
            range(2, 8_000, 192_000, SampleFormat::I32),
            range(1, 8_000, 192_000, SampleFormat::F32),
            range(2, 44_100, 44_100, SampleFormat::I16),
        ];
        let tried = candidates(Some(default), listed);
        assert_eq!(tried[0], default);
        // Mono first, at the best rate each range allows; the default is not tried twice.
        assert_eq!(tried[1].channels(), 1);
        assert_eq!(tried[1].sample_rate(), 48_000);
        assert_eq!(tried[1].sample_format(), SampleFormat::F32);
        assert_eq!(tried[2].sample_format(), SampleFormat::I32);
        assert_eq!(tried.len(), 3);
    }

    #[test]
    fn a_device_without_a_default_is_tried_at_what_it_lists_odd_rates_included() {
        let tried = candidates(None, vec![range(1, 8_000, 8_000, SampleFormat::U8)]);
        assert_eq!(tried.len(), 1);
        assert_eq!(tried[0].sample_rate(), 8_000);
        assert!(candidates(None, Vec::new()).is_empty());
    }

    #[test]
    fn a_stream_that_stops_calling_back_counts_as_stalled_after_a_while() {
        let beat = Heartbeat::new();
        let t0 = beat.origin;
        beat.beat();
        assert!(beat.silent_for(t0 + Duration::from_secs(1)) < STALL);
        assert!(beat.silent_for(t0 + Duration::from_secs(3)) >= STALL);
    }

    #[test]
    fn samples_convert_from_any_format_to_voxides() {
        assert_eq!(to_i16(1.5), 32_767);
        assert_eq!(to_i16(-1.0), -32_767);
        assert_eq!(to_i16(0u8.to_sample::<f32>()), -32_767);
        assert_eq!(to_i16(i32::MAX.to_sample::<f32>()), 32_767);
        assert_eq!(u16::from_sample(0.0f32), 32_768);
    }
}
