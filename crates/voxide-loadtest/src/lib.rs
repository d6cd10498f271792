//! `voxide loadtest`: drives a running voice bot the way callers do, with recorded audio, and
//! says how it holds up, measured from the audio itself.
//!
//! Each session connects over the protocol a client uses (voxide's `/ws`, or Twilio Media
//! Streams), speaks its WAV turns paced by a 20 ms clock (silence in between, as a microphone
//! sends), waits for the bot's reply to end plus a think time, and speaks the next. The end of the
//! user's speech is where the WAV's last voiced window leaves; the bot's reply starts at the
//! first voiced window of the audio received: `v2v` is the difference, as a caller hears it.
//! Sessions start at seeded random offsets, at most `concurrency` at once, ramped.
//!
//! It checks itself: a generator that cannot keep its 20 ms clock makes the run invalid (exit
//! 4), not a false verdict.

// voxide's modules under the names the rest of voxide knows them by.
use voxide_core::{ids, text};
use voxide_media::{audio, transports};
use voxide_services as services;

pub mod impair;
mod link;
mod plan;
mod report;
pub mod room;
mod session;
pub mod signal;
mod sip;
pub mod stats;
mod webrtc;
mod wire;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use transports::sip::sdp::Codec;

use plan::{NetworkCounts, Plan, TurnAudio};
use session::SessionResult;
use stats::{Distribution, Slo, Verdict};

/// How the sessions reach the bot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// voxide's `/ws`: PCM both ways, JSON events.
    Ws,
    /// Twilio Media Streams (`/ws/twilio`): μ-law at 8 kHz in JSON.
    Twilio,
    /// pipecat's SmallWebRTC: `POST /api/offer`, Opus, RTVI on the data channel.
    #[serde(rename = "webrtc")]
    WebRtc,
    /// pipecat's runner and Pipecat Cloud: `POST /start`, then `/sessions/{id}/api/offer`.
    #[serde(rename = "webrtc-start")]
    WebRtcStart,
    /// A phone call over SIP (`sip:[user@]host[:port]`): PCMU over RTP at 8 kHz.
    Sip,
    /// A wideband phone call over SIP: G.722 over RTP, 16 kHz audio.
    #[serde(rename = "sip-g722")]
    SipWideband,
    /// A phone call over SIP in Opus: 16 kHz audio on RTP's 48 kHz clock.
    #[serde(rename = "sip-opus")]
    SipOpus,
}

impl Protocol {
    /// The rate of the bot's audio as it arrives.
    fn output_rate(self) -> u32 {
        match self {
            Protocol::Ws | Protocol::SipWideband | Protocol::SipOpus => 16_000,
            Protocol::Twilio | Protocol::Sip => 8_000,
            Protocol::WebRtc | Protocol::WebRtcStart => 48_000,
        }
    }

    /// One 20 ms frame of silence as the wire carries it.
    fn silence(self) -> Vec<u8> {
        match self {
            Protocol::Ws => vec![0; wire::FRAME * 2],
            Protocol::Twilio | Protocol::Sip => {
                vec![crate::audio::mulaw::encode(0); wire::FRAME / 2]
            }
            Protocol::SipWideband => wire::g722_silence(),
            Protocol::WebRtc | Protocol::WebRtcStart | Protocol::SipOpus => wire::opus_silence(),
        }
    }

    /// The codec of a SIP call; `None` on the other protocols.
    fn sip_codec(self) -> Option<Codec> {
        match self {
            Protocol::Sip => Some(Codec::Pcmu),
            Protocol::SipWideband => Some(Codec::G722),
            Protocol::SipOpus => Some(Codec::Opus),
            Protocol::Ws | Protocol::Twilio | Protocol::WebRtc | Protocol::WebRtcStart => None,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadtestOptions {
    /// The server, `http://host:port` (or `ws://`).
    pub target: String,
    /// The protocol the sessions speak.
    pub protocol: Protocol,
    /// WAVs, one user turn each: the sessions take them in turn, each from where the one before
    /// stopped, cycling.
    pub audio: Vec<PathBuf>,
    /// Sessions in all.
    pub sessions: usize,
    /// Sessions at once.
    pub concurrency: usize,
    /// Turns per session.
    pub turns: usize,
    /// Silence after a reply before the next turn.
    pub think: Duration,
    /// Each turn after the first talks over the bot's reply this long after it starts; the bot's
    /// audio should stop (`barge_in_stop`).
    pub barge_in_at: Option<Duration>,
    /// How long the first `concurrency` sessions take to start.
    pub ramp: Duration,
    /// A load shape over time, k6's way (`30s:5,2m:20,30s:0`: ramp to 5 sessions at once over
    /// 30 s, to 20 over 2 minutes, down to none over 30 s): each slot runs sessions back to back
    /// while the target is above it. When set, `sessions` and `concurrency` are not used.
    pub stages: Vec<Stage>,
    /// Seeds the sessions' start offsets.
    pub seed: u64,
    /// A turn with no reply for this long after the speech ended is an error.
    pub response_timeout: Duration,
    /// The SLOs judged.
    pub slos: Vec<Slo>,
    /// Where the results go.
    pub out: Option<PathBuf>,
    /// The run is invalid when the p99 lag of the generator's 20 ms clock is above this.
    pub max_pacing_lag: Duration,
    /// The bearer token a guarded server wants (`Authorization: Bearer`, on every request).
    pub auth_token: Option<String>,
    /// The noise floor sent under the speech and in every gap; `None`: digital silence.
    pub room: Option<room::Room>,
    /// What the network does to each caller's frames.
    pub network: impair::Impairment,
    /// What the network does to the bot's voice on its way to each caller (WebRTC: the caller
    /// loses its packets and says so in its receiver reports).
    pub received: impair::Impairment,
    /// Copies of earlier frames each WebRTC caller sends in every packet when the bot's answer
    /// asks for RED (RFC 2198); Chrome sends one. 0: plain Opus always.
    pub red: usize,
}

/// Why a run could not be made (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum LoadtestError {
    /// The command asked for something that cannot be run.
    #[error("{0}")]
    Usage(String),
    /// Writing the results failed.
    #[error("writing the results failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The run's verdict, as the exit status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunVerdict {
    /// Every SLO passed.
    Pass,
    /// An SLO failed (exit 1).
    SloFailed,
    /// No session connected (exit 3).
    Unreachable,
    /// The generator could not keep time (exit 4): the figures are not to be trusted.
    Saturated,
}

impl RunVerdict {
    /// The exit status.
    pub fn exit_code(self) -> u8 {
        match self {
            RunVerdict::Pass => 0,
            RunVerdict::SloFailed => 1,
            RunVerdict::Unreachable => 3,
            RunVerdict::Saturated => 4,
        }
    }
}

/// Session counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Sessions begun.
    pub started: usize,
    /// Sessions whose connection opened.
    pub connected: usize,
    /// Sessions that spoke every turn and heard every reply.
    pub completed: usize,
    /// Sessions that failed to connect, were dropped, or lost a turn.
    pub failed: usize,
}

/// What became of the trickled candidates (SmallWebRTC's `PATCH`es).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Trickle {
    /// `PATCH`es sent.
    pub sent: usize,
    /// `PATCH`es refused, by status (`0`: no answer).
    pub refused: BTreeMap<u16, usize>,
}

