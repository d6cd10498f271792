//! `voxide serve`: the HTTP server. The browser page, the WebSocket transports, health,
//! readiness, status and Prometheus metrics, with a session limit and a graceful shutdown.

pub mod access;
mod audiosocket;
mod calls;
mod carrier_api;
pub mod cluster;
mod error;
mod metrics;
mod phone;
mod recorded;
mod rtvi;
mod sip;
mod sip_tcp;
mod telnyx;
pub mod twilio;
mod webrtc;
mod ws;

pub use webrtc::{CHANGE_BURST, MAX_CANDIDATES_PER_CONNECTION, MAX_CANDIDATES_PER_REQUEST};
pub use ws::{CLIENT_WRITE_TIMEOUT, MAX_WS_MESSAGE};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use serde::Serialize;
use tokio::sync::watch;

pub use access::AccessOptions;
pub use cluster::{NodeId, Peers};
pub use error::ApiError;
pub use metrics::Metrics;
pub use sip::{Network, SipOptions};

use access::Access;
use cluster::Cluster;

use crate::bot::{Bot, BotError, BotOptions, SessionInfo};
use crate::pipeline::SessionHandle;
use crate::transports::{AudioSink, OutputOptions};

/// Largest HTTP request body accepted (signalling messages are a few kilobytes).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// What the server needs to run.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Live sessions at most; more are refused with 503.
    pub max_sessions: usize,
    /// How long live sessions get to finish once the node drains (`SIGTERM`, `SIGINT`,
    /// `POST /admin/drain`); what is left then is ended.
    pub drain_timeout: Duration,
    /// The bots it serves: a client picks one by name (`{"bot": "name"}` in `/start`'s body or
    /// the offer's `requestData`, `?bot=` on the WebSockets); the first is the default.
    pub bots: Vec<BotOptions>,
    /// STUN/TURN server URLs for WebRTC; none: host candidates only.
    pub ice_servers: Vec<String>,
    /// The UDP ports WebRTC connections bind, one each; none: any.
    pub webrtc_udp_ports: Option<std::ops::RangeInclusive<u16>>,
    /// The address callers reach this host at behind a 1:1 NAT, for host candidates.
    pub webrtc_public_ip: Option<std::net::IpAddr>,
    /// Whether a WebRTC client that offers RED is asked to send it.
    pub webrtc_red: bool,
    /// When the bot's voice goes in RED to a client that takes it.
    pub webrtc_red_voice: crate::transports::webrtc::RedVoice,
    /// This node's name, the prefix of every id it mints.
    pub node_id: NodeId,
    /// Where the other nodes answer, for requests that belong to them.
    pub peers: Peers,
    /// Where to answer HAProxy's agent check (the node's free capacity, or `drain`).
    pub agent_addr: Option<SocketAddr>,
    /// Where health, readiness, status, metrics and `/admin/*` answer when not on `addr`.
    pub admin_addr: Option<SocketAddr>,
    /// Tokens, CORS and the per-address session limit.
    pub access: AccessOptions,
    /// Take the messages of pipecat's eval harness that change a session's bot
    /// (`eval-context` replaces its conversation, `eval-configure` tells the client every
    /// function call's arguments and result): for a test server, never for callers.
    pub allow_evals: bool,
    /// Where each session's stereo recording and transcript go (`--record-dir`); none: no
    /// recordings. A caller refuses with `"record": false`.
    pub record_dir: Option<std::path::PathBuf>,
    /// Where each session's trace goes (`--otlp-endpoint`, `OTEL_EXPORTER_OTLP_*`).
    pub traces: Option<crate::observe::trace::TraceOptions>,
    /// Where finished recordings are uploaded (`--record-url`).
    pub uploads: Option<crate::observe::Uploads>,
    /// SIP calls taken directly (`--sip-listen`); none: no SIP.
    pub sip: Option<SipOptions>,
    /// Asterisk's AudioSocket connections (`--audiosocket-listen`), and who may open them.
    pub audiosocket: Option<(SocketAddr, Vec<Network>)>,
    /// Twilio's REST API, for the calls `POST /calls` places through it (`--twilio-api-url`;
    /// [`twilio::DEFAULT_API`] unless given).
    pub twilio_api_url: Option<String>,
    /// Telnyx's API key and its Call Control API (`--telnyx-api-url`; Telnyx's own unless
    /// given), for handing over calls on Telnyx's streams.
    pub telnyx: Option<(crate::secret::Secret, Option<String>)>,
}

