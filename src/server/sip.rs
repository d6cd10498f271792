//! SIP calls without a carrier (`--sip-listen`): one UDP socket takes every call's signalling
//! (and with `--sip-transport udp,tcp` a TCP listener on the same address, its connections read
//! by `sip_tcp`), each answered call gets an RTP port of `--sip-rtp-ports` and a session like
//! any other. The protocol is `transports::sip`'s, sans-IO; this is its driver.
//!
//! Who may call: source addresses in `--sip-allow` (loopback when none is given), and from
//! anywhere the users of `--sip-users` who answer a digest challenge (401, then 403 for a wrong
//! answer); every INVITE from outside counts against the per-address limit, challenged or not,
//! so passwords are not guessed faster than calls are let in. A new call also takes a slot under
//! `--max-sessions` and the per-address limit on new sessions, and is refused with 503 and
//! `Retry-After` past either, 403 from elsewhere, 488 without a codec both sides speak.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::calls::{CallState, Placing, plain_user};
use super::phone::CallSession;
use super::rtvi::RtviInput;
use super::sip_tcp::{Connections, Heard, Wire, accept};
use super::{Admission, ApiError, App};
use crate::bot::SessionInfo;
use crate::events::Event;
use crate::frames::{AudioFrame, PhoneAction};
use crate::ids::random_u32;
use crate::transports::jitter::NetworkStats;
use crate::transports::output::AudioSink;
use crate::transports::phone_in::PhoneInput;
use crate::transports::phone_out::PhoneEncoder;
use crate::transports::sip::SipError;
use crate::transports::sip::auth::{Callers, Verdict};
use crate::transports::sip::call::{Action, Call, Ending, Local};
use crate::transports::sip::dial::{Dial, Dialer, Dialing};
use crate::transports::sip::message::{MAX_MESSAGE, SipMessage, StartLine};
use crate::transports::sip::register::{Account, Registration, Standing};
use crate::transports::sip::rtp::{Keys, Packet, Sender};
use crate::transports::sip::sdp::{self, Chosen, Offer};

/// How SIP calls are taken.
#[derive(Debug, Clone)]
pub struct SipOptions {
    /// Where SIP is heard (UDP, and TCP with `tcp`).
    pub listen: SocketAddr,
    /// Whether SIP is taken over TCP too, on the same address (`--sip-transport udp,tcp`).
    pub tcp: bool,
    /// The address callers reach this host at (behind a 1:1 NAT): in Contact, Via and SDP.
    pub public_ip: Option<IpAddr>,
    /// The UDP ports calls' RTP binds, one a call.
    pub rtp_ports: std::ops::RangeInclusive<u16>,
    /// Who may call: networks as `address/bits`.
    pub allow: Vec<Network>,
    /// The PBX voxide registers with as an extension (`--sip-register`); its address may call.
    pub register: Option<Account>,
    /// Callers from anywhere with a password (`--sip-users`).
    pub users: Option<Arc<Callers>>,
}

/// A network, `address/bits` (a bare address is one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    address: IpAddr,
    bits: u8,
}

impl std::str::FromStr for Network {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (address, bits) = match text.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (text, None),
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("{text:?} is not an address or address/bits"))?;
        let most = if address.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= most)
                .ok_or_else(|| format!("{text:?}: bits must be 0 to {most}"))?,
            None => most,
        };
        Ok(Self { address, bits })
    }
}

impl Network {
    /// Loopback, IPv4 and IPv6: who may call when no network is given.
    pub fn loopback() -> Vec<Network> {
        vec![
            Network {
                address: IpAddr::from([127, 0, 0, 0]),
                bits: 8,
            },
            Network {
                address: IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
                bits: 128,
            },
        ]
    }

    /// One host.
    pub fn host(address: IpAddr) -> Self {
        let bits = if address.is_ipv4() { 32 } else { 128 };
        Self { address, bits }
    }