impl Trickle {
    fn of(results: &[SessionResult]) -> Self {
        results.iter().fold(Self::default(), |mut all, r| {
            all.sent += r.trickle_sent;
            for status in &r.trickle_refused {
                *all.refused.entry(*status).or_default() += 1;
            }
            all
        })
    }
}

/// What the network did, each way, summed over the sessions that said (WebRTC).
#[derive(Debug, Clone, Default, Serialize)]
pub struct NetworkSeen {
    /// The callers' audio, as the bot reported it in its `network` metrics.
    pub to_bot: Option<NetworkCounts>,
    /// The bot's voice, as the callers' jitter buffers saw it.
    pub to_caller: Option<NetworkCounts>,
}

impl NetworkSeen {
    fn of(results: &[SessionResult]) -> Self {
        let sum = |pick: fn(&SessionResult) -> Option<NetworkCounts>| {
            results.iter().filter_map(pick).reduce(|mut all, one| {
                all.add(&one);
                all
            })
        };
        Self {
            to_bot: sum(|r| r.bot_heard),
            to_caller: sum(|r| r.caller_heard),
        }
    }
}

/// The words `heard` got wrong against what was said (`reference`), and the reference's words,
/// as the load tester scores a turn: lowercase, without punctuation, numbers as digits.
pub fn word_errors(reference: &str, heard: &str) -> (usize, usize) {
    let reference = plan::scored_words(reference);
    let errors = text::word_edits(&reference, &plan::scored_words(heard));
    (errors, reference.len())
}

/// The words of what was said (`reference`) that `heard` left out, scored as [`word_errors`]
/// scores them: a word heard wrong is not one left out.
pub fn words_left_out(reference: &str, heard: &str) -> usize {
    text::words_left_out(&plan::scored_words(reference), &plan::scored_words(heard))
}

/// The words of `text` as [`word_errors`] scores them.
pub fn scored_words(text: &str) -> Vec<String> {
    plan::scored_words(text)
}

/// The word error rate of the bot's transcripts against the turns' reference texts, over the
/// turns that have one; `None` when no turn has one or the bot sent no transcript at all. A turn
/// the bot did not transcribe counts every word as an error.
fn word_error_rate(results: &[SessionResult]) -> Option<f64> {
    if !results.iter().any(|r| r.transcribed) {
        return None;
    }
    let (errors, words) = results
        .iter()
        .flat_map(|r| &r.turns)
        .filter_map(|t| t.word_errors)
        .fold((0, 0), |(e, w), (errors, words)| (e + errors, w + words));
    (words > 0).then(|| errors as f64 / words as f64)
}

/// Sessions by the node that answered them.
fn nodes(results: &[SessionResult]) -> BTreeMap<String, usize> {
    let mut nodes = BTreeMap::new();
    for node in results.iter().filter_map(|r| r.node.clone()) {
        *nodes.entry(node).or_default() += 1;
    }
    nodes
}

/// How well the generator kept time.
#[derive(Debug, Clone, Serialize)]
pub struct Generator {
    /// The lag of its 20 ms clock.
    pub pacing_lag_ms: Option<Distribution>,
    /// CPU it and whatever shares its process used, as a share of one core.
    pub cpu_percent: f64,
    /// Whether the figures can be trusted.
    pub valid: bool,
}