impl ServeOptions {
    /// Options for `addr` serving `bots`, everything else as `voxide serve` defaults it.
    pub fn new(addr: SocketAddr, bots: Vec<BotOptions>) -> Self {
        Self {
            addr,
            max_sessions: 32,
            drain_timeout: Duration::from_secs(60),
            bots,
            ice_servers: Vec::new(),
            webrtc_udp_ports: None,
            webrtc_public_ip: None,
            webrtc_red: true,
            webrtc_red_voice: crate::transports::webrtc::RedVoice::OnLoss,
            node_id: NodeId::from_hostname(),
            peers: Peers::default(),
            agent_addr: None,
            admin_addr: None,
            access: AccessOptions {
                sessions_per_minute: 120,
                ..AccessOptions::default()
            },
            allow_evals: false,
            record_dir: None,
            traces: None,
            uploads: None,
            sip: None,
            audiosocket: None,
            twilio_api_url: None,
            telnyx: None,
        }
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The admin address could not be bound.
    #[error("cannot listen for admin requests on {addr}: {source}")]
    BindAdmin {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The agent-check address could not be bound.
    #[error("cannot listen for agent checks on {addr}: {source}")]
    BindAgent {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The SIP address could not be bound.
    #[error("cannot listen for SIP on {addr}: {source}")]
    BindSip {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The AudioSocket address could not be bound.
    #[error("cannot listen for AudioSocket on {addr}: {source}")]
    BindAudioSocket {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The server stopped with an error.
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Builds each session's bot. The server's own are its [`BotOptions`] ([`Bots`]); a test gives
/// one that needs no models.
pub trait BotFactory: Send + Sync + 'static {
    /// Loads what every session shares (the embedded models) before the server says it is
    /// ready.
    fn preload(&self) -> Result<(), BotError>;
    /// Whether a client may ask for the bot `name`; an error names the bots there are.
    fn find(&self, name: &str) -> Result<(), BotError>;
    /// The names clients may ask for, the default first (none: one unnamed bot).
    fn names(&self) -> Vec<String> {
        Vec::new()
    }
    /// Whether the bot `name` (the default one for `None`) may be recorded and traced.
    fn observed(&self, name: Option<&str>) -> (bool, bool) {
        let _ = name;
        (true, true)
    }
    /// The bot `session` asked for (the default one when it named none), speaking at
    /// `out_rate` into `sink`.
    fn build(
        &self,
        session: &SessionInfo,
        out_rate: u32,
        sink: Box<dyn AudioSink>,
    ) -> Result<Bot, BotError>;
}

/// The server's bots, by name; the first is the default.
pub struct Bots(Vec<BotOptions>);

impl Bots {
    /// These bots; an empty list serves the default bot.
    pub fn new(bots: Vec<BotOptions>) -> Self {
        if bots.is_empty() {
            Self(vec![BotOptions::default()])
        } else {
            Self(bots)
        }
    }

    fn pick(&self, name: Option<&str>) -> Result<&BotOptions, BotError> {
        match name {
            None => Ok(&self.0[0]),
            Some(name) => self
                .0
                .iter()
                .find(|bot| bot.name.as_deref() == Some(name))
                .ok_or_else(|| BotError::UnknownBot {
                    name: name.to_owned(),
                    known: self
                        .0
                        .iter()
                        .filter_map(|bot| bot.name.clone())
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
        }
    }
}

impl BotFactory for Bots {
    fn preload(&self) -> Result<(), BotError> {
        self.0.iter().try_for_each(crate::bot::preload)
    }

    fn find(&self, name: &str) -> Result<(), BotError> {
        self.pick(Some(name)).map(drop)
    }

    fn observed(&self, name: Option<&str>) -> (bool, bool) {
        self.pick(name)
            .map_or((true, true), |bot| (bot.record, bot.trace))
    }

    fn build(
        &self,
        session: &SessionInfo,
        out_rate: u32,
        sink: Box<dyn AudioSink>,
    ) -> Result<Bot, BotError> {
        let mut options = self.pick(session.bot())?.clone();
        options.audio_out_sample_rate = out_rate;
        options.placed_call = session.placed;
        Ok(crate::bot::build(&options, sink, OutputOptions::default())?
            .for_session(session.clone()))
    }
}

/// Shared by every request.
pub(crate) struct App {
    pub(crate) options: ServeOptions,
    pub(crate) bots: Arc<dyn BotFactory>,
    pub(crate) metrics: Arc<Metrics>,
    /// Each session's recording and trace.
    pub(crate) watchers: crate::observe::Watchers,
    pub(crate) cluster: Cluster,
    access: Access,
    lifecycle: Arc<Lifecycle>,
    sessions: Mutex<HashMap<u64, SessionHandle>>,
    peers: Mutex<HashMap<String, webrtc::PeerHandle>>,
    /// What each `/start` asked for, until its offer comes.
    starts: Mutex<webrtc::Starts>,
    /// Places for restarted connections being set up: as many as `--max-sessions`.
    restarting: tokio::sync::Semaphore,
    next_id: AtomicU64,
    /// A session ended (a drain waits on it).
    session_ended: tokio::sync::Notify,
    /// Where the registration with the PBX stands (`sip::NOT_REGISTERING`, `sip::UNREGISTERED`,
    /// `sip::REGISTERED`).
    sip_registration: std::sync::atomic::AtomicU8,
    /// Calls placed (`POST /calls`).
    outbound: calls::Outbound,
    /// Places calls through Twilio, where its account and voxide's public URL are set.
    twilio: Option<twilio::Dialer>,
    /// Hands over calls on Telnyx's streams, where its API key is set.
    telnyx: Option<telnyx::CallControl>,
}

/// Whether the server takes sessions: loading, ready, draining.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    ready: AtomicBool,
    /// Set once, when the node starts draining; the server waits on it.
    draining: watch::Sender<bool>,
    started: Instant,
}

impl Lifecycle {
    fn new() -> Self {
        Self {
            ready: AtomicBool::new(false),
            draining: watch::Sender::new(false),
            started: Instant::now(),
        }
    }

    fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Starts draining; false if it had started already.
    fn drain(&self) -> bool {
        !self.draining.send_replace(true)
    }

    /// Ok when a new session may start, else why not.
    fn readiness(&self) -> Result<(), ApiError> {
        if self.is_draining() {
            Err(ApiError::Draining)
        } else if self.ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(ApiError::NotReady)
        }
    }
}

/// The router's state: the whole app for the session routes, and the narrow parts the others
/// take through `FromRef`.
#[derive(Clone)]
struct AppState {
    app: Arc<App>,
}

impl axum::extract::FromRef<AppState> for Arc<App> {
    fn from_ref(state: &AppState) -> Self {
        state.app.clone()
    }
}

impl axum::extract::FromRef<AppState> for Arc<Metrics> {
    fn from_ref(state: &AppState) -> Self {
        state.app.metrics.clone()
    }
}

impl axum::extract::FromRef<AppState> for Arc<Lifecycle> {
    fn from_ref(state: &AppState) -> Self {
        state.app.lifecycle.clone()
    }
}

/// A live session's place in the registry; leaving frees it.
pub(crate) struct Admission {
    app: Arc<App>,
    id: u64,
}

impl Admission {
    /// Registers the session's handle, so a shutdown can ask it to finish.
    pub(crate) fn attach(&self, handle: SessionHandle) {
        self.app.lock_sessions().insert(self.id, handle);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.app.lock_sessions().remove(&self.id);
        self.app.metrics.session_ended();
        self.app.session_ended.notify_waiters();
    }
}

impl App {
    fn lock_peers(&self) -> std::sync::MutexGuard<'_, HashMap<String, webrtc::PeerHandle>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_starts(&self) -> std::sync::MutexGuard<'_, webrtc::Starts> {
        self.starts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, HashMap<u64, SessionHandle>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a session slot, or says why not.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Admission, ApiError> {
        self.lifecycle.readiness()?;
        self.take_slot()
    }

    /// Takes a slot for the offer of a session this node's `/start` began: promised before a
    /// drain began, it is kept during one.
    pub(crate) fn admit_started(self: &Arc<Self>) -> Result<Admission, ApiError> {
        match self.lifecycle.readiness() {
            Ok(()) | Err(ApiError::Draining) => self.take_slot(),
            Err(e) => Err(e),
        }
    }

    fn take_slot(self: &Arc<Self>) -> Result<Admission, ApiError> {
        // Slots are reserved under the lock, so the limit holds under a burst of connections.
        let sessions = self.lock_sessions();
        if self.metrics.active() >= self.options.max_sessions {
            self.metrics.session_rejected();
            return Err(ApiError::Full(self.options.max_sessions));
        }
        self.metrics.session_started();
        drop(sessions);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        Ok(Admission {
            app: self.clone(),
            id,
        })
    }
}

/// For [`crate::fuzz`]: the signalling bodies read as the handlers and the routing read them.
pub(crate) fn fuzz_bodies(bytes: &[u8]) {
    webrtc::fuzz_bodies(bytes);
    let _ = cluster::owning_id("/api/offer", bytes);
}

/// The server without its socket: its routes and its state. [`serve_until`] runs one; a test
/// sends its [`Server::router`] requests with `tower::ServiceExt::oneshot`.
pub struct Server {
    app: Arc<App>,
}

impl Server {
    /// A server whose sessions run the bots `bots` builds. It takes no session until
    /// [`Server::set_ready`].
    pub fn new(options: ServeOptions, bots: Arc<dyn BotFactory>) -> Self {
        let cluster = Cluster::new(options.node_id.clone(), options.peers.clone());
        let access = Access::new(options.access.clone());
        let twilio = twilio::Dialer::new(&options.access, options.twilio_api_url.as_deref());
        let telnyx = options
            .telnyx
            .as_ref()
            .and_then(|(key, api)| telnyx::CallControl::new(key.clone(), api.as_deref()));
        let max_sessions = options.max_sessions;
        let metrics = Arc::new(Metrics::default());
        let exporter = options.traces.clone().map(|traces| {
            Arc::new(crate::observe::trace::Exporter::new(
                traces,
                options.node_id.to_string(),
                metrics.traces.clone(),
            ))
        });
        let watchers = crate::observe::Watchers::new(
            options.record_dir.clone(),
            exporter,
            metrics.observed.clone(),
        )
        .uploading(options.uploads.clone());
        Self {
            app: Arc::new(App {
                options,
                bots,
                metrics,
                watchers,
                cluster,
                access,
                lifecycle: Arc::new(Lifecycle::new()),
                sessions: Mutex::default(),
                peers: Mutex::default(),
                starts: Mutex::default(),
                restarting: tokio::sync::Semaphore::new(max_sessions),
                next_id: AtomicU64::new(1),
                session_ended: tokio::sync::Notify::new(),
                sip_registration: std::sync::atomic::AtomicU8::new(sip::NOT_REGISTERING),
                outbound: calls::Outbound::default(),
                twilio,
                telnyx,
            }),
        }
    }

    /// The routes.
    pub fn router(&self) -> Router {
        router(self.app.clone())
    }

    /// The models are in: sessions are taken from now on.
    pub fn set_ready(&self) {
        self.app.lifecycle.ready.store(true, Ordering::SeqCst);
    }

    /// Drains: takes no new session, waits up to `timeout` for the live ones to end, ends
    /// what is left.
    pub async fn drain(&self, timeout: Duration) {
        self.app.lifecycle.drain();
        drain(&self.app, timeout).await;
    }
}

/// The routes: all of them on one port, or without the admin ones where `--admin-port` gives
/// those a port of their own ([`admin_router`]).
fn router(app: Arc<App>) -> Router {
    let state = AppState { app: app.clone() };
    // Requests for a connection or a session another node holds go to that node.
    let signalling = Router::new()
        .route("/api/offer", post(webrtc::offer).patch(webrtc::candidates))
        .route(
            "/sessions/{session_id}/api/offer",
            post(webrtc::session_offer).patch(webrtc::candidates),
        )
        .route("/calls/{id}", get(calls::state))
        .route("/calls/{id}/status", post(calls::twilio_status))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            cluster::route_to_owner,
        ));
    let mut routes = Router::new()
        .route("/", get(page))
        .route("/bots", get(bots))
        .route("/ws", get(ws::pcm))
        .route("/ws/{carrier}", get(ws::phone))
        .route("/start", post(webrtc::start))
        .route("/calls", post(calls::place))
        .route("/calls/{id}/stream", get(ws::placed_call))
        .merge(signalling);
    if app.options.admin_addr.is_none() {
        routes = routes.merge(admin_routes());
    } else {
        routes = routes
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz));
    }
    layered(routes, app).with_state(state)
}

/// Health, readiness, status, metrics and `/admin/*`, on the admin port.
fn admin_router(app: Arc<App>) -> Router {
    let state = AppState { app: app.clone() };
    layered(admin_routes(), app).with_state(state)
}

fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(prometheus))
        .route("/admin/drain", post(admin_drain))
        .route("/admin/sessions/{id}/report", get(recorded::report))
        .route("/admin/sessions/{id}/audio", get(recorded::audio))
        .route("/admin/sessions/{id}/transcript", get(recorded::transcript))
}

