//! Who may use the server. A bearer token guards what opens or steers a session (signalling,
//! `/start`, the WebSockets) and `/admin/*`; Twilio's media streams may prove themselves by
//! their signature instead. Browsers on other origins get CORS where allowed. New sessions are
//! limited per client address. Health, readiness and metrics stay open (`--admin-port` moves
//! them to a port of their own).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use crate::secret::{Secret, same_secret};
use crate::transports::carriers::{Call, Carrier};

use super::cluster::{FORWARDED_HEADER, Forwarded, SIGNATURE_HEADER, signed, unix_now};
use super::{ApiError, App, MAX_BODY_BYTES};

/// How the server decides who may use it.
#[derive(Debug, Clone, Default)]
pub struct AccessOptions {
    /// The token every guarded request carries: `Authorization: Bearer <token>`, or
    /// `?token=<token>` where a header cannot be set (a browser's WebSocket).
    pub auth_token: Option<Secret>,
    /// The Twilio account's auth token: a media stream whose `X-Twilio-Signature` checks out
    /// needs no bearer token.
    pub twilio_auth_token: Option<Secret>,
    /// The Twilio account whose calls this server takes: a stream whose `start` names another
    /// is closed.
    pub twilio_account_sid: Option<String>,
    /// The server's URL as Twilio calls it (`wss://voice.example.com`), for the signature;
    /// without it, the request's `Host` and `X-Forwarded-Proto` (else `wss`).
    pub public_url: Option<String>,
    /// Origins whose browser pages may call the API (`*`: any).
    pub cors_origins: Vec<String>,
    /// New sessions a client address may open a minute (a burst of as many); 0: no limit.
    pub sessions_per_minute: u32,
    /// Take the client's address from the last `X-Forwarded-For` entry (behind a proxy that
    /// sets it) rather than the connection's.
    pub trust_forwarded_for: bool,
}

/// The access rules and the per-address session counts.
pub(crate) struct Access {
    options: AccessOptions,
    limiter: Mutex<RateLimiter>,
    calls: Mutex<Calls>,
}

impl Access {
    pub(crate) fn new(options: AccessOptions) -> Self {
        let limiter = RateLimiter::new(options.sessions_per_minute);
        Self {
            options,
            limiter: Mutex::new(limiter),
            calls: Mutex::new(Calls::default()),
        }
    }

    /// Takes a telephone call's stream: once per call, and only for the configured account
    /// (a replayed handshake cannot open a call twice).
    pub(crate) fn take_call(&self, call: &Call) -> Result<(), CallRefused> {
        if call.carrier == Carrier::Twilio
            && let Some(account) = &self.options.twilio_account_sid
            && !call
                .account_sid
                .as_ref()
                .is_some_and(|sid| same_secret(sid.as_bytes(), account.as_bytes()))
        {
            return Err(CallRefused::OtherAccount);
        }
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(&call.call_sid, Instant::now())
    }

    /// Whether `request` may go on, as far as tokens go.
    /// With a Twilio token set, a media stream needs Twilio's signature (or the bearer token,
    /// where there is one): a Twilio token alone never leaves `/ws/twilio` open.
    /// The rules as given.
    pub(crate) fn options(&self) -> &AccessOptions {
        &self.options
    }

