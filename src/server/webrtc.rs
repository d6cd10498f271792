//! WebRTC signalling, as pipecat's SmallWebRTC clients expect it: `POST /api/offer` (new,
//! renegotiated or restarted connection), `PATCH /api/offer` (trickled ICE), `POST /start` and
//! the session-scoped `/sessions/{id}/api/offer`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use rtc::peer_connection::transport::RTCIceCandidateInit;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::rtvi::{Leave, RtviInput};
use super::{ApiError, App};
use crate::bot::SessionInfo;
use crate::events::{EndReason, Event, ReportLevel, SessionEvent};
use crate::frames::{AudioFrame, MetricsData};
use crate::observe::Watched;
use crate::pipeline::{Session, SessionHandle};
use crate::transports::jitter::NetworkStats;
use crate::transports::pace::{Allowance, Pace, TooFast};
use crate::transports::rtvi::{self, Rtvi};
use crate::transports::signalling::{
    self, AUDIO_RECEIVER, Inbound, Liveness, OfferPlan, Signal, plan_offer,
};
use crate::transports::webrtc::{
    INPUT_RATE, OPUS_RATE, Peer, PeerEvent, PeerOptions, TrackSink, connect,
};

/// An SDP offer.
#[derive(Debug, Deserialize)]
pub(crate) struct OfferRequest {
    sdp: String,
    #[serde(rename = "type")]
    kind: String,
    pc_id: Option<String>,
    #[serde(default)]
    restart_pc: bool,
    /// What the app sent with the connection (pipecat's `requestData`): the bot it asks for
    /// (`{"bot": "name"}`) and anything its tools should see.
    #[serde(default, rename = "requestData", alias = "request_data")]
    request_data: Option<Value>,
}

/// Trickled candidates one `PATCH` may carry.
pub const MAX_CANDIDATES_PER_REQUEST: usize = 32;
/// Trickled candidates one connection may take in all (a browser gathers a handful per
/// network interface).
pub const MAX_CANDIDATES_PER_CONNECTION: usize = 256;
/// The longest candidate line.
const MAX_CANDIDATE_BYTES: usize = 1024;
/// Restarts and renegotiations a session may ask for at once, then one every
/// [`CHANGE_EVERY`]: a client on a flaky network needs a few; a loop needs none.
pub const CHANGE_BURST: u32 = 5;
const CHANGE_EVERY: std::time::Duration =
    std::time::Duration::from_secs(super::error::CHANGE_EVERY_SECS as u64);

/// How long what a `/start` asked for waits for its offer.
const START_TTL: std::time::Duration = std::time::Duration::from_secs(300);
/// The largest `/start` body kept for its offer.
pub(crate) const MAX_START_BODY: usize = 16 * 1024;
/// `/start`s waiting for their offers at most, and the bytes of what they asked for in all;
/// past either, the oldest goes first.
const MAX_STARTS: usize = 10_000;
const MAX_STARTS_BYTES: usize = 8 * 1024 * 1024;

/// Each `/start`'s session, by id, with what it asked for (its `body`), until its offer comes:
/// the first offer takes it, and it is gone.
#[derive(Default)]
pub(crate) struct Starts {
    waiting: HashMap<String, Started>,
    bytes: usize,
}

struct Started {
    at: Instant,
    body: Value,
    bytes: usize,
}

impl Starts {
    fn insert(&mut self, id: String, body: Value, bytes: usize, now: Instant) {
        self.waiting
            .retain(|_, s| now.duration_since(s.at) < START_TTL);
        self.bytes = self.waiting.values().map(|s| s.bytes).sum();
        while (self.waiting.len() >= MAX_STARTS || self.bytes + bytes > MAX_STARTS_BYTES)
            && let Some(oldest) = self
                .waiting
                .iter()
                .min_by_key(|(_, s)| s.at)
                .map(|(k, _)| k.clone())
        {
            self.remove(&oldest);
        }
        self.bytes += bytes;
        self.waiting.insert(
            id,
            Started {
                at: now,
                body,
                bytes,
            },
        );
    }

    /// What the start asked for, taken by its offer.
    fn take(&mut self, id: &str) -> Option<Value> {
        self.remove(id)
    }

    fn remove(&mut self, id: &str) -> Option<Value> {
        let started = self.waiting.remove(id)?;
        self.bytes -= started.bytes;
        Some(started.body)
    }

    /// Whether a `/start` here began session `id`, and its offer has not come yet.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.waiting.contains_key(id)
    }
}