    /// Whether `ip` is in the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Where the registration with the PBX stands, for `/metrics` (`App::sip_registration`).
pub(crate) const NOT_REGISTERING: u8 = 0;
pub(crate) const UNREGISTERED: u8 = 1;
pub(crate) const REGISTERED: u8 = 2;

/// Messages queued for one call at most (SIP retransmits what is lost).
const CALL_INBOX: usize = 16;
/// The header that names the bot a call goes to (before the called user).
pub const BOT_HEADER: &str = "X-Voxide-Bot";
const FRAME: Duration = Duration::from_millis(20);
/// How long without any audio from the caller, before its first packet, until the call's
/// timeline moves on in silence: three packets' time. After the first packet the jitter buffer
/// moves it on.
const QUIET_AFTER: Duration = Duration::from_millis(60);
/// A call whose caller sends no audio for this long is hung up (a phone gone without a BYE).
const RTP_TIMEOUT: Duration = Duration::from_secs(60);

/// Takes calls on `socket` (and the connections of `tcp`) until the server stops.
pub(crate) async fn serve(
    app: Arc<App>,
    (socket, tcp): (UdpSocket, Option<TcpListener>),
    mut options: SipOptions,
) {
    let socket = Arc::new(socket);
    let listen = socket.local_addr().unwrap_or(options.listen);
    let mut registration = match options.register.clone() {
        Some(account) => registering(account, &mut options, listen).await,
        None => None,
    };
    if let Some((registration, _)) = &registration {
        app.note_registration(registration.standing());
    }
    let options = Arc::new(options);
    let next_port = Arc::new(AtomicU32::new(0));
    let mut calls: HashMap<String, mpsc::Sender<(SipMessage, Wire)>> = HashMap::new();
    let (ended_tx, mut ended) = mpsc::channel::<String>(64);
    let mut placing = app.outbound.open();
    let mut buffer = vec![0u8; MAX_MESSAGE];
    let connections = Connections::default();
    let (heard_tx, mut heard) = mpsc::channel::<Heard>(CALL_INBOX);
    loop {
        let renewal = registration
            .as_ref()
            .map(|(r, _)| tokio::time::Instant::from_std(r.deadline()));
        let (message, from, wire) = tokio::select! {
            Some(id) = ended.recv() => {
                calls.remove(&id);
                continue;
            }
            Some(placing) = placing.recv() => {
                let taken = Taking { app: &app, options: &options, listen, next_port: &next_port };
                let pbx = registration.as_ref().map(|(_, registrar)| *registrar);
                let Placing { to, from, info, admission, ring_for, time_limit, placed } = placing;
                match taken.dial(&to, from.as_deref(), pbx, ring_for).await {
                    Ok((dial, peer, rtp)) => {
                        let (dialer, actions) = Dialer::start(dial, Instant::now().into_std());
                        send_dialing(&socket, peer, &actions).await;
                        let call_id = dialer.call_id().to_owned();
                        let (tx, inbox) = mpsc::channel(CALL_INBOX);
                        calls.insert(call_id.clone(), tx);
                        tracing::info!(session = %info.id, %to, %peer, "placing a SIP call");
                        let _ = placed.send(Ok(()));
                        let line = Line { wire: Wire::Udp(socket.clone(), peer), peer, inbox };
                        let media = Pending { rtp, options: options.clone(), info, admission, time_limit };
                        tokio::spawn(run_placed(app.clone(), line, dialer, media, (call_id, ended_tx.clone())));
                    }
                    Err(e) => {
                        let _ = placed.send(Err(e));
                    }
                }
                continue;
            }
            () = tokio::time::sleep_until(renewal.unwrap_or_else(Instant::now)), if renewal.is_some() => {
                if let Some((registration, registrar)) = &mut registration {
                    if let Some(register) = registration.poll(Instant::now().into_std()) {
                        let _ = socket.send_to(&register, *registrar).await;
                    }
                    app.note_registration(registration.standing());
                }
                continue;
            }
            accepted = accept(tcp.as_ref()) => {
                match accepted {
                    Ok((stream, peer)) => connections.take(stream, peer, heard_tx.clone()),
                    Err(e) => {
                        // Out of descriptors, say: a short pause, not a loop that spins on it.
                        tracing::warn!(error = %e, "a SIP connection could not be taken");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                continue;
            }
            Some(from_stream) = heard.recv() => from_stream,
            received = socket.recv_from(&mut buffer) => {
                let (n, from) = match received {
                    Ok(received) => received,
                    Err(e) => {
                        tracing::debug!(error = %e, "a SIP datagram could not be read");
                        continue;
                    }
                };
                match SipMessage::parse(&buffer[..n]) {
                    Ok(message) => (message, from, Wire::Udp(socket.clone(), from)),
                    // Nothing to answer to: a message without its headers has no address.
                    Err(e) => {
                        tracing::debug!(%from, error = %e, "an unreadable SIP datagram dropped");
                        continue;
                    }
                }
            }
        };
        let Some(call_id) = message.call_id().map(str::to_owned) else {
            continue;
        };
        if let Some(call) = calls.get(&call_id) {
            // A full inbox drops the message: the caller sends it again.
            let _ = call.try_send((message, wire));
            continue;
        }
        if let Some((registration, registrar)) = &mut registration
            && registration.owns(&message)
        {
            if let Some(register) = registration.receive(&message, Instant::now().into_std()) {
                let _ = socket.send_to(&register, *registrar).await;
            }
            app.note_registration(registration.standing());
            continue;
        }
        match message.method() {
            Some("INVITE") if message.param("To", "tag").is_none() => {
                let taken = Taking {
                    app: &app,
                    options: &options,
                    listen,
                    next_port: &next_port,
                };
                match taken.take(&message, from).await {
                    Ok(answering) => {
                        let (tx, inbox) = mpsc::channel(CALL_INBOX);
                        calls.insert(call_id.clone(), tx);
                        tokio::spawn(run_call(
                            app.clone(),
                            Line {
                                wire,
                                peer: from,
                                inbox,
                            },
                            message,
                            answering,
                            (call_id, ended_tx.clone()),
                        ));
                    }
                    Err(refused) => {
                        tracing::info!(%from, status = refused.status, reason = refused.reason, "a SIP call refused");
                        wire.send(&refused.answering(&message).render()).await;
                    }
                }
            }
            Some("OPTIONS") if allowed(&options, from.ip()) => {
                let allow = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO";
                let response = message.response(200, "OK", None).with("Allow", allow);
                wire.send(&response.render()).await;
            }
            // An ACK to a refusal, or a stray response: nothing to answer.
            Some("ACK") | None => {}
            Some(_) => {
                let response = message.response(481, "Call/Transaction Does Not Exist", None);
                wire.send(&response.render()).await;
            }
        }
    }
}

/// Registration with `account`'s registrar, whose address may then call in too; `None` (and a
/// warning) when its host does not resolve.
async fn registering(
    account: Account,
    options: &mut SipOptions,
    listen: SocketAddr,
) -> Option<(Registration, SocketAddr)> {
    let host = account.registrar().to_owned();
    let host = if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host
    } else {
        format!("{host}:5060")
    };
    let Some(registrar) = tokio::net::lookup_host(&host)
        .await
        .ok()
        .and_then(|mut a| a.next())
    else {
        tracing::warn!(%host, "the registrar's address does not resolve: not registering");
        return None;
    };
    options.allow.push(Network::host(registrar.ip()));
    let ip = match options.public_ip {
        Some(ip) => ip,
        None if !listen.ip().is_unspecified() => listen.ip(),
        None => route_to(registrar).await,
    };
    let contact = SocketAddr::new(ip, listen.port()).to_string();
    let ids = (
        format!("reg-{:08x}{:08x}@voxide", random_u32(), random_u32()),
        format!("{:08x}", random_u32()),
    );
    tracing::info!(aor = %account.aor, %registrar, %contact, "registering with the PBX");
    Some((
        Registration::new(account, contact, ids, Instant::now().into_std()),
        registrar,
    ))
}

impl App {
    /// Notes where the registration with the PBX stands, for `/metrics`.
    fn note_registration(&self, standing: Standing) {
        let value = match standing {
            Standing::Registered => REGISTERED,
            Standing::Unregistered => UNREGISTERED,
        };
        self.sip_registration.store(value, Ordering::Relaxed);
    }
}

fn allowed(options: &SipOptions, ip: IpAddr) -> bool {
    options.allow.iter().any(|n| n.contains(ip))
}

/// Why a new call is refused, as SIP says it.
struct Refused {
    status: u16,
    reason: &'static str,
    retry_after: Option<u32>,
    warning: Option<String>,
    /// A digest challenge (`WWW-Authenticate`), with 401.
    challenge: Option<String>,
}

impl Refused {
    fn new(status: u16, reason: &'static str) -> Self {
        Self {
            status,
            reason,
            retry_after: None,
            warning: None,
            challenge: None,
        }
    }

    fn saying(mut self, warning: impl Into<String>) -> Self {
        self.warning = Some(warning.into());
        self
    }

    fn challenging(mut self, challenge: String) -> Self {
        self.challenge = Some(challenge);
        self
    }

    fn after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// The refusal as the answer to `invite`.
    fn answering(self, invite: &SipMessage) -> SipMessage {
        let mut response = invite.response(self.status, self.reason, Some("refused"));
        if let Some(after) = self.retry_after {
            response = response.with("Retry-After", after.to_string());
        }
        if let Some(warning) = self.warning {
            response = response.with("Warning", format!("399 voxide \"{warning}\""));
        }
        if let Some(challenge) = self.challenge {
            response = response.with("WWW-Authenticate", challenge);
        }
        response
    }
}

impl From<SipError> for Refused {
    fn from(error: SipError) -> Self {
        Refused::new(400, "Bad Request").saying(error.to_string())
    }
}

/// What a call taken needs to be answered.
struct Answering {
    offer: Offer,
    chosen: Chosen,
    rtp: UdpSocket,
    /// This host as the caller reaches it.
    host: IpAddr,
    sip_port: u16,
    info: SessionInfo,
    admission: Admission,
}

/// Deciding on a new call.
struct Taking<'a> {
    app: &'a Arc<App>,
    options: &'a SipOptions,
    listen: SocketAddr,
    next_port: &'a AtomicU32,
}

impl Taking<'_> {
    async fn take(&self, invite: &SipMessage, from: SocketAddr) -> Result<Answering, Refused> {
        let from_outside = !allowed(self.options, from.ip());
        if from_outside && self.options.users.is_none() {
            return Err(
                Refused::new(403, "Forbidden").saying("this address may not call (--sip-allow)")
            );
        }
        // From outside, a challenge counts as a call: passwords are guessed no faster.
        if !self.app.access.allow_session(from.ip()) {
            self.app.metrics.session_rejected();
            return Err(Refused::new(503, "Service Unavailable")
                .after(60)
                .saying("too many calls from this address"));
        }
        if from_outside && let Some(users) = &self.options.users {
            match users.judge(invite, from.ip(), std::time::SystemTime::now()) {
                Verdict::Welcome(user) => {
                    tracing::info!(%from, user, "a SIP caller let in by its password")
                }
                Verdict::Challenge(challenge) => {
                    return Err(Refused::new(401, "Unauthorized").challenging(challenge));
                }
                Verdict::Wrong => {
                    return Err(Refused::new(403, "Forbidden").saying("wrong credentials"));
                }
            }
        }
        let kind = invite.header("Content-Type").unwrap_or_default();
        if invite.body.is_empty() || !kind.to_ascii_lowercase().starts_with("application/sdp") {
            return Err(
                Refused::new(488, "Not Acceptable Here").saying("an INVITE needs an SDP offer")
            );
        }
        let text = std::str::from_utf8(&invite.body)
            .map_err(|_| SipError::BadOffer("not UTF-8".into()))?;
        let offer = Offer::parse(text)?;
        // The offer says where voxide's audio goes: only to a network that may call, so that a
        // caller cannot point voxide's RTP at an address of its choosing.
        let media_allowed = if from_outside {
            // A caller from outside sends and hears its audio at its own address only.
            offer.address == from.ip()
        } else {
            allowed(self.options, offer.address)
        };
        if !media_allowed {
            return Err(Refused::new(488, "Not Acceptable Here")
                .saying("the offer's media address is not the caller's or in --sip-allow"));
        }
        let chosen = offer.choose().ok_or_else(|| {
            Refused::new(488, "Not Acceptable Here")
                .saying("voxide speaks Opus, G722, PCMU or PCMA")
        })?;
        let bot = self.bot(invite)?;
        let admission = self.app.admit().map_err(|e| {
            let secs = match e {
                ApiError::Draining => 1,
                _ => 5,
            };
            Refused::new(503, "Service Unavailable")
                .after(secs)
                .saying(e.to_string())
        })?;
        let host = match self.options.public_ip {
            Some(ip) => ip,
            None if !self.listen.ip().is_unspecified() => self.listen.ip(),
            None => route_to(from).await,
        };
        let rtp = self.rtp_socket().await.ok_or_else(|| {
            Refused::new(503, "Service Unavailable")
                .after(5)
                .saying("no RTP port free")
        })?;
        let mut request_data = serde_json::Map::new();
        if let Some(bot) = bot {
            request_data.insert("bot".into(), serde_json::Value::String(bot));
        }
        let info = SessionInfo {
            id: format!("sip-{:08x}{:08x}", random_u32(), random_u32()),
            request_data: if request_data.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::Value::Object(request_data)
            },
            placed: false,
        };
        Ok(Answering {
            offer,
            chosen,
            rtp,
            host,
            sip_port: self.listen.port(),
            info,
            admission,
        })
    }

    /// A call to place to `to`: where its INVITE goes, its RTP socket and this host's address.
    /// `to` is a `sip:` URI at an address that may call (`--sip-allow`), or a number for the
    /// PBX (`pbx`, the registrar's address) to route; nothing else is dialled.
    async fn dial(
        &self,
        to: &str,
        from: Option<&str>,
        pbx: Option<SocketAddr>,
        ring_for: Duration,
    ) -> Result<(Dial, SocketAddr, UdpSocket), ApiError> {
        let account = self.options.register.as_ref();
        let (uri, peer, through_pbx) = match to.strip_prefix("sip:") {
            Some(rest) => {
                let (user, host) = rest
                    .split_once('@')
                    .filter(|(user, _)| plain_user(user))
                    .ok_or_else(|| {
                        ApiError::BadRequest(format!(
                            "to {to:.80?}: write sip:user@address[:port] (an IP address)"
                        ))
                    })?;
                let peer = host
                    .parse::<SocketAddr>()
                    .or_else(|_| host.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 5060)))
                    .map_err(|_| {
                        ApiError::BadRequest(format!(
                            "to {to:.80?}: the host must be an IP address in --sip-allow"
                        ))
                    })?;
                if Some(peer) != pbx && !allowed(self.options, peer.ip()) {
                    return Err(ApiError::Forbidden(format!(
                        "{peer} is not in --sip-allow: voxide calls only the networks its operator allows"
                    )));
                }
                (format!("sip:{user}@{peer}"), peer, Some(peer) == pbx)
            }
            None if plain_user(to) => {
                let (Some(account), Some(pbx)) = (account, pbx) else {
                    return Err(ApiError::BadRequest(format!(
                        "to {to:.80?}: a number is called through a PBX (--sip-register); else write sip:user@address"
                    )));
                };
                (format!("sip:{to}@{}", account.registrar()), pbx, true)
            }
            None => {
                return Err(ApiError::BadRequest(format!(
                    "to {to:.80?}: a sip: URI, or a number or extension"
                )));
            }
        };
        let host = match self.options.public_ip {
            Some(ip) => ip,
            None if !self.listen.ip().is_unspecified() => self.listen.ip(),
            None => route_to(peer).await,
        };
        let rtp = self
            .rtp_socket()
            .await
            .ok_or_else(|| ApiError::TooOften("no RTP port free".into()))?;
        let rtp_port = rtp.local_addr().map(|a| a.port()).unwrap_or_default();
        let local = SocketAddr::new(host, self.listen.port()).to_string();
        let from = match (through_pbx, account) {
            (true, Some(account)) => format!("<{}>", account.aor),
            _ => format!("<sip:{}@{local}>", from.unwrap_or("voxide")),
        };
        let dial = Dial {
            to: uri,
            from,
            local: Local::udp(local),
            offer: sdp::offer(host, rtp_port, u64::from(random_u32())),
            account: account.filter(|_| through_pbx).cloned(),
            ring_for,
            ids: (
                format!("out-{:08x}{:08x}@voxide", random_u32(), random_u32()),
                format!("{:08x}", random_u32()),
            ),
        };
        Ok((dial, peer, rtp))
    }

    /// The bot the call goes to: `X-Voxide-Bot`, else the called user if a bot has that name,
    /// else the default.
    fn bot(&self, invite: &SipMessage) -> Result<Option<String>, Refused> {
        if let Some(name) = invite.header(BOT_HEADER) {
            self.app
                .bots
                .find(name)
                .map_err(|e| Refused::new(404, "Not Found").saying(e.to_string()))?;
            return Ok(Some(name.to_owned()));
        }
        let user = match &invite.start {
            StartLine::Request { uri, .. } => uri
                .split_once(':')
                .map(|(_, rest)| rest.split(['@', ';']).next().unwrap_or_default())
                .unwrap_or_default(),
            StartLine::Response { .. } => "",
        };
        Ok((!user.is_empty() && self.app.bots.find(user).is_ok()).then(|| user.to_owned()))
    }

    /// A socket on the next free port of the range.
    async fn rtp_socket(&self) -> Option<UdpSocket> {
        let range = &self.options.rtp_ports;
        let count = u32::from(range.end() - range.start()) + 1;
        for _ in 0..count.min(1_000) {
            let n = self.next_port.fetch_add(1, Ordering::Relaxed) % count;
            let port = range.start() + n as u16;
            let addr = SocketAddr::new(self.listen.ip(), port);
            if let Ok(socket) = UdpSocket::bind(addr).await {
                return Some(socket);
            }
        }
        None
    }
}

