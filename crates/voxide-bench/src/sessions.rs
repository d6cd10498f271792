//! Sessions per core: K input-only sessions in one process, each fed a recording at real-time
//! pace (transport in → VAD → user turns → user aggregator → a sink that measures lag), the same
//! shape as pipecat's `session_load.py`. Run it pinned (`taskset -c 0`) to read it per core.
//!
//! Session i starts (i/K)·20 ms into the chunk period and (i/K) into the file, so the sessions'
//! speech does not line up. Each 20 ms chunk is due at an absolute time; the sink's lag is when
//! the chunk reached it minus when it was due, so a stage that falls behind shows as lag.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::aggregators::UserAggregator;
use crate::audio::denoise::Denoiser;
use crate::audio::turn::{SmartTurn, SmartTurnEngine, SmartTurnStats};
use crate::audio::vad::{VadBatcher, VadParams, VadStage};
use crate::audio::wav;
use crate::context::{ContextHandle, LlmContext};
use crate::frames::{AudioFrame, Frame, FrameBody, SystemFrame};
use crate::loadtest::stats::cpu_seconds;
use crate::models::ModelError;
use crate::turns::{TurnStop, UserTurns};
use voxide_core::pipeline::{
    Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session,
};

/// What the bench runs.
#[derive(Debug, Clone)]
pub struct SessionsOptions {
    /// Concurrent sessions.
    pub sessions: usize,
    /// Smart Turn at each pause (else a plain silence timeout).
    pub smart_turn: bool,
    /// Smart Turn's worker threads (`None`: the shared model's, as many as its engine uses well).
    pub turn_workers: Option<usize>,
    /// Seconds of the recording each session plays (0: all of it).
    pub seconds: f64,
    /// RNNoise before the VAD in every session.
    pub denoise: bool,
}

/// Why the bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    /// The recording could not be read.
    #[error("cannot read the input: {0}")]
    Input(String),
    /// A model is missing.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// The figures, one JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct SessionsReport {
    /// Concurrent sessions.
    pub sessions: usize,
    /// The stop strategy: `smart` or `timeout`.
    pub turn: &'static str,
    /// RNNoise ran before the VAD.
    pub denoise: bool,
    /// Cores the process may use (its affinity).
    pub cores: usize,
    /// Seconds of audio each session played.
    pub audio_s_per_session: f64,
    /// Chunks that reached the sinks, of those fed.
    pub chunks_seen: u64,
    /// Chunks fed.
    pub chunks_expected: u64,
    /// Wall seconds of streaming.
    pub stream_wall_s: f64,
    /// CPU seconds (all threads) while streaming.
    pub cpu_s: f64,
    /// CPU seconds per second of one session's audio.
    pub cpu_s_per_session_s: f64,
    /// Lag of the sinks behind the schedule, ms.
    pub lag_ms: LagReport,
    /// The worst session's p99 lag, ms.
    pub worst_session_p99_lag_ms: f64,
    /// User turns the sessions ended.
    pub turns: u64,
    /// From the VAD's stop to the turn's end, ms: the turn model's verdict, or the timeout
    /// where none came in time (3 s for Smart Turn, 0.6 s for the silence strategy).
    pub turn_end_ms: LagReport,
    /// Resident memory once the models were loaded, MB.
    pub rss_base_mb: f64,
    /// Peak resident memory, MB.
    pub rss_peak_mb: f64,
    /// (peak − base) / sessions, MB.
    pub rss_per_session_mb: f64,
    /// Smart Turn's work in the run: inferences, requests skipped as stale, seconds busy.
    pub smart_turn: Option<SmartTurnStats>,
    /// Smart Turn's worker threads.
    pub smart_turn_workers: Option<usize>,
}

/// Lag percentiles, ms.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LagReport {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl LagReport {
    /// Percentiles of sorted figures.
    pub(crate) fn of(sorted: &[f64]) -> Self {
        Self {
            p50: percentile(sorted, 0.5),
            p90: percentile(sorted, 0.9),
            p99: percentile(sorted, 0.99),
            max: sorted.last().copied().unwrap_or(0.0),
        }
    }
}

const CHUNK: Duration = Duration::from_millis(20);

