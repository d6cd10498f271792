//! One answered call's signalling, sans-IO (RFC 3261 §13.3, §15, §17.2.1): the 200 OK resent
//! until the caller's ACK, requests within the call answered, keys sent by SIP INFO heard, and
//! the hang-up either way. Messages and time go in; what to send and what happened come out.

use std::time::{Duration, Instant};

use super::message::{SipMessage, StartLine};

/// RFC 3261's T1 (a round trip's estimate) and T2 (the longest interval between resends).
const T1: Duration = Duration::from_millis(500);
const T2: Duration = Duration::from_secs(4);
/// How long a 200 OK waits for its ACK, and a BYE for its answer: 64 × T1.
const GIVE_UP: Duration = Duration::from_secs(32);

/// What the call does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send these bytes to the caller's signalling address.
    Send(Vec<u8>),
    /// The caller pressed a key (SIP INFO).
    Key(char),
    /// How a transfer went: handed over (voxide's BYE follows), or why not (the call goes on).
    Transferred(Result<(), String>),
    /// The call is over.
    Ended(Ending),
}

/// Why a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The other side hung up (its BYE).
    PeerHungUp,
    /// voxide hung up, and the caller answered the BYE (or never did).
    HungUp,
    /// The caller never acknowledged the answer.
    NoAck,
    /// The call was handed over to another party, and voxide left it.
    Transferred,
}

/// A resend schedule: the next time, the interval, and when to give up.
#[derive(Debug, Clone, Copy)]
struct Resend {
    at: Instant,
    interval: Duration,
    give_up: Instant,
}

impl Resend {
    fn new(now: Instant) -> Self {
        Self {
            at: now + T1,
            interval: T1,
            give_up: now + GIVE_UP,
        }
    }

    fn next(&mut self) {
        self.interval = (self.interval * 2).min(T2);
        self.at += self.interval;
    }
}

/// Where the call stands.
#[derive(Debug)]
enum Phase {
    /// Answered; the 200 OK is resent until the ACK.
    Answered(Resend),
    /// Acknowledged: the call is up.
    Up,
    /// The call is up and being handed over (RFC 3515).
    Transferring(Referring),
    /// voxide hung up; its BYE is resent until answered.
    Leaving {
        bye: Vec<u8>,
        resend: Resend,
        why: Ending,
    },
    Over,
}

/// A transfer under way.
#[derive(Debug)]
enum Referring {
    /// The REFER is resent until the other side answers it.
    Asking {
        refer: Vec<u8>,
        cseq: u32,
        resend: Resend,
    },
    /// Accepted: the other side calls the new party, and its NOTIFYs tell how that goes.
    Accepted { give_up: Instant },
}

/// How long an accepted transfer may take to say how it went.
const TRANSFER_GIVE_UP: Duration = Duration::from_secs(120);

/// Which side placed the call, and what it sends again when the other side repeats itself.
#[derive(Debug)]
enum Side {
    /// voxide answered: the caller's INVITE (by its CSeq) gets the 200 OK again.
    Answered { invite: u32, ok: Vec<u8> },
    /// voxide placed the call: the callee's 200 OK, sent again, gets the ACK again.
    Placed { ack: Vec<u8> },
}

/// The transport a call's signalling travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Datagrams, each message in one.
    Udp,
    /// A connection the other side opened, messages framed by their Content-Length.
    Tcp,
}

/// Where voxide's signalling is reached in a call: `host:port` on a transport, as its Contact
/// and Via say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// `host:port`.
    pub address: String,
    /// The transport.
    pub transport: Transport,
}

impl Local {
    /// `address` on UDP.
    pub fn udp(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            transport: Transport::Udp,
        }
    }

    /// `address` on TCP.
    pub fn tcp(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            transport: Transport::Tcp,
        }
    }

    /// voxide's Contact: `<sip:voxide@host:port>`, with `;transport=tcp` on TCP so that the
    /// other side's requests within the call come the same way (RFC 3261 §19.1.1).
    pub(super) fn contact(&self) -> String {
        match self.transport {
            Transport::Udp => format!("<sip:voxide@{}>", self.address),
            Transport::Tcp => format!("<sip:voxide@{};transport=tcp>", self.address),
        }
    }

    /// A Via for a request voxide sends, on a fresh branch.
    pub(super) fn via(&self) -> String {
        let transport = match self.transport {
            Transport::Udp => "UDP",
            Transport::Tcp => "TCP",
        };
        format!(
            "SIP/2.0/{transport} {};branch=z9hG4bK{:08x}{:08x};rport",
            self.address,
            crate::ids::random_u32(),
            crate::ids::random_u32()
        )
    }
}

