//! A caller over SIP, as a phone on a SIP trunk is: an INVITE from its own UDP port offering
//! one codec (PCMU, G.722 for a wideband phone, or Opus) and telephone-events, the caller's audio as
//! RTP every 20 ms to the address the answer names, the bot's RTP heard, and a BYE. It works
//! against any SIP endpoint that answers with that codec.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::impair::Fate;
use crate::audio::g722::G722Decoder;
use crate::audio::mulaw;
use crate::ids::random_u32;
use crate::transports::sip::message::{SipMessage, StartLine};
use crate::transports::sip::rtp::{Packet, Sender};
use crate::transports::sip::sdp::{Codec, Offer};

/// How long the INVITE waits for a final answer, resent on RFC 3261's schedule meanwhile.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a BYE waits for its answer.
const BYE_TIMEOUT: Duration = Duration::from_secs(2);
/// telephone-event's payload type as the offer names it.
const EVENTS: u8 = 101;

/// A SIP target: `sip:[user@]host[:port]`.
pub(super) fn target(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("sip:")
        .ok_or_else(|| format!("--target {url:?}: write sip:[user@]host[:port]"))?;
    let (user, host) = match rest.split_once('@') {
        Some((user, host)) => (user.to_owned(), host),
        None => ("agent".to_owned(), rest),
    };
    if host.is_empty() {
        return Err(format!("--target {url:?}: no host"));
    }
    let host = if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host.to_owned()
    } else {
        format!("{host}:5060")
    };
    Ok((user, host))
}

/// One call, answered.
pub(super) struct SipCall {
    sip: Arc<UdpSocket>,
    rtp: Arc<UdpSocket>,
    remote_rtp: SocketAddr,
    sender: Sender,
    /// A packet's 20 ms in ticks of the codec's RTP clock.
    ticks: u32,
    /// The dialog as the BYE needs it: From (with our tag), To (with theirs), Call-ID, the
    /// target, and our address.
    dialog: Dialog,
    readers: [tokio::task::JoinHandle<()>; 2],
}

struct Dialog {
    from: String,
    to: String,
    call_id: String,
    uri: String,
    local: SocketAddr,
}

impl Dialog {
    fn request(&self, method: &str, cseq: u32, branch: u32) -> SipMessage {
        SipMessage {
            start: StartLine::Request {
                method: method.into(),
                uri: self.uri.clone(),
            },
            headers: Vec::new(),
            body: Vec::new(),
        }
        .with(
            "Via",
            format!(
                "SIP/2.0/UDP {};branch=z9hG4bK{branch:08x};rport",
                self.local
            ),
        )
        .with("Max-Forwards", "70")
        .with("From", self.from.clone())
        .with("To", self.to.clone())
        .with("Call-ID", self.call_id.clone())
        .with("CSeq", format!("{cseq} {method}"))
    }
}

/// Where the bot's audio (at the codec's rate) goes, each packet as it comes.
pub(super) type Listener = Box<dyn FnMut(&[i16]) + Send>;

/// What a call tells whoever placed it.
pub(super) struct Hooks {
    /// The bot's audio.
    pub(super) audio: Listener,
    /// The server hung up (its BYE).
    pub(super) hung_up: Box<dyn FnOnce() + Send>,
}