/// `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The version of this layout.
    pub schema: u32,
    /// The server loaded.
    pub target: String,
    /// How it was reached.
    pub protocol: Protocol,
    /// What the callers' microphones heard besides their words: `digital silence`, or the
    /// noise and its level (`brown at -55 dBFS`).
    pub room: String,
    /// What the network did to the callers' frames: `clean`, or `3 % loss, 30 ms jitter`.
    pub network: String,
    /// What it did to the bot's voice on the way back.
    pub network_back: String,
    /// When the run began.
    pub started_at_unix_ms: u64,
    /// How long it took.
    pub wall_s: f64,
    /// Sessions by outcome.
    pub sessions: Counts,
    /// Turns spoken.
    pub turns: usize,
    /// Per metric, in ms: `v2v`, `first_audio`, `connect`, and `barge_in_stop` when turns talk
    /// over the bot.
    pub metrics: BTreeMap<String, Option<Distribution>>,
    /// Failures by kind.
    pub errors: BTreeMap<String, usize>,
    /// Failed turns and sessions that never connected, over all of them.
    pub error_rate: f64,
    /// Each SLO's verdict.
    pub slos: Vec<Verdict>,
    /// Sessions by the node that answered them (`X-Voxide-Node`), behind a load balancer.
    pub nodes: BTreeMap<String, usize>,
    /// Trickled ICE candidates: batches sent, and those refused, by HTTP status.
    pub trickle: Trickle,
    /// The word error rate of what the bot heard, where the WAVs have reference texts.
    pub wer: Option<f64>,
    /// What the network did each way, as the two ends counted it.
    pub network_seen: NetworkSeen,
    /// How well the generator kept time.
    pub generator: Generator,
    /// The run's verdict (its exit status).
    pub verdict: RunVerdict,
}

/// The run's timeline: one line per event, seconds from the run's start.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Vec<Value>>>);

impl Recorder {
    fn event(&self, at: f64, session: usize, kind: &str, mut detail: Value) {
        if let Value::Object(map) = &mut detail {
            map.insert("t_ms".into(), json!((at * 1000.0).round()));
            map.insert("session".into(), json!(session));
            map.insert("event".into(), json!(kind));
        }
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(detail);
    }

    fn take(&self) -> Vec<Value> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The WebSocket URL of `target` for `protocol`: `http(s)://` becomes `ws(s)://`; with no path,
/// voxide's (`/ws?…`, `/ws/twilio`); with one, that path (a pipecat bot's `/ws`).
fn socket_url(target: &str, protocol: Protocol) -> Result<String, LoadtestError> {
    if protocol.sip_codec().is_some() {
        sip::target(target).map_err(LoadtestError::Usage)?;
        return Ok(target.to_owned());
    }
    let (scheme, rest) = target.split_once("://").ok_or_else(|| {
        LoadtestError::Usage(format!("--target {target:?}: write http://host:port"))
    })?;
    let scheme = match scheme {
        "http" | "ws" => "ws",
        "https" | "wss" => "wss",
        other => {
            return Err(LoadtestError::Usage(format!(
                "--target {target:?}: the scheme {other:?} is not http, https, ws or wss"
            )));
        }
    };
    let (host, path) = match rest.split_once('/') {
        Some((host, path)) if !path.trim_end_matches('/').is_empty() => {
            (host, format!("/{}", path.trim_end_matches('/')))
        }
        Some((host, _)) => (host, String::new()),
        None => (rest, String::new()),
    };
    if host.is_empty() {
        return Err(LoadtestError::Usage(format!(
            "--target {target:?}: no host"
        )));
    }
    let path = match (path.is_empty(), protocol) {
        (false, _) => path,
        (true, Protocol::Ws) => "/ws?sample_rate=16000&out_sample_rate=16000".to_owned(),
        (true, Protocol::Twilio) => "/ws/twilio".to_owned(),
        (true, Protocol::WebRtc) => "/api/offer".to_owned(),
        (true, Protocol::WebRtcStart) => "/start".to_owned(),
        (true, Protocol::Sip | Protocol::SipWideband | Protocol::SipOpus) => String::new(),
    };
    let scheme = match protocol {
        // Signalling is HTTP.
        Protocol::WebRtc | Protocol::WebRtcStart => scheme.replacen("ws", "http", 1),
        Protocol::Ws
        | Protocol::Twilio
        | Protocol::Sip
        | Protocol::SipWideband
        | Protocol::SipOpus => scheme.to_owned(),
    };
    Ok(format!("{scheme}://{host}{path}"))
}

/// A seeded offset in `[0, 1)` for session `i` (splitmix64).
fn offset(seed: u64, i: usize) -> f64 {
    let mut z = seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// Reads and encodes the turns once.
fn turns(options: &LoadtestOptions) -> Result<Vec<TurnAudio>, LoadtestError> {
    if options.audio.is_empty() {
        return Err(LoadtestError::Usage("give at least one --audio WAV".into()));
    }
    options
        .audio
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let wav = crate::audio::wav::read(path)
                .map_err(|e| LoadtestError::Usage(format!("--audio {}: {e}", path.display())))?;
            let rate = wav.sample_rate;
            let mono = wav.to_mono();
            let samples = if rate == 16_000 {
                mono
            } else {
                crate::audio::resample::StreamResampler::new(rate, 16_000)
                    .map_err(|e| LoadtestError::Usage(format!("--audio {}: {e}", path.display())))?
                    .process(&mono)
            };
            let name = path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            let tone = match &options.room {
                Some(room) => room
                    .tone(samples.len(), options.seed.wrapping_add(i as u64 + 1))
                    .map_err(LoadtestError::Usage)?,
                None => Vec::new(),
            };
            let mut turn =
                TurnAudio::new(name, &samples, &tone, options.protocol).ok_or_else(|| {
                    LoadtestError::Usage(format!("--audio {}: no speech in it", path.display()))
                })?;
            turn.reference = reference(path)?;
            Ok(turn)
        })
        .collect()
}