/// The address this host sends from toward `peer` (what a socket bound to any address uses).
async fn route_to(peer: SocketAddr) -> IpAddr {
    let any: SocketAddr = if peer.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    match UdpSocket::bind(any).await {
        Ok(probe) if probe.connect(peer).await.is_ok() => {
            probe.local_addr().map_or(any.ip(), |a| a.ip())
        }
        _ => any.ip(),
    }
}

/// What goes to the caller's RTP: the bot's audio at the codec's rate, an interruption, or what
/// the bot asks of the line once its words before have played.
enum Out {
    Audio(Vec<i16>),
    Clear,
    Phone(PhoneAction),
}

/// The bot's audio at the codec's rate, to the call's RTP loop; past a bounded queue it is
/// dropped.
struct CallSink(mpsc::Sender<Out>, u32);

impl AudioSink for CallSink {
    fn write(&mut self, samples: &[i16], sample_rate: u32) {
        debug_assert_eq!(sample_rate, self.1);
        if let Err(mpsc::error::TrySendError::Full(_)) =
            self.0.try_send(Out::Audio(samples.to_vec()))
        {
            crate::warnings::audio_dropped("sip_out");
        }
    }

    fn clear(&mut self) {
        let _ = self.0.try_send(Out::Clear);
    }

    fn phone(&mut self, action: &PhoneAction) -> bool {
        let _ = self.0.try_send(Out::Phone(action.clone()));
        true
    }
}