/// What every route goes through, innermost first: the body limit, the token and the session
/// limit, the node's name on the answer, CORS.
fn layered(routes: Router<AppState>, app: Arc<App>) -> Router<AppState> {
    routes
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            access::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            cluster::name_the_node,
        ))
        .layer(axum::middleware::from_fn_with_state(app, access::cors))
}

/// Runs the server until SIGINT or SIGTERM (or `POST /admin/drain`), then drains: no new
/// sessions, the live ones get `drain_timeout` to end, then the rest are ended. A second
/// signal ends the process at once.
pub async fn serve(options: ServeOptions) -> Result<(), ServeError> {
    let shutdown = async {
        shutdown_signal().await?;
        tokio::spawn(async {
            if shutdown_signal().await.is_ok() {
                tracing::warn!("a second shutdown signal: ending now");
                std::process::exit(130);
            }
        });
        Ok(())
    };
    serve_until(options, shutdown, |_| {}).await
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() -> std::io::Result<()> {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = ctrl_c => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await
}

/// Runs the server until `shutdown` completes or `POST /admin/drain` asks, then drains;
/// `on_listening` gets the bound address (port 0 picks a free one).
pub async fn serve_until(
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = std::io::Result<()>> + Send + 'static,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let bots = Arc::new(Bots::new(options.bots.clone()));
    serve_with(options, bots, shutdown, on_listening).await
}

/// [`serve_until`], with the sessions' bots built by `bots` rather than from the options.
pub async fn serve_with(
    options: ServeOptions,
    bots: Arc<dyn BotFactory>,
    shutdown: impl std::future::Future<Output = std::io::Result<()>> + Send + 'static,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: options.addr,
            source,
        })?;
    let admin = bind_optional(options.admin_addr, |addr, source| ServeError::BindAdmin {
        addr,
        source,
    })
    .await?;
    let agent = bind_optional(options.agent_addr, |addr, source| ServeError::BindAgent {
        addr,
        source,
    })
    .await?;
    let sip = match &options.sip {
        Some(sip) => {
            let bind_error = |source| ServeError::BindSip {
                addr: sip.listen,
                source,
            };
            let udp = tokio::net::UdpSocket::bind(sip.listen)
                .await
                .map_err(bind_error)?;
            // TCP on the same address and port as UDP (the port UDP took, when asked for any).
            let tcp = match sip.tcp {
                true => {
                    let at = udp.local_addr().map_err(bind_error)?;
                    Some(
                        tokio::net::TcpListener::bind(at)
                            .await
                            .map_err(bind_error)?,
                    )
                }
                false => None,
            };
            Some((udp, tcp))
        }
        None => None,
    };
    let audiosocket = bind_optional(
        options.audiosocket.as_ref().map(|(addr, _)| *addr),
        |addr, source| ServeError::BindAudioSocket { addr, source },
    )
    .await?;
    let addr = listener.local_addr()?;
    let timeout = options.drain_timeout;
    let app = Server::new(options, bots).app;
    // Load the models in the background: /healthz answers at once, /readyz once they are in.
    {
        let app = app.clone();
        tokio::task::spawn_blocking(move || match app.bots.preload() {
            Ok(()) => {
                app.lifecycle.ready.store(true, Ordering::SeqCst);
                tracing::info!("models loaded; ready");
            }
            Err(e) => tracing::error!(error = %e, "the models could not be loaded"),
        });
    }
    let mut own = own_tasks(&app, agent, admin);
    if let (Some(sockets), Some(options)) = (sip, app.options.sip.clone()) {
        let tcp = sockets.1.is_some();
        tracing::info!(addr = %sockets.0.local_addr()?, tcp, "taking SIP calls");
        own.spawn(sip::serve(app.clone(), sockets, options));
    }
    if let (Some(listener), Some((_, allow))) = (audiosocket, app.options.audiosocket.clone()) {
        tracing::info!(addr = %listener.local_addr()?, "taking AudioSocket calls");
        own.spawn(audiosocket::serve(app.clone(), listener, allow));
    }
    on_listening(addr);
    tracing::info!(%addr, node = %app.cluster.node(), "listening");
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let drain_app = app.clone();
    let graceful = async move {
        let mut asked = drain_app.lifecycle.draining.subscribe();
        tokio::select! {
            signalled = shutdown => if let Err(e) = signalled {
                tracing::warn!(error = %e, "cannot wait for a shutdown signal; draining");
            },
            _ = asked.wait_for(|draining| *draining) => {}
        }
        drain_app.lifecycle.drain();
        drain(&drain_app, timeout).await;
        let _ = stop_tx.send(true);
    };
    let server = axum::serve(
        listener.tap_io(without_nagle),
        router(app).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    });
    tokio::select! {
        result = server => result?,
        () = graceful => {}
    }
    own.shutdown().await;
    Ok(())
}