    fn authorized(&self, parts: &RequestView<'_>) -> bool {
        let twilio_stream = match &self.options.twilio_auth_token {
            Some(twilio) if parts.path == "/ws/twilio" || placed_stream(parts.path) => {
                if self.signed_by_twilio(twilio.expose(), parts) {
                    return true;
                }
                true
            }
            _ => false,
        };
        let Some(token) = &self.options.auth_token else {
            return !twilio_stream;
        };
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let query = parts
            .query
            .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("token=")));
        [bearer, query]
            .into_iter()
            .flatten()
            .any(|given| same_secret(given.trim().as_bytes(), token.expose().as_bytes()))
    }

    /// Twilio signs the URL it called with the account's auth token (HMAC-SHA1, base64); a
    /// WebSocket upgrade has no form parameters to add.
    fn signed_by_twilio(&self, auth_token: &str, parts: &RequestView<'_>) -> bool {
        let Some(signature) = parts
            .headers
            .get("x-twilio-signature")
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let base = match &self.options.public_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => {
                let host = parts
                    .headers
                    .get(header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let scheme = parts
                    .headers
                    .get("x-forwarded-proto")
                    .and_then(|v| v.to_str().ok())
                    .map_or("wss", |p| {
                        if p == "http" {
                            "ws"
                        } else if p == "https" {
                            "wss"
                        } else {
                            p
                        }
                    });
                format!("{scheme}://{host}")
            }
        };
        let url = match parts.query {
            Some(q) => format!("{base}{}?{q}", parts.path),
            None => format!("{base}{}", parts.path),
        };
        // Twilio's own helpers accept the URL with and without its standard port.
        with_and_without_port(&url).iter().any(|url| {
            same_secret(
                twilio_signature(auth_token, url).as_bytes(),
                signature.trim().as_bytes(),
            )
        })
    }

    /// Whether `ip` may open one more session now (`--sessions-per-minute-per-ip`), for a
    /// transport outside HTTP (a SIP INVITE).
    pub(crate) fn allow_session(&self, ip: IpAddr) -> bool {
        self.limiter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allow(ip, Instant::now())
    }

    /// Keeps `ip` from opening a session for [`COOL_DOWN`]: a session of its was closed for
    /// abuse (audio faster than real time, nothing read). Nothing without a per-address limit.
    pub(crate) fn cool_down(&self, ip: IpAddr) {
        self.limiter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cool_down(ip, COOL_DOWN, Instant::now());
    }

    /// The client's address: the connection's, or the proxy's word for it.
    fn client(&self, request: &Request) -> Option<IpAddr> {
        if self.options.trust_forwarded_for
            && let Some(ip) = request
                .headers()
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit(',').next())
                .and_then(|ip| ip.trim().parse().ok())
        {
            return Some(ip);
        }
        request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| addr.ip())
    }
}

/// For [`crate::fuzz`]: a request's path, query and header lines (`name: value`), split at
/// `0xff`, read by the access rules: the token, Twilio's signature over the rebuilt URL, the
/// client's address from `X-Forwarded-For`.
pub(crate) fn fuzz_request(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let mut parts = text.split('\u{fffd}').flat_map(|p| p.split('\n'));
    let path = parts.next().unwrap_or_default();
    let query = parts.next().filter(|q| !q.is_empty());
    let mut headers = HeaderMap::new();
    for line in parts.take(32) {
        if let Some((name, value)) = line.split_once(':')
            && let (Ok(name), Ok(value)) = (
                axum::http::HeaderName::from_bytes(name.trim().as_bytes()),
                HeaderValue::from_str(value.trim()),
            )
        {
            headers.append(name, value);
        }
    }
    let access = Access::new(AccessOptions {
        auth_token: Some("s3cret".into()),
        twilio_auth_token: Some("twilio".into()),
        trust_forwarded_for: true,
        sessions_per_minute: 2,
        ..AccessOptions::default()
    });
    let view = RequestView {
        path,
        query,
        headers: &headers,
    };
    let _ = access.authorized(&view);
    let _ = guarded(path);
    let _ = opens_session(&Method::POST, path, |_| false);
    let _ = with_and_without_port(&format!("wss://{path}"));
    let mut request = Request::new(axum::body::Body::empty());
    *request.headers_mut() = headers;
    if let Some(ip) = access.client(&request) {
        let _ = access.take_call(&Call {
            carrier: Carrier::Twilio,
            call_sid: ip.to_string(),
            account_sid: Some("AC1".into()),
        });
        let _ = subscriber(ip);
    }
}

/// What the access rules look at in a request.
struct RequestView<'a> {
    path: &'a str,
    query: Option<&'a str>,
    headers: &'a HeaderMap,
}