/// Runs the bench on `input`.
pub async fn run_sessions(
    input: &Path,
    options: SessionsOptions,
) -> Result<SessionsReport, SessionsError> {
    let recording = wav::read(input).map_err(|e| SessionsError::Input(e.to_string()))?;
    let rate = recording.sample_rate;
    let mut audio = recording.to_mono();
    if options.seconds > 0.0 {
        audio.truncate((options.seconds * f64::from(rate)) as usize);
    }
    let per_chunk = (rate / 50) as usize;
    let chunks = audio.len() / per_chunk;
    if chunks == 0 {
        return Err(SessionsError::Input("shorter than one 20 ms chunk".into()));
    }
    let audio: Arc<[i16]> = audio.into();
    let batcher = VadBatcher::shared()?;
    let smart = match (options.smart_turn, options.turn_workers) {
        (false, _) => None,
        (true, None) => Some(SmartTurn::shared()?),
        (true, Some(workers)) => Some(Arc::new(SmartTurn::load_with(
            SmartTurnEngine::best(),
            workers,
        )?)),
    };
    let k = options.sessions.max(1);
    let rss_base = rss_mb("VmRSS");
    let turn_stats_start = smart.as_ref().map(|m| m.stats());
    let cpu_start = cpu_seconds();
    let wall_start = std::time::Instant::now();
    let start = Instant::now() + Duration::from_millis(200);
    let mut runs = Vec::with_capacity(k);
    for i in 0..k {
        let stop = match &smart {
            Some(model) => TurnStop::SmartTurn {
                model: model.clone(),
                incomplete_timeout: Duration::from_secs(3),
                words: true,
            },
            None => TurnStop::SpeechTimeout(Duration::from_millis(600)),
        };
        let sink = LagSink::default();
        let lags = sink.0.clone();
        let mut pipeline = Pipeline::new();
        if options.denoise {
            pipeline = pipeline.then(Denoiser::new());
        }
        let pipeline = pipeline
            .then(VadStage::new(batcher.clone(), VadParams::default()))
            .then(UserTurns::new(stop))
            .then(UserAggregator::new(ContextHandle::new(
                LlmContext::default(),
            )))
            .then(sink);
        let session = Session::builder(pipeline).idle_timeout(None).spawn();
        let handle = session.handle();
        let audio = audio.clone();
        let first = start + CHUNK.mul_f64(i as f64 / k as f64);
        let offset = chunks * i / k;
        let feeder = tokio::spawn(async move {
            for n in 0..chunks {
                tokio::time::sleep_until(first + CHUNK * n as u32).await;
                let at = ((offset + n) % chunks) * per_chunk;
                let piece = audio[at..at + per_chunk].to_vec();
                let frame = SystemFrame::InputAudio(AudioFrame::new(piece, rate, 1));
                if handle.queue_frame(frame).await.is_err() {
                    break;
                }
            }
            let _ = handle.stop_when_done().await;
        });
        lags.lock().unwrap_or_else(|p| p.into_inner()).first = Some(first);
        runs.push((session, feeder, lags));
    }
    let mut all = Vec::new();
    let mut worst = 0.0f64;
    let (mut seen, mut turns) = (0u64, 0u64);
    let mut turn_ends = Vec::new();
    for (session, feeder, lags) in runs {
        let _ = feeder.await;
        session.join().await;
        let lags = lags.lock().unwrap_or_else(|p| p.into_inner());
        seen += lags.lags_ms.len() as u64;
        turns += lags.turn_ends_ms.len() as u64;
        turn_ends.extend_from_slice(&lags.turn_ends_ms);
        let mut own = lags.lags_ms.clone();
        own.sort_by(f64::total_cmp);
        worst = worst.max(percentile(&own, 0.99));
        all.extend(own);
    }
    let cpu = cpu_seconds() - cpu_start;
    let wall = wall_start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    turn_ends.sort_by(f64::total_cmp);
    let audio_secs = chunks as f64 * CHUNK.as_secs_f64();
    let rss_peak = rss_mb("VmHWM");
    let smart_turn = smart.as_ref().zip(turn_stats_start).map(|(m, before)| {
        let after = m.stats();
        SmartTurnStats {
            inferences: after.inferences - before.inferences,
            skipped: after.skipped - before.skipped,
            late: after.late - before.late,
            busy_secs: after.busy_secs - before.busy_secs,
        }
    });
    Ok(SessionsReport {
        sessions: k,
        turn: if options.smart_turn {
            "smart"
        } else {
            "timeout"
        },
        denoise: options.denoise,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        audio_s_per_session: audio_secs,
        chunks_seen: seen,
        chunks_expected: (chunks * k) as u64,
        stream_wall_s: wall,
        cpu_s: cpu,
        cpu_s_per_session_s: cpu / (audio_secs * k as f64),
        lag_ms: LagReport::of(&all),
        worst_session_p99_lag_ms: worst,
        turns,
        turn_end_ms: LagReport::of(&turn_ends),
        rss_base_mb: rss_base,
        rss_peak_mb: rss_peak,
        rss_per_session_mb: (rss_peak - rss_base).max(0.0) / k as f64,
        smart_turn,
        smart_turn_workers: smart.as_ref().map(|m| m.workers()),
    })
}

/// The end of a bench session: notes how late each input chunk arrived.
#[derive(Default)]
struct LagSink(Arc<Mutex<Lags>>);

#[derive(Default)]
struct Lags {
    first: Option<Instant>,
    lags_ms: Vec<f64>,
    /// The VAD's latest stop, while the turn is open.
    vad_stopped: Option<Instant>,
    /// From the VAD's stop to the end of each turn, ms.
    turn_ends_ms: Vec<f64>,
}

impl FrameProcessor for LagSink {
    fn name(&self) -> &str {
        "LagSink"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::System(SystemFrame::InputAudio(_)) => {
                let mut lags = self.0.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(first) = lags.first {
                    let due = first + CHUNK * lags.lags_ms.len() as u32;
                    let lag = Instant::now().saturating_duration_since(due);
                    lags.lags_ms.push(lag.as_secs_f64() * 1e3);
                }
                // Chunks end here: the sink stands for the rest of a bot.
                return Ok(());
            }
            FrameBody::System(SystemFrame::VadUserStoppedSpeaking) => {
                self.0.lock().unwrap_or_else(|p| p.into_inner()).vad_stopped = Some(Instant::now());
            }
            FrameBody::System(SystemFrame::UserStoppedSpeaking) => {
                let mut lags = self.0.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(stopped) = lags.vad_stopped.take() {
                    lags.turn_ends_ms
                        .push(stopped.elapsed().as_secs_f64() * 1e3);
                }
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A memory figure from /proc/self/status, MB.
fn rss_mb(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