/// What the kernel may hold for a client that has not read it: a few seconds of the bot's voice
/// (24 kHz PCM is 48 KB a second; the kernel doubles the figure asked for). A client that reads
/// nothing fills it within an answer or two, and its writer's timeout then closes it, rather
/// than after minutes of the kernel's own autotuned buffer.
const SEND_BUFFER: usize = 128 * 1024;

/// Sets up an accepted connection: Nagle's algorithm off, so a caller's small messages (a
/// WebSocket frame of audio, an RTVI event) leave at once rather than wait, up to the peer's
/// delayed ACK (40 ms), behind data not yet acknowledged; and a bounded send buffer.
pub(crate) fn without_nagle(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set on a connection");
    }
    if let Err(e) = socket2::SockRef::from(&*tcp).set_send_buffer_size(SEND_BUFFER) {
        tracing::debug!(error = %e, "SO_SNDBUF not set on a connection");
    }
}

/// The node's own tasks, which end with the server: the scheduling-lag probe, the agent check
/// and the admin port.
fn own_tasks(
    app: &Arc<App>,
    agent: Option<tokio::net::TcpListener>,
    admin: Option<tokio::net::TcpListener>,
) -> tokio::task::JoinSet<()> {
    let mut own = tokio::task::JoinSet::new();
    {
        let app = app.clone();
        own.spawn(async move { app.metrics.probe_lag().await });
    }
    if let Some(agent) = agent {
        own.spawn(agent_check(agent, app.clone()));
    }
    if let Some(admin) = admin {
        let routes = admin_router(app.clone());
        own.spawn(async move {
            if let Err(e) = axum::serve(admin, routes).await {
                tracing::error!(error = %e, "the admin port failed");
            }
        });
    }
    own
}

