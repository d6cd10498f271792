//! The WebSocket provider driver the streaming services share: it connects with the provider's
//! headers, reconnects with backoff and jitter, tells a rejected key (a 401 or 403 handshake:
//! no retry) from a passing failure, and takes send-side and receive-side failures down the same
//! reconnect path. What to send and what the provider's messages mean is the provider's sans-IO
//! [`WsCore`]: it is told what happened (opened, an input, a message, the time) with the time
//! injected, and answers with messages to send; it keeps what the provider has not yet answered
//! and sends it again on the next connection, keeps the socket alive, and asks for a reconnect
//! when the provider falls silent.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub use tungstenite::Message;

/// The request that opens a provider's socket.
pub type ConnectRequest = tungstenite::handshake::client::Request;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Why a connection ended or could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WsError {
    /// The provider refused the key or the request: trying again cannot help.
    #[error("{0}")]
    Permanent(String),
    /// The connection failed or was lost; another may work.
    #[error("{0}")]
    Passing(String),
}

/// How a lost connection is retried: exponential backoff with jitter, a bounded number of times
/// in a row.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconnectPolicy {
    /// Failed attempts in a row before the driver gives up.
    pub max_attempts: u32,
    /// Delay before the first retry; each further retry doubles it.
    pub initial_delay: Duration,
    /// Longest delay between two attempts.
    pub max_delay: Duration,
    /// How long opening the socket may take.
    pub connect_timeout: Duration,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl ReconnectPolicy {
    /// The wait before attempt `attempt` (1-based): the doubled delay, jittered down by up to
    /// half so that many sessions cut off together do not come back in step.
    pub fn delay(&self, attempt: u32) -> Duration {
        backoff(self.initial_delay, self.max_delay, attempt)
    }
}

/// `initial` doubled for each attempt after the first (1-based), at most `max`, jittered down by
/// up to half.
pub fn backoff(initial: Duration, max: Duration, attempt: u32) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let doubled = initial.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    let ceiling = doubled.min(max);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(attempt);
    let fraction = (hasher.finish() % 1000) as f64 / 1000.0;
    ceiling.mul_f64(0.5 + 0.5 * fraction)
}

/// What a core asks for after time passed.
#[derive(Debug, Default, PartialEq)]
pub struct Tick {
    /// Messages to send (a keepalive).
    pub send: Vec<Message>,
    /// Reconnect, for this reason (the provider fell silent).
    pub reconnect: Option<String>,
}

/// What a core answers an event with: messages to send, in order, and what to tell the service.
pub type Step<O> = (Vec<Message>, Vec<O>);

/// One provider's protocol, sans-IO.
pub trait WsCore: Send + 'static {
    /// What the service sends it.
    type Input: Send + 'static;
    /// What it tells the service.
    type Output: Send + 'static;

    /// The request that opens the socket (URL, headers).
    fn request(&self) -> Result<ConnectRequest, WsError>;

    /// A connection is open: what to send first (set-up, then what the provider has not yet
    /// answered).
    fn opened(&mut self, now: Instant) -> Vec<Message>;

    /// The connection is gone; a new one may follow. What to tell the service (work the
    /// connection took with it).
    fn lost(&mut self, now: Instant) -> Vec<Self::Output>;

    /// An input from the service: what to send now (nothing while disconnected: the core keeps
    /// it for the next connection) and what to tell the service.
    fn input(&mut self, input: Self::Input, now: Instant) -> Step<Self::Output>;

    /// A message from the provider: what to send back (a set-up it asked for, audio kept for
    /// it) and what to tell the service. An error drops the connection.
    fn message(&mut self, message: Message, now: Instant) -> Result<Step<Self::Output>, WsError>;

    /// Time passed: keepalives, liveness, answers overdue.
    fn tick(&mut self, now: Instant) -> (Tick, Vec<Self::Output>);

    /// When [`WsCore::tick`] wants to run next.
    fn next_deadline(&self) -> Option<Instant>;

    /// The service is gone: what to send before closing.
    fn closing(&mut self) -> Vec<Message>;

    /// The driver gave up: what to tell the service.
    fn failed(&mut self, error: &WsError) -> Vec<Self::Output>;

    /// Whether the connection now open counts as made, so that its loss starts the count of
    /// failed attempts afresh (a provider that accepts the socket but never confirms its set-up
    /// does not reset it). Any open socket counts by default.
    fn established(&self) -> bool {
        true
    }

    /// The connection failed and attempt `attempt` (1-based) follows in `delay`: what to tell
    /// the service. Nothing by default.
    fn reconnecting(
        &mut self,
        _attempt: u32,
        _delay: Duration,
        _error: &WsError,
    ) -> Vec<Self::Output> {
        Vec::new()
    }
}