/// The longest reference text read beside a WAV.
const MAX_REFERENCE: u64 = 64 * 1024;

/// What `wav` says, from the `.txt` beside it (`q.wav` and `q.txt`), if there is one.
pub fn reference(wav: &std::path::Path) -> Result<Option<String>, LoadtestError> {
    let path = wav.with_extension("txt");
    let Ok(meta) = std::fs::metadata(&path) else {
        return Ok(None);
    };
    if meta.len() > MAX_REFERENCE {
        return Err(LoadtestError::Usage(format!(
            "{}: a reference text is at most {MAX_REFERENCE} bytes",
            path.display()
        )));
    }
    std::fs::read_to_string(&path)
        .map(|text| Some(text.trim().to_owned()))
        .map_err(|e| LoadtestError::Usage(format!("{}: {e}", path.display())))
}

/// Seconds of room tone the gaps between turns loop through.
const GAP_LOOP_SECS: usize = 10;

/// The 20 ms frames every gap between turns is made of, as the wire carries them: digital
/// silence, or a loop of the room's tone.
fn gap(options: &LoadtestOptions) -> Result<Vec<Vec<u8>>, LoadtestError> {
    let Some(room) = &options.room else {
        return Ok(vec![options.protocol.silence()]);
    };
    let tone = room
        .tone(16_000 * GAP_LOOP_SECS, options.seed)
        .map_err(LoadtestError::Usage)?;
    wire::encode(&tone, options.protocol)
        .ok_or_else(|| LoadtestError::Usage("the room's tone could not be encoded".into()))
}

/// Runs the load test.
pub async fn run(options: LoadtestOptions) -> Result<Summary, LoadtestError> {
    if options.sessions == 0 || options.concurrency == 0 || options.turns == 0 {
        return Err(LoadtestError::Usage(
            "--sessions, --concurrency and --turns must be at least 1".into(),
        ));
    }
    let url = socket_url(&options.target, options.protocol)?;
    let audio = Arc::new(turns(&options)?);
    let gap = Arc::new(gap(&options)?);
    let origin = Instant::now();
    let started_at_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let cpu_start = stats::cpu_seconds();
    let plan = Arc::new(Plan {
        protocol: options.protocol,
        url,
        turns: options.turns,
        think: options.think,
        barge_in_at: options.barge_in_at,
        response_timeout: options.response_timeout,
        audio,
        gap,
        origin,
        auth_token: options.auth_token.clone(),
        network: options.network,
        received: options.received,
        red: options.red,
    });
    let recorder = Recorder::default();
    let expected = if options.stages.is_empty() {
        options.sessions
    } else {
        stages_peak(&options.stages)
    };
    let live = live_line(expected, origin);
    let tasks = if options.stages.is_empty() {
        fixed(&options, origin, &plan, &recorder, &live)
    } else {
        staged(&options, origin, &plan, &recorder, &live)
    };
    let mut results = Vec::new();
    for task in tasks {
        if let Ok(done) = task.await {
            results.extend(done);
        }
    }
    results.sort_by_key(|r| r.session);
    live.stop();
    let wall_s = origin.elapsed().as_secs_f64();
    let cpu = stats::cpu_seconds() - cpu_start;
    let summary = summarize(&options, &results, started_at_unix_ms, wall_s, cpu);
    if let Some(dir) = &options.out {
        report::write(dir, &summary, &results, recorder.take())?;
    }
    Ok(summary)
}

type Sessions = Vec<tokio::task::JoinHandle<Vec<SessionResult>>>;

/// `sessions` sessions, `concurrency` at once, the first wave spread over the ramp; every
/// session adds its own seeded offset, so sessions do not speak in lock step.
fn fixed(
    options: &LoadtestOptions,
    origin: Instant,
    plan: &Arc<Plan>,
    recorder: &Recorder,
    live: &Live,
) -> Sessions {
    let permits = Arc::new(tokio::sync::Semaphore::new(options.concurrency));
    (0..options.sessions)
        .map(|i| {
            let ramp = options
                .ramp
                .mul_f64(i.min(options.concurrency) as f64 / options.concurrency as f64);
            let start = origin + ramp + Duration::from_millis(500).mul_f64(offset(options.seed, i));
            let permits = permits.clone();
            let (plan, recorder, live) = (plan.clone(), recorder.clone(), live.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start).await;
                let _permit = permits.acquire_owned().await;
                live.started();
                let result = session::run(i, plan, recorder, &live).await;
                live.finished(&result);
                vec![result]
            })
        })
        .collect()
}

