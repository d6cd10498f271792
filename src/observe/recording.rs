//! A session's audio as one stereo WAV file: the user on the left, the bot on the right, on
//! the session's clock.
//!
//! The user's audio is taken as it reaches the pipeline ([`UserTap`], an observer), the bot's
//! as it is played ([`BotTap`], around the transport's sink); each chunk is stamped with the
//! recording's clock and handed to the writer's thread through a bounded queue, so a slow or
//! full disk costs the recording chunks, never the call its audio. The writer ([`Stereo`],
//! sans-IO) places each chunk at its time: a gap is silence, and a channel that has nothing
//! is filled with silence up to a second behind the latest chunk of the other, so the file is
//! written as the call goes and holds little in memory.

use std::collections::VecDeque;
use std::io::{BufWriter, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::audio::AudioSink;
use crate::audio::resample::StreamResampler;
use crate::frames::{FrameBody, SystemFrame};
use crate::pipeline::{FramePushed, Observer};

/// The file's rate: speech, both sides.
pub const RECORDING_RATE: u32 = 16_000;
/// Chunks the writer may fall behind by before new ones are dropped (about five seconds of
/// both sides in 20 ms chunks).
const QUEUE: usize = 512;
/// How often the writer takes the chunks queued.
const WRITE_EVERY: Duration = Duration::from_millis(200);
/// How far behind the latest chunk a silent channel is filled in: later audio for it is
/// placed after that.
const LAG: Duration = Duration::from_secs(1);
/// A chunk this much later than where its channel ends leaves a gap of silence; less is
/// the jitter of its arrival, and it follows on.
const GAP: Duration = Duration::from_millis(60);

/// Which side of the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The user: the left channel.
    User,
    /// The bot: the right channel.
    Bot,
}

/// A piece of one side's audio and when it started, on the recording's clock.
#[derive(Debug)]
pub struct Chunk {
    /// Whose.
    pub side: Side,
    /// When its first sample was heard.
    pub at: Duration,
    /// Mono samples.
    pub samples: Vec<i16>,
    /// Their rate.
    pub sample_rate: u32,
}

/// One side of the call: its audio, resampled to the file's rate, waiting to be written.
struct Track {
    /// The resampler for the rate the audio comes at (`None` before any audio).
    resampler: Option<(u32, StreamResampler)>,
    /// Where the audio fed so far ends, on the recording's clock.
    end: Duration,
    /// Resampled output the resampler's delay still owes the start of the track.
    skip: usize,
    /// Resampled samples not yet written.
    ready: VecDeque<i16>,
}

impl Track {
    fn new() -> Self {
        Self {
            resampler: None,
            end: Duration::ZERO,
            skip: 0,
            ready: VecDeque::new(),
        }
    }

    fn rate(&self) -> u32 {
        self.resampler
            .as_ref()
            .map_or(RECORDING_RATE, |(rate, _)| *rate)
    }

    /// Takes audio that started at `at`.
    fn feed(&mut self, at: Duration, samples: &[i16], rate: u32) {
        if self.resampler.as_ref().is_none_or(|(r, _)| *r != rate) {
            match StreamResampler::new(rate, RECORDING_RATE) {
                Ok(resampler) => {
                    self.skip += resampler.delay();
                    self.resampler = Some((rate, resampler));
                }
                Err(_) => return,
            }
        }
        if at > self.end + GAP {
            self.silence_to(at);
        }
        self.push(samples);
    }

    /// Fills with silence up to `t`.
    fn silence_to(&mut self, t: Duration) {
        let rate = self.rate();
        let missing = t.saturating_sub(self.end);
        let mut samples = (missing.as_secs_f64() * f64::from(rate)).round() as usize;
        let zeros = vec![0i16; rate as usize];
        while samples > 0 {
            let n = samples.min(zeros.len());
            self.push(&zeros[..n]);
            samples -= n;
        }
        self.end = self.end.max(t);
    }

    fn push(&mut self, samples: &[i16]) {
        let rate = self.rate();
        self.end += Duration::from_secs_f64(samples.len() as f64 / f64::from(rate));
        let out = match &mut self.resampler {
            Some((_, resampler)) => resampler.process(samples),
            None => samples.to_vec(),
        };
        let skipped = self.skip.min(out.len());
        self.skip -= skipped;
        self.ready.extend(&out[skipped..]);
    }
}