/// A provider's text message read as its wire type `T`. One that does not read is warned about
/// (as `kind`, repeats counted, not logged) and skipped: one odd message costs nothing else.
pub fn read_wire<T: serde::de::DeserializeOwned>(
    text: &str,
    provider: &str,
    kind: &'static str,
) -> Option<T> {
    match serde_json::from_str(text) {
        Ok(parsed) => Some(parsed),
        Err(e) => {
            voxide_core::warnings::warn(
                kind,
                format_args!("an unreadable {provider} message was skipped ({e}): {text:.200}"),
            );
            None
        }
    }
}

/// A connect request for `url` with extra headers.
pub fn connect_request(url: &str, headers: &[(&str, &str)]) -> Result<ConnectRequest, WsError> {
    let mut request = url
        .into_client_request()
        // The query may hold a key: the error names the URL without it.
        .map_err(|e| {
            let without_query = url.split('?').next().unwrap_or_default();
            WsError::Permanent(format!("bad URL {without_query}: {e}"))
        })?;
    for (name, value) in headers {
        let value = value
            .parse()
            .map_err(|_| WsError::Permanent(format!("bad value for header {name}")))?;
        let name: tungstenite::http::HeaderName = name
            .parse()
            .map_err(|_| WsError::Permanent(format!("bad header name {name}")))?;
        request.headers_mut().insert(name, value);
    }
    Ok(request)
}

/// Runs `core` until `inputs` closes or the driver gives up; what it says goes to `outputs`.
pub async fn drive<C: WsCore>(
    mut core: C,
    mut inputs: mpsc::Receiver<C::Input>,
    outputs: mpsc::Sender<C::Output>,
    policy: ReconnectPolicy,
) {
    let mut failures = 0u32;
    loop {
        let connected = match core.request() {
            Err(e) => Err(e),
            Ok(request) => {
                let connecting = connect(request, &policy);
                tokio::pin!(connecting);
                loop {
                    tokio::select! {
                        connected = &mut connecting => break connected,
                        // Inputs keep coming while the socket opens: the core keeps them for it.
                        closed = take_inputs(&mut core, &mut inputs, &outputs) => {
                            if closed { return; }
                        }
                    }
                }
            }
        };
        let error = match connected {
            Ok(mut socket) => match serve(&mut core, &mut socket, &mut inputs, &outputs).await {
                Served::Closed => {
                    for message in core.closing() {
                        let _ = socket.send(message).await;
                    }
                    let _ = socket.close(None).await;
                    return;
                }
                Served::Lost(error) => {
                    if core.established() {
                        failures = 0;
                    }
                    for output in core.lost(Instant::now()) {
                        let _ = outputs.send(output).await;
                    }
                    error
                }
            },
            Err(error) => error,
        };
        failures += 1;
        if matches!(error, WsError::Permanent(_)) || failures > policy.max_attempts {
            tracing::warn!(%error, failures, "the provider's connection failed for good");
            for output in core.failed(&error) {
                let _ = outputs.send(output).await;
            }
            // The core answers what still comes on its own (an STT's finalizes, with no words).
            while !take_inputs(&mut core, &mut inputs, &outputs).await {}
            return;
        }
        let delay = policy.delay(failures);
        tracing::warn!(%error, attempt = failures, delay_ms = delay.as_millis() as u64, "the provider's connection was lost; reconnecting");
        for output in core.reconnecting(failures, delay, &error) {
            let _ = outputs.send(output).await;
        }
        let wake = tokio::time::Instant::now() + delay;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(wake) => break,
                closed = take_inputs(&mut core, &mut inputs, &outputs) => {
                    if closed { return; }
                }
            }
        }
    }
}

/// Takes one input while disconnected; says whether the inputs closed.
async fn take_inputs<C: WsCore>(
    core: &mut C,
    inputs: &mut mpsc::Receiver<C::Input>,
    outputs: &mpsc::Sender<C::Output>,
) -> bool {
    match inputs.recv().await {
        None => true,
        Some(input) => {
            let (_, said) = core.input(input, Instant::now());
            for output in said {
                let _ = outputs.send(output).await;
            }
            false
        }
    }
}

/// Bytes a provider socket reads at a time.
const READ_BUFFER: usize = 16 * 1024;

