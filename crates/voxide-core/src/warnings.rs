//! Warnings that could repeat on every frame or audio callback (a device error, audio at a rate
//! the sink cannot take): the first is logged, the rest are counted, and a summary line says how
//! many came, at most once per [`SUMMARY_EVERY`]. No per-frame log line, and nothing is hidden.
//!
//! The counts are process-wide, by kind; `/metrics` renders them as
//! `voxide_repeated_warnings_total{kind="…"}`.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a warning that keeps coming is summarised.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// One kind's count.
#[derive(Debug, Clone, Copy)]
struct Tally {
    total: u64,
    /// `total` at the last line logged.
    logged_at_total: u64,
    /// When the last line was logged.
    logged_at: Instant,
}

/// What to log for one occurrence, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// The first of its kind: log it as it is.
    First,
    /// A summary: this many more since the last line, over this long.
    Summary { more: u64, over: Duration },
    /// Counted only.
    Quiet,
}

/// The counts of every kind: sans-IO, the time given.
#[derive(Debug, Default)]
struct Tallies(BTreeMap<&'static str, Tally>);

impl Tallies {
    fn note(&mut self, kind: &'static str, now: Instant) -> Line {
        let Some(tally) = self.0.get_mut(kind) else {
            self.0.insert(
                kind,
                Tally {
                    total: 1,
                    logged_at_total: 1,
                    logged_at: now,
                },
            );
            return Line::First;
        };
        tally.total += 1;
        let over = now.saturating_duration_since(tally.logged_at);
        if over < SUMMARY_EVERY {
            return Line::Quiet;
        }
        let more = tally.total - tally.logged_at_total;
        tally.logged_at_total = tally.total;
        tally.logged_at = now;
        Line::Summary { more, over }
    }
}

static TALLIES: Mutex<Tallies> = Mutex::new(Tallies(BTreeMap::new()));

fn tallies() -> MutexGuard<'static, Tallies> {
    TALLIES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Warns about one occurrence of `kind` (a short, stable name: `speaker_stream_error`): the first
/// is logged with `message`, later ones are counted and summarised every [`SUMMARY_EVERY`].
pub fn warn(kind: &'static str, message: impl std::fmt::Display) {
    let line = tallies().note(kind, Instant::now());
    match line {
        Line::First => tracing::warn!(kind, "{message} (repeats are counted, not logged)"),
        Line::Summary { more, over } => tracing::warn!(
            kind,
            repeats = more,
            "{message} ({more} times in the last {:.0} s)",
            over.as_secs_f64()
        ),
        Line::Quiet => {}
    }
}

/// How many of each kind came since the process started.
pub fn counts() -> BTreeMap<&'static str, u64> {
    tallies().0.iter().map(|(k, t)| (*k, t.total)).collect()
}

/// Audio chunks dropped by a full bounded queue, by queue.
static DROPS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// A full bounded audio queue (`queue`: `ws_out`, `webrtc_in`, `vad_in`, `aec_in`…; also
/// `data_channel_out`, the RTVI messages a WebRTC client is not taking) dropped a
/// chunk rather than let a consumer that fell behind grow memory without end: counted by queue
/// (`/metrics`: `voxide_audio_dropped_total{queue="…"}`) and warned about as a repeated warning.
pub fn audio_dropped(queue: &'static str) {
    *DROPS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(queue)
        .or_default() += 1;
    warn(
        "audio_dropped",
        format_args!(
            "the {queue} audio queue is full: its consumer fell behind and a chunk was dropped"
        ),
    );
}

/// Chunks each audio queue dropped since the process started.
pub fn audio_drops() -> BTreeMap<&'static str, u64> {
    DROPS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_warning_is_logged_and_the_next_ones_only_counted() {
        let t0 = Instant::now();
        let mut tallies = Tallies::default();
        assert_eq!(tallies.note("a", t0), Line::First);
        for k in 1..50 {
            assert_eq!(
                tallies.note("a", t0 + Duration::from_millis(20 * k)),
                Line::Quiet
            );
        }
        assert_eq!(tallies.note("b", t0), Line::First, "kinds are apart");
        assert_eq!(tallies.0["a"].total, 50);
    }

    #[test]
    fn a_warning_that_keeps_coming_is_summarised_once_a_period() {
        let t0 = Instant::now();
        let mut tallies = Tallies::default();
        tallies.note("a", t0);
        let mut summaries = Vec::new();
        // Every 20 ms for 25 s: 1,250 occurrences, two summary lines.
        for k in 1..1250 {
            if let Line::Summary { more, .. } =
                tallies.note("a", t0 + Duration::from_millis(20 * k))
            {
                summaries.push(more);
            }
        }
        assert_eq!(summaries, [500, 500]);
    }
}