/// A dialog as voxide's requests within it need it (RFC 3261 §12), whichever side placed
/// the call.
#[derive(Debug, Clone)]
pub struct Dialog {
    /// Where voxide's signalling is reached (its Contact and Via).
    pub(super) local: Local,
    pub(super) call_id: String,
    /// voxide's party, with its tag: From in voxide's requests.
    pub(super) us: String,
    /// The other party, with its tag: To in voxide's requests.
    pub(super) them: String,
    /// Where voxide's requests go: the other side's Contact.
    pub(super) target: String,
    /// The route set, in the order voxide's requests carry it.
    pub(super) route: Vec<String>,
    /// voxide's last CSeq number.
    pub(super) cseq: u32,
}

impl Dialog {
    /// The callee's dialog, from the INVITE it answers with tag `tag` (§12.1.1).
    fn answering(invite: &SipMessage, local: Local, tag: &str) -> Self {
        let to = invite.header("To").unwrap_or_default();
        let us = if invite.param("To", "tag").is_some() {
            to.to_owned()
        } else {
            format!("{to};tag={tag}")
        };
        Self {
            local,
            call_id: invite.call_id().unwrap_or_default().to_owned(),
            us,
            them: invite.header("From").unwrap_or_default().to_owned(),
            target: contact_of(invite),
            route: invite.all("Record-Route").map(str::to_owned).collect(),
            cseq: 0,
        }
    }

    /// The caller's dialog, from its INVITE and the callee's 2xx to it (§12.1.2): the route
    /// the 2xx recorded is taken in reverse.
    pub(super) fn placed(invite: &SipMessage, ok: &SipMessage, local: Local) -> Self {
        let mut route: Vec<String> = ok.all("Record-Route").map(str::to_owned).collect();
        route.reverse();
        Self {
            local,
            call_id: invite.call_id().unwrap_or_default().to_owned(),
            us: invite.header("From").unwrap_or_default().to_owned(),
            them: ok.header("To").unwrap_or_default().to_owned(),
            target: contact_of(ok),
            route,
            cseq: invite.cseq().map_or(1, |(n, _)| n),
        }
    }

    /// A request within the dialog with CSeq number `cseq`, on a new branch.
    pub(super) fn request(&self, method: &str, cseq: u32) -> SipMessage {
        let mut request = SipMessage {
            start: StartLine::Request {
                method: method.into(),
                uri: self.target.clone(),
            },
            headers: Vec::new(),
            body: Vec::new(),
        }
        .with("Via", self.local.via())
        .with("Max-Forwards", "70");
        for route in &self.route {
            request = request.with("Route", route.clone());
        }
        request
            .with("From", self.us.clone())
            .with("To", self.them.clone())
            .with("Call-ID", self.call_id.clone())
            .with("CSeq", format!("{cseq} {method}"))
    }

    /// voxide's next request within the dialog.
    fn next(&mut self, method: &str) -> SipMessage {
        self.cseq += 1;
        self.request(method, self.cseq)
    }
}

/// The URI a message's Contact names (its From when it has none).
fn contact_of(message: &SipMessage) -> String {
    message
        .header("Contact")
        .or_else(|| message.header("From"))
        .map(uri_of)
        .unwrap_or_default()
        .to_owned()
}

/// voxide's side of one call.
#[derive(Debug)]
pub struct Call {
    dialog: Dialog,
    /// voxide's session description: its answer, or its offer on a call it placed. A
    /// re-INVITE gets it back.
    sdp: Vec<u8>,
    side: Side,
    phase: Phase,
}

/// What voxide's Allow header lists.
pub(super) const ALLOW: &str = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, NOTIFY";