/// Binds `addr` when there is one; `error` says why it could not.
async fn bind_optional(
    addr: Option<SocketAddr>,
    error: impl FnOnce(SocketAddr, std::io::Error) -> ServeError,
) -> Result<Option<tokio::net::TcpListener>, ServeError> {
    match addr {
        Some(addr) => tokio::net::TcpListener::bind(addr)
            .await
            .map(Some)
            .map_err(|source| error(addr, source)),
        None => Ok(None),
    }
}

/// The node drains: it takes no new session (`/readyz` says 503), and waits up to `timeout`
/// for the live ones to end by themselves; those left are asked to finish what they are
/// saying, then ended.
async fn drain(app: &Arc<App>, timeout: Duration) {
    let live = app.metrics.active();
    tracing::info!(
        sessions = live,
        timeout_secs = timeout.as_secs_f64(),
        "draining: no new sessions; waiting for the live ones to end"
    );
    if !sessions_end_within(app, timeout).await {
        let left: Vec<SessionHandle> = app.lock_sessions().values().cloned().collect();
        tracing::warn!(
            sessions = left.len(),
            "drain timeout: ending the sessions still live"
        );
        for handle in &left {
            let _ = handle.stop_when_done().await;
        }
        if !sessions_end_within(app, FINISH_AFTER_DRAIN).await {
            for handle in app.lock_sessions().values() {
                handle.cancel();
            }
        }
    }
    tracing::info!("drained");
}

