//! Frame throughput and latency through a line of pass-through processors.
//!
//! The same shape as `shared/bench/pipecat/frame_throughput.py`: N pass-through processors and a
//! counting sink. A saturated run pushes M text frames at once and counts frames per second from
//! the first injection to the last arrival; a closed-loop run injects frames one at a time and
//! measures injection-to-sink latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

use crate::frames::{DataFrame, Frame, FrameBody};
use voxide_core::pipeline::{
    Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session,
};

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct PipelineBench {
    /// Pass-through processors in the line.
    pub processors: usize,
    /// Frames in the saturated run.
    pub frames: usize,
    /// Frames in the closed-loop run.
    pub latency_frames: usize,
}

/// One JSON line of results.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineReport {
    /// Pass-through processors in the line.
    pub processors: usize,
    /// Frames in the saturated run.
    pub frames: usize,
    /// Saturated throughput.
    pub frames_per_sec: f64,
    /// Closed-loop latency, median, µs.
    pub p50_us: f64,
    /// Closed-loop latency, 99th percentile, µs.
    pub p99_us: f64,
    /// Closed-loop latency, mean, µs.
    pub mean_us: f64,
}

/// Passes every frame on unchanged.
struct PassThrough;

impl FrameProcessor for PassThrough {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        cx.push(frame, direction);
        Ok(())
    }
}

/// Consumes text frames; reports the arrival time of every `every`-th one, so the saturated run
/// does not wake the bench on each frame.
struct Sink {
    arrivals: mpsc::UnboundedSender<Instant>,
    every: Arc<AtomicUsize>,
    count: usize,
}

impl FrameProcessor for Sink {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if let FrameBody::Data(DataFrame::Text(_)) = frame.body {
            let at = Instant::now();
            self.count += 1;
            if self.count >= self.every.load(Ordering::Relaxed) {
                self.count = 0;
                let _ = self.arrivals.send(at);
            }
            return Ok(());
        }
        cx.push(frame, direction);
        Ok(())
    }
}

impl PipelineBench {
    /// Runs both measurements in one session.
    pub async fn run(self) -> PipelineReport {
        let (tx, mut arrivals) = mpsc::unbounded_channel();
        let every = Arc::new(AtomicUsize::new(1));
        let mut pipeline = Pipeline::new();
        for _ in 0..self.processors {
            pipeline = pipeline.then(PassThrough);
        }
        let sink = Sink {
            arrivals: tx,
            every: every.clone(),
            count: 0,
        };
        let session = Session::builder(pipeline.then(sink))
            .idle_timeout(None)
            .spawn();
        let handle = session.handle();
        let text = || Frame::new(DataFrame::Text("x".to_owned()));

        // Warm up allocators and caches.
        for _ in 0..2_000.min(self.frames) {
            let _ = handle.queue_frame(text()).await;
            arrivals.recv().await;
        }

        let frames: Vec<Frame> = (0..self.frames).map(|_| text()).collect();
        every.store(self.frames.max(1), Ordering::Relaxed);
        let started = Instant::now();
        let (_, last) = tokio::join!(handle.queue_frames(frames), arrivals.recv());
        let last = last.unwrap_or(started);
        every.store(1, Ordering::Relaxed);
        let elapsed = last.duration_since(started).max(Duration::from_nanos(1));
        let frames_per_sec = self.frames as f64 / elapsed.as_secs_f64();

        let mut latencies = Vec::with_capacity(self.latency_frames);
        for _ in 0..self.latency_frames {
            let frame = text();
            let t0 = Instant::now();
            let _ = handle.queue_frame(frame).await;
            if let Some(at) = arrivals.recv().await {
                latencies.push(at.duration_since(t0).as_secs_f64() * 1e6);
            }
        }
        let _ = handle.stop_when_done().await;
        session.join().await;

        latencies.sort_by(f64::total_cmp);
        let pct = |p: f64| -> f64 {
            if latencies.is_empty() {
                return 0.0;
            }
            let k = (p / 100.0 * (latencies.len() - 1) as f64).round() as usize;
            latencies[k.min(latencies.len() - 1)]
        };
        let mean = latencies.iter().sum::<f64>() / latencies.len().max(1) as f64;
        PipelineReport {
            processors: self.processors,
            frames: self.frames,
            frames_per_sec: frames_per_sec.round(),
            p50_us: round2(pct(50.0)),
            p99_us: round2(pct(99.0)),
            mean_us: round2(mean),
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