/// Opens the socket. A handshake the provider answered with 401 or 403 is permanent.
async fn connect(request: ConnectRequest, policy: &ReconnectPolicy) -> Result<Socket, WsError> {
    // rustls needs its crypto provider chosen once per process; a second call is a no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // tungstenite zero-fills the free part of its read buffer before every read: at its default
    // of 128 KiB, a session's small provider messages cost more in memset than in parsing.
    // Larger messages take a few reads of 16 KiB.
    let config = tungstenite::protocol::WebSocketConfig::default().read_buffer_size(READ_BUFFER);
    // Without Nagle: a small message (a `Finalize`, a line of text to speak) that follows audio
    // still unacknowledged would otherwise wait for the provider's delayed ACK, up to 40 ms.
    let connected = tokio::time::timeout(
        policy.connect_timeout,
        tokio_tungstenite::connect_async_with_config(request, Some(config), true),
    )
    .await
    .map_err(|_| WsError::Passing("connecting timed out".into()))?;
    match connected {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status();
            let body = response
                .body()
                .as_deref()
                .map(|b| {
                    String::from_utf8_lossy(b)
                        .chars()
                        .take(200)
                        .collect::<String>()
                })
                .unwrap_or_default();
            let message = format!("the provider refused the connection: HTTP {status} {body}");
            if (400..=404).contains(&status.as_u16()) {
                Err(WsError::Permanent(message))
            } else {
                Err(WsError::Passing(message))
            }
        }
        Err(e) => Err(WsError::Passing(format!("connecting failed: {e}"))),
    }
}

enum Served {
    /// The service closed its inputs.
    Closed,
    /// The connection failed.
    Lost(WsError),
}

async fn serve<C: WsCore>(
    core: &mut C,
    socket: &mut Socket,
    inputs: &mut mpsc::Receiver<C::Input>,
    outputs: &mpsc::Sender<C::Output>,
) -> Served {
    if let Err(e) = send_all(socket, core.opened(Instant::now())).await {
        return Served::Lost(e);
    }
    loop {
        let deadline = core.next_deadline();
        let (send, said) = tokio::select! {
            input = inputs.recv() => match input {
                None => return Served::Closed,
                Some(input) => core.input(input, Instant::now()),
            },
            message = socket.next() => match message {
                Some(Ok(Message::Close(frame))) => {
                    let reason = match frame {
                        Some(f) => format!("the provider closed the connection ({}: {})", f.code, f.reason),
                        None => "the provider closed the connection".to_owned(),
                    };
                    return Served::Lost(WsError::Passing(reason));
                }
                Some(Ok(message)) => match core.message(message, Instant::now()) {
                    Ok(step) => step,
                    Err(e) => return Served::Lost(e),
                },
                Some(Err(e)) => return Served::Lost(WsError::Passing(format!("the connection failed: {e}"))),
                None => return Served::Lost(WsError::Passing("the connection ended".into())),
            },
            () = sleep_until(deadline), if deadline.is_some() => {
                let (tick, said) = core.tick(Instant::now());
                for output in said {
                    let _ = outputs.send(output).await;
                }
                if let Some(reason) = tick.reconnect {
                    return Served::Lost(WsError::Passing(reason));
                }
                (tick.send, Vec::new())
            }
        };
        for output in said {
            let _ = outputs.send(output).await;
        }
        if let Err(e) = send_all(socket, send).await {
            return Served::Lost(e);
        }
    }
}

async fn send_all(socket: &mut Socket, messages: Vec<Message>) -> Result<(), WsError> {
    for message in messages {
        socket
            .send(message)
            .await
            .map_err(|e| WsError::Passing(format!("sending failed: {e}")))?;
    }
    Ok(())
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_ceiling_with_jitter() {
        let policy = ReconnectPolicy::default();
        for attempt in 1..10 {
            let ceiling = (policy.initial_delay * (1 << (attempt - 1))).min(policy.max_delay);
            let delay = policy.delay(attempt);
            assert!(
                delay <= ceiling && delay >= ceiling / 2,
                "{attempt}: {delay:?}"
            );
        }
    }

    #[test]
    fn connect_requests_carry_headers_and_reject_bad_urls() {
        let request = connect_request(
            "wss://example.com/v1/listen",
            &[("Authorization", "Token k")],
        )
        .expect("request");
        assert_eq!(request.headers()["Authorization"], "Token k");
        assert!(matches!(
            connect_request("not a url", &[]),
            Err(WsError::Permanent(_))
        ));
    }

    #[tokio::test]
    async fn a_provider_socket_sends_small_messages_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let provider = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            tokio_tungstenite::accept_async(tcp)
                .await
                .expect("handshake")
        });
        let request = connect_request(&format!("ws://{addr}/v1/listen"), &[]).expect("request");
        let socket = connect(request, &ReconnectPolicy::default())
            .await
            .expect("connected");
        let _provider = provider.await.expect("provider");
        let MaybeTlsStream::Plain(tcp) = socket.get_ref() else {
            panic!("a ws:// socket is plain TCP");
        };
        assert!(tcp.nodelay().expect("TCP_NODELAY"), "Nagle is off");
    }
}