/// `url` as written, and with its scheme's standard port taken out or put in.
fn with_and_without_port(url: &str) -> Vec<String> {
    let mut out = vec![url.to_owned()];
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return out;
    };
    let standard = match parsed.scheme() {
        "wss" | "https" => 443,
        "ws" | "http" => 80,
        _ => return out,
    };
    let Some(host) = parsed.host_str() else {
        return out;
    };
    let (scheme, rest) = url.split_once("://").unwrap_or((parsed.scheme(), url));
    let after_host = rest.find(['/', '?']).map_or("", |i| &rest[i..]);
    let with_port = format!("{scheme}://{host}:{standard}{after_host}");
    let without = format!("{scheme}://{host}{after_host}");
    for candidate in [with_port, without] {
        if !out.contains(&candidate) {
            out.push(candidate);
        }
    }
    out
}

/// `X-Twilio-Signature` for a request to `url` with no form parameters.
pub fn twilio_signature(auth_token: &str, url: &str) -> String {
    let key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        auth_token.as_bytes(),
    );
    let tag = ring::hmac::sign(&key, url.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
}

/// Paths that open or steer sessions, or administer the node: a token guards them. Twilio's
/// status callbacks are checked by their handler, whose signature covers the form it posts.
fn guarded(path: &str) -> bool {
    matches!(path, "/start" | "/api/offer" | "/ws" | "/bots" | "/calls")
        || Carrier::is_stream_path(path)
        || (path.starts_with("/calls/") && placed_call_path(path) != Some("status"))
        || path.starts_with("/sessions/")
        || path.starts_with("/admin/")
}

/// What a path under one placed call is for: `/calls/{id}/stream` gives `stream`.
fn placed_call_path(path: &str) -> Option<&str> {
    let (id, what) = path.strip_prefix("/calls/")?.split_once('/')?;
    (!id.is_empty() && !what.contains('/')).then_some(what)
}

/// Whether `path` is the stream Twilio opens for a call voxide placed through it.
fn placed_stream(path: &str) -> bool {
    placed_call_path(path) == Some("stream")
}

/// Requests that open a session. The offer of a session a `/start` on this node began was
/// counted with its start; any other offer to `/sessions/{id}` counts.
fn opens_session(method: &Method, path: &str, started_here: impl Fn(&str) -> bool) -> bool {
    if matches!(path, "/start" | "/ws") || Carrier::is_stream_path(path) {
        return true;
    }
    if method != Method::POST {
        return false;
    }
    if path == "/api/offer" || path == "/calls" {
        return true;
    }
    match path
        .strip_prefix("/sessions/")
        .and_then(|rest| rest.strip_suffix("/api/offer"))
    {
        Some(id) => !started_here(id),
        None => false,
    }
}

/// Whether `request` comes from a node of the cluster: it says so, and its signature over
/// method, path, body and time checks out with the cluster's secret. Without a secret no claim
/// can be checked, and none is believed. The request comes back with its body whole; a claim
/// that is not believed loses its header, so nothing after trusts it.
async fn from_a_peer(app: &App, request: Request) -> Result<(Request, Option<bool>), ApiError> {
    if !request.headers().contains_key(FORWARDED_HEADER) {
        return Ok((request, None));
    }
    let Some(secret) = app.cluster.secret() else {
        let mut request = request;
        request.headers_mut().remove(FORWARDED_HEADER);
        return Ok((request, None));
    };
    let (mut parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| ApiError::TooLarge(format!("the request body is too large: {e}")))?;
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    let proven = parts
        .headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|h| signed(secret, h, parts.method.as_str(), path, &body, unix_now()));
    if proven {
        parts.extensions.insert(Forwarded);
    } else {
        parts.headers.remove(FORWARDED_HEADER);
    }
    Ok((
        Request::from_parts(parts, axum::body::Body::from(body)),
        Some(proven),
    ))
}