impl Call {
    /// Answers `invite` with the SDP `answer`, as `local` with dialog tag
    /// `local_tag`: the 200 OK to send comes back.
    pub fn answer(
        invite: SipMessage,
        answer: String,
        local: Local,
        local_tag: String,
        now: Instant,
    ) -> (Self, Vec<Action>) {
        let sdp = answer.into_bytes();
        let ok = Self::ok_to(&invite, &local, &local_tag, &sdp);
        let call = Self {
            dialog: Dialog::answering(&invite, local, &local_tag),
            sdp,
            side: Side::Answered {
                invite: invite.cseq().map_or(0, |(n, _)| n),
                ok: ok.clone(),
            },
            phase: Phase::Answered(Resend::new(now)),
        };
        (call, vec![Action::Send(ok)])
    }

    /// A call voxide placed, up once its `ack` to the callee's 2xx is sent.
    pub(super) fn placed(dialog: Dialog, offer: Vec<u8>, ack: Vec<u8>) -> Self {
        Self {
            dialog,
            sdp: offer,
            side: Side::Placed { ack },
            phase: Phase::Up,
        }
    }

    fn ok_to(request: &SipMessage, local: &Local, tag: &str, sdp: &[u8]) -> Vec<u8> {
        request
            .response(200, "OK", Some(tag))
            .with("Contact", local.contact())
            .with("Allow", ALLOW)
            .with("Server", "voxide")
            .with_body("application/sdp", sdp.to_vec())
            .render()
    }

    /// voxide's own tag in the dialog, which its answers carry.
    fn tag(&self) -> &str {
        self.dialog
            .us
            .rsplit_once(";tag=")
            .map_or("", |(_, t)| t.split(';').next().unwrap_or(t))
    }

    /// Whether the call is over.
    pub fn over(&self) -> bool {
        matches!(self.phase, Phase::Over)
    }