/// `POST /start`'s body, as pipecat's runner and JS client send it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct StartRequest {
    /// What the bot's session gets (the runner's `body`).
    body: Option<Value>,
    /// The same, as pipecat's JS client names it.
    #[serde(rename = "requestData", alias = "request_data")]
    request_data: Option<Value>,
}

#[derive(Debug, Serialize)]
pub(crate) struct OfferAnswer {
    sdp: String,
    #[serde(rename = "type")]
    kind: &'static str,
    pc_id: String,
}

/// Trickled ICE candidates.
#[derive(Debug, Deserialize)]
pub(crate) struct CandidatesRequest {
    pc_id: String,
    candidates: Vec<Candidate>,
}

#[derive(Debug, Deserialize)]
struct Candidate {
    candidate: String,
    sdp_mid: Option<String>,
    sdp_mline_index: Option<u16>,
}

type Answer = Result<Json<OfferAnswer>, ApiError>;

/// For [`crate::fuzz`]: an offer, trickled candidates and a `/start` body, read from `bytes`,
/// and the offer's plan.
pub(super) fn fuzz_bodies(bytes: &[u8]) {
    if let Ok(offer) = serde_json::from_slice::<OfferRequest>(bytes) {
        let _ = plan_offer(
            &offer.kind,
            offer.pc_id.as_deref(),
            offer.restart_pc,
            offer.pc_id.is_some(),
        );
    }
    let _ = serde_json::from_slice::<CandidatesRequest>(bytes);
    let _ = serde_json::from_slice::<StartRequest>(bytes);
}

/// `POST /api/offer`.
pub(crate) async fn offer(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    request: Result<Json<OfferRequest>, JsonRejection>,
) -> Answer {
    let Json(request) = request?;
    offer_for(app, request, (None, traceparent(&headers))).await
}

/// The caller's W3C `traceparent` header, where it sent one.
pub(crate) fn traceparent(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 64)
        .map(str::to_owned)
}

/// `POST /sessions/{id}/api/offer`: the offer of a session `/start` began, which carries what
/// the start asked for.
pub(crate) async fn session_offer(
    State(app): State<Arc<App>>,
    Path(session_id): Path<String>,
    headers: axum::http::HeaderMap,
    request: Result<Json<OfferRequest>, JsonRejection>,
) -> Answer {
    let Json(request) = request?;
    offer_for(app, request, (Some(session_id), traceparent(&headers))).await
}

async fn offer_for(
    app: Arc<App>,
    request: OfferRequest,
    (session_id, traceparent): (Option<String>, Option<String>),
) -> Answer {
    let link = request
        .pc_id
        .as_ref()
        .and_then(|pc_id| app.lock_peers().get(pc_id).cloned());
    let plan = plan_offer(
        &request.kind,
        request.pc_id.as_deref(),
        request.restart_pc,
        link.is_some(),
    )
    .map_err(ApiError::BadRequest)?;
    match (plan, link, request.pc_id.clone()) {
        (OfferPlan::Restart, Some(link), Some(pc_id)) => {
            link.change(&pc_id)?;
            restart(&app, &link, &pc_id, request.sdp).await
        }
        (OfferPlan::Renegotiate, Some(link), Some(pc_id)) => {
            link.change(&pc_id)?;
            let sdp = link.peer().renegotiate(request.sdp).await?;
            Ok(answer(sdp, pc_id))
        }
        (OfferPlan::Unknown, _, pc_id) => Err(ApiError::NotFound(format!(
            "no connection {}",
            pc_id.unwrap_or_default()
        ))),
        _ => new_session(app, request, (session_id, traceparent)).await,
    }
}