/// Middleware: the token (or Twilio's signature) on guarded routes, and the per-address limit
/// on new sessions.
pub(crate) async fn guard(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let path = request.uri().path();
    if guarded(path) {
        let view = RequestView {
            path,
            query: request.uri().query(),
            headers: request.headers(),
        };
        if !app.access.authorized(&view) {
            return Err(ApiError::Unauthorized);
        }
    }
    let (mut request, claim) = from_a_peer(&app, request).await?;
    let path = request.uri().path();
    // A forwarded request was counted where it came in; a false claim is counted here.
    let first_hop = claim != Some(true);
    let started_here = |id: &str| app.lock_starts().contains(id);
    if first_hop
        && opens_session(request.method(), path, started_here)
        && let Some(ip) = app.access.client(&request)
    {
        let allowed = app
            .access
            .limiter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allow(ip, Instant::now());
        if !allowed {
            app.metrics.session_rejected();
            return Err(ApiError::RateLimited(ip.to_string()));
        }
        request.extensions_mut().insert(ClientAddr(ip));
    }
    if claim == Some(false) {
        tracing::warn!(
            path = request.uri().path(),
            "a request claimed to be forwarded by a node without a valid signature: refused"
        );
        return Err(ApiError::Unauthorized);
    }
    Ok(next.run(request).await)
}

/// Middleware: CORS for the origins allowed, preflights included.
pub(crate) async fn cors(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let origins = &app.access.options.cors_origins;
    let allowed = request
        .headers()
        .get(header::ORIGIN)
        .filter(|origin| {
            origins
                .iter()
                .any(|o| o == "*" || origin.to_str().is_ok_and(|origin| origin == o))
        })
        .cloned();
    let Some(origin) = allowed else {
        return next.run(request).await;
    };
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(request).await
    };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("x-voxide-node, retry-after"),
    );
    if preflight {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, PATCH, OPTIONS"),
        );
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type"),
        );
        headers.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
    }
    response
}

/// Why a call's stream was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CallRefused {
    /// Its `start` names an account other than `--twilio-account-sid`.
    #[error("this call belongs to another Twilio account")]
    OtherAccount,
    /// A stream for this call was opened already.
    #[error("a stream for this call was opened already")]
    Taken,
}

/// Calls remembered at most, and for how long (Twilio ends a call after 4 hours).
const MAX_CALLS: usize = 100_000;
const CALL_MEMORY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The calls whose streams were opened, oldest first.
#[derive(Default)]
struct Calls {
    taken: std::collections::HashSet<String>,
    order: std::collections::VecDeque<(Instant, String)>,
}

impl Calls {
    fn take(&mut self, call_sid: &str, now: Instant) -> Result<(), CallRefused> {
        while let Some((at, _)) = self.order.front()
            && (now.saturating_duration_since(*at) > CALL_MEMORY || self.order.len() >= MAX_CALLS)
        {
            if let Some((_, old)) = self.order.pop_front() {
                self.taken.remove(&old);
            }
        }
        if !self.taken.insert(call_sid.to_owned()) {
            return Err(CallRefused::Taken);
        }
        self.order.push_back((now, call_sid.to_owned()));
        Ok(())
    }
}

/// Addresses tracked at most. Past that, the ones with a full allowance are forgotten, and if
/// that is not enough, the quarter seen longest ago: the table never grows past this, and the
/// sweep runs once per many new addresses, not once per request.
const MAX_TRACKED: usize = 10_000;

/// The key an address is limited under: an IPv4 address (an IPv4-mapped IPv6 one too) on its
/// own, an IPv6 address by its /64, the block one subscriber is handed.
fn subscriber(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(prefix.into())
            }
        },
    }
}

/// How long an address whose session was closed for abuse waits for its next: a client that
/// reconnects in a loop costs a session's first second every this long, not every second.
pub(crate) const COOL_DOWN: std::time::Duration = std::time::Duration::from_secs(30);

/// The address a session was opened from, as the per-address limit counted it (a request
/// extension, set where the limit applies).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientAddr(pub(crate) IpAddr);