/// The stereo file as it is written: two tracks, interleaved as far as both are known.
pub struct Stereo<W: Write + Seek> {
    user: Track,
    bot: Track,
    /// The latest moment any chunk reached.
    latest: Duration,
    out: hound::WavWriter<W>,
}

impl<W: Write + Seek> Stereo<W> {
    /// A recording into `out`.
    pub fn new(out: W) -> Result<Self, hound::Error> {
        let spec = hound::WavSpec {
            channels: 2,
            sample_rate: RECORDING_RATE,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        Ok(Self {
            user: Track::new(),
            bot: Track::new(),
            latest: Duration::ZERO,
            out: hound::WavWriter::new(out, spec)?,
        })
    }

    /// Places `chunk` and writes what both sides now have.
    pub fn add(&mut self, chunk: &Chunk) -> Result<(), hound::Error> {
        let track = match chunk.side {
            Side::User => &mut self.user,
            Side::Bot => &mut self.bot,
        };
        track.feed(chunk.at, &chunk.samples, chunk.sample_rate);
        self.latest = self.latest.max(track.end);
        let horizon = self.latest.saturating_sub(LAG);
        for track in [&mut self.user, &mut self.bot] {
            if track.end < horizon {
                track.silence_to(horizon);
            }
        }
        self.write(false)
    }

    /// Writes the rest, the shorter side padded with silence, and finishes the file.
    pub fn finish(mut self) -> Result<(), hound::Error> {
        self.write(true)?;
        self.out.finalize()
    }

    fn write(&mut self, all: bool) -> Result<(), hound::Error> {
        let both = self.user.ready.len().min(self.bot.ready.len());
        let frames = if all {
            self.user.ready.len().max(self.bot.ready.len())
        } else {
            both
        };
        let mut writer = self
            .out
            .get_i16_writer(u32::try_from(frames * 2).unwrap_or(0));
        for _ in 0..frames {
            writer.write_sample(self.user.ready.pop_front().unwrap_or(0));
            writer.write_sample(self.bot.ready.pop_front().unwrap_or(0));
        }
        writer.flush()
    }
}

/// A session's recording: where its audio goes, and what it lost.
#[derive(Clone)]
pub struct Recorder {
    /// The recording's clock: the session's, once it starts ([`Recorder::start_clock`]).
    started: Arc<OnceLock<Instant>>,
    chunks: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
}

/// What the writer's thread is told.
enum Message {
    Chunk(Chunk),
    /// The session is over: finish the file.
    Finish,
}

impl Recorder {
    /// Starts recording into `path` (created or truncated) on a thread of its own, which
    /// finishes the file when [`RecordingDone::wait`] asks it to.
    pub fn create(path: &Path) -> std::io::Result<(Self, RecordingDone)> {
        let file = std::fs::File::create(path)?;
        let stereo = Stereo::new(BufWriter::new(file)).map_err(std::io::Error::other)?;
        let (chunks, inbox) = std::sync::mpsc::sync_channel(QUEUE);
        let (failed, failure) = tokio::sync::oneshot::channel();
        let path = path.to_owned();
        let thread = std::thread::Builder::new()
            .name("voxide-recorder".into())
            .spawn(move || write_all(stereo, inbox, failed))?;
        Ok((
            Self {
                started: Arc::default(),
                chunks: chunks.clone(),
                dropped: Arc::default(),
            },
            RecordingDone {
                thread,
                path,
                finish: chunks,
                failure: Some(failure),
            },
        ))
    }

    /// Starts the recording's clock: call it as the session starts, so the file and the
    /// session's events share a clock.
    pub fn start_clock(&self) {
        let _ = self.started.set(Instant::now());
    }

    fn elapsed(&self) -> Duration {
        self.started.get().map_or(Duration::ZERO, Instant::elapsed)
    }

    /// Chunks lost so far: the writer fell behind, or failed.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The tap for the user's audio, to observe the session with.
    pub fn user_tap(&self) -> UserTap {
        UserTap(self.clone())
    }

    /// The bot's sink, recording what it plays.
    pub fn bot_tap<S: AudioSink>(&self, sink: S) -> BotTap<S> {
        BotTap {
            sink,
            recorder: self.clone(),
        }
    }