/// A call's signalling: the way to the other side, its address, and the messages of this call
/// the SIP loop hands on, each with the way it came.
struct Line {
    wire: Wire,
    peer: SocketAddr,
    inbox: mpsc::Receiver<(SipMessage, Wire)>,
}

/// What a call placed needs once answered.
struct Pending {
    rtp: UdpSocket,
    /// Who may call, which is where the callee's audio may be.
    options: Arc<SipOptions>,
    info: SessionInfo,
    admission: Admission,
    time_limit: Option<Duration>,
}

/// The audio of a call, as the SDP settled it.
struct Media {
    rtp: UdpSocket,
    /// Where the other side takes audio (and sends it from).
    remote: SocketAddr,
    chosen: Chosen,
}

/// One answered call: its signalling, its RTP both ways, and its session.
async fn run_call(
    app: Arc<App>,
    line: Line,
    invite: SipMessage,
    answering: Answering,
    (call_id, ended): (String, mpsc::Sender<String>),
) {
    let Answering {
        offer,
        chosen,
        rtp,
        host,
        sip_port,
        info,
        admission,
    } = answering;
    let rtp_port = rtp.local_addr().map(|a| a.port()).unwrap_or_default();
    let answer = sdp::answer(host, rtp_port, chosen, u64::from(random_u32()));
    let local = Local {
        address: SocketAddr::new(host, sip_port).to_string(),
        transport: line.wire.transport(),
    };
    let (call, actions) = Call::answer(
        invite,
        answer,
        local,
        format!("{:08x}", random_u32()),
        Instant::now().into_std(),
    );
    send_all(&line.wire, &actions).await;
    let transport = line.wire.transport();
    tracing::info!(session = %info.id, peer = %line.peer, ?transport, codec = chosen.codec.name(), rtp_port, "a SIP call answered");
    let media = Media {
        rtp,
        remote: SocketAddr::new(offer.address, offer.port),
        chosen,
    };
    let ending = talk(&app, line, call, media, (&info, admission), None).await;
    tracing::info!(session = %info.id, ending = ?ending, "a SIP call ended");
    let _ = ended.send(call_id).await;
}