/// One slot per session the stages ever want at once; a slot runs sessions back to back while
/// the target stands above it, and lets its session finish when the target drops.
fn staged(
    options: &LoadtestOptions,
    origin: Instant,
    plan: &Arc<Plan>,
    recorder: &Recorder,
    live: &Live,
) -> Sessions {
    let stages = Arc::new(options.stages.clone());
    let end = origin + stages.iter().map(|s| s.duration).sum::<Duration>();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    (0..stages_peak(&stages))
        .map(|slot| {
            let (stages, next, seed) = (stages.clone(), next.clone(), options.seed);
            let (plan, recorder, live) = (plan.clone(), recorder.clone(), live.clone());
            tokio::spawn(async move {
                let mut done = Vec::new();
                let jitter = Duration::from_millis(500).mul_f64(offset(seed, slot));
                tokio::time::sleep(jitter).await;
                loop {
                    let now = Instant::now();
                    if now >= end {
                        return done;
                    }
                    if target_at(&stages, now.duration_since(origin)) <= slot as f64 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    live.started();
                    let result = session::run(i, plan.clone(), recorder.clone(), &live).await;
                    live.finished(&result);
                    done.push(result);
                }
            })
        })
        .collect()
}

/// One stage of a load shape: reach `target` sessions at once over `duration`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stage {
    /// How long it takes.
    pub duration: Duration,
    /// Sessions at once at its end.
    pub target: usize,
}

impl Stage {
    /// Reads k6's `30s:5,2m:20,30s:0` (durations in ms, s, m or h).
    pub fn parse_list(text: &str) -> Result<Vec<Stage>, String> {
        let bad = || format!("--stages {text:?}: write DURATION:SESSIONS,…, as 30s:5,2m:20,30s:0");
        text.split(',')
            .map(|part| {
                let (duration, target) = part.trim().split_once(':').ok_or_else(bad)?;
                let (number, unit) = duration
                    .find(|c: char| c.is_ascii_alphabetic())
                    .map(|i| duration.split_at(i))
                    .ok_or_else(bad)?;
                let value: f64 = number.parse().map_err(|_| bad())?;
                let seconds = match unit {
                    "ms" => value / 1000.0,
                    "s" => value,
                    "m" => value * 60.0,
                    "h" => value * 3600.0,
                    _ => return Err(bad()),
                };
                if !(seconds.is_finite() && seconds >= 0.0) {
                    return Err(bad());
                }
                Ok(Stage {
                    duration: Duration::from_secs_f64(seconds),
                    target: target.parse().map_err(|_| bad())?,
                })
            })
            .collect()
    }
}

/// The most sessions the stages want at once.
fn stages_peak(stages: &[Stage]) -> usize {
    stages.iter().map(|s| s.target).max().unwrap_or(0)
}

/// The target `elapsed` into the stages: each stage moves linearly from the one before's target
/// (0 at the start) to its own.
fn target_at(stages: &[Stage], elapsed: Duration) -> f64 {
    let mut from = 0.0;
    let mut at = Duration::ZERO;
    for stage in stages {
        let to = stage.target as f64;
        if elapsed < at + stage.duration {
            let share = (elapsed - at).as_secs_f64() / stage.duration.as_secs_f64();
            return from + (to - from) * share;
        }
        at += stage.duration;
        from = to;
    }
    from
}

/// One step of a capacity search.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Sessions at once (and in all).
    pub concurrency: usize,
    /// How it went.
    pub verdict: RunVerdict,
    /// Its SLO verdicts.
    pub slos: Vec<Verdict>,
    /// Its v2v.
    pub v2v: Option<Distribution>,
}

/// `capacity.json`: the largest concurrency at which every SLO held.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    /// The version of this layout.
    pub schema: u32,
    /// The steps, in the order run.
    pub steps: Vec<Step>,
    /// The largest passing concurrency; none when even one session failed an SLO.
    pub capacity: Option<usize>,
    /// The search's verdict: `saturated` when the generator could not keep time at the step
    /// just above the capacity (which is then a lower bound on the bot's: the generator gave
    /// out first), `unreachable` when no session of the first step connected.
    pub verdict: RunVerdict,
}

/// Raises the concurrency (1, 2, 4, … up to `max`, then halfway between the last pass and the
/// first failure until they meet) until an SLO breaks; every step runs `concurrency` sessions at
/// once. A step whose generator could not keep time bounds the search as a failure does. The
/// SLOs must be given: without them nothing can fail.
pub async fn find_capacity(
    options: LoadtestOptions,
    max: usize,
) -> Result<Capacity, LoadtestError> {
    if options.slos.is_empty() {
        return Err(LoadtestError::Usage(
            "--find-capacity needs at least one --slo".into(),
        ));
    }
    let mut steps = Vec::new();
    let mut search = Search::default();
    let mut next = Some(1usize);
    while let Some(k) = next {
        let k = k.min(max.max(1));
        let step_options = LoadtestOptions {
            sessions: k,
            concurrency: k,
            stages: Vec::new(),
            out: options
                .out
                .as_ref()
                .map(|d| d.join(format!("concurrency-{k}"))),
            ..options.clone()
        };
        eprintln!("[capacity] {k} sessions at once");
        let summary = run(step_options).await?;
        steps.push(Step {
            concurrency: k,
            verdict: summary.verdict,
            slos: summary.slos.clone(),
            v2v: summary.metrics.get("v2v").copied().flatten(),
        });
        next = search.record(k, summary.verdict, max);
    }
    let capacity = Capacity {
        schema: 1,
        steps,
        capacity: search.pass,
        verdict: search.verdict(),
    };
    if let Some(dir) = &options.out {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(&capacity).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("capacity.json"), json + "\n")?;
    }
    Ok(capacity)
}