    /// When [`Call::poll`] has something to do.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Answered(resend)
            | Phase::Leaving { resend, .. }
            | Phase::Transferring(Referring::Asking { resend, .. }) => {
                Some(resend.at.min(resend.give_up))
            }
            Phase::Transferring(Referring::Accepted { give_up }) => Some(*give_up),
            Phase::Up | Phase::Over => None,
        }
    }

    /// Resends what waits for an answer, or gives up on it.
    pub fn poll(&mut self, now: Instant) -> Vec<Action> {
        match &mut self.phase {
            Phase::Answered(resend) if now >= resend.give_up => {
                // No ACK: the caller is gone or never heard us; hang up as RFC 3261 §13.3.1.4 asks.
                let mut actions = self.hang_up(now);
                actions.push(Action::Ended(Ending::NoAck));
                self.phase = Phase::Over;
                actions
            }
            Phase::Answered(resend) if now >= resend.at => {
                resend.next();
                match &self.side {
                    Side::Answered { ok, .. } => vec![Action::Send(ok.clone())],
                    Side::Placed { .. } => Vec::new(),
                }
            }
            Phase::Leaving { resend, why, .. } if now >= resend.give_up => {
                let why = *why;
                self.phase = Phase::Over;
                vec![Action::Ended(why)]
            }
            Phase::Leaving { bye, resend, .. } if now >= resend.at => {
                resend.next();
                vec![Action::Send(bye.clone())]
            }
            Phase::Transferring(Referring::Asking { resend, .. }) if now >= resend.give_up => {
                self.transfer_failed("the other side did not answer the REFER".into())
            }
            Phase::Transferring(Referring::Asking { refer, resend, .. }) if now >= resend.at => {
                resend.next();
                vec![Action::Send(refer.clone())]
            }
            Phase::Transferring(Referring::Accepted { give_up }) if now >= *give_up => {
                self.transfer_failed("the transfer never said how it went".into())
            }
            _ => Vec::new(),
        }
    }

    /// A message of this call from the other side, at `now`.
    pub fn receive(&mut self, message: &SipMessage, now: Instant) -> Vec<Action> {
        let method = match &message.start {
            StartLine::Response { status, .. } => {
                let cseq = message.cseq();
                // The answer to voxide's BYE ends the call.
                if let Phase::Leaving { why, .. } = self.phase
                    && *status >= 200
                    && cseq.is_some_and(|(_, m)| m == "BYE")
                {
                    self.phase = Phase::Over;
                    return vec![Action::Ended(why)];
                }
                // The answer to voxide's REFER: accepted, or the call goes on.
                if let Phase::Transferring(Referring::Asking { cseq: asked, .. }) = self.phase
                    && *status >= 200
                    && cseq == Some((asked, "REFER"))
                {
                    if *status < 300 {
                        self.phase = Phase::Transferring(Referring::Accepted {
                            give_up: now + TRANSFER_GIVE_UP,
                        });
                        return Vec::new();
                    }
                    let reason = match &message.start {
                        StartLine::Response { reason, .. } => reason.as_str(),
                        StartLine::Request { .. } => "",
                    };
                    return self.transfer_failed(format!("{status} {reason}"));
                }
                // The callee's 200 OK again: the ACK was lost (§13.2.2.4).
                if let Side::Placed { ack } = &self.side
                    && (200..300).contains(status)
                    && cseq.is_some_and(|(_, m)| m == "INVITE")
                {
                    return vec![Action::Send(ack.clone())];
                }
                return Vec::new();
            }
            StartLine::Request { method, .. } => method.as_str(),
        };
        let tag = self.tag().to_owned();
        let reply = |status: u16, reason: &str| {
            Action::Send(message.response(status, reason, Some(&tag)).render())
        };
        match method {
            "ACK" => {
                if matches!(self.phase, Phase::Answered(_)) {
                    self.phase = Phase::Up;
                }
                Vec::new()
            }
            "INVITE" => match &self.side {
                // The INVITE again: our 200 OK was lost.
                Side::Answered { invite, ok }
                    if message.cseq().map(|(n, _)| n) == Some(*invite) =>
                {
                    vec![Action::Send(ok.clone())]
                }
                // A re-INVITE (a session refresh, a hold): the same audio goes on.
                _ => vec![Action::Send(Self::ok_to(
                    message,
                    &self.dialog.local,
                    &tag,
                    &self.sdp,
                ))],
            },
            "BYE" => {
                let was_over = self.over();
                self.phase = Phase::Over;
                let mut actions = vec![reply(200, "OK")];
                if !was_over {
                    actions.push(Action::Ended(Ending::PeerHungUp));
                }
                actions
            }
            // Too late to cancel an answered call (RFC 3261 §9.2): the CANCEL itself succeeds.
            "CANCEL" | "OPTIONS" => vec![reply(200, "OK")],
            "INFO" => {
                let mut actions = vec![reply(200, "OK")];
                actions.extend(info_key(message).map(Action::Key));
                actions
            }
            // How the transfer goes (RFC 3515 §2.4.5): the new call's status line as a sipfrag.
            "NOTIFY" => {
                let mut actions = vec![reply(200, "OK")];
                if matches!(self.phase, Phase::Transferring(_))
                    && let Some((status, reason)) = sipfrag_status(&message.body)
                {
                    if (200..300).contains(&status) {
                        actions.push(Action::Transferred(Ok(())));
                        actions.extend(self.leave(now, Ending::Transferred));
                    } else if status >= 300 {
                        actions.extend(self.transfer_failed(format!("{status} {reason}")));
                    }
                }
                actions
            }
            _ => vec![Action::Send(
                message
                    .response(501, "Not Implemented", Some(&tag))
                    .with("Allow", ALLOW)
                    .render(),
            )],
        }
    }

    /// voxide hangs up: its BYE (resent until answered). Nothing once the call is over.
    pub fn hang_up(&mut self, now: Instant) -> Vec<Action> {
        self.leave(now, Ending::HungUp)
    }

    fn leave(&mut self, now: Instant, why: Ending) -> Vec<Action> {
        if matches!(self.phase, Phase::Over | Phase::Leaving { .. }) {
            return Vec::new();
        }
        // A BYE within the dialog (§12.2.1.1): to the other side's Contact, on the route it
        // recorded.
        let bye = self.dialog.next("BYE").render();
        self.phase = Phase::Leaving {
            bye: bye.clone(),
            resend: Resend::new(now),
            why,
        };
        vec![Action::Send(bye)]
    }

    /// Hands the call to `to` (a `sip:` URI, or a number for the other side to route): a
    /// REFER within the dialog (RFC 3515), a blind transfer. Once the new call is up voxide
    /// leaves this one; if it fails, the call goes on. Only while the call is up.
    pub fn transfer(&mut self, to: &str, now: Instant) -> Vec<Action> {
        if !matches!(self.phase, Phase::Up) {
            return vec![Action::Transferred(Err(
                "the call is not up, or a transfer is under way".into(),
            ))];
        }
        let target = if to.starts_with("sip:") {
            to.to_owned()
        } else {
            // A number: the party that carries the call routes it.
            let host = self.dialog.target.split_once('@').map_or("", |(_, h)| h);
            let host = host.split(';').next().unwrap_or(host);
            format!("sip:{to}@{host}")
        };
        let local = self.dialog.local.contact();
        let refer = self
            .dialog
            .next("REFER")
            .with("Refer-To", format!("<{target}>"))
            .with("Referred-By", local.clone())
            .with("Contact", local)
            .render();
        self.phase = Phase::Transferring(Referring::Asking {
            refer: refer.clone(),
            cseq: self.dialog.cseq,
            resend: Resend::new(now),
        });
        vec![Action::Send(refer)]
    }

    /// A transfer that did not happen: the call goes on.
    fn transfer_failed(&mut self, why: String) -> Vec<Action> {
        self.phase = Phase::Up;
        vec![Action::Transferred(Err(why))]
    }
}