/// A new connection and the session behind it; the session id is the one `/start` gave, or
/// the connection's own.
async fn new_session(
    app: Arc<App>,
    request: OfferRequest,
    (session_id, traceparent): (Option<String>, Option<String>),
) -> Answer {
    let pc_id = app.cluster.mint();
    let started = session_id
        .as_deref()
        .and_then(|id| app.lock_starts().take(id));
    if let (Some(id), None) = (&session_id, &started) {
        // Only a session a `/start` of this node began, once: an id no start minted would
        // reach the tools as the session's.
        return Err(ApiError::NotFound(format!(
            "no session {id:.80} waits for an offer here (each /start's id takes one offer)"
        )));
    }
    let promised = started.is_some();
    let info = SessionInfo {
        id: session_id.unwrap_or_else(|| pc_id.clone()),
        request_data: request
            .request_data
            .or(started.filter(|body| !body.is_null()))
            .unwrap_or(Value::Null),
        placed: false,
    };
    if let Some(name) = info.bot() {
        app.bots.find(name)?;
    }
    let admission = if promised {
        app.admit_started()?
    } else {
        app.admit()?
    };
    let sink = TrackSink::new();
    let (peer, peer_events, sdp) = connect(request.sdp, &peer_options(&app), &sink).await?;
    let mut observing = app.watchers.watch(&Watched {
        id: &info.id,
        bot: info.bot(),
        transport: "webrtc",
        level: ReportLevel::default(),
        consent: info.consents_to_recording(),
        traceparent: traceparent.as_deref(),
        bot_allows: app.bots.observed(info.bot()),
    });
    let bot = match app
        .bots
        .build(&info, OPUS_RATE, observing.sink(Box::new(sink.clone())))
    {
        Ok(bot) => bot,
        Err(e) => {
            peer.close().await;
            return Err(e.into());
        }
    };
    let input = RtviInput::new(
        bot.context.clone(),
        bot.params.skip_tts,
        app.options.allow_evals,
        bot.report_level,
    );
    observing.report_level(bot.report_level);
    let mut builder = Session::builder(bot.pipeline)
        .params(bot.params)
        .resources(bot.resources);
    if let Some(observer) = observing.observer() {
        builder = builder.observer(observer);
    }
    let events = builder.subscribe();
    let watched = builder.subscribe();
    let session = builder.spawn();
    admission.attach(session.handle());
    let recorded = observing.recorded();
    let watching = tokio::spawn(observing.follow(watched, session.handle()));

    let peer = Arc::new(peer);
    let (restarts, restarted) = mpsc::channel(1);
    app.lock_peers().insert(
        pc_id.clone(),
        Arc::new(Link {
            peer: std::sync::Mutex::new(peer.clone()),
            sink,
            restarts,
            limits: std::sync::Mutex::new(Limits::new()),
        }),
    );
    let drive = Drive {
        app: app.clone(),
        pc_id: pc_id.clone(),
        peer,
        peer_events,
        restarted,
        events,
        rtvi: {
            let mut rtvi = Rtvi::new();
            rtvi.set_session(&info.id, recorded);
            rtvi
        },
        liveness: Liveness::new(),
        muted: false,
        pace: Pace::default(),
        report_level: input.report_level(),
        input,
        network: NetworkTotals::default(),
    };
    tokio::spawn(async move {
        match drive.run(&session).await {
            Ending::ClientGone => session.handle().cancel_because(EndReason::ClientGone),
            Ending::ClientLeft | Ending::SessionEnded | Ending::TooFast(_) => {
                session.handle().cancel()
            }
        }
        let reason = session.join().await;
        tracing::info!(reason = reason.kind(), "WebRTC session ended");
        app.metrics.observe(&Event::SessionEnded { reason });
        let _ = watching.await;
        drop(admission);
    });
    Ok(answer(sdp, pc_id))
}

fn answer(sdp: String, pc_id: String) -> Json<OfferAnswer> {
    Json(OfferAnswer {
        sdp,
        kind: "answer",
        pc_id,
    })
}

fn peer_options(app: &App) -> PeerOptions {
    PeerOptions {
        bind: app.options.addr.ip(),
        ice_servers: app.options.ice_servers.clone(),
        udp_ports: app.options.webrtc_udp_ports.clone(),
        public_ip: app.options.webrtc_public_ip,
        red: app.options.webrtc_red,
        red_voice: app.options.webrtc_red_voice,
    }
}

/// `restart_pc`: a new peer connection for a live session. The session, its conversation and
/// the bot's queued voice carry over; only the connection is replaced. A connection being set
/// up takes one of the server's `--max-sessions` restart places until the session has it.
async fn restart(app: &App, link: &Link, pc_id: &str, sdp: String) -> Answer {
    let Ok(_place) = app.restarting.try_acquire() else {
        return Err(ApiError::Full(app.options.max_sessions));
    };
    let (peer, peer_events, sdp) = connect(sdp, &peer_options(app), &link.sink).await?;
    let peer = Arc::new(peer);
    *link.peer.lock().unwrap_or_else(|p| p.into_inner()) = peer.clone();
    let handed = link
        .restarts
        .send_timeout((peer.clone(), peer_events), RESTART_HANDOVER)
        .await;
    if handed.is_err() {
        peer.close().await;
        return Err(ApiError::NotFound(format!("connection {pc_id} has ended")));
    }
    link.limits
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .candidates = 0;
    tracing::info!(pc_id, "peer connection restarted");
    Ok(answer(sdp, pc_id.to_owned()))
}