/// Where a capacity search stands, sans-IO: the largest concurrency that passed, and the
/// smallest that did not and why.
#[derive(Debug, Default)]
struct Search {
    pass: Option<usize>,
    bound: Option<usize>,
    /// The bound is a step the generator could not keep time for, not a failed SLO.
    saturated: bool,
    unreachable: bool,
}

impl Search {
    /// Takes step `k`'s verdict; the next concurrency to run, if any.
    fn record(&mut self, k: usize, verdict: RunVerdict, max: usize) -> Option<usize> {
        match verdict {
            RunVerdict::Pass => self.pass = Some(k),
            // Each step is below the last bound, so it becomes the bound.
            RunVerdict::SloFailed => (self.bound, self.saturated) = (Some(k), false),
            // No verdict on the bot at this load, but a bound all the same: the steps below it
            // may still keep time.
            RunVerdict::Saturated => (self.bound, self.saturated) = (Some(k), true),
            // Nothing more can be learnt.
            RunVerdict::Unreachable => {
                self.unreachable = true;
                return None;
            }
        }
        next_step(self.pass, self.bound, max)
    }

    /// The search's verdict. A capacity bounded by the generator is only a lower bound on the
    /// bot's: `saturated`.
    fn verdict(&self) -> RunVerdict {
        if self.unreachable {
            RunVerdict::Unreachable
        } else if self.saturated {
            RunVerdict::Saturated
        } else if self.pass.is_some() {
            RunVerdict::Pass
        } else {
            RunVerdict::SloFailed
        }
    }
}

/// The next concurrency to try after the largest that passed and the smallest that failed:
/// doubling up to `max`, then bisecting; none when they meet.
fn next_step(pass: Option<usize>, fail: Option<usize>, max: usize) -> Option<usize> {
    match (pass, fail) {
        (Some(p), None) if p < max => Some((p * 2).min(max)),
        (Some(p), Some(f)) if f > p + 1 => Some(p + (f - p) / 2),
        _ => None,
    }
}

/// What the sessions' results add up to, before the figures are made of it.
#[derive(Default)]
struct Tally {
    counts: Counts,
    errors: BTreeMap<String, usize>,
    v2v: Vec<f64>,
    first_audio: Vec<f64>,
    connect: Vec<f64>,
    lags: Vec<f64>,
    barge_in: Vec<f64>,
    turns: usize,
    failed_turns: usize,
}

impl Tally {
    fn of(results: &[SessionResult]) -> Self {
        let mut t = Tally {
            counts: Counts {
                started: results.len(),
                ..Counts::default()
            },
            ..Tally::default()
        };
        for result in results {
            t.lags.extend(&result.pacing_lag_ms);
            if let Some(connected) = result.connected {
                t.counts.connected += 1;
                t.connect.push((connected - result.started) * 1000.0);
                if let Some(first) = result.first_audio {
                    t.first_audio.push((first - connected) * 1000.0);
                }
            }
            for turn in &result.turns {
                t.turns += 1;
                // A reply that came is timed, whatever happened after it.
                t.v2v.extend(turn.v2v_ms());
                t.barge_in.extend(turn.barge_in_stop_ms);
                match &turn.error {
                    Some(kind) => {
                        t.failed_turns += 1;
                        *t.errors.entry(kind.clone()).or_default() += 1;
                    }
                    None if turn.onset.is_none() => t.failed_turns += 1,
                    None => {}
                }
            }
            match &result.error {
                Some(kind) => {
                    t.counts.failed += 1;
                    if result.connected.is_none() {
                        *t.errors.entry(kind.clone()).or_default() += 1;
                    }
                }
                None if result.turns.iter().all(|t| t.error.is_none()) => {
                    t.counts.completed += 1;
                }
                None => t.counts.failed += 1,
            }
        }
        t
    }
}

fn summarize(
    options: &LoadtestOptions,
    results: &[SessionResult],
    started_at_unix_ms: u64,
    wall_s: f64,
    cpu_s: f64,
) -> Summary {
    let Tally {
        counts,
        errors,
        v2v,
        first_audio,
        connect,
        lags,
        barge_in,
        turns,
        failed_turns,
    } = Tally::of(results);
    let mut metrics = BTreeMap::new();
    metrics.insert("v2v".to_owned(), Distribution::of(&v2v));
    metrics.insert("first_audio".to_owned(), Distribution::of(&first_audio));
    metrics.insert("connect".to_owned(), Distribution::of(&connect));
    if options.barge_in_at.is_some() {
        metrics.insert("barge_in_stop".to_owned(), Distribution::of(&barge_in));
    }
    let attempts = turns + results.iter().filter(|r| r.connected.is_none()).count();
    let error_rate = if attempts == 0 {
        1.0
    } else {
        (failed_turns + results.iter().filter(|r| r.connected.is_none()).count()) as f64
            / attempts as f64
    };
    let slos: Vec<Verdict> = options
        .slos
        .iter()
        .map(|slo| slo.judge(&metrics, error_rate))
        .collect();
    let pacing = Distribution::of(&lags);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let cpu_percent = 100.0 * cpu_s / wall_s.max(1e-9);
    let valid = pacing.is_none_or(|p| p.p99 <= options.max_pacing_lag.as_secs_f64() * 1000.0)
        && cpu_percent <= 80.0 * cores;
    let verdict = if counts.connected == 0 {
        RunVerdict::Unreachable
    } else if !valid {
        RunVerdict::Saturated
    } else if slos.iter().all(|s| s.pass) {
        RunVerdict::Pass
    } else {
        RunVerdict::SloFailed
    };
    Summary {
        schema: 1,
        target: options.target.clone(),
        protocol: options.protocol,
        room: room_name(options.room.as_ref()),
        network: options.network.describe(),
        network_back: options.received.describe(),
        started_at_unix_ms,
        wall_s,
        sessions: counts,
        turns,
        metrics,
        errors,
        error_rate,
        slos,
        nodes: nodes(results),
        trickle: Trickle::of(results),
        wer: word_error_rate(results),
        network_seen: NetworkSeen::of(results),
        generator: Generator {
            pacing_lag_ms: pacing,
            cpu_percent,
            valid,
        },
        verdict,
    }
}