impl SipCall {
    /// Places call number `index` to `url` in `codec` (PCMU or G.722), carrying `traceparent`;
    /// the error is its kind (`sip_503`, `sip_timeout`, …).
    pub(super) async fn connect(
        url: &str,
        index: usize,
        (codec, traceparent): (Codec, String),
        hooks: Hooks,
    ) -> Result<Self, String> {
        let pt = codec.payload_type();
        let (name, rtpmap) = (codec.name(), codec.rtpmap());
        let (user, host) = target(url)?;
        let server = tokio::net::lookup_host(&host)
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| "sip_unresolved".to_owned())?;
        let any: SocketAddr = if server.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            ([0u16; 8], 0).into()
        };
        let sip = UdpSocket::bind(any)
            .await
            .map_err(|_| "sip_bind".to_owned())?;
        sip.connect(server)
            .await
            .map_err(|_| "sip_unreachable".to_owned())?;
        let local = sip.local_addr().map_err(|_| "sip_bind".to_owned())?;
        let rtp = UdpSocket::bind(SocketAddr::new(local.ip(), 0))
            .await
            .map_err(|_| "rtp_bind".to_owned())?;
        let rtp_port = rtp.local_addr().map_err(|_| "rtp_bind".to_owned())?.port();
        let family = if local.is_ipv4() { "IP4" } else { "IP6" };
        let offer = format!(
            "v=0\r\no=loadtest {index} 1 IN {family} {ip}\r\ns=voxide loadtest\r\nc=IN {family} {ip}\r\n\
             t=0 0\r\nm=audio {rtp_port} RTP/AVP {pt} {EVENTS}\r\na=rtpmap:{pt} {rtpmap}\r\n\
             a=rtpmap:{EVENTS} telephone-event/8000\r\na=fmtp:{EVENTS} 0-15\r\na=ptime:20\r\na=sendrecv\r\n",
            ip = local.ip()
        );
        let mut dialog = Dialog {
            from: format!("<sip:loadtest@{local}>;tag=lt{:08x}", random_u32()),
            to: format!("<sip:{user}@{host}>"),
            call_id: format!(
                "{:08x}{:08x}-{index}@voxide-loadtest",
                random_u32(),
                random_u32()
            ),
            uri: format!("sip:{user}@{host}"),
            local,
        };
        let branch = random_u32();
        let invite = dialog
            .request("INVITE", 1, branch)
            .with("Contact", format!("<sip:loadtest@{local}>"))
            .with("traceparent", traceparent)
            .with_body("application/sdp", offer.into_bytes())
            .render();
        let answer = invite_and_wait(&sip, &invite).await?;
        if let Some(tag) = answer.param("To", "tag") {
            dialog.to = format!("{};tag={tag}", dialog.to);
        }
        let ack = dialog.request("ACK", 1, branch).render();
        let _ = sip.send(&ack).await;
        let answer = std::str::from_utf8(&answer.body)
            .ok()
            .and_then(|sdp| Offer::parse(sdp).ok())
            .ok_or_else(|| "sip_no_answer_sdp".to_owned())?;
        if !answer.formats.contains(&pt) {
            return Err(format!("sip_no_{}", name.to_ascii_lowercase()));
        }
        let remote_rtp = SocketAddr::new(answer.address, answer.port);
        let (sip, rtp) = (Arc::new(sip), Arc::new(rtp));
        let listening = tokio::spawn(hear(rtp.clone(), codec, hooks.audio));
        let answering = tokio::spawn(answer_requests(sip.clone(), hooks.hung_up));
        Ok(Self {
            sip,
            rtp,
            remote_rtp,
            sender: Sender::new(pt, random_u32(), random_u32()),
            ticks: codec.clock() / 50,
            dialog,
            readers: [listening, answering],
        })
    }

    /// Sends frame number `n` (20 ms of its codec's bytes) as `fate` has
    /// it.
    pub(super) async fn send(&mut self, frame: &[u8], _n: usize, fate: Fate) -> Result<(), ()> {
        // The clock and the sequence move on for a lost packet too, as a sender's do.
        let packet = self.sender.packet(frame, self.ticks);
        let Fate::Sent { delay, copy } = fate else {
            return Ok(());
        };
        for after in std::iter::once(delay).chain(copy) {
            if after.is_zero() {
                self.rtp
                    .send_to(&packet, self.remote_rtp)
                    .await
                    .map_err(|_| ())?;
            } else {
                let (rtp, packet, to) = (self.rtp.clone(), packet.clone(), self.remote_rtp);
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = rtp.send_to(&packet, to).await;
                });
            }
        }
        Ok(())
    }

    /// Hangs up: a BYE, answered or not within [`BYE_TIMEOUT`].
    pub(super) async fn close(self) {
        self.readers[1].abort();
        let bye = self.dialog.request("BYE", 2, random_u32()).render();
        let mut buffer = vec![0u8; 65_535];
        let deadline = Instant::now() + BYE_TIMEOUT;
        let mut resend = Instant::now();
        loop {
            if Instant::now() >= resend {
                let _ = self.sip.send(&bye).await;
                resend = Instant::now() + Duration::from_millis(500);
            }
            let wait = resend.min(deadline);
            match tokio::time::timeout_at(wait, self.sip.recv(&mut buffer)).await {
                Ok(Ok(n)) => {
                    let answered = SipMessage::parse(&buffer[..n]).is_ok_and(|m| {
                        matches!(m.start, StartLine::Response { status, .. } if status >= 200)
                            && m.cseq().is_some_and(|(_, method)| method == "BYE")
                    });
                    if answered {
                        break;
                    }
                }
                _ if Instant::now() >= deadline => break,
                _ => {}
            }
        }
        self.readers[0].abort();
    }
}

