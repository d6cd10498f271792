//! Process-wide counters, rendered in the Prometheus text format at `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::events::Event;
use crate::frames::MetricsData;

/// A sum and a count, as a Prometheus summary without quantiles.
#[derive(Debug, Default, Clone, Copy)]
struct Sum {
    sum: f64,
    count: u64,
}

/// The server's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    active: AtomicUsize,
    started: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
    interruptions: AtomicU64,
    tool_calls: AtomicU64,
    voice_to_voice: Mutex<Sum>,
    turn_wait: Mutex<Sum>,
    ttfb: Mutex<BTreeMap<String, Sum>>,
    /// Sessions ended, by reason (`completed`, `client_gone`, ...).
    ended: Mutex<BTreeMap<String, u64>>,
}

fn add(sum: &Mutex<Sum>, value: f64) {
    let mut sum = sum.lock().unwrap_or_else(|p| p.into_inner());
    sum.sum += value;
    sum.count += 1;
}

impl Metrics {
    /// Live sessions.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Sessions started since the process started.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Sessions refused at the limit.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    pub(crate) fn session_started(&self) {
        self.active.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn session_ended(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }

    /// Sessions ended since the process started, by reason.
    pub fn ended(&self) -> BTreeMap<String, u64> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn session_rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts what a session event says.
    pub fn observe(&self, event: &Event) {
        match event {
            Event::Error { .. } => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            Event::Interruption => {
                self.interruptions.fetch_add(1, Ordering::Relaxed);
            }
            Event::ToolCallStarted { .. } => {
                self.tool_calls.fetch_add(1, Ordering::Relaxed);
            }
            Event::SessionEnded { reason } => {
                *self
                    .ended
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(reason.kind().to_owned())
                    .or_default() += 1;
            }
            Event::Metrics { data } => {
                for item in data {
                    match item {
                        MetricsData::VoiceToVoice { seconds } => {
                            add(&self.voice_to_voice, *seconds)
                        }
                        MetricsData::TurnWait { seconds } => add(&self.turn_wait, *seconds),
                        MetricsData::Ttfb {
                            processor, seconds, ..
                        } => {
                            // "LlmService#4" → "LlmService": one series per kind of service.
                            let service = processor.split('#').next().unwrap_or(processor);
                            let mut ttfb = self.ttfb.lock().unwrap_or_else(|p| p.into_inner());
                            let sum = ttfb.entry(service.to_owned()).or_default();
                            sum.sum += seconds;
                            sum.count += 1;
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, kind: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        counter(
            "voxide_sessions_active",
            "Live sessions.",
            "gauge",
            self.active().to_string(),
        );
        counter(
            "voxide_sessions_started_total",
            "Sessions started.",
            "counter",
            self.started().to_string(),
        );
        counter(
            "voxide_sessions_rejected_total",
            "Sessions refused at the session limit.",
            "counter",
            self.rejected().to_string(),
        );
        counter(
            "voxide_errors_total",
            "Errors reported by sessions.",
            "counter",
            self.errors.load(Ordering::Relaxed).to_string(),
        );
        counter(
            "voxide_interruptions_total",
            "Times a user interrupted the bot.",
            "counter",
            self.interruptions.load(Ordering::Relaxed).to_string(),
        );
        counter(
            "voxide_tool_calls_total",
            "Function calls started.",
            "counter",
            self.tool_calls.load(Ordering::Relaxed).to_string(),
        );
        let _ = writeln!(
            out,
            "# HELP voxide_sessions_ended_total Sessions ended, by reason.\n\
             # TYPE voxide_sessions_ended_total counter"
        );
        for (reason, count) in self.ended() {
            let _ = writeln!(
                out,
                "voxide_sessions_ended_total{{reason=\"{reason}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP voxide_repeated_warnings_total Warnings logged once and counted after.\n\
             # TYPE voxide_repeated_warnings_total counter"
        );
        for (kind, count) in crate::warnings::counts() {
            let _ = writeln!(
                out,
                "voxide_repeated_warnings_total{{kind=\"{kind}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP voxide_audio_dropped_total Audio chunks a full bounded queue dropped.\n\
             # TYPE voxide_audio_dropped_total counter"
        );
        for (queue, count) in crate::warnings::audio_drops() {
            let _ = writeln!(
                out,
                "voxide_audio_dropped_total{{queue=\"{queue}\"}} {count}"
            );
        }
        let v2v = *self
            .voice_to_voice
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(
            out,
            "# HELP voxide_voice_to_voice_seconds End of user speech to first bot audio.\n\
             # TYPE voxide_voice_to_voice_seconds summary\n\
             voxide_voice_to_voice_seconds_sum {}\nvoxide_voice_to_voice_seconds_count {}",
            v2v.sum, v2v.count
        );
        let wait = *self.turn_wait.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(
            out,
            "# HELP voxide_turn_wait_seconds End of user speech to the end of their turn.\n\
             # TYPE voxide_turn_wait_seconds summary\n\
             voxide_turn_wait_seconds_sum {}\nvoxide_turn_wait_seconds_count {}",
            wait.sum, wait.count
        );
        let _ = writeln!(
            out,
            "# HELP voxide_ttfb_seconds Time to first output per service.\n\
             # TYPE voxide_ttfb_seconds summary"
        );
        for (service, sum) in self.ttfb.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(
                out,
                "voxide_ttfb_seconds_sum{{service=\"{service}\"}} {}\n\
                 voxide_ttfb_seconds_count{{service=\"{service}\"}} {}",
                sum.sum, sum.count
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_become_prometheus_series() {
        let metrics = Metrics::default();
        metrics.session_started();
        metrics.observe(&Event::Metrics {
            data: vec![
                MetricsData::VoiceToVoice { seconds: 0.5 },
                MetricsData::Ttfb {
                    processor: "LlmService#4".into(),
                    model: None,
                    seconds: 0.25,
                },
            ],
        });
        metrics.observe(&Event::Interruption);
        metrics.observe(&Event::SessionEnded {
            reason: crate::events::EndReason::ClientGone,
        });
        let text = metrics.render();
        assert!(text.contains("\nvoxide_sessions_active 1\n"), "{text}");
        assert!(text.contains("voxide_voice_to_voice_seconds_sum 0.5\n"));
        assert!(text.contains("voxide_voice_to_voice_seconds_count 1\n"));
        assert!(text.contains("voxide_ttfb_seconds_sum{service=\"LlmService\"} 0.25\n"));
        assert!(text.contains("voxide_interruptions_total 1\n"));
        assert!(text.contains("voxide_sessions_ended_total{reason=\"client_gone\"} 1\n"));
        metrics.session_ended();
        assert!(metrics.render().contains("\nvoxide_sessions_active 0\n"));
    }
}