/// How long a session ended by a drain timeout gets to finish its sentence.
const FINISH_AFTER_DRAIN: Duration = Duration::from_secs(2);

/// Waits until no session is live, for at most `timeout`; whether none is.
async fn sessions_end_within(app: &App, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let ended = app.session_ended.notified();
        if app.lock_sessions().is_empty() && app.metrics.active() == 0 {
            return true;
        }
        if tokio::time::timeout_at(deadline, ended).await.is_err() {
            return app.metrics.active() == 0;
        }
    }
}

/// Answers HAProxy's agent check: `drain` while draining, `down` until the models are in,
/// else `ready up` and the node's free capacity as a weight (`ready up 75%`; `ready` lifts a
/// drain HAProxy remembers from before a restart).
async fn agent_check(listener: tokio::net::TcpListener, app: Arc<App>) {
    use tokio::io::AsyncWriteExt;
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let line = app.agent_status();
        tokio::spawn(async move {
            let _ = stream.write_all(line.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

impl App {
    /// The agent check's answer, a line.
    fn agent_status(&self) -> String {
        if self.lifecycle.is_draining() {
            return "drain\n".into();
        }
        if !self.lifecycle.ready.load(Ordering::SeqCst) {
            return "down\n".into();
        }
        let max = self.options.max_sessions.max(1);
        let free = max.saturating_sub(self.metrics.active());
        // Never 0%: that would drain the node; a full one refuses with 503 by itself.
        let weight = (free * 100 / max).max(1);
        format!("ready up {weight}%\n")
    }

    fn gauges(&self) -> metrics::NodeGauges {
        metrics::NodeGauges {
            capacity: self.options.max_sessions,
            draining: self.lifecycle.is_draining(),
            sip_registered: match self.sip_registration.load(Ordering::Relaxed) {
                sip::NOT_REGISTERING => None,
                standing => Some(standing == sip::REGISTERED),
            },
        }
    }
}

/// `POST /admin/drain`: the node starts draining (as on `SIGTERM`) and exits once its
/// sessions have ended.
async fn admin_drain(State(app): State<Arc<App>>) -> (StatusCode, axum::Json<serde_json::Value>) {
    let started = app.lifecycle.drain();
    if started {
        tracing::info!("drain asked for over HTTP");
    }
    (
        StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({
            "draining": true,
            "sessions": app.metrics.active(),
            "node": app.cluster.node().as_str(),
        })),
    )
}

/// `GET /bots`: the bots a client may ask for by name, the default first.
async fn bots(State(app): State<Arc<App>>) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({ "bots": app.bots.names() }))
}

async fn page() -> Html<&'static str> {
    Html(include_str!("../../assets/web/index.html"))
}