/// A token bucket per subscriber: `per_minute` sessions a minute, in bursts of as many.
struct RateLimiter {
    per_minute: u32,
    buckets: HashMap<IpAddr, Bucket>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            buckets: HashMap::new(),
        }
    }

    /// Whether `ip` may open a session at `now`; takes one from its allowance if so.
    fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        if self.per_minute == 0 {
            return true;
        }
        let key = subscriber(ip);
        let full = f64::from(self.per_minute);
        let refill = |b: &Bucket| {
            let secs = now.saturating_duration_since(b.at).as_secs_f64();
            (b.tokens + secs * full / 60.0).min(full)
        };
        if self.buckets.len() >= MAX_TRACKED && !self.buckets.contains_key(&key) {
            self.buckets.retain(|_, b| refill(b) < full);
            if self.buckets.len() > MAX_TRACKED * 3 / 4 {
                let mut seen: Vec<Instant> = self.buckets.values().map(|b| b.at).collect();
                let cut = seen.len() / 4;
                let (_, oldest_kept, _) = seen.select_nth_unstable(cut);
                let oldest_kept = *oldest_kept;
                self.buckets.retain(|_, b| b.at >= oldest_kept);
            }
        }
        let bucket = self.buckets.entry(key).or_insert(Bucket {
            tokens: full,
            at: now,
        });
        let tokens = refill(bucket);
        let allowed = tokens >= 1.0;
        *bucket = Bucket {
            tokens: if allowed { tokens - 1.0 } else { tokens },
            at: now,
        };
        allowed
    }

    /// Empties `ip`'s allowance so that its next session is allowed only after `wait`.
    fn cool_down(&mut self, ip: IpAddr, wait: std::time::Duration, now: Instant) {
        if self.per_minute == 0 {
            return;
        }
        let owed = wait.as_secs_f64() * f64::from(self.per_minute) / 60.0;
        self.buckets.insert(
            subscriber(ip),
            Bucket {
                tokens: 1.0 - owed,
                at: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_client_gets_its_burst_then_one_session_per_refill() {
        let mut limiter = RateLimiter::new(3);
        let t0 = Instant::now();
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        assert!((0..3).all(|_| limiter.allow(a, t0)));
        assert!(!limiter.allow(a, t0), "the burst is spent");
        assert!(limiter.allow(b, t0), "another client has its own");
        assert!(!limiter.allow(a, t0 + Duration::from_secs(19)));
        assert!(
            limiter.allow(a, t0 + Duration::from_secs(20)),
            "a minute / 3"
        );
        assert!(RateLimiter::new(0).allow(a, t0), "0: no limit");
    }

    #[test]
    fn an_address_cooled_down_waits_that_long_for_its_next_session_and_others_do_not() {
        let mut limiter = RateLimiter::new(120);
        let t0 = Instant::now();
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        limiter.cool_down(a, COOL_DOWN, t0);
        assert!(!limiter.allow(a, t0 + COOL_DOWN - Duration::from_millis(100)));
        assert!(limiter.allow(b, t0), "another client has its own");
        assert!(
            limiter.allow(a, t0 + COOL_DOWN + Duration::from_millis(10)),
            "allowed again after the wait"
        );
        let mut unlimited = RateLimiter::new(0);
        unlimited.cool_down(a, COOL_DOWN, t0);
        assert!(unlimited.allow(a, t0), "no per-address limit: no cool-down");
    }

    #[test]
    fn addresses_of_one_ipv6_64_share_one_allowance() {
        let mut limiter = RateLimiter::new(2);
        let t0 = Instant::now();
        let a: IpAddr = "2001:db8:1:2::1".parse().expect("an address");
        let b: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:ffff"
            .parse()
            .expect("an address");
        let other: IpAddr = "2001:db8:1:3::1".parse().expect("an address");
        assert!(limiter.allow(a, t0) && limiter.allow(b, t0));
        assert!(!limiter.allow(a, t0), "one /64, one allowance");
        assert!(limiter.allow(other, t0), "the next /64 has its own");
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("an address");
        let v4: IpAddr = [10, 0, 0, 1].into();
        assert!(limiter.allow(mapped, t0) && limiter.allow(v4, t0));
        assert!(!limiter.allow(v4, t0), "a mapped IPv4 is that IPv4");
    }

    #[test]
    fn the_rate_table_stays_bounded_however_many_addresses_come() {
        let mut limiter = RateLimiter::new(5);
        let t0 = Instant::now();
        for i in 0..(3 * MAX_TRACKED as u32) {
            let ip: IpAddr = std::net::Ipv4Addr::from(0x0a00_0000 + i).into();
            let at = t0 + Duration::from_millis(u64::from(i));
            assert!(limiter.allow(ip, at));
            assert!(limiter.buckets.len() <= MAX_TRACKED);
        }
        let last: IpAddr =
            std::net::Ipv4Addr::from(0x0a00_0000 + 3 * MAX_TRACKED as u32 - 1).into();
        let now = t0 + Duration::from_millis(3 * MAX_TRACKED as u64);
        assert!((0..4).all(|_| limiter.allow(last, now)));
        assert!(!limiter.allow(last, now), "the newest are remembered");
    }

    #[test]
    fn a_call_is_taken_once_and_remembered_for_a_day() {
        let mut calls = Calls::default();
        let t0 = Instant::now();
        assert_eq!(calls.take("CA1", t0), Ok(()));
        assert_eq!(calls.take("CA2", t0), Ok(()));
        assert_eq!(
            calls.take("CA1", t0 + Duration::from_secs(3600)),
            Err(CallRefused::Taken)
        );
        assert_eq!(
            calls.take("CA1", t0 + CALL_MEMORY + Duration::from_secs(1)),
            Ok(())
        );
        assert!(!calls.taken.contains("CA2"), "forgotten with its age");
    }

    #[test]
    fn a_call_of_another_account_is_refused() {
        let access = Access::new(AccessOptions {
            twilio_account_sid: Some("AC1".into()),
            ..AccessOptions::default()
        });
        let call = |account: &str| Call {
            carrier: Carrier::Twilio,
            call_sid: format!("CA-{account}"),
            account_sid: Some(account.into()),
        };
        assert_eq!(
            access.take_call(&call("AC2")),
            Err(CallRefused::OtherAccount)
        );
        assert_eq!(access.take_call(&call("AC1")), Ok(()));
        assert_eq!(access.take_call(&call("AC1")), Err(CallRefused::Taken));
        // Another carrier's call names no Twilio account; it is taken once too.
        let telnyx = Call {
            carrier: Carrier::Telnyx,
            call_sid: "v3:abc".into(),
            account_sid: None,
        };
        assert_eq!(access.take_call(&telnyx), Ok(()));
        assert_eq!(access.take_call(&telnyx), Err(CallRefused::Taken));
    }

    #[test]
    fn secrets_compare_equal_only_when_they_are() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3creT"));
        assert!(!same_secret(b"s3cret", b"s3cret!"));
        assert!(!same_secret(b"", b"x"));
    }

    #[test]
    fn a_twilio_url_is_also_tried_with_and_without_its_standard_port() {
        assert_eq!(
            with_and_without_port("wss://voice.example.com/ws/twilio?bot=a"),
            [
                "wss://voice.example.com/ws/twilio?bot=a",
                "wss://voice.example.com:443/ws/twilio?bot=a",
            ]
        );
        assert_eq!(
            with_and_without_port("wss://voice.example.com:443/ws/twilio"),
            [
                "wss://voice.example.com:443/ws/twilio",
                "wss://voice.example.com/ws/twilio",
            ]
        );
    }

    #[test]
    fn twilio_signatures_are_hmac_sha1_of_the_url_in_base64() {
        // RFC 2202's second HMAC-SHA1 test case: key "Jefe".
        let signature = twilio_signature("Jefe", "what do ya want for nothing?");
        assert_eq!(signature, "7/zfauXrL6LSdBbV8YTfnCWafHk=");
    }

    #[test]
    fn only_what_opens_or_steers_a_session_or_administers_is_guarded() {
        for path in [
            "/start",
            "/api/offer",
            "/sessions/n1.x/api/offer",
            "/ws",
            "/ws/twilio",
            "/admin/drain",
            "/calls",
            "/calls/n1.x",
            "/calls/n1.x/stream",
            "/calls/n1.x/status/more",
        ] {
            assert!(guarded(path), "{path}");
        }
        // Twilio's status callback is checked by its handler, over its form too.
        for path in [
            "/",
            "/healthz",
            "/readyz",
            "/metrics",
            "/status",
            "/calls/n1.x/status",
        ] {
            assert!(!guarded(path), "{path}");
        }
    }
}
