//! A session as an OpenTelemetry trace, exported over OTLP/HTTP (protobuf).
//!
//! The spans are made from the session's [`Journal`], on the audio's clock, once a turn is
//! settled (the next one has begun and its tool calls have ended) and at the session's end: a
//! root span for the session, one per turn, and inside each turn the user's speech, the turn
//! detector's wait, the STT's finalize, each LLM request (named and attributed by
//! OpenTelemetry's GenAI conventions), each tool call (an async tool's span ends at its final
//! result), the voice and the bot's speech, with the interruption that cut the turn as an
//! event and the turn's voice-to-voice latency as an attribute. Making spans is sans-IO
//! ([`TraceBuilder`]); [`Exporter`] posts them in batches from a bounded queue, so a slow or
//! absent collector costs spans, counted, and never the audio.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
use prost::Message as _;
use tokio::sync::mpsc;

use super::journal::{Interval, Journal, Millis, Turn};

/// Spans waiting for the exporter before new ones are dropped.
const QUEUE_SPANS: usize = 4_096;
/// Most spans in one export request.
const BATCH: usize = 512;
/// How long the exporter gathers spans before it posts what it has.
const BATCH_DELAY: Duration = Duration::from_millis(500);
/// Characters of a text attribute (a transcript, a tool's arguments) kept.
const MAX_TEXT: usize = 1_000;

/// Where traces go and how many are kept.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    /// The collector's traces URL (`http://collector:4318/v1/traces`).
    pub endpoint: String,
    /// Headers every export carries (`OTEL_EXPORTER_OTLP_HEADERS`: an API key).
    pub headers: Vec<(String, String)>,
    /// How long one export may take.
    pub timeout: Duration,
    /// The `service.name` of the spans.
    pub service_name: String,
    /// The share of sessions traced, 0 to 1 (decided by the trace id, as
    /// `TraceIdRatioBased` does).
    pub sample: f64,
}

/// Why the trace options cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TraceConfigError(String);

