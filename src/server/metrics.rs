//! Process-wide counters, rendered in the Prometheus text format at `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::events::Event;
use crate::frames::MetricsData;
use crate::transports::jitter::NetworkStats;

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
    /// Sessions closed for abuse: audio faster than real time, and clients that read nothing.
    too_fast: AtomicU64,
    not_reading: AtomicU64,
    /// Audio frames dropped on arrival because their client did not answer its pings.
    unheard_frames: AtomicU64,
    errors: AtomicU64,
    interruptions: AtomicU64,
    tool_calls: AtomicU64,
    /// Preemptive generations taken over, and thrown away.
    preemptions_used: AtomicU64,
    preemptions_wasted: AtomicU64,
    /// Tokens the thrown-away ones cost (prompt and answer), and their dollars in millionths.
    preemption_wasted_tokens: AtomicU64,
    preemption_wasted_micro_usd: AtomicU64,
    voice_to_voice: Mutex<Sum>,
    turn_wait: Mutex<Sum>,
    ttfb: Mutex<BTreeMap<String, Sum>>,
    /// Sessions ended, by reason (`completed`, `client_gone`, ...).
    ended: Mutex<BTreeMap<String, u64>>,
    /// The runtime's latest scheduling lag, in nanoseconds ([`Metrics::probe_lag`]).
    lag_nanos: AtomicU64,
    /// What the network did to the WebRTC sessions' incoming audio, summed.
    network: Mutex<NetworkStats>,
    /// Interarrival jitter, per report.
    jitter: Mutex<Sum>,
    /// What the recordings did.
    pub(crate) observed: Arc<crate::observe::ObserveCounts>,
    /// What the trace exporter did.
    pub(crate) traces: Arc<crate::observe::trace::ExportCounts>,
}

/// What the node says of itself beside its counters.
#[derive(Debug, Clone, Copy)]
pub struct NodeGauges {
    /// Live sessions it takes at most.
    pub capacity: usize,
    /// It is draining.
    pub draining: bool,
    /// Whether it is registered with its PBX (`--sip-register`); `None`: it does not register.
    pub sip_registered: Option<bool>,
}