/// How long a restart waits for the session to take its connection.
const RESTART_HANDOVER: std::time::Duration = std::time::Duration::from_secs(5);

/// What one connection of a session may still ask for.
struct Limits {
    /// Candidates its connection took.
    candidates: usize,
    /// Restarts and renegotiations.
    changes: Allowance,
}

impl Limits {
    fn new() -> Self {
        Self {
            candidates: 0,
            changes: Allowance::new(CHANGE_BURST, CHANGE_EVERY),
        }
    }
}

/// A replacement connection for a session: the peer and its events.
type Replacement = (Arc<Peer>, mpsc::Receiver<PeerEvent>);

/// A WebRTC session as the registry holds it.
pub(crate) struct Link {
    /// The live connection (renegotiation and trickled candidates go to it).
    peer: std::sync::Mutex<Arc<Peer>>,
    /// The bot's voice: it outlives any one connection.
    sink: TrackSink,
    /// Hands the session's driver a restarted connection.
    restarts: mpsc::Sender<Replacement>,
    /// What the client may still ask of it.
    limits: std::sync::Mutex<Limits>,
}

impl Link {
    fn peer(&self) -> Arc<Peer> {
        self.peer.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Takes one restart or renegotiation from the session's allowance.
    fn change(&self, pc_id: &str) -> Result<(), ApiError> {
        let allowed = self
            .limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .changes
            .take(Instant::now());
        if allowed {
            Ok(())
        } else {
            Err(ApiError::TooOften(format!(
                "connection {pc_id} was restarted or renegotiated {CHANGE_BURST} times just now; \
                 one more every {} s",
                CHANGE_EVERY.as_secs()
            )))
        }
    }
}

/// Registry entries.
pub(crate) type PeerHandle = Arc<Link>;

/// How one session's traffic ended.
enum Ending {
    /// The session finished by itself (the bot ended the call, a shutdown, a fatal error).
    SessionEnded,
    /// The client said goodbye (`disconnect-bot`).
    ClientLeft,
    /// The client stopped pinging, or its connection failed and was not restarted.
    ClientGone,
    /// The client sent audio faster than real time.
    TooFast(TooFast),
}

/// Moves one session's traffic: the client's audio and data-channel messages in, the session's
/// events out as RTVI, connection restarts in between.
struct Drive {
    app: Arc<App>,
    pc_id: String,
    peer: Arc<Peer>,
    peer_events: mpsc::Receiver<PeerEvent>,
    restarted: mpsc::Receiver<Replacement>,
    events: tokio::sync::broadcast::Receiver<SessionEvent>,
    rtvi: Rtvi,
    liveness: Liveness,
    /// The user muted the microphone (`trackStatus`): their audio is heard as silence.
    muted: bool,
    /// How fast the client's audio comes.
    pace: Pace,
    /// What the client's RTVI messages do to the session.
    input: RtviInput,
    /// What the client is told of function calls.
    report_level: tokio::sync::watch::Receiver<ReportLevel>,
    /// What the network did to the session's audio, across its connections.
    network: NetworkTotals,
}

/// How often a session reports what the network did to its audio.
const NETWORK_REPORT: std::time::Duration = std::time::Duration::from_secs(5);

/// A session's network counts: those of the connections it had before a restart, and the last
/// seen of the current one.
#[derive(Debug, Default)]
struct NetworkTotals {
    closed: NetworkStats,
    current: NetworkStats,
}

impl Drive {
    /// Reports what the network did since the last report: into `/metrics`, and as a `metrics`
    /// event with the session's totals (to the client as RTVI).
    fn report_network(&mut self, handle: &SessionHandle) {
        let report = self.peer.network();
        let since = report.incoming.since(&self.network.current);
        if since.received == 0 && since.lost == 0 && report.sent_loss.is_none() {
            return;
        }
        self.network.current = report.incoming;
        self.app.metrics.network(&since);
        let mut total = self.network.closed;
        total.add(&report.incoming);
        handle.emit(Event::Metrics {
            data: vec![MetricsData::Network {
                transport: "webrtc".into(),
                received: total.received,
                lost: total.lost,
                recovered: total.recovered,
                redundant: total.redundant,
                red: total.red,
                concealed: total.concealed,
                late: total.late,
                reordered: total.reordered,
                duplicated: total.duplicated,
                jitter_ms: total.jitter * 1e3,
                depth_ms: total.depth * 1e3,
                sent_loss: report.sent_loss,
            }],
        });
    }