impl TraceOptions {
    /// The options from `--otlp-endpoint` (a base URL: `/v1/traces` is added) and the
    /// standard variables, which `lookup` reads: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the
    /// whole URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (a base), `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`,
    /// `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` (ms), `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`
    /// (only `http/protobuf`) and `OTEL_SERVICE_NAME`. `None`: no endpoint, no traces.
    pub fn resolve(
        flag: Option<&str>,
        sample: f64,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, TraceConfigError> {
        let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let either = |name: &str| {
            var(&format!("OTEL_EXPORTER_OTLP_TRACES_{name}"))
                .or_else(|| var(&format!("OTEL_EXPORTER_OTLP_{name}")))
        };
        let base = |url: &str| {
            let url = url.trim_end_matches('/');
            if url.ends_with("/v1/traces") {
                url.to_owned()
            } else {
                format!("{url}/v1/traces")
            }
        };
        let endpoint = match flag {
            Some(url) => base(url),
            None => match var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
                Some(url) => url,
                None => match var("OTEL_EXPORTER_OTLP_ENDPOINT") {
                    Some(url) => base(&url),
                    None => return Ok(None),
                },
            },
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(TraceConfigError(format!(
                "the OTLP endpoint {endpoint:?} is not an http:// or https:// URL"
            )));
        }
        if let Some(protocol) = either("PROTOCOL")
            && protocol != "http/protobuf"
        {
            return Err(TraceConfigError(format!(
                "OTLP over {protocol:?} is not spoken: voxide exports http/protobuf"
            )));
        }
        if !(0.0..=1.0).contains(&sample) {
            return Err(TraceConfigError(
                "the trace sample must be between 0 and 1".into(),
            ));
        }
        let headers = either("HEADERS")
            .map(|list| {
                list.split(',')
                    .filter_map(|pair| {
                        let (name, value) = pair.split_once('=')?;
                        Some((name.trim().to_owned(), percent_decode(value.trim())))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let timeout = match either("TIMEOUT") {
            Some(ms) => Duration::from_millis(ms.trim().parse().map_err(|_| {
                TraceConfigError(format!("the OTLP timeout {ms:?} is not milliseconds"))
            })?),
            None => Duration::from_secs(10),
        };
        Ok(Some(Self {
            endpoint,
            headers,
            timeout,
            service_name: var("OTEL_SERVICE_NAME").unwrap_or_else(|| "voxide".into()),
            sample,
        }))
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A trace id and the ids of spans in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceId(pub [u8; 16]);

impl TraceId {
    /// A fresh random id.
    pub fn random() -> Self {
        Self(random_bytes())
    }

    /// Whether a trace with this id is kept at `ratio` (its low 8 bytes under the ratio's share
    /// of their range, as OpenTelemetry's `TraceIdRatioBased` decides).
    pub fn sampled(&self, ratio: f64) -> bool {
        if ratio >= 1.0 {
            return true;
        }
        let low = u64::from_be_bytes(self.0[8..].try_into().unwrap_or_default());
        (low as f64) < ratio * (u64::MAX as f64)
    }

    /// The id as 32 lowercase hex digits, as trace viewers show it.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A W3C `traceparent` header (`00-{trace}-{span}-{flags}`) as the trace it names, the span
/// it names as the parent, and whether the caller sampled it; `None` when malformed.
pub fn parse_traceparent(header: &str) -> Option<(TraceId, [u8; 8], bool)> {
    let mut parts = header.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || trace.len() != 32 || span.len() != 16 {
        return None;
    }
    let hex = |text: &str, out: &mut [u8]| -> Option<()> {
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(())
    };
    let (mut trace_id, mut span_id) = ([0u8; 16], [0u8; 8]);
    hex(trace, &mut trace_id)?;
    hex(span, &mut span_id)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    // All-zero ids are invalid.
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some((TraceId(trace_id), span_id, flags & 1 == 1))
}

fn random_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; N];
    // The system's random source does not fail on the platforms voxide runs on; an id of
    // zeros would be refused by the collector, not harm the call.
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes
}

fn span_id() -> Vec<u8> {
    random_bytes::<8>().to_vec()
}

/// Makes a session's spans as its journal grows.
#[derive(Debug)]
pub struct TraceBuilder {
    trace: TraceId,
    root: Vec<u8>,
    /// The caller's span the session's root hangs under (its `traceparent`).
    parent: Option<Vec<u8>>,
    /// Turns (by index) whose spans were made.
    exported: std::collections::BTreeSet<usize>,
}

impl TraceBuilder {
    /// A trace with the id `trace`.
    pub fn new(trace: TraceId) -> Self {
        Self {
            trace,
            root: span_id(),
            parent: None,
            exported: Default::default(),
        }
    }

    /// Hangs the session's root under the caller's span `parent`.
    pub fn with_parent(mut self, parent: [u8; 8]) -> Self {
        self.parent = Some(parent.to_vec());
        self
    }

    /// The trace's id.
    pub fn id(&self) -> TraceId {
        self.trace
    }

    /// The spans of the turns settled since the last call: every turn but the last, once its
    /// tool calls have ended.
    pub fn settled(&mut self, journal: &Journal) -> Vec<Span> {
        let Some((_, earlier)) = journal.turns.split_last() else {
            return Vec::new();
        };
        let mut spans = Vec::new();
        for turn in earlier {
            let open_tool = turn.tools.iter().any(|call| call.span.end_ms.is_none());
            if !open_tool && self.exported.insert(turn.index) {
                spans.extend(self.turn(journal, turn));
            }
        }
        spans
    }

    /// The spans of the turns not yet made and the session's own root span: the session is
    /// over.
    pub fn finish(&mut self, journal: &Journal) -> Vec<Span> {
        let mut spans = Vec::new();
        for turn in &journal.turns {
            if self.exported.insert(turn.index) {
                spans.extend(self.turn(journal, turn));
            }
        }
        let end = journal
            .ended
            .as_ref()
            .map(|ended| ended.at_ms)
            .unwrap_or_else(|| last_moment(journal));
        let mut attributes = vec![
            text("session.id", &journal.session),
            text("voxide.transport", &journal.transport),
            int("voxide.session.turns", journal.turns.len() as i64),
        ];
        if let Some(bot) = &journal.bot {
            attributes.push(text("voxide.bot", bot));
        }
        if let Some(ended) = &journal.ended {
            attributes.push(text("voxide.session.end_reason", &ended.reason));
        }
        let mut root = self.span(journal, "voxide.session", None, (0, end), attributes);
        root.kind = span::SpanKind::Server as i32;
        root.parent_span_id = self.parent.clone().unwrap_or_default();
        root.events = journal
            .errors
            .iter()
            .map(|error| {
                event(
                    journal,
                    error.at_ms,
                    "error",
                    vec![text("message", &error.message)],
                )
            })
            .collect();
        if !journal.errors.is_empty() {
            root.status = Some(Status {
                message: journal.errors[0].message.clone(),
                code: opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32,
            });
        }
        spans.push(root);
        spans
    }

    fn span(
        &self,
        journal: &Journal,
        name: &str,
        parent: Option<&[u8]>,
        (start, end): (Millis, Millis),
        attributes: Vec<KeyValue>,
    ) -> Span {
        let id = if parent.is_none() {
            self.root.clone()
        } else {
            span_id()
        };
        Span {
            trace_id: self.trace.0.to_vec(),
            span_id: id,
            parent_span_id: parent.map(<[u8]>::to_vec).unwrap_or_default(),
            flags: 1,
            name: name.to_owned(),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: nanos(journal, start),
            end_time_unix_nano: nanos(journal, end.max(start)),
            attributes,
            ..Span::default()
        }
    }

    /// A turn's span and its children.
    fn turn(&self, journal: &Journal, turn: &Turn) -> Vec<Span> {
        let (start, end) = turn_bounds(turn);
        let mut attributes = vec![int("voxide.turn.index", turn.index as i64)];
        if let Some(v2v) = turn.voice_to_voice_ms {
            attributes.push(double("voxide.turn.voice_to_voice_ms", v2v));
        }
        attributes.push(boolean(
            "voxide.turn.interrupted",
            turn.interrupted_ms.is_some(),
        ));
        if !turn.user_text.is_empty() {
            attributes.push(text("voxide.turn.user_text", &turn.user_text.join(" ")));
        }
        if !turn.bot_text.is_empty() {
            attributes.push(text("voxide.turn.bot_text", &turn.bot_text.join(" ")));
        }
        let mut parent = self.span(
            journal,
            "voxide.turn",
            Some(&self.root),
            (start, end),
            attributes,
        );
        if let Some(at) = turn.interrupted_ms {
            parent
                .events
                .push(event(journal, at, "voxide.interruption", Vec::new()));
        }
        let id = parent.span_id.clone();
        let mut spans = vec![parent];
        let mut child = |name: &str, interval: (Millis, Millis), attributes| {
            spans.push(self.span(journal, name, Some(&id), interval, attributes));
        };

        // The user's speech, the turn detector's wait after it, the STT's finalize.
        if let Some(user) = turn.user {
            let turn_end = user.end_ms.unwrap_or(end);
            let wait = turn.turn_wait_ms.unwrap_or(0.0).round() as Millis;
            let speech_end = turn_end.saturating_sub(wait).max(user.start_ms);
            child(
                "voxide.user_speaking",
                (user.start_ms, speech_end),
                Vec::new(),
            );
            if let Some(ms) = turn.turn_wait_ms {
                child(
                    "voxide.turn_wait",
                    (speech_end, turn_end),
                    vec![double("voxide.turn_wait_ms", ms)],
                );
            }
            if let Some(stt) = &turn.stt {
                let ttfb = stt.ttfb_ms.unwrap_or(0.0).round() as Millis;
                let mut attributes = vec![text("voxide.service", &stt.processor)];
                push_opt_text(&mut attributes, "gen_ai.request.model", &stt.model);
                push_opt_double(&mut attributes, "voxide.ttfb_ms", stt.ttfb_ms);
                push_opt_double(&mut attributes, "voxide.stt.audio_seconds", stt.amount);
                push_opt_double(&mut attributes, "voxide.cost_usd", stt.cost_usd);
                child("voxide.stt", (speech_end, speech_end + ttfb), attributes);
            }
        }
        for llm in &turn.llm {
            let Some(interval) = llm.span else { continue };
            let model = llm.model.as_deref().unwrap_or("unknown");
            let mut attributes = vec![text("gen_ai.operation.name", "chat")];
            push_opt_text(&mut attributes, "gen_ai.request.model", &llm.model);
            push_opt_text(&mut attributes, "voxide.service", &llm.processor);
            if let Some(usage) = &llm.usage {
                attributes.push(int("gen_ai.usage.input_tokens", usage.input as i64));
                attributes.push(int("gen_ai.usage.output_tokens", usage.output as i64));
                if usage.cache_read > 0 {
                    attributes.push(int(
                        "gen_ai.usage.cache_read.input_tokens",
                        usage.cache_read as i64,
                    ));
                }
            }
            push_opt_double(&mut attributes, "voxide.ttfb_ms", llm.ttfb_ms);
            push_opt_double(&mut attributes, "voxide.cost_usd", llm.cost_usd);
            if let Some(used) = llm.preemption_used {
                attributes.push(boolean("voxide.llm.preemption_used", used));
            }
            child(
                &format!("chat {model}"),
                (interval.start_ms, interval.end_ms.unwrap_or(end)),
                attributes,
            );
        }
        for call in &turn.tools {
            let mut attributes = vec![
                text("gen_ai.operation.name", "execute_tool"),
                text("gen_ai.tool.call.id", &call.id),
            ];
            if !call.name.is_empty() {
                attributes.push(text("gen_ai.tool.name", &call.name));
            }
            if let Some(arguments) = &call.arguments {
                attributes.push(text("gen_ai.tool.call.arguments", &arguments.to_string()));
            }
            if let Some(result) = &call.result {
                attributes.push(text("gen_ai.tool.call.result", &result.to_string()));
            }
            if let Some(reason) = &call.cancelled {
                attributes.push(text("voxide.tool.cancelled", reason));
            }
            let name = if call.name.is_empty() {
                "execute_tool".to_owned()
            } else {
                format!("execute_tool {}", call.name)
            };
            let mut span = self.span(
                journal,
                &name,
                Some(&id),
                (call.span.start_ms, call.span.end_ms.unwrap_or(end)),
                attributes,
            );
            span.events = call
                .intermediate_ms
                .iter()
                .map(|&at| event(journal, at, "voxide.tool.intermediate", Vec::new()))
                .collect();
            spans.push(span);
        }
        for tts in &turn.tts {
            let ttfb = tts.ttfb_ms.unwrap_or(0.0).round() as Millis;
            let mut attributes = vec![text("voxide.service", &tts.processor)];
            push_opt_text(&mut attributes, "gen_ai.request.model", &tts.model);
            push_opt_double(&mut attributes, "voxide.ttfb_ms", tts.ttfb_ms);
            push_opt_double(&mut attributes, "voxide.tts.characters", tts.amount);
            push_opt_double(&mut attributes, "voxide.cost_usd", tts.cost_usd);
            spans.push(self.span(
                journal,
                "voxide.tts",
                Some(&id),
                (tts.at_ms.saturating_sub(ttfb), tts.at_ms),
                attributes,
            ));
        }
        if let Some(bot) = turn.bot {
            spans.push(self.span(
                journal,
                "voxide.bot_speaking",
                Some(&id),
                (bot.start_ms, bot.end_ms.unwrap_or(end)),
                Vec::new(),
            ));
        }
        spans
    }
}

/// A turn's first and last moment.
fn turn_bounds(turn: &Turn) -> (Millis, Millis) {
    let intervals = turn
        .user
        .iter()
        .chain(turn.bot.iter())
        .chain(turn.llm.iter().filter_map(|s| s.span.as_ref()))
        .chain(turn.tools.iter().map(|c| &c.span))
        .copied()
        .collect::<Vec<Interval>>();
    let start = intervals.iter().map(|i| i.start_ms).min().unwrap_or(0);
    let end = intervals
        .iter()
        .map(|i| i.end_ms.unwrap_or(i.start_ms))
        .chain(turn.tts.iter().map(|s| s.at_ms))
        .chain(turn.stt.iter().map(|s| s.at_ms))
        .chain(turn.interrupted_ms)
        .max()
        .unwrap_or(start);
    (start, end)
}

fn last_moment(journal: &Journal) -> Millis {
    journal
        .turns
        .iter()
        .map(|turn| turn_bounds(turn).1)
        .max()
        .unwrap_or(0)
}

fn nanos(journal: &Journal, at: Millis) -> u64 {
    journal
        .started_unix_ms
        .saturating_add(at)
        .saturating_mul(1_000_000)
}

fn event(journal: &Journal, at: Millis, name: &str, attributes: Vec<KeyValue>) -> span::Event {
    span::Event {
        time_unix_nano: nanos(journal, at),
        name: name.to_owned(),
        attributes,
        dropped_attributes_count: 0,
    }
}

fn value(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

fn text(key: &str, v: &str) -> KeyValue {
    value(
        key,
        any_value::Value::StringValue(v.chars().take(MAX_TEXT).collect()),
    )
}

fn int(key: &str, v: i64) -> KeyValue {
    value(key, any_value::Value::IntValue(v))
}

fn double(key: &str, v: f64) -> KeyValue {
    value(key, any_value::Value::DoubleValue(v))
}

fn boolean(key: &str, v: bool) -> KeyValue {
    value(key, any_value::Value::BoolValue(v))
}

fn push_opt_text(attributes: &mut Vec<KeyValue>, key: &str, v: &Option<String>) {
    if let Some(v) = v {
        attributes.push(text(key, v));
    }
}

fn push_opt_double(attributes: &mut Vec<KeyValue>, key: &str, v: Option<f64>) {
    if let Some(v) = v {
        attributes.push(double(key, v));
    }
}

/// One export request: the spans under the service's resource and voxide's scope.
pub fn request(service_name: &str, node: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", service_name),
                    text("service.instance.id", node),
                    text("service.version", env!("CARGO_PKG_VERSION")),
                ],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "voxide".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// What the exporter did, for `/metrics`.
#[derive(Debug, Default)]
pub struct ExportCounts {
    /// Spans the collector took.
    pub exported: AtomicU64,
    /// Spans dropped: the queue was full.
    pub dropped: AtomicU64,
    /// Spans lost with an export that failed (unreachable, refused, too slow).
    pub failed: AtomicU64,
}

/// Posts spans to the collector from a bounded queue.
#[derive(Debug)]
pub struct Exporter {
    options: TraceOptions,
    node: String,
    queue: mpsc::Sender<Span>,
    /// The queue's other end, until the first export starts the task that posts.
    inbox: std::sync::Mutex<Option<mpsc::Receiver<Span>>>,
    counts: Arc<ExportCounts>,
}

impl Exporter {
    /// An exporter; `node` names this server in the spans' resource. Its task starts with
    /// the first spans, on the runtime that exports them.
    pub fn new(options: TraceOptions, node: String, counts: Arc<ExportCounts>) -> Self {
        let (queue, inbox) = mpsc::channel(QUEUE_SPANS);
        Self {
            options,
            node,
            queue,
            inbox: std::sync::Mutex::new(Some(inbox)),
            counts,
        }
    }

    /// The options it runs with.
    pub fn options(&self) -> &TraceOptions {
        &self.options
    }

    /// Its counts.
    pub fn counts(&self) -> &ExportCounts {
        &self.counts
    }

    /// Queues spans without waiting; what does not fit is dropped and counted.
    pub fn export(&self, spans: Vec<Span>) {
        if spans.is_empty() {
            return;
        }
        let inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(inbox) = inbox {
            tokio::spawn(post_batches(
                self.options.clone(),
                self.node.clone(),
                inbox,
                self.counts.clone(),
            ));
        }
        for span in spans {
            if self.queue.try_send(span).is_err() {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

async fn post_batches(
    options: TraceOptions,
    node: String,
    mut inbox: mpsc::Receiver<Span>,
    counts: Arc<ExportCounts>,
) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = match reqwest::Client::builder()
        .timeout(options.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the OTLP client: no traces");
            return;
        }
    };
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = inbox.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, inbox.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let body =
            request(&options.service_name, &node, std::mem::take(&mut batch)).encode_to_vec();
        let mut post = client
            .post(&options.endpoint)
            .header("content-type", "application/x-protobuf")
            .body(body);
        for (name, value) in &options.headers {
            post = post.header(name, value);
        }
        match post.send().await {
            Ok(response) if response.status().is_success() => {
                counts.exported.fetch_add(n, Ordering::Relaxed);
            }
            Ok(response) => {
                counts.failed.fetch_add(n, Ordering::Relaxed);
                crate::warnings::warn(
                    "otlp_export",
                    format_args!(
                        "the OTLP collector refused {n} spans: {}",
                        response.status()
                    ),
                );
            }
            Err(e) => {
                counts.failed.fetch_add(n, Ordering::Relaxed);
                crate::warnings::warn(
                    "otlp_export",
                    format_args!("cannot export {n} spans to the OTLP collector: {e}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_endpoint_comes_from_the_flag_else_the_standard_variables() {
        let none = TraceOptions::resolve(None, 1.0, env(&[])).expect("ok");
        assert!(none.is_none(), "no endpoint, no traces");
        let flag = TraceOptions::resolve(Some("http://c:4318/"), 1.0, env(&[]))
            .expect("ok")
            .expect("some");
        assert_eq!(flag.endpoint, "http://c:4318/v1/traces");
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%3Db,x-team = voice"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
            ("OTEL_SERVICE_NAME", "front-desk"),
        ]);
        let options = TraceOptions::resolve(None, 0.5, vars)
            .expect("ok")
            .expect("some");
        assert_eq!(options.endpoint, "http://base:4318/v1/traces");
        assert_eq!(
            options.headers,
            [
                ("api-key".to_owned(), "a=b".to_owned()),
                ("x-team".to_owned(), "voice".to_owned())
            ]
        );
        assert_eq!(options.timeout, Duration::from_millis(2500));
        assert_eq!(options.service_name, "front-desk");
        let whole = env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://x/otlp/traces",
        )]);
        assert_eq!(
            TraceOptions::resolve(None, 1.0, whole)
                .expect("ok")
                .expect("some")
                .endpoint,
            "https://x/otlp/traces",
            "a traces endpoint is used as it is"
        );
    }

    #[test]
    fn grpc_a_bad_url_and_a_ratio_out_of_range_are_refused_with_a_reason() {
        let grpc = env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
        let e = TraceOptions::resolve(Some("http://c:4317"), 1.0, grpc).expect_err("grpc");
        assert!(e.to_string().contains("http/protobuf"), "{e}");
        assert!(TraceOptions::resolve(Some("c:4318"), 1.0, env(&[])).is_err());
        assert!(TraceOptions::resolve(Some("http://c"), 1.5, env(&[])).is_err());
    }

    /// Two turns, an async tool whose result comes in the second, an interruption.
    fn journal() -> Journal {
        use crate::events::{EndReason, Event, ReportLevel, SessionEvent};
        use crate::frames::MetricsData;
        let at = |ms: u64, event: Event| SessionEvent {
            elapsed: Duration::from_millis(ms),
            event,
        };
        let events = [
            at(1_000, Event::UserStartedSpeaking),
            at(2_000, Event::UserStoppedSpeaking),
            at(
                2_050,
                Event::Metrics {
                    data: vec![MetricsData::TurnWait { seconds: 0.2 }],
                },
            ),
            at(2_100, Event::LlmStarted),
            at(
                2_200,
                Event::ToolCallStarted {
                    name: "book".into(),
                    tool_call_id: "c1".into(),
                    arguments: serde_json::json!({"people": 2}),
                },
            ),
            at(2_300, Event::LlmStopped),
            at(2_500, Event::BotStartedSpeaking),
            at(
                2_500,
                Event::Metrics {
                    data: vec![MetricsData::VoiceToVoice { seconds: 0.7 }],
                },
            ),
            at(3_000, Event::UserStartedSpeaking),
            at(3_010, Event::Interruption),
            at(3_020, Event::BotStoppedSpeaking),
            at(
                4_000,
                Event::ToolCallResult {
                    name: "book".into(),
                    tool_call_id: "c1".into(),
                    result: Some(serde_json::json!({"ok": true})),
                },
            ),
            at(4_500, Event::UserStoppedSpeaking),
            at(
                5_000,
                Event::SessionEnded {
                    reason: EndReason::Completed,
                },
            ),
        ];
        let mut builder =
            super::super::journal::JournalBuilder::new("s", "websocket", ReportLevel::Name);
        for event in &events {
            builder.observe(event);
        }
        builder.finish()
    }

    #[test]
    fn a_turns_spans_hang_under_it_and_an_async_tool_waits_for_its_result() {
        let mut journal = journal();
        let mut trace = TraceBuilder::new(TraceId::random());
        // While the tool runs, the first turn is not settled; once its result is in, it is.
        let mut early = journal.clone();
        early.turns[0].tools[0].span.end_ms = None;
        assert!(trace.settled(&early).is_empty());
        journal.ended = None;
        let settled = trace.settled(&journal);
        let turn = settled
            .iter()
            .find(|s| s.name == "voxide.turn")
            .expect("the first turn");
        assert!(
            settled
                .iter()
                .skip(1)
                .all(|s| s.parent_span_id == turn.span_id)
        );
        let tool = settled
            .iter()
            .find(|s| s.name == "execute_tool book")
            .expect("the tool's span");
        assert_eq!(
            (tool.end_time_unix_nano - tool.start_time_unix_nano) / 1_000_000,
            1_800,
            "from its start to its result"
        );
        assert_eq!(turn.events[0].name, "voxide.interruption");
        assert!(
            settled.iter().any(|s| s.name == "voxide.turn_wait"),
            "the turn detector's wait"
        );

        // The end: the second turn and the root, which every turn hangs under.
        let rest = trace.finish(&journal);
        let root = rest.last().expect("the root");
        assert_eq!(root.name, "voxide.session");
        assert!(root.parent_span_id.is_empty());
        assert_eq!(turn.parent_span_id, root.span_id);
        assert_eq!(
            rest.iter().filter(|s| s.name == "voxide.turn").count(),
            1,
            "each turn once"
        );
        let request = request("voxide", "node-1", rest);
        let bytes = request.encode_to_vec();
        let back = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(back, request);
    }

    #[test]
    fn a_callers_traceparent_names_the_trace_and_its_parent_and_a_bad_one_is_ignored() {
        let w3c = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let (trace, parent, sampled) = parse_traceparent(w3c).expect("the spec's example");
        assert_eq!(trace.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(!sampled);
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn sampling_keeps_the_share_of_traces_asked_for() {
        let kept = (0..10_000)
            .filter(|_| TraceId::random().sampled(0.25))
            .count();
        assert!((2_200..2_800).contains(&kept), "{kept} of 10000 at 0.25");
        assert!(TraceId([0; 16]).sampled(1.0));
        assert!(!TraceId([0xff; 16]).sampled(0.0));
    }
}