/// The room as the summary names it.
fn room_name(room: Option<&room::Room>) -> String {
    match room {
        None => "digital silence".into(),
        Some(room) => room.to_string(),
    }
}

/// The console's live line, once a second on stderr.
#[derive(Clone)]
pub(crate) struct Live {
    state: Arc<Mutex<LiveState>>,
    ticker: Arc<tokio::task::JoinHandle<()>>,
}

#[derive(Default)]
struct LiveState {
    total: usize,
    active: usize,
    started: usize,
    failed: usize,
    v2v: Vec<f64>,
}

fn live_line(total: usize, origin: Instant) -> Live {
    let state = Arc::new(Mutex::new(LiveState {
        total,
        ..LiveState::default()
    }));
    let ticker = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.tick().await;
            loop {
                every.tick().await;
                let s = state.lock().unwrap_or_else(|p| p.into_inner());
                let d = Distribution::of(&s.v2v);
                eprintln!(
                    "[{:>5.0}s] active {:>3}  started {:>4}/{}  failed {:>3}  v2v p50 {}  p95 {}",
                    origin.elapsed().as_secs_f64(),
                    s.active,
                    s.started,
                    s.total,
                    s.failed,
                    d.map_or("-".into(), |d| format!("{:.0} ms", d.p50)),
                    d.map_or("-".into(), |d| format!("{:.0} ms", d.p95)),
                );
            }
        })
    };
    Live {
        state,
        ticker: Arc::new(ticker),
    }
}

impl Live {
    fn started(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.active += 1;
        s.started += 1;
    }

    fn finished(&self, result: &SessionResult) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.active = s.active.saturating_sub(1);
        if result.error.is_some() {
            s.failed += 1;
        }
    }

    /// A turn was answered (or not): the live percentiles include it at once.
    fn turn(&self, v2v_ms: Option<f64>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.v2v.extend(v2v_ms);
    }

    fn stop(&self) {
        self.ticker.abort();
    }
}