/// The URI of a name-addr (`"Name" <sip:a@b>;tag=x` → `sip:a@b`) or an addr-spec.
pub fn uri_of(value: &str) -> &str {
    match (value.find('<'), value.find('>')) {
        (Some(open), Some(close)) if open < close => &value[open + 1..close],
        _ => value.split(';').next().unwrap_or(value).trim(),
    }
}

/// The status of a `message/sipfrag` body's status line (`SIP/2.0 200 OK`).
fn sipfrag_status(body: &[u8]) -> Option<(u16, String)> {
    let line = std::str::from_utf8(body).ok()?.lines().next()?;
    let mut parts = line.trim().splitn(3, ' ');
    if parts.next()? != "SIP/2.0" {
        return None;
    }
    let status = parts.next()?.parse().ok()?;
    Some((status, parts.next().unwrap_or_default().to_owned()))
}

/// A key in a SIP INFO body: `application/dtmf-relay` (`Signal=5`) or `application/dtmf` (`5`).
fn info_key(message: &SipMessage) -> Option<char> {
    let kind = message.header("Content-Type")?.to_ascii_lowercase();
    let body = std::str::from_utf8(&message.body).ok()?;
    let signal = if kind.starts_with("application/dtmf-relay") {
        body.lines().find_map(|line| {
            let (key, value) = line.split_once('=')?;
            key.trim()
                .eq_ignore_ascii_case("signal")
                .then(|| value.trim())
        })?
    } else if kind.starts_with("application/dtmf") {
        body.trim()
    } else {
        return None;
    };
    let mut chars = signal.chars();
    match (chars.next(), chars.next()) {
        (Some(key), None) if crate::transports::dtmf::is_key(key) => Some(key),
        _ => match signal {
            "10" => Some('*'),
            "11" => Some('#'),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invite() -> SipMessage {
        SipMessage::parse(
            b"INVITE sip:agent@127.0.0.1:5080 SIP/2.0\r\n\
            Via: SIP/2.0/UDP 127.0.0.1:5091;branch=z9hG4bK-1\r\n\
            From: sipp <sip:sipp@127.0.0.1:5091>;tag=caller\r\n\
            To: agent <sip:agent@127.0.0.1:5080>\r\n\
            Call-ID: 1-42@127.0.0.1\r\nCSeq: 1 INVITE\r\n\
            Contact: <sip:sipp@127.0.0.1:5091>\r\nContent-Length: 0\r\n\r\n",
        )
        .expect("INVITE")
    }

    fn request(method: &str, cseq: u32, extra: &str, body: &str) -> SipMessage {
        let text = format!(
            "{method} sip:voxide@127.0.0.1:5080 SIP/2.0\r\n\
            Via: SIP/2.0/UDP 127.0.0.1:5091;branch=z9hG4bK-{cseq}{method}\r\n\
            From: sipp <sip:sipp@127.0.0.1:5091>;tag=caller\r\n\
            To: agent <sip:agent@127.0.0.1:5080>;tag=vx\r\n\
            Call-ID: 1-42@127.0.0.1\r\nCSeq: {cseq} {method}\r\n{extra}\
            Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        SipMessage::parse(text.as_bytes()).expect("request")
    }

    fn sent(actions: &[Action]) -> Vec<SipMessage> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send(bytes) => Some(SipMessage::parse(bytes).expect("sent SIP")),
                _ => None,
            })
            .collect()
    }

    fn status(message: &SipMessage) -> u16 {
        match message.start {
            StartLine::Response { status, .. } => status,
            StartLine::Request { .. } => 0,
        }
    }

    fn answered(now: Instant) -> (Call, Vec<Action>) {
        Call::answer(
            invite(),
            "v=0\r\n".into(),
            Local::udp("127.0.0.1:5080"),
            "vx".into(),
            now,
        )
    }

    #[test]
    fn the_answer_is_resent_ever_more_slowly_until_the_ack() {
        let t0 = Instant::now();
        let (mut call, actions) = answered(t0);
        let ok = &sent(&actions)[0];
        assert_eq!(status(ok), 200);
        assert_eq!(ok.param("To", "tag"), Some("vx"));
        assert_eq!(ok.header("Content-Type"), Some("application/sdp"));
        assert_eq!(ok.body, b"v=0\r\n");
        // Resent at 0.5 s, then 1.5 s (1 s later), then 3.5 s.
        let mut resent = Vec::new();
        for ms in (0..4_000).step_by(100) {
            let now = t0 + Duration::from_millis(ms);
            if !call.poll(now).is_empty() {
                resent.push(ms);
            }
        }
        assert_eq!(resent, [500, 1_500, 3_500]);
        call.receive(&request("ACK", 1, "", ""), t0);
        assert_eq!(call.deadline(), None);
        assert!(call.poll(t0 + Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn an_answer_never_acknowledged_is_hung_up() {
        let t0 = Instant::now();
        let (mut call, _) = answered(t0);
        let actions = call.poll(t0 + GIVE_UP);
        let bye = &sent(&actions)[0];
        assert_eq!(bye.method(), Some("BYE"));
        assert_eq!(actions.last(), Some(&Action::Ended(Ending::NoAck)));
        assert!(call.over());
    }

    #[test]
    fn the_callers_bye_ends_the_call_and_is_answered_even_twice() {
        let t0 = Instant::now();
        let (mut call, _) = answered(t0);
        call.receive(&request("ACK", 1, "", ""), t0);
        let bye = request("BYE", 2, "", "");
        let actions = call.receive(&bye, t0);
        assert_eq!(status(&sent(&actions)[0]), 200);
        assert_eq!(actions.last(), Some(&Action::Ended(Ending::PeerHungUp)));
        let again = call.receive(&bye, t0);
        assert_eq!(status(&sent(&again)[0]), 200);
        assert_eq!(again.len(), 1, "ended once");
    }

    #[test]
    fn voxides_bye_goes_to_the_callers_contact_with_the_tags_swapped() {
        let t0 = Instant::now();
        let (mut call, _) = answered(t0);
        call.receive(&request("ACK", 1, "", ""), t0);
        let bye = &sent(&call.hang_up(t0))[0];
        assert_eq!(
            bye.start,
            StartLine::Request {
                method: "BYE".into(),
                uri: "sip:sipp@127.0.0.1:5091".into()
            }
        );
        assert_eq!(bye.param("From", "tag"), Some("vx"));
        assert_eq!(bye.param("To", "tag"), Some("caller"));
        assert_eq!(bye.cseq(), Some((1, "BYE")));
        // Resent until answered; the answer ends the call.
        assert_eq!(sent(&call.poll(t0 + T1)).len(), 1);
        let ok =
            SipMessage::parse(b"SIP/2.0 200 OK\r\nCall-ID: 1-42@127.0.0.1\r\nCSeq: 1 BYE\r\n\r\n")
                .expect("200");
        assert_eq!(call.receive(&ok, t0), [Action::Ended(Ending::HungUp)]);
        assert!(call.hang_up(t0).is_empty());
    }

    #[test]
    fn requests_within_the_call_are_answered_and_info_keys_heard() {
        let t0 = Instant::now();
        let (mut call, _) = answered(t0);
        assert_eq!(
            status(&sent(&call.receive(&invite(), t0))[0]),
            200,
            "a resent INVITE"
        );
        call.receive(&request("ACK", 1, "", ""), t0);
        let reinvite = call.receive(&request("INVITE", 3, "", ""), t0);
        assert_eq!(
            sent(&reinvite)[0].body,
            b"v=0\r\n",
            "the same audio goes on"
        );
        let relay = "Content-Type: application/dtmf-relay\r\n";
        let actions = call.receive(
            &request("INFO", 4, relay, "Signal=5\r\nDuration=160\r\n"),
            t0,
        );
        assert_eq!(status(&sent(&actions)[0]), 200);
        assert_eq!(actions.last(), Some(&Action::Key('5')));
        let plain = "Content-Type: application/dtmf\r\n";
        assert_eq!(
            call.receive(&request("INFO", 5, plain, "11"), t0).last(),
            Some(&Action::Key('#'))
        );
        assert_eq!(
            call.receive(&request("INFO", 6, relay, "Signal=x"), t0)
                .len(),
            1
        );
        assert_eq!(
            status(&sent(&call.receive(&request("OPTIONS", 7, "", ""), t0))[0]),
            200
        );
        assert_eq!(
            status(&sent(&call.receive(&request("SUBSCRIBE", 8, "", ""), t0))[0]),
            501
        );
    }

    #[test]
    fn a_transfer_refers_the_caller_and_leaves_once_the_new_call_is_up() {
        let t0 = Instant::now();
        let (mut call, _) = answered(t0);
        call.receive(&request("ACK", 1, "", ""), t0);
        let refer = sent(&call.transfer("2001", t0)).remove(0);
        assert_eq!(refer.method(), Some("REFER"));
        assert_eq!(
            refer.header("Refer-To"),
            Some("<sip:2001@127.0.0.1:5091>"),
            "a number, routed by the party that carries the call"
        );
        assert_eq!(refer.cseq(), Some((1, "REFER")));
        // Resent until answered.
        assert_eq!(sent(&call.poll(t0 + T1)).len(), 1);
        let accepted = SipMessage::parse(&refer.response(202, "Accepted", Some("caller")).render())
            .expect("202");
        assert!(call.receive(&accepted, t0).is_empty());
        let sipfrag = "Content-Type: message/sipfrag\r\nEvent: refer\r\n";
        let trying = call.receive(&request("NOTIFY", 2, sipfrag, "SIP/2.0 100 Trying\r\n"), t0);
        assert_eq!(trying.len(), 1, "answered, nothing else: {trying:?}");
        let up = call.receive(&request("NOTIFY", 3, sipfrag, "SIP/2.0 200 OK\r\n"), t0);
        assert_eq!(status(&sent(&up)[0]), 200);
        assert!(up.contains(&Action::Transferred(Ok(()))));
        let bye = sent(&up).remove(1);
        assert_eq!(bye.method(), Some("BYE"));
        let ok = SipMessage::parse(&bye.response(200, "OK", None).render()).expect("200");
        assert_eq!(call.receive(&ok, t0), [Action::Ended(Ending::Transferred)]);
    }

    #[test]
    fn a_refused_or_failed_transfer_leaves_the_call_up() {
        let t0 = Instant::now();
        let (mut call, _) = answered(t0);
        call.receive(&request("ACK", 1, "", ""), t0);
        let refer = sent(&call.transfer("sip:sales@10.0.0.5", t0)).remove(0);
        assert_eq!(refer.header("Refer-To"), Some("<sip:sales@10.0.0.5>"));
        let refused =
            SipMessage::parse(&refer.response(603, "Decline", None).render()).expect("603");
        assert_eq!(
            call.receive(&refused, t0),
            [Action::Transferred(Err("603 Decline".into()))]
        );
        // Up again: a second try, accepted, whose new call is busy.
        let refer = sent(&call.transfer("2001", t0)).remove(0);
        let accepted =
            SipMessage::parse(&refer.response(202, "Accepted", None).render()).expect("202");
        call.receive(&accepted, t0);
        let sipfrag = "Content-Type: message/sipfrag\r\n";
        let busy = call.receive(&request("NOTIFY", 2, sipfrag, "SIP/2.0 486 Busy Here"), t0);
        assert_eq!(
            busy.last(),
            Some(&Action::Transferred(Err("486 Busy Here".into())))
        );
        assert!(!call.over());
        assert_eq!(call.deadline(), None, "up, waiting on nothing");
    }

    #[test]
    fn a_uri_is_read_from_a_name_addr_or_an_addr_spec() {
        assert_eq!(uri_of("\"A\" <sip:a@b:5060>;tag=1"), "sip:a@b:5060");
        assert_eq!(uri_of("sip:a@b;tag=1"), "sip:a@b");
    }
}