/// One call voxide placed: dialled until answered or not, then talked like any other.
async fn run_placed(
    app: Arc<App>,
    mut line: Line,
    mut dialer: Dialer,
    pending: Pending,
    (call_id, ended): (String, mpsc::Sender<String>),
) {
    let Pending {
        rtp,
        options,
        info,
        admission,
        time_limit,
    } = pending;
    let mut answered = None;
    while answered.is_none() && !dialer.over() {
        let deadline = dialer.deadline().map(Instant::from_std);
        let actions = tokio::select! {
            message = line.inbox.recv() => match message {
                Some((message, _)) => dialer.receive(&message, Instant::now().into_std()),
                None => break,
            },
            () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                dialer.poll(Instant::now().into_std())
            }
        };
        for action in actions {
            match action {
                Dialing::Send(bytes) => {
                    line.wire.send(&bytes).await;
                }
                Dialing::Ringing => app.outbound.note(&info.id, CallState::Ringing),
                Dialing::Answered(call, sdp) => answered = Some((call, sdp)),
                Dialing::Failed(failure) => {
                    tracing::info!(session = %info.id, %failure, "a SIP call placed was not answered");
                    app.outbound.note(
                        &info.id,
                        CallState::Failed {
                            reason: failure.to_string(),
                        },
                    );
                }
            }
        }
    }
    let Some((mut call, sdp)) = answered else {
        drop(admission);
        let _ = ended.send(call_id).await;
        return;
    };
    // The callee's answer says where its audio goes: to a network that may call only.
    let media = std::str::from_utf8(&sdp)
        .ok()
        .and_then(|text| Offer::parse(text).ok())
        .filter(|answer| answer.address == line.peer.ip() || allowed(&options, answer.address))
        .and_then(|answer| {
            let chosen = answer.choose()?;
            Some(Media {
                rtp,
                remote: SocketAddr::new(answer.address, answer.port),
                chosen,
            })
        });
    let Some(media) = media else {
        tracing::warn!(session = %info.id, "the callee's answer has no codec voxide speaks, or audio elsewhere: hanging up");
        let actions = call.hang_up(Instant::now().into_std());
        send_all(&line.wire, &actions).await;
        app.outbound.note(
            &info.id,
            CallState::Failed {
                reason: "488 the answer is unusable".into(),
            },
        );
        let _ = ended.send(call_id).await;
        return;
    };
    tracing::info!(session = %info.id, peer = %line.peer, codec = media.chosen.codec.name(), "a SIP call placed was answered");
    app.outbound.note(&info.id, CallState::Answered);
    let hang_up_at = time_limit.map(|limit| Instant::now() + limit);
    let ending = talk(&app, line, *call, media, (&info, admission), hang_up_at).await;
    let reason = match ending {
        Some(Ending::PeerHungUp) => "callee_hung_up",
        Some(Ending::HungUp) => "hung_up",
        Some(Ending::Transferred) => "transferred",
        Some(Ending::NoAck) | None => "lost",
    };
    tracing::info!(session = %info.id, reason, "a SIP call placed ended");
    app.outbound.note(
        &info.id,
        CallState::Ended {
            reason: reason.into(),
        },
    );
    let _ = ended.send(call_id).await;
}