async fn readyz(State(lifecycle): State<Arc<Lifecycle>>) -> Result<&'static str, ApiError> {
    lifecycle.readiness().map(|()| "ready")
}

#[derive(Serialize)]
struct Status {
    node: String,
    ready: bool,
    draining: bool,
    sessions: usize,
    max_sessions: usize,
    sessions_started: u64,
    sessions_rejected: u64,
    /// Sessions ended, by reason (`completed`, `client_gone`, ...).
    sessions_ended: std::collections::BTreeMap<String, u64>,
    uptime_secs: f64,
    version: &'static str,
}

async fn status(State(app): State<Arc<App>>) -> axum::Json<Status> {
    axum::Json(Status {
        node: app.cluster.node().to_string(),
        ready: app.lifecycle.ready.load(Ordering::SeqCst),
        draining: app.lifecycle.is_draining(),
        sessions: app.metrics.active(),
        max_sessions: app.options.max_sessions,
        sessions_started: app.metrics.started(),
        sessions_rejected: app.metrics.rejected(),
        sessions_ended: app.metrics.ended(),
        uptime_secs: app.lifecycle.started.elapsed().as_secs_f64(),
        version: env!("CARGO_PKG_VERSION"),
    })
}

async fn prometheus(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(app.gauges()),
    )
        .into_response()
}