    async fn run(mut self, session: &Session) -> Ending {
        let handle = session.handle();
        let mut network_report = tokio::time::interval(NETWORK_REPORT);
        network_report.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ending = loop {
            let gone_at = self.liveness.deadline().map(tokio::time::Instant::from_std);
            let keypad = self
                .input
                .keypad_deadline()
                .map(tokio::time::Instant::from_std);
            tokio::select! {
                _ = network_report.tick() => self.report_network(&handle),
                Some((peer, peer_events)) = self.restarted.recv() => {
                    self.report_network(&handle);
                    let last = std::mem::take(&mut self.network.current);
                    self.network.closed.add(&last);
                    let old = std::mem::replace(&mut self.peer, peer);
                    self.peer_events = peer_events;
                    self.liveness.restarted(std::time::Instant::now());
                    // Closing may wait on a peer that is already gone: never hold up the session.
                    tokio::spawn(async move { old.close().await });
                }
                () = tokio::time::sleep_until(keypad.unwrap_or_else(tokio::time::Instant::now)), if keypad.is_some() => {
                    if self.input.keypad_due(&handle).await.is_err() {
                        break Ending::SessionEnded;
                    }
                }
                () = tokio::time::sleep_until(gone_at.unwrap_or_else(tokio::time::Instant::now)), if gone_at.is_some() => {
                    tracing::info!(pc_id = %self.pc_id, "the client is gone: no keepalive, or the connection was lost and not restarted");
                    break Ending::ClientGone;
                }
                event = self.peer_events.recv(), if !self.liveness.is_lost() => match event {
                    Some(PeerEvent::Audio(mut samples)) => {
                        if let Err(too_fast) = self.pace.take(samples.len(), INPUT_RATE, std::time::Instant::now()) {
                            break Ending::TooFast(too_fast);
                        }
                        if self.muted {
                            samples.fill(0);
                        }
                        let audio = AudioFrame::new(samples, INPUT_RATE, 1);
                        if handle.queue_live_audio(audio).await.is_err() {
                            break Ending::SessionEnded;
                        }
                    }
                    Some(PeerEvent::Message(text)) => {
                        if let Some(ending) = self.message(&text, &handle).await {
                            break ending;
                        }
                    }
                    Some(PeerEvent::Closed) | None => {
                        self.liveness.connection_lost(std::time::Instant::now());
                    }
                },
                event = self.events.recv() => match event {
                    Ok(event) => {
                        if matches!(event.event, Event::SessionEnded { .. }) {
                            break Ending::SessionEnded;
                        }
                        self.app.metrics.observe(&event.event);
                        let seen = event.event.for_client(*self.report_level.borrow());
                        for message in seen.iter().flat_map(|event| self.rtvi.render(event)) {
                            self.peer.send(message);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(pc_id = %self.pc_id, missed, "fell behind the session's events");
                    }
                    Err(_) => break Ending::SessionEnded,
                },
            }
        };
        self.report_network(&handle);
        self.app.lock_peers().remove(&self.pc_id);
        match &ending {
            Ending::SessionEnded => {
                // The bot is leaving, not the network failing: say so before closing.
                self.peer
                    .send_last(signalling::render(&Signal::PeerLeft))
                    .await;
            }
            Ending::TooFast(too_fast) => {
                tracing::warn!(pc_id = %self.pc_id, %too_fast, "a client sends audio faster than real time: closed");
                self.peer
                    .send_last(rtvi::fatal_error(&too_fast.to_string()))
                    .await;
            }
            Ending::ClientLeft | Ending::ClientGone => {}
        }
        self.peer.close().await;
        // A restart that raced the end: its connection closes too.
        self.restarted.close();
        while let Ok((peer, _)) = self.restarted.try_recv() {
            peer.close().await;
        }
        ending
    }

    /// Handles one data-channel message; returns how the session ends if it does.
    async fn message(&mut self, text: &str, handle: &SessionHandle) -> Option<Ending> {
        if text.len() > rtvi::MAX_CLIENT_MESSAGE {
            tracing::debug!(pc_id = %self.pc_id, bytes = text.len(), "an oversized data-channel message dropped unread");
            self.peer.send(rtvi::too_large(text.len()));
            return None;
        }
        match signalling::classify(text) {
            Inbound::Ping => self.liveness.ping(std::time::Instant::now()),
            Inbound::Signal(Signal::TrackStatus {
                receiver_index: AUDIO_RECEIVER,
                enabled,
            }) => {
                if self.muted == enabled {
                    self.muted = !enabled;
                    tracing::info!(pc_id = %self.pc_id, muted = self.muted, "the user's microphone");
                    handle.emit(if self.muted {
                        Event::UserMuteStarted
                    } else {
                        Event::UserMuteStopped
                    });
                }
            }
            // Video tracks and the server's own messages: nothing to do.
            Inbound::Signal(signal) => tracing::debug!(?signal, "signalling message ignored"),
            Inbound::BadSignal(why) => {
                tracing::debug!(pc_id = %self.pc_id, why, "unreadable signalling message dropped");
            }
            Inbound::Rtvi => {
                let message = self.rtvi.parse(text);
                match self.input.apply(message, handle).await {
                    Ok(replies) => {
                        for reply in replies {
                            self.peer.send(reply);
                        }
                    }
                    Err(Leave::Disconnect | Leave::Cancel) => return Some(Ending::ClientLeft),
                    Err(Leave::TooFast(too_fast)) => return Some(Ending::TooFast(too_fast)),
                    Err(Leave::Ended) => return Some(Ending::SessionEnded),
                }
            }
        }
        None
    }
}

pub(crate) async fn candidates(
    State(app): State<Arc<App>>,
    request: Result<Json<CandidatesRequest>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(request) = request?;
    if request.candidates.len() > MAX_CANDIDATES_PER_REQUEST {
        return Err(ApiError::BadRequest(format!(
            "{} candidates in one request; at most {MAX_CANDIDATES_PER_REQUEST}",
            request.candidates.len()
        )));
    }
    if let Some(long) = request
        .candidates
        .iter()
        .find(|c| c.candidate.len() > MAX_CANDIDATE_BYTES)
    {
        return Err(ApiError::BadRequest(format!(
            "a candidate of {} bytes; at most {MAX_CANDIDATE_BYTES}",
            long.candidate.len()
        )));
    }
    let Some(link) = app.lock_peers().get(&request.pc_id).cloned() else {
        return Err(ApiError::NotFound(format!(
            "no connection {:.80}",
            request.pc_id
        )));
    };
    {
        let mut limits = link.limits.lock().unwrap_or_else(|p| p.into_inner());
        if limits.candidates + request.candidates.len() > MAX_CANDIDATES_PER_CONNECTION {
            return Err(ApiError::BadRequest(format!(
                "connection {} has taken {} candidates; at most {MAX_CANDIDATES_PER_CONNECTION}",
                request.pc_id, limits.candidates
            )));
        }
        limits.candidates += request.candidates.len();
    }
    let candidates = request
        .candidates
        .into_iter()
        .map(|c| RTCIceCandidateInit {
            candidate: c.candidate,
            sdp_mid: c.sdp_mid,
            sdp_mline_index: c.sdp_mline_index,
            ..Default::default()
        })
        .collect();
    link.peer().add_candidates(candidates).await?;
    Ok(Json(json!({"status": "success"})))
}

/// `POST /start`: a session id and the ICE servers; what the body asks for waits for the
/// session's offer.
pub(crate) async fn start(
    State(app): State<Arc<App>>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    if app.lifecycle.is_draining() {
        return Err(ApiError::Draining);
    }
    if body.len() > MAX_START_BODY {
        return Err(ApiError::TooLarge(format!(
            "the /start body is {} bytes; at most {MAX_START_BODY} are kept for the session",
            body.len()
        )));
    }
    let request: StartRequest = if body.iter().all(u8::is_ascii_whitespace) {
        StartRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("the /start body is not valid: {e}")))?
    };
    let data = request.body.or(request.request_data).unwrap_or(Value::Null);
    if let Some(name) = data.get("bot").and_then(Value::as_str) {
        app.bots.find(name)?;
    }
    let id = app.cluster.mint();
    // Kept even without a body: the session's offer is then admitted during a drain.
    app.lock_starts()
        .insert(id.clone(), data, body.len(), Instant::now());
    let servers: Vec<Value> = app
        .options
        .ice_servers
        .iter()
        .map(|url| json!({"urls": [url]}))
        .collect();
    Ok(Json(
        json!({"sessionId": id, "iceConfig": {"iceServers": servers}}),
    ))
}