/// An established call: its session built and run, RTP both ways, requests within the call
/// answered, and voxide's hang-up when the bot ends the session or at `hang_up_at`. How the
/// call ended comes back.
async fn talk(
    app: &Arc<App>,
    line: Line,
    mut call: Call,
    media: Media,
    (info, admission): (&SessionInfo, Admission),
    mut hang_up_at: Option<Instant>,
) -> Option<Ending> {
    let Line {
        mut wire,
        peer: _,
        mut inbox,
    } = line;
    let Media {
        rtp,
        remote: offered,
        chosen,
    } = media;
    // The call's audio both ways is at the codec's rate: 8 kHz, or 16 kHz on G.722 and Opus;
    // a packet is 20 ms, in ticks of the codec's RTP clock (48 kHz on Opus, else 8 kHz).
    let rate = chosen.codec.rate();
    let packet_samples = (rate / 50) as usize;
    let packet_ticks = chosen.codec.clock() / 50;
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(crate::audio::AUDIO_QUEUE);
    let sink: Box<dyn AudioSink> = Box::new(CallSink(out_tx, rate));
    let started = CallSession::start(app, info, "sip", (rate, sink), admission);
    let mut phone = match started {
        Ok(started) => started,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the bot; hanging up");
            let actions = call.hang_up(Instant::now().into_std());
            send_all(&wire, &actions).await;
            return None;
        }
    };

    // Symmetric RTP: audio goes where the other side's comes from, once it comes (from the
    // SDP's address only); until then, to the SDP's address.
    let mut remote = offered;
    let mut latched = false;
    let mut sender = Sender::new(chosen.payload_type, random_u32(), random_u32());
    let mut keys = Keys::default();
    // The caller's audio, in order and on its own timeline, what was lost concealed.
    let mut input = PhoneInput::new(chosen.codec);
    let mut encoder = PhoneEncoder::new(chosen.codec);
    let mut reported = NetworkStats::default();
    let mut pending: Vec<i16> = Vec::new();
    // Keys the bot presses, as packets ready to go, one on each tick of the timeline.
    let mut pressing: std::collections::VecDeque<Vec<u8>> = std::collections::VecDeque::new();
    let mut buffer = vec![0u8; 2_048];
    let mut ending = None;
    let mut session_over = false;
    // A caller whose phone sends nothing while it is quiet (silence suppression, a line on
    // hold, a lost stream) is heard as silence, so that its turn still ends.
    let mut heard_at = Instant::now();
    let mut timeline = tokio::time::interval(FRAME);
    timeline.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let deadline = call.deadline().map(Instant::from_std);
        let keypad = phone.input.keypad_deadline().map(Instant::from_std);
        let hole = input.deadline().map(Instant::from_std);
        tokio::select! {
            message = inbox.recv() => {
                let Some((message, came)) = message else { break };
                // On TCP the other side may come back on a new connection: its latest is the
                // way to it.
                if let Wire::Tcp(_) = came {
                    wire = came;
                }
                let actions = call.receive(&message, Instant::now().into_std());
                ending = ending.or(act(&wire, &actions, &mut phone.input, &phone.handle).await);
            }
            received = rtp.recv_from(&mut buffer) => {
                let Ok((n, from)) = received else { continue };
                // Only the other side's address is heard: RTP from elsewhere is dropped.
                if from.ip() != offered.ip() && !(latched && from == remote) {
                    continue;
                }
                if !latched {
                    (remote, latched) = (from, true);
                }
                let Ok(packet) = Packet::parse(&buffer[..n]) else { continue };
                if Some(packet.payload_type) == chosen.events {
                    if let Some(key) = keys.take(&packet) {
                        let _ = phone.input.press(&key.to_string(), &phone.handle).await;
                    }
                } else if packet.payload_type == chosen.payload_type {
                    heard_at = Instant::now();
                    input.push(packet.sequence, packet.timestamp, packet.payload, heard_at.into_std());
                    session_over |= play(&mut input, &phone.handle).await;
                }
            }
            () = tokio::time::sleep_until(hole.unwrap_or_else(Instant::now)), if hole.is_some() => {
                session_over |= play(&mut input, &phone.handle).await;
            }
            _ = timeline.tick() => {
                if let Some(packet) = pressing.pop_front() {
                    let _ = rtp.send_to(&packet, remote).await;
                }
                let network = input.stats();
                app.metrics.network(&network.since(&reported));
                reported = network;
                if heard_at.elapsed() >= RTP_TIMEOUT {
                    tracing::info!(session = %info.id, "no audio from the other side for a minute: hanging up");
                    session_over = true;
                } else if hole.is_none() && heard_at.elapsed() >= QUIET_AFTER {
                    let silence = AudioFrame::new(vec![0; packet_samples], rate, 1);
                    if phone.handle.queue_live_audio(silence).await.is_err() {
                        session_over = true;
                    }
                }
            }
            out = out_rx.recv() => match out {
                Some(Out::Audio(samples)) => {
                    pending.extend_from_slice(&samples);
                    let whole = pending.len() / packet_samples * packet_samples;
                    for frame in pending.drain(..whole).collect::<Vec<_>>().chunks(packet_samples) {
                        let payload = encoder.encode(frame);
                        let _ = rtp.send_to(&sender.packet(&payload, packet_ticks), remote).await;
                    }
                }
                Some(Out::Clear) => {
                    pending.clear();
                    sender.pause(0);
                }
                Some(Out::Phone(PhoneAction::SendKeys(keys))) => {
                    tracing::info!(session = %info.id, %keys, "pressing keys");
                    match chosen.events {
                        Some(events) => {
                            let clocks = (chosen.events_clock, chosen.codec.clock());
                            pressing.extend(sender.keys(events, clocks, &keys));
                        }
                        // No telephone-events on this call: the keypad's tones, in the audio.
                        None => {
                            let tones = crate::transports::dtmf::tones(&keys, rate);
                            pressing.extend(tones.chunks(packet_samples).map(|frame| {
                                let payload = encoder.encode(frame);
                                sender.packet(&payload, packet_ticks)
                            }));
                        }
                    }
                }
                Some(Out::Phone(PhoneAction::Transfer(to))) => {
                    tracing::info!(session = %info.id, %to, "transferring the call");
                    let actions = call.transfer(&to, Instant::now().into_std());
                    ending = ending.or(act(&wire, &actions, &mut phone.input, &phone.handle).await);
                }
                None => session_over = true,
            },
            event = phone.events.recv() => match event {
                Ok(event) => {
                    app.metrics.observe(&event.event);
                    match event.event {
                        Event::BotStoppedSpeaking => sender.pause(0),
                        Event::SessionEnded { .. } => session_over = true,
                        Event::CallAnswered { by, because } => {
                            app.outbound.note_answerer(&info.id, by, because);
                        }
                        _ => {}
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => session_over = true,
            },
            () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                let actions = call.poll(Instant::now().into_std());
                ending = ending.or(act(&wire, &actions, &mut phone.input, &phone.handle).await);
            }
            () = tokio::time::sleep_until(keypad.unwrap_or_else(Instant::now)), if keypad.is_some() => {
                let _ = phone.input.keypad_due(&phone.handle).await;
            }
            () = tokio::time::sleep_until(hang_up_at.unwrap_or_else(Instant::now)), if hang_up_at.is_some() => {
                tracing::info!(session = %info.id, "the call's time limit: hanging up");
                hang_up_at = None;
                session_over = true;
            }
        }
        if session_over && ending.is_none() && !call.over() {
            // The bot ended the call: hang up, and wait for the BYE's answer.
            let actions = call.hang_up(Instant::now().into_std());
            send_all(&wire, &actions).await;
            session_over = false;
        }
        if ending.is_some() || call.over() {
            break;
        }
    }
    let network = input.stats();
    app.metrics.network(&network.since(&reported));
    tracing::info!(
        session = %info.id,
        received = network.received,
        lost = network.lost,
        concealed = network.concealed,
        late = network.late,
        reordered = network.reordered,
        duplicated = network.duplicated,
        damaged = input.damaged(),
        jitter_ms = network.jitter * 1e3,
        "the caller's audio over the call"
    );
    phone.end().await;
    ending
}

