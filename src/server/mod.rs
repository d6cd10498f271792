//! `voxide serve`: the HTTP server. The browser page, the WebSocket transports, health,
//! readiness, status and Prometheus metrics, with a session limit and a graceful shutdown.

mod error;
mod metrics;
mod webrtc;
mod ws;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use tokio::sync::watch;

pub use error::ApiError;
pub use metrics::Metrics;

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
    /// How long live sessions get to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// The bots it serves: a client picks one by name (`{"bot": "name"}` in `/start`'s body or
    /// the offer's `requestData`, `?bot=` on the WebSockets); the first is the default.
    pub bots: Vec<BotOptions>,
    /// STUN/TURN server URLs for WebRTC; none: host candidates only.
    pub ice_servers: Vec<String>,
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

    fn build(
        &self,
        session: &SessionInfo,
        out_rate: u32,
        sink: Box<dyn AudioSink>,
    ) -> Result<Bot, BotError> {
        let mut options = self.pick(session.bot())?.clone();
        options.audio_out_sample_rate = out_rate;
        Ok(crate::bot::build(&options, sink, OutputOptions::default())?
            .for_session(session.clone()))
    }
}

/// Shared by every request.
pub(crate) struct App {
    pub(crate) options: ServeOptions,
    pub(crate) bots: Arc<dyn BotFactory>,
    pub(crate) metrics: Arc<Metrics>,
    lifecycle: Arc<Lifecycle>,
    sessions: Mutex<HashMap<u64, SessionHandle>>,
    peers: Mutex<HashMap<String, webrtc::PeerHandle>>,
    /// What each `/start` asked for, until its offer comes.
    starts: Mutex<webrtc::Starts>,
    next_id: AtomicU64,
}

/// Whether the server takes sessions: loading, ready, draining.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    ready: AtomicBool,
    draining: AtomicBool,
    started: Instant,
}

impl Lifecycle {
    fn new() -> Self {
        Self {
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            started: Instant::now(),
        }
    }

    /// Ok when a new session may start, else why not.
    fn readiness(&self) -> Result<(), ApiError> {
        if self.draining.load(Ordering::SeqCst) {
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

/// The server without its socket: its routes and its state. [`serve_until`] runs one; a test
/// sends its [`Server::router`] requests with `tower::ServiceExt::oneshot`.
pub struct Server {
    app: Arc<App>,
}

impl Server {
    /// A server whose sessions run the bots `bots` builds. It takes no session until
    /// [`Server::set_ready`].
    pub fn new(options: ServeOptions, bots: Arc<dyn BotFactory>) -> Self {
        Self {
            app: Arc::new(App {
                options,
                bots,
                metrics: Arc::default(),
                lifecycle: Arc::new(Lifecycle::new()),
                sessions: Mutex::default(),
                peers: Mutex::default(),
                starts: Mutex::default(),
                next_id: AtomicU64::new(1),
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

    /// Stops taking sessions, asks the live ones to finish, cancels what is left after `grace`.
    pub async fn drain(&self, grace: Duration) {
        drain(&self.app, grace).await;
    }
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(prometheus))
        .route("/ws", get(ws::pcm))
        .route("/ws/twilio", get(ws::twilio))
        .route("/api/offer", post(webrtc::offer).patch(webrtc::candidates))
        .route("/start", post(webrtc::start))
        .route(
            "/sessions/{session_id}/api/offer",
            post(webrtc::session_offer).patch(webrtc::candidates),
        )
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(AppState { app })
}

/// Runs the server until SIGINT or SIGTERM, then drains: no new sessions, live ones get
/// `shutdown_grace` to finish, then the rest are cancelled.
pub async fn serve(options: ServeOptions) -> Result<(), ServeError> {
    let shutdown = async {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                r = ctrl_c => r,
                _ = term.recv() => Ok(()),
            }
        }
        #[cfg(not(unix))]
        ctrl_c.await
    };
    serve_until(options, shutdown, |_| {}).await
}

/// Runs the server until `shutdown` completes; `on_listening` gets the bound address (port 0
/// picks a free one).
pub async fn serve_until(
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = std::io::Result<()>> + Send + 'static,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: options.addr,
            source,
        })?;
    let addr = listener.local_addr()?;
    let grace = options.shutdown_grace;
    let bots = Arc::new(Bots::new(options.bots.clone()));
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
    on_listening(addr);
    tracing::info!(%addr, "listening");
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let drain_app = app.clone();
    let graceful = async move {
        if let Err(e) = shutdown.await {
            tracing::warn!(error = %e, "cannot wait for a shutdown signal; shutting down");
        }
        drain(&drain_app, grace).await;
        let _ = stop_tx.send(true);
    };
    let server = axum::serve(listener, router(app)).with_graceful_shutdown(async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    });
    tokio::select! {
        result = server => result?,
        () = graceful => {}
    }
    Ok(())
}

/// Stops taking sessions, asks the live ones to finish, cancels what is left after `grace`.
async fn drain(app: &Arc<App>, grace: Duration) {
    app.lifecycle.draining.store(true, Ordering::SeqCst);
    let live: Vec<SessionHandle> = app.lock_sessions().values().cloned().collect();
    tracing::info!(sessions = live.len(), "shutting down");
    for handle in &live {
        let _ = handle.stop_when_done().await;
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !app.lock_sessions().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for handle in app.lock_sessions().values() {
        handle.cancel();
    }
}

async fn page() -> Html<&'static str> {
    Html(include_str!("../../assets/web/index.html"))
}

async fn readyz(State(lifecycle): State<Arc<Lifecycle>>) -> Result<&'static str, ApiError> {
    lifecycle.readiness().map(|()| "ready")
}

#[derive(Serialize)]
struct Status {
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
        ready: app.lifecycle.ready.load(Ordering::SeqCst),
        draining: app.lifecycle.draining.load(Ordering::SeqCst),
        sessions: app.metrics.active(),
        max_sessions: app.options.max_sessions,
        sessions_started: app.metrics.started(),
        sessions_rejected: app.metrics.rejected(),
        sessions_ended: app.metrics.ended(),
        uptime_secs: app.lifecycle.started.elapsed().as_secs_f64(),
        version: env!("CARGO_PKG_VERSION"),
    })
}

async fn prometheus(State(metrics): State<Arc<Metrics>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics.render(),
    )
        .into_response()
}