/// The final table, for the console.
pub fn table(summary: &Summary) -> String {
    let mut out = format!(
        "room: {}\nnetwork: {} (back: {})\nsessions: {} started, {} connected, {} completed, {} failed; {} turns\n",
        summary.room,
        summary.network,
        summary.network_back,
        summary.sessions.started,
        summary.sessions.connected,
        summary.sessions.completed,
        summary.sessions.failed,
        summary.turns
    );
    out.push_str("metric           p50      p90      p95      p99      max    n\n");
    for (name, d) in &summary.metrics {
        match d {
            Some(d) => out.push_str(&format!(
                "{name:<12} {:>6.0}ms {:>6.0}ms {:>6.0}ms {:>6.0}ms {:>6.0}ms {:>4}\n",
                d.p50, d.p90, d.p95, d.p99, d.max, d.n
            )),
            None => out.push_str(&format!("{name:<12} no data\n")),
        }
    }
    for (kind, n) in &summary.errors {
        out.push_str(&format!("error {kind}: {n}\n"));
    }
    if !summary.nodes.is_empty() {
        let nodes: Vec<String> = summary
            .nodes
            .iter()
            .map(|(node, n)| format!("{node} {n}"))
            .collect();
        out.push_str(&format!("nodes: {}\n", nodes.join(", ")));
    }
    if summary.trickle.sent > 0 {
        let refused: usize = summary.trickle.refused.values().sum();
        out.push_str(&format!(
            "trickle: {} PATCHes, {refused} refused\n",
            summary.trickle.sent
        ));
    }
    if let Some(wer) = summary.wer {
        out.push_str(&format!(
            "WER of what the bot heard: {:.1} %\n",
            wer * 100.0
        ));
    }
    let seen = [
        ("callers' audio at the bot", summary.network_seen.to_bot),
        ("bot's voice at the callers", summary.network_seen.to_caller),
    ];
    for (way, counts) in seen {
        if let Some(c) = counts {
            out.push_str(&format!(
                "{way}: {} packets, {} lost ({} played from RED copies, {} rebuilt by FEC), {} frames concealed, {} late\n",
                c.received, c.lost, c.redundant, c.recovered, c.concealed, c.late
            ));
        }
    }
    for slo in &summary.slos {
        out.push_str(&format!(
            "SLO {}: {} ({})\n",
            slo.slo,
            if slo.pass { "pass" } else { "FAIL" },
            slo.value.map_or("no data".into(), |v| format!("{v:.1}"))
        ));
    }
    if let Some(lag) = summary.generator.pacing_lag_ms {
        out.push_str(&format!(
            "generator: 20 ms clock lag p99 {:.1} ms, CPU {:.0}%{}\n",
            lag.p99,
            summary.generator.cpu_percent,
            if summary.generator.valid {
                ""
            } else {
                " — saturated: the run is invalid"
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_read_like_k6_and_ramp_linearly() {
        let stages = Stage::parse_list("30s:5, 1m:20,500ms:0").expect("valid");
        assert_eq!(
            stages[1],
            Stage {
                duration: Duration::from_secs(60),
                target: 20
            }
        );
        assert_eq!(stages_peak(&stages), 20);
        assert_eq!(target_at(&stages, Duration::from_secs(15)), 2.5);
        assert_eq!(target_at(&stages, Duration::from_secs(60)), 12.5);
        assert_eq!(target_at(&stages, Duration::from_secs(91)), 0.0);
        // A stage of no length jumps to its target.
        let constant = [
            Stage {
                duration: Duration::ZERO,
                target: 4,
            },
            Stage {
                duration: Duration::from_secs(10),
                target: 4,
            },
        ];
        assert_eq!(target_at(&constant, Duration::from_secs(1)), 4.0);
        for bad in ["30:5", "30s", "30s:x", "1d:3", "-1s:2"] {
            assert!(Stage::parse_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_capacity_search_doubles_then_bisects_until_pass_and_fail_meet() {
        assert_eq!(next_step(Some(1), None, 64), Some(2));
        assert_eq!(next_step(Some(32), None, 50), Some(50));
        assert_eq!(next_step(Some(50), None, 50), None);
        assert_eq!(next_step(Some(8), Some(16), 64), Some(12));
        assert_eq!(next_step(Some(12), Some(13), 64), None);
        assert_eq!(next_step(None, Some(1), 64), None);
    }

    #[test]
    fn a_step_the_generator_cannot_pace_bounds_the_search_and_marks_the_capacity_a_lower_bound() {
        let mut search = Search::default();
        for k in [1, 2, 4, 8, 16, 32] {
            assert_eq!(search.record(k, RunVerdict::Pass, 128), Some(k * 2));
        }
        assert_eq!(search.record(64, RunVerdict::Pass, 128), Some(128));
        // 128 saturates: the search goes on below it rather than stopping with 64.
        assert_eq!(search.record(128, RunVerdict::Saturated, 128), Some(96));
        assert_eq!(search.record(96, RunVerdict::Saturated, 128), Some(80));
        assert_eq!(search.record(80, RunVerdict::Pass, 128), Some(88));
        assert_eq!(search.record(88, RunVerdict::Saturated, 128), Some(84));
        assert_eq!(search.record(84, RunVerdict::Pass, 128), Some(86));
        assert_eq!(search.record(86, RunVerdict::Pass, 128), Some(87));
        assert_eq!(search.record(87, RunVerdict::Pass, 128), None);
        assert_eq!(
            (search.pass, search.verdict()),
            (Some(87), RunVerdict::Saturated)
        );
    }

    #[test]
    fn an_slo_that_breaks_below_a_saturated_step_is_the_verdict() {
        let mut search = Search::default();
        search.record(1, RunVerdict::Pass, 4);
        search.record(2, RunVerdict::Pass, 4);
        assert_eq!(search.record(4, RunVerdict::Saturated, 4), Some(3));
        assert_eq!(search.record(3, RunVerdict::SloFailed, 4), None);
        assert_eq!((search.pass, search.verdict()), (Some(2), RunVerdict::Pass));

        let mut unreachable = Search::default();
        assert_eq!(unreachable.record(1, RunVerdict::Unreachable, 4), None);
        assert_eq!(
            (unreachable.pass, unreachable.verdict()),
            (None, RunVerdict::Unreachable)
        );
        let mut failed = Search::default();
        assert_eq!(failed.record(1, RunVerdict::SloFailed, 4), None);
        assert_eq!(failed.verdict(), RunVerdict::SloFailed);
    }

    #[test]
    fn targets_become_websocket_bases_and_offsets_are_seeded() {
        let url = |t: &str, p| socket_url(t, p).expect("valid");
        assert_eq!(
            url("http://127.0.0.1:8080/", Protocol::Ws),
            "ws://127.0.0.1:8080/ws?sample_rate=16000&out_sample_rate=16000"
        );
        assert_eq!(
            url("https://bot.example", Protocol::Twilio),
            "wss://bot.example/ws/twilio"
        );
        // A pipecat Twilio bot's own path.
        assert_eq!(
            url("http://127.0.0.1:8765/ws", Protocol::Twilio),
            "ws://127.0.0.1:8765/ws"
        );
        assert!(socket_url("127.0.0.1:8080", Protocol::Ws).is_err());
        assert!(socket_url("ftp://h", Protocol::Ws).is_err());
        assert!(socket_url("http:///ws", Protocol::Ws).is_err());
        assert_eq!(
            url("sip:night-desk@127.0.0.1:5080", Protocol::Sip),
            "sip:night-desk@127.0.0.1:5080"
        );
        assert!(socket_url("http://127.0.0.1:5080", Protocol::Sip).is_err());
        assert!(socket_url("sip:", Protocol::Sip).is_err());
        let a: Vec<f64> = (0..5).map(|i| offset(7, i)).collect();
        assert_eq!(a, (0..5).map(|i| offset(7, i)).collect::<Vec<_>>());
        assert_ne!(a, (0..5).map(|i| offset(8, i)).collect::<Vec<_>>());
        assert!(a.iter().all(|o| (0.0..1.0).contains(o)));
    }
}