    fn take(&self, side: Side, at: Duration, samples: &[i16], sample_rate: u32) {
        let chunk = Chunk {
            side,
            at,
            samples: samples.to_vec(),
            sample_rate,
        };
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.chunks.try_send(Message::Chunk(chunk))
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The writer's thread; joining it says whether the file was written.
pub struct RecordingDone {
    thread: std::thread::JoinHandle<Result<(), hound::Error>>,
    path: PathBuf,
    finish: SyncSender<Message>,
    failure: Option<tokio::sync::oneshot::Receiver<String>>,
}

impl RecordingDone {
    /// Says why, as soon as the file cannot be written any more (the call goes on).
    pub fn failure(&mut self) -> Option<tokio::sync::oneshot::Receiver<String>> {
        self.failure.take()
    }

    /// Waits (on a blocking thread) for the file to be finished.
    pub async fn wait(self) -> Result<PathBuf, String> {
        let RecordingDone {
            thread,
            path,
            finish,
            ..
        } = self;
        let joined = tokio::task::spawn_blocking(move || {
            // Behind the chunks already queued; a writer that is gone has finished.
            let _ = finish.send(Message::Finish);
            thread.join()
        });
        match joined.await {
            Ok(Ok(Ok(()))) => Ok(path),
            Ok(Ok(Err(e))) => Err(format!("cannot write {}: {e}", path.display())),
            _ => Err(format!("the recorder of {} failed", path.display())),
        }
    }
}

fn write_all<W: Write + Seek>(
    mut stereo: Stereo<W>,
    inbox: Receiver<Message>,
    failed: tokio::sync::oneshot::Sender<String>,
) -> Result<(), hound::Error> {
    // On an error the queue is still drained (and dropped) until the session ends, so the
    // taps never wait; the error is the result. The thread wakes every WRITE_EVERY and takes
    // what came meanwhile: woken by each 20 ms chunk instead, forty sessions' writers cost
    // more in context switches than in writing.
    let mut error = None;
    let mut failed = Some(failed);
    'session: loop {
        std::thread::sleep(WRITE_EVERY);
        loop {
            let chunk = match inbox.try_recv() {
                Ok(Message::Chunk(chunk)) => chunk,
                Ok(Message::Finish) | Err(TryRecvError::Disconnected) => break 'session,
                Err(TryRecvError::Empty) => break,
            };
            if error.is_none()
                && let Err(e) = stereo.add(&chunk)
            {
                if let Some(failed) = failed.take() {
                    let _ = failed.send(e.to_string());
                }
                error = Some(e);
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None => stereo.finish(),
    }
}

/// Records the user's audio as it reaches the pipeline.
pub struct UserTap(Recorder);

impl Observer for UserTap {
    fn on_push(&self, event: &FramePushed<'_>) {
        if event.source != crate::pipeline::SOURCE {
            return;
        }
        if let FrameBody::System(SystemFrame::InputAudio(audio)) = &event.frame.body {
            let heard = self.0.elapsed();
            let length =
                Duration::from_secs_f64(audio.samples.len() as f64 / f64::from(audio.sample_rate));
            // It arrives as it ends.
            self.0.take(
                Side::User,
                heard.saturating_sub(length),
                &audio.samples,
                audio.sample_rate,
            );
        }
    }
}

/// Records the bot's audio as it is played, then plays it.
pub struct BotTap<S> {
    sink: S,
    recorder: Recorder,
}

impl<S: AudioSink> AudioSink for BotTap<S> {
    fn write(&mut self, samples: &[i16], sample_rate: u32) {
        let at = self.recorder.elapsed();
        self.recorder.take(Side::Bot, at, samples, sample_rate);
        self.sink.write(samples, sample_rate);
    }

    fn clear(&mut self) {
        self.sink.clear();
    }

    fn record_playback(&mut self, reference: &crate::audio::echo::EchoReference) -> bool {
        self.sink.record_playback(reference)
    }

    fn phone(&mut self, action: &crate::frames::PhoneAction) -> bool {
        self.sink.phone(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn tone(samples: usize, level: i16) -> Vec<i16> {
        (0..samples)
            .map(|i| if i % 2 == 0 { level } else { -level })
            .collect()
    }

    fn written(chunks: &[Chunk]) -> (Vec<i16>, Vec<i16>) {
        let mut bytes = Cursor::new(Vec::new());
        let mut stereo = Stereo::new(&mut bytes).expect("header");
        for chunk in chunks {
            stereo.add(chunk).expect("written");
        }
        stereo.finish().expect("finished");
        let wav = crate::audio::wav::parse(bytes.get_ref(), "test").expect("a WAV");
        assert_eq!((wav.channels, wav.sample_rate), (2, RECORDING_RATE));
        let left = wav.samples.iter().step_by(2).copied().collect();
        let right = wav.samples.iter().skip(1).step_by(2).copied().collect();
        (left, right)
    }

    /// Where a channel's audio first gets loud, in ms.
    fn onset_ms(channel: &[i16]) -> Option<f64> {
        let i = channel.iter().position(|s| s.unsigned_abs() > 1000)?;
        Some(i as f64 * 1e3 / f64::from(RECORDING_RATE))
    }

    fn chunk(side: Side, at_ms: u64, samples: Vec<i16>, sample_rate: u32) -> Chunk {
        Chunk {
            side,
            at: Duration::from_millis(at_ms),
            samples,
            sample_rate,
        }
    }

    #[test]
    fn each_side_lands_where_it_was_heard_whatever_its_rate() {
        // The user speaks from 0.5 s in 20 ms chunks at 16 kHz; the bot answers at 1.7 s at
        // 24 kHz, while the user's (silent) audio goes on.
        let mut chunks = Vec::new();
        for i in 0..150u64 {
            let level = if (25..50).contains(&i) { 8_000 } else { 0 };
            chunks.push(chunk(Side::User, i * 20, tone(320, level), 16_000));
            if (85..110).contains(&i) {
                chunks.push(chunk(Side::Bot, i * 20, tone(480, 8_000), 24_000));
            }
        }
        let (user, bot) = written(&chunks);
        assert!((onset_ms(&user).expect("the user") - 500.0).abs() <= 1.0);
        let bot_onset = onset_ms(&bot).expect("the bot");
        assert!(
            (bot_onset - 1_700.0).abs() <= 10.0,
            "the bot's first sound at {bot_onset} ms, not 1700"
        );
        assert!(
            (user.len() as f64 / 16.0 - 3_000.0).abs() <= 20.0,
            "three seconds: {} samples",
            user.len()
        );
    }

    #[test]
    fn a_side_that_sends_nothing_is_silence_and_memory_stays_bounded() {
        let mut bytes = Cursor::new(Vec::new());
        let mut stereo = Stereo::new(&mut bytes).expect("header");
        // A minute of the bot alone.
        for i in 0..3_000u64 {
            stereo
                .add(&chunk(Side::Bot, i * 20, tone(320, 4_000), 16_000))
                .expect("written");
            let held = stereo.user.ready.len().max(stereo.bot.ready.len());
            assert!(held <= 2 * RECORDING_RATE as usize, "{held} samples held");
        }
        stereo.finish().expect("finished");
        let wav = crate::audio::wav::parse(bytes.get_ref(), "test").expect("a WAV");
        assert_eq!(wav.samples.len(), 2 * 60 * RECORDING_RATE as usize);
        assert!(
            wav.samples.iter().step_by(2).all(|&s| s == 0),
            "the user's side is silent"
        );
    }

    struct Discard;

    impl AudioSink for Discard {
        fn write(&mut self, _: &[i16], _: u32) {}
    }

    #[tokio::test]
    async fn a_full_disk_is_said_at_once_and_the_taps_never_wait() {
        // Every write to /dev/full fails with "no space left".
        let (recorder, mut done) = Recorder::create(Path::new("/dev/full")).expect("opens");
        let failure = done.failure().expect("a failure channel");
        recorder.start_clock();
        let mut bot = recorder.bot_tap(Discard);
        for _ in 0..(QUEUE * 4) {
            bot.write(&tone(480, 8_000), 24_000);
        }
        let reason = failure.await.expect("told why");
        assert!(reason.to_lowercase().contains("space"), "{reason}");
        drop((bot, recorder));
        assert!(done.wait().await.is_err());
    }

    #[test]
    fn a_recording_that_cannot_be_created_is_an_error_at_once() {
        let dir = std::env::temp_dir().join("voxide-no-such-dir/deeper");
        assert!(Recorder::create(&dir.join("x.wav")).is_err());
    }
}