/// How often the scheduling lag is measured.
const LAG_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

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

    /// A session closed for sending audio faster than real time.
    pub(crate) fn closed_too_fast(&self) {
        self.too_fast.fetch_add(1, Ordering::Relaxed);
    }

    /// A session closed because its client read nothing.
    pub(crate) fn closed_not_reading(&self) {
        self.not_reading.fetch_add(1, Ordering::Relaxed);
    }

    /// An audio frame dropped because its client does not answer its pings.
    pub(crate) fn unheard_frame(&self) {
        self.unheard_frames.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds what the network did to a session's audio since its last report.
    pub fn network(&self, since_last: &NetworkStats) {
        self.network
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(since_last);
        add(&self.jitter, since_last.jitter);
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
                        MetricsData::Preemption { used: true, .. } => {
                            self.preemptions_used.fetch_add(1, Ordering::Relaxed);
                        }
                        MetricsData::Preemption { tokens, wasted, .. } => {
                            self.preemptions_wasted.fetch_add(1, Ordering::Relaxed);
                            let (billed, cost) = match wasted {
                                Some(guess) => {
                                    (guess.usage.total(), guess.cost_usd.unwrap_or_default())
                                }
                                None => (*tokens, 0.0),
                            };
                            self.preemption_wasted_tokens
                                .fetch_add(billed, Ordering::Relaxed);
                            self.preemption_wasted_micro_usd
                                .fetch_add((cost * 1e6).round() as u64, Ordering::Relaxed);
                        }
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

    /// Measures, for as long as it runs, how late the runtime wakes a task that asked to sleep:
    /// a busy or blocked runtime delays every session's audio by as much.
    pub async fn probe_lag(&self) {
        loop {
            let asked = tokio::time::Instant::now() + LAG_PERIOD;
            tokio::time::sleep_until(asked).await;
            let late = tokio::time::Instant::now().saturating_duration_since(asked);
            let nanos = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
            self.lag_nanos.store(nanos, Ordering::Relaxed);
        }
    }

    /// The runtime's latest scheduling lag, in seconds.
    pub fn scheduling_lag(&self) -> f64 {
        self.lag_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// The Prometheus text exposition, with what `node` says of itself.
    pub fn render(&self, node: NodeGauges) -> String {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let mut out = Exposition::default();
        let singles = [
            (
                "voxide_active_sessions",
                "Live sessions.",
                "gauge",
                self.active() as u64,
            ),
            (
                "voxide_session_capacity",
                "Live sessions the node takes at most.",
                "gauge",
                node.capacity as u64,
            ),
            (
                "voxide_draining",
                "1 while the node drains: it takes no new sessions.",
                "gauge",
                u64::from(node.draining),
            ),
            (
                "voxide_sessions_started_total",
                "Sessions started.",
                "counter",
                self.started(),
            ),
            (
                "voxide_sessions_rejected_total",
                "Sessions refused at the session limit.",
                "counter",
                self.rejected(),
            ),
            (
                "voxide_sessions_too_fast_total",
                "Sessions closed for sending audio faster than real time.",
                "counter",
                load(&self.too_fast),
            ),
            (
                "voxide_sessions_not_reading_total",
                "Sessions closed because the client read nothing (a ping unanswered, or a write \
                 stuck, for the write timeout).",
                "counter",
                load(&self.not_reading),
            ),
            (
                "voxide_unheard_audio_frames_total",
                "Client audio frames dropped on arrival: the client had not answered a ping for \
                 a second, so it was not hearing the bot either.",
                "counter",
                load(&self.unheard_frames),
            ),
            (
                "voxide_errors_total",
                "Errors reported by sessions.",
                "counter",
                load(&self.errors),
            ),
            (
                "voxide_interruptions_total",
                "Times a user interrupted the bot.",
                "counter",
                load(&self.interruptions),
            ),
            (
                "voxide_tool_calls_total",
                "Function calls started.",
                "counter",
                load(&self.tool_calls),
            ),
            (
                "voxide_preemptive_wasted_tokens_total",
                "Tokens (prompt and answer) of answers started before the turn ended and thrown away.",
                "counter",
                load(&self.preemption_wasted_tokens),
            ),
        ];
        for (name, help, kind, value) in singles {
            out.single(name, help, kind, value);
        }
        if let Some(registered) = node.sip_registered {
            out.single(
                "voxide_sip_registered",
                "1 while the node is registered with its PBX (--sip-register).",
                "gauge",
                u64::from(registered),
            );
        }
        out.single(
            "voxide_preemptive_wasted_usd_total",
            "Dollars of answers started before the turn ended and thrown away (models with a known price).",
            "counter",
            load(&self.preemption_wasted_micro_usd) as f64 / 1e6,
        );
        out.single(
            "voxide_runtime_scheduling_lag_seconds",
            "How late the runtime last woke a task that slept.",
            "gauge",
            self.scheduling_lag(),
        );
        self.families(&mut out);
        out.0
    }

    /// The labelled counters and the summaries.
    fn families(&self, out: &mut Exposition) {
        out.labelled(
            ("voxide_sessions_ended_total", "Sessions ended, by reason."),
            "reason",
            self.ended(),
        );
        out.labelled(
            (
                "voxide_repeated_warnings_total",
                "Warnings logged once and counted after.",
            ),
            "kind",
            crate::warnings::counts(),
        );
        out.labelled(
            (
                "voxide_audio_dropped_total",
                "Audio chunks a full bounded queue dropped.",
            ),
            "queue",
            crate::warnings::audio_drops(),
        );
        out.labelled(
            (
                "voxide_preemptive_generations_total",
                "Answers started before the turn ended, by whether the turn took them.",
            ),
            "outcome",
            [
                ("used", self.preemptions_used.load(Ordering::Relaxed)),
                ("wasted", self.preemptions_wasted.load(Ordering::Relaxed)),
            ],
        );
        let observed = &self.observed;
        out.labelled(
            (
                "voxide_recordings_total",
                "Session recordings, by whether they were written whole.",
            ),
            "outcome",
            [
                (
                    "written",
                    observed.recordings_written.load(Ordering::Relaxed),
                ),
                ("failed", observed.recordings_failed.load(Ordering::Relaxed)),
            ],
        );
        out.labelled(
            (
                "voxide_recording_uploads_total",
                "Finished recordings sent to --record-url, by whether the store took them.",
            ),
            "outcome",
            [
                ("uploaded", observed.uploads_done.load(Ordering::Relaxed)),
                ("failed", observed.uploads_failed.load(Ordering::Relaxed)),
            ],
        );
        out.single(
            "voxide_recording_chunks_dropped_total",
            "Audio chunks recordings lost: their writer fell behind or failed.",
            "counter",
            observed.recording_chunks_dropped.load(Ordering::Relaxed),
        );
        out.labelled(
            (
                "voxide_trace_spans_total",
                "Spans for the OTLP collector, by what became of them.",
            ),
            "outcome",
            [
                ("exported", self.traces.exported.load(Ordering::Relaxed)),
                ("dropped", self.traces.dropped.load(Ordering::Relaxed)),
                ("failed", self.traces.failed.load(Ordering::Relaxed)),
            ],
        );
        let network = *self.network.lock().unwrap_or_else(|p| p.into_inner());
        out.labelled(
            (
                "voxide_webrtc_packets_total",
                "The users' audio packets over WebRTC, by what became of them.",
            ),
            "outcome",
            [
                ("received", network.received),
                ("lost", network.lost),
                ("recovered", network.recovered),
                ("redundant", network.redundant),
                ("red", network.red),
                ("concealed", network.concealed),
                ("late", network.late),
                ("reordered", network.reordered),
                ("duplicated", network.duplicated),
            ],
        );
        let sum = |m: &Mutex<Sum>| *m.lock().unwrap_or_else(|p| p.into_inner());
        out.summary(
            (
                "voxide_webrtc_jitter_seconds",
                "Interarrival jitter of the users' audio, per session report.",
            ),
            None,
            [("", sum(&self.jitter))],
        );
        out.summary(
            (
                "voxide_voice_to_voice_seconds",
                "End of user speech to first bot audio.",
            ),
            None,
            [("", sum(&self.voice_to_voice))],
        );
        out.summary(
            (
                "voxide_turn_wait_seconds",
                "End of user speech to the end of their turn.",
            ),
            None,
            [("", sum(&self.turn_wait))],
        );
        let ttfb = self.ttfb.lock().unwrap_or_else(|p| p.into_inner()).clone();
        out.summary(
            ("voxide_ttfb_seconds", "Time to first output per service."),
            Some("service"),
            ttfb.iter().map(|(service, sum)| (service.as_str(), *sum)),
        );
    }
}

/// Prometheus' text format, a family at a time.
#[derive(Default)]
struct Exposition(String);

impl Exposition {
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One unlabelled series.
    fn single(&mut self, name: &str, help: &str, kind: &str, value: impl std::fmt::Display) {
        self.header(name, help, kind);
        let _ = writeln!(self.0, "{name} {value}");
    }

    /// A counter with one series per value of `label`.
    fn labelled<K: std::fmt::Display>(
        &mut self,
        (name, help): (&str, &str),
        label: &str,
        series: impl IntoIterator<Item = (K, u64)>,
    ) {
        self.header(name, help, "counter");
        for (value, count) in series {
            let _ = writeln!(self.0, "{name}{{{label}=\"{value}\"}} {count}");
        }
    }

    /// A summary's sums and counts, one series per value of `label` (none: one series).
    fn summary<'a>(
        &mut self,
        (name, help): (&str, &str),
        label: Option<&str>,
        series: impl IntoIterator<Item = (&'a str, Sum)>,
    ) {
        self.header(name, help, "summary");
        for (value, sum) in series {
            let labels = label.map_or(String::new(), |l| format!("{{{l}=\"{value}\"}}"));
            let _ = writeln!(
                self.0,
                "{name}_sum{labels} {}\n{name}_count{labels} {}",
                sum.sum, sum.count
            );
        }
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
                MetricsData::Preemption {
                    processor: "LlmService#4".into(),
                    used: false,
                    tokens: 7,
                    wasted: Some(crate::frames::WastedGuess {
                        usage: crate::frames::TokenUsage {
                            input: 1_000,
                            output: 7,
                            ..Default::default()
                        },
                        cost_usd: Some(0.0025),
                    }),
                },
            ],
        });
        metrics.observe(&Event::Interruption);
        metrics.observe(&Event::SessionEnded {
            reason: crate::events::EndReason::ClientGone,
        });
        let node = NodeGauges {
            capacity: 32,
            draining: true,
            sip_registered: None,
        };
        let text = metrics.render(node);
        assert!(text.contains("\nvoxide_active_sessions 1\n"), "{text}");
        assert!(text.contains("\nvoxide_session_capacity 32\n"), "{text}");
        assert!(text.contains("\nvoxide_draining 1\n"), "{text}");
        assert!(
            text.contains("\nvoxide_runtime_scheduling_lag_seconds 0\n"),
            "{text}"
        );
        assert!(text.contains("voxide_voice_to_voice_seconds_sum 0.5\n"));
        assert!(text.contains("voxide_voice_to_voice_seconds_count 1\n"));
        assert!(text.contains("voxide_ttfb_seconds_sum{service=\"LlmService\"} 0.25\n"));
        assert!(text.contains("voxide_interruptions_total 1\n"));
        assert!(text.contains("voxide_preemptive_generations_total{outcome=\"wasted\"} 1\n"));
        assert!(text.contains("voxide_preemptive_wasted_tokens_total 1007\n"));
        assert!(text.contains("voxide_preemptive_wasted_usd_total 0.0025\n"));
        assert!(text.contains("voxide_sessions_ended_total{reason=\"client_gone\"} 1\n"));
        metrics.session_ended();
        assert!(
            metrics
                .render(node)
                .contains("\nvoxide_active_sessions 0\n")
        );
    }
}