/// Sends the INVITE until a final answer comes: the 200 OK, or the status as an error.
async fn invite_and_wait(sip: &UdpSocket, invite: &[u8]) -> Result<SipMessage, String> {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut interval = Duration::from_millis(500);
    let mut resend = Instant::now();
    let mut provisional = false;
    let mut buffer = vec![0u8; 65_535];
    loop {
        if !provisional && Instant::now() >= resend {
            sip.send(invite)
                .await
                .map_err(|_| "sip_unreachable".to_owned())?;
            resend = Instant::now() + interval;
            interval = (interval * 2).min(Duration::from_secs(4));
        }
        let wait = if provisional {
            deadline
        } else {
            resend.min(deadline)
        };
        match tokio::time::timeout_at(wait, sip.recv(&mut buffer)).await {
            Ok(Ok(n)) => {
                let Ok(message) = SipMessage::parse(&buffer[..n]) else {
                    continue;
                };
                let status = match &message.start {
                    StartLine::Response { status, .. } => *status,
                    StartLine::Request { .. } => continue,
                };
                match status {
                    100..=199 => provisional = true,
                    200..=299 => return Ok(message),
                    other => return Err(format!("sip_{other}")),
                }
            }
            Ok(Err(_)) => return Err("sip_unreachable".to_owned()),
            Err(_) if Instant::now() >= deadline => return Err("sip_timeout".to_owned()),
            Err(_) => {}
        }
    }
}

/// The bot's RTP in `codec`, decoded and handed on.
async fn hear(rtp: Arc<UdpSocket>, codec: Codec, mut audio: Listener) {
    let mut buffer = vec![0u8; 2_048];
    let mut wideband = G722Decoder::new();
    let mut opus = opus::Decoder::new(codec.rate(), opus::Channels::Mono).ok();
    let mut pcm = vec![0i16; 5_760];
    while let Ok(n) = rtp.recv(&mut buffer).await {
        let Ok(packet) = Packet::parse(&buffer[..n]) else {
            continue;
        };
        if packet.payload_type != codec.payload_type() {
            continue;
        }
        let samples: Vec<i16> = match codec {
            Codec::G722 => wideband.decode(packet.payload),
            Codec::Opus => match opus
                .as_mut()
                .map(|d| d.decode(packet.payload, &mut pcm, false))
            {
                Some(Ok(n)) => pcm[..n].to_vec(),
                _ => continue,
            },
            _ => packet.payload.iter().map(|b| mulaw::decode(*b)).collect(),
        };
        audio(&samples);
    }
}

/// Requests from the server within the call: a BYE ends it (answered 200), others get 200.
async fn answer_requests(sip: Arc<UdpSocket>, hung_up: Box<dyn FnOnce() + Send>) {
    let mut buffer = vec![0u8; 65_535];
    while let Ok(n) = sip.recv(&mut buffer).await {
        let Ok(message) = SipMessage::parse(&buffer[..n]) else {
            continue;
        };
        let Some(method) = message.method() else {
            continue;
        };
        let _ = sip.send(&message.response(200, "OK", None).render()).await;
        if method == "BYE" {
            hung_up();
            return;
        }
    }
}