/// Plays what the caller's audio has due now into the call's session; whether the session is
/// over.
async fn play(input: &mut PhoneInput, session: &crate::pipeline::SessionHandle) -> bool {
    while let Some(piece) = input.pop(std::time::Instant::now()) {
        let frame = AudioFrame::new(piece.samples, input.rate(), 1);
        if session.queue_live_audio(frame).await.is_err() {
            return true;
        }
    }
    false
}

/// Sends what dialing has to send.
async fn send_dialing(sip: &UdpSocket, peer: SocketAddr, actions: &[Dialing]) {
    for action in actions {
        if let Dialing::Send(bytes) = action {
            let _ = sip.send_to(bytes, peer).await;
        }
    }
}

async fn send_all(wire: &Wire, actions: &[Action]) {
    for action in actions {
        if let Action::Send(bytes) = action {
            wire.send(bytes).await;
        }
    }
}

/// Carries out a call's actions: messages sent, keys pressed; how it ended, if it did.
async fn act(
    wire: &Wire,
    actions: &[Action],
    input: &mut RtviInput,
    handle: &crate::pipeline::SessionHandle,
) -> Option<Ending> {
    send_all(wire, actions).await;
    let mut ending = None;
    for action in actions {
        match action {
            Action::Key(key) => {
                let _ = input.press(&key.to_string(), handle).await;
            }
            Action::Ended(why) => ending = Some(*why),
            Action::Transferred(Ok(())) => tracing::info!("the call was handed over"),
            Action::Transferred(Err(why)) => super::phone::transfer_failed(handle, why).await,
            Action::Send(_) => {}
        }
    }
    ending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_hold_their_addresses_and_no_others() {
        let lan: Network = "10.1.0.0/16".parse().expect("network");
        assert!(lan.contains("10.1.200.3".parse().expect("ip")));
        assert!(!lan.contains("10.2.0.1".parse().expect("ip")));
        let host: Network = "192.0.2.7".parse().expect("host");
        assert!(host.contains("192.0.2.7".parse().expect("ip")));
        assert!(!host.contains("192.0.2.8".parse().expect("ip")));
        let any: Network = "0.0.0.0/0".parse().expect("any");
        assert!(any.contains("203.0.113.9".parse().expect("ip")));
        assert!(
            Network::loopback()
                .iter()
                .any(|n| n.contains("::ffff:127.0.0.1".parse().expect("mapped")))
        );
        assert!(
            Network::loopback()
                .iter()
                .any(|n| n.contains("::1".parse().expect("v6")))
        );
        for bad in ["10.0.0.0/33", "nope", "::/129", "10.0.0.0/x"] {
            assert!(bad.parse::<Network>().is_err(), "{bad}");
        }
    }
}
