//! A call voxide places, sans-IO (RFC 3261 §13.2, §17.1.1): the INVITE resent until the
//! callee's side answers at all, a digest challenge answered once, the ringing given up with a
//! CANCEL, and every final answer acknowledged. A 2xx turns the dialing into a [`Call`].

use std::time::{Duration, Instant};

use super::call::{ALLOW, Call, Dialog, Local};
use super::message::{SipMessage, StartLine};
use super::register::{Account, Challenge};

/// RFC 3261's T1 and T2, and timer B: how long an INVITE waits for any answer (64 × T1).
const T1: Duration = Duration::from_millis(500);
const T2: Duration = Duration::from_secs(4);
const TIMER_B: Duration = Duration::from_secs(32);

/// The call to place.
#[derive(Debug, Clone)]
pub struct Dial {
    /// The Request-URI and To: `sip:user@host[:port]`.
    pub to: String,
    /// voxide's party (From), without a tag: `<sip:voxide@host>`.
    pub from: String,
    /// Where voxide's signalling is reached.
    pub local: Local,
    /// voxide's SDP offer.
    pub offer: String,
    /// Credentials for a challenge (the PBX's extension, when calls go through it).
    pub account: Option<Account>,
    /// How long the callee's phone may ring before voxide gives up.
    pub ring_for: Duration,
    /// The call's Call-ID and voxide's tag.
    pub ids: (String, String),
}

/// What dialing does next.
#[derive(Debug)]
pub enum Dialing {
    /// Send these bytes toward the callee.
    Send(Vec<u8>),
    /// The callee's phone rings (180 or 183).
    Ringing,
    /// The callee answered: the call, and the callee's SDP answer.
    Answered(Box<Call>, Vec<u8>),
    /// No call: why.
    Failed(Failure),
}

/// Why a call placed was not answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A final answer other than 2xx: busy (486), declined (603), not found (404), …
    Refused {
        /// The status code.
        status: u16,
        /// Its reason phrase.
        reason: String,
    },
    /// It rang for the whole of `ring_for`; voxide cancelled it.
    NoAnswer,
    /// Nothing answered the INVITE at all (timer B).
    Unreachable,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused { status, reason } => write!(f, "{status} {reason}"),
            Failure::NoAnswer => f.write_str("no answer"),
            Failure::Unreachable => f.write_str("unreachable"),
        }
    }
}

/// Where the dialing stands.
#[derive(Debug)]
enum Phase {
    /// The INVITE is out, resent until any answer comes; ringing gives up at `ring_until`.
    Calling {
        next: Instant,
        interval: Duration,
        give_up: Instant,
        ring_until: Instant,
    },
    /// A provisional answer came: the phone rings until `ring_until`.
    Proceeding {
        ring_until: Instant,
    },
    /// voxide gave up on the ringing; its CANCEL is resent until the 487 comes.
    Cancelling {
        cancel: Vec<u8>,
        next: Instant,
        give_up: Instant,
    },
    Over,
}

/// voxide's side of a call it places, until it is answered or not.
#[derive(Debug)]
pub struct Dialer {
    dial: Dial,
    /// The INVITE in flight.
    invite: SipMessage,
    /// The nonce of the challenge answered (a second challenge to it means wrong credentials).
    answered: Option<String>,
    rang: bool,
    phase: Phase,
}

impl Dialer {
    /// Starts dialing: the INVITE to send comes back.
    pub fn start(dial: Dial, now: Instant) -> (Self, Vec<Dialing>) {
        let invite = Self::invite(&dial, 1, None);
        let dialer = Self {
            invite,
            answered: None,
            rang: false,
            phase: Phase::Calling {
                next: now + T1,
                interval: T1,
                give_up: now + TIMER_B,
                ring_until: now + dial.ring_for,
            },
            dial,
        };
        let bytes = dialer.invite.render();
        (dialer, vec![Dialing::Send(bytes)])
    }

    fn invite(dial: &Dial, cseq: u32, authorization: Option<(&str, String)>) -> SipMessage {
        let mut invite = SipMessage {
            start: StartLine::Request {
                method: "INVITE".into(),
                uri: dial.to.clone(),
            },
            headers: Vec::new(),
            body: Vec::new(),
        }
        .with("Via", dial.local.via())
        .with("Max-Forwards", "70")
        .with("From", format!("{};tag={}", dial.from, dial.ids.1))
        .with("To", format!("<{}>", dial.to))
        .with("Call-ID", dial.ids.0.clone())
        .with("CSeq", format!("{cseq} INVITE"))
        .with("Contact", dial.local.contact())
        .with("Allow", ALLOW)
        .with("User-Agent", "voxide");
        if let Some((field, value)) = authorization {
            invite = invite.with(field, value);
        }
        invite.with_body("application/sdp", dial.offer.clone().into_bytes())
    }

    /// The Call-ID of the call.
    pub fn call_id(&self) -> &str {
        &self.dial.ids.0
    }

    /// Whether dialing is over (answered or failed).
    pub fn over(&self) -> bool {
        matches!(self.phase, Phase::Over)
    }

    /// When [`Dialer::poll`] has something to do.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Calling {
                next, ring_until, ..
            } => Some((*next).min(*ring_until)),
            Phase::Proceeding { ring_until } => Some(*ring_until),
            Phase::Cancelling { next, give_up, .. } => Some((*next).min(*give_up)),
            Phase::Over => None,
        }
    }

    /// Resends, gives up on the ringing, or on the callee.
    pub fn poll(&mut self, now: Instant) -> Vec<Dialing> {
        match &mut self.phase {
            Phase::Calling { give_up, .. } if now >= *give_up => {
                self.phase = Phase::Over;
                vec![Dialing::Failed(Failure::Unreachable)]
            }
            Phase::Calling { ring_until, .. } | Phase::Proceeding { ring_until }
                if now >= *ring_until =>
            {
                self.cancel(now)
            }
            Phase::Calling { next, interval, .. } if now >= *next => {
                *interval = (*interval * 2).min(T2);
                *next += *interval;
                vec![Dialing::Send(self.invite.render())]
            }
            Phase::Cancelling { give_up, .. } if now >= *give_up => {
                self.phase = Phase::Over;
                vec![Dialing::Failed(Failure::NoAnswer)]
            }
            Phase::Cancelling { cancel, next, .. } if now >= *next => {
                *next = now + T2;
                vec![Dialing::Send(cancel.clone())]
            }
            _ => Vec::new(),
        }
    }

    /// Gives up on the call: a CANCEL (RFC 3261 §9.1), the same branch and CSeq number as the
    /// INVITE.
    pub fn cancel(&mut self, now: Instant) -> Vec<Dialing> {
        if !matches!(self.phase, Phase::Calling { .. } | Phase::Proceeding { .. }) {
            return Vec::new();
        }
        let cseq = self.invite.cseq().map_or(1, |(n, _)| n);
        let cancel = self.same_transaction("CANCEL", cseq, None).render();
        self.phase = Phase::Cancelling {
            cancel: cancel.clone(),
            next: now + T1,
            give_up: now + TIMER_B,
        };
        vec![Dialing::Send(cancel)]
    }

    /// A request of the INVITE's own transaction (its CANCEL, the ACK of a failure): the same
    /// Request-URI, Via, From, Call-ID and CSeq number, To as the answer gave it.
    fn same_transaction(&self, method: &str, cseq: u32, to: Option<&str>) -> SipMessage {
        let invite = &self.invite;
        SipMessage {
            start: StartLine::Request {
                method: method.into(),
                uri: self.dial.to.clone(),
            },
            headers: Vec::new(),
            body: Vec::new(),
        }
        .with("Via", invite.header("Via").unwrap_or_default())
        .with("Max-Forwards", "70")
        .with("From", invite.header("From").unwrap_or_default())
        .with(
            "To",
            to.unwrap_or_else(|| invite.header("To").unwrap_or_default()),
        )
        .with("Call-ID", self.dial.ids.0.clone())
        .with("CSeq", format!("{cseq} {method}"))
    }

    /// A response from the callee's side.
    pub fn receive(&mut self, response: &SipMessage, now: Instant) -> Vec<Dialing> {
        let StartLine::Response { status, reason } = &response.start else {
            return Vec::new();
        };
        let Some((cseq, method)) = response.cseq() else {
            return Vec::new();
        };
        // The CANCEL's own answer says nothing: the INVITE's 487 follows.
        if method != "INVITE" || Some(cseq) != self.invite.cseq().map(|(n, _)| n) {
            return Vec::new();
        }
        if matches!(self.phase, Phase::Over) {
            return Vec::new();
        }
        match status {
            100..=199 => {
                if let Phase::Calling { ring_until, .. } = self.phase {
                    self.phase = Phase::Proceeding { ring_until };
                }
                if *status >= 180 && !self.rang {
                    self.rang = true;
                    return vec![Dialing::Ringing];
                }
                Vec::new()
            }
            200..=299 => {
                // Answered, even while voxide was cancelling: the ACK, and the call is up.
                let dialog = Dialog::placed(&self.invite, response, self.dial.local.clone());
                let ack = dialog.request("ACK", cseq).render();
                let call = Call::placed(dialog, self.dial.offer.clone().into_bytes(), ack.clone());
                self.phase = Phase::Over;
                vec![
                    Dialing::Send(ack),
                    Dialing::Answered(Box::new(call), response.body.clone()),
                ]
            }
            _ => {
                // A failure is acknowledged within its transaction (§17.1.1.3).
                let ack = self
                    .same_transaction("ACK", cseq, response.header("To"))
                    .render();
                let mut actions = vec![Dialing::Send(ack)];
                if let Some(again) = self.challenged(*status, response, cseq, now) {
                    actions.push(Dialing::Send(again));
                    return actions;
                }
                let failure = match (&self.phase, status) {
                    (Phase::Cancelling { .. }, 487) => Failure::NoAnswer,
                    _ => Failure::Refused {
                        status: *status,
                        reason: reason.clone(),
                    },
                };
                self.phase = Phase::Over;
                actions.push(Dialing::Failed(failure));
                actions
            }
        }
    }

    /// The INVITE again with the challenge answered, when a 401 or 407 challenges a dialer
    /// with credentials that have not answered this challenge yet.
    fn challenged(
        &mut self,
        status: u16,
        response: &SipMessage,
        cseq: u32,
        now: Instant,
    ) -> Option<Vec<u8>> {
        let (asked, field) = match status {
            401 => ("WWW-Authenticate", "Authorization"),
            407 => ("Proxy-Authenticate", "Proxy-Authorization"),
            _ => return None,
        };
        let account = self.dial.account.as_ref()?;
        let challenge = response.header(asked).and_then(Challenge::parse)?;
        if self.answered.as_deref() == Some(challenge.nonce()) && !challenge.stale() {
            return None;
        }
        if !matches!(self.phase, Phase::Calling { .. } | Phase::Proceeding { .. }) {
            return None;
        }
        self.answered = Some(challenge.nonce().to_owned());
        let answer = challenge.answer(account, "INVITE", &self.dial.to, 1);
        self.invite = Self::invite(&self.dial, cseq + 1, Some((field, answer)));
        let ring_until = match self.phase {
            Phase::Calling { ring_until, .. } | Phase::Proceeding { ring_until } => ring_until,
            _ => now + self.dial.ring_for,
        };
        self.phase = Phase::Calling {
            next: now + T1,
            interval: T1,
            give_up: now + TIMER_B,
            ring_until,
        };
        Some(self.invite.render())
    }
}

#[cfg(test)]
mod tests {
    use super::super::call::Action;
    use super::*;

    fn dial(account: Option<Account>) -> Dial {
        Dial {
            to: "sip:bob@127.0.0.1:5090".into(),
            from: "<sip:voxide@127.0.0.1:5080>".into(),
            local: Local::udp("127.0.0.1:5080"),
            offer: "v=0\r\n".into(),
            account,
            ring_for: Duration::from_secs(30),
            ids: ("out-1@voxide".into(), "vx".into()),
        }
    }

    fn sent(actions: &[Dialing]) -> Vec<SipMessage> {
        actions
            .iter()
            .filter_map(|a| match a {
                Dialing::Send(bytes) => Some(SipMessage::parse(bytes).expect("sent SIP")),
                _ => None,
            })
            .collect()
    }

    /// The callee's answer to `request` with `status`, from `tag`, with `extra` headers.
    fn answer(request: &SipMessage, status: u16, extra: &[(&str, &str)], body: &str) -> SipMessage {
        let mut response = request.response(status, "Reason", Some("callee"));
        for (name, value) in extra {
            response = response.with(name, *value);
        }
        if !body.is_empty() {
            response = response.with_body("application/sdp", body.as_bytes().to_vec());
        }
        SipMessage::parse(&response.render()).expect("answer")
    }

    #[test]
    fn the_invite_is_resent_until_the_callee_answers_then_acknowledged_and_the_call_is_up() {
        let t0 = Instant::now();
        let (mut dialer, actions) = Dialer::start(dial(None), t0);
        let invite = sent(&actions).remove(0);
        assert_eq!(invite.method(), Some("INVITE"));
        assert_eq!(invite.param("From", "tag"), Some("vx"));
        assert_eq!(invite.body, b"v=0\r\n");
        // Resent at 0.5 s, 1.5 s, 3.5 s, as an INVITE's timer A has it.
        let mut resent = Vec::new();
        for ms in (0..4_000).step_by(100) {
            if !dialer.poll(t0 + Duration::from_millis(ms)).is_empty() {
                resent.push(ms);
            }
        }
        assert_eq!(resent, [500, 1_500, 3_500]);
        // Ringing stops the resends and is told once.
        assert!(matches!(
            dialer.receive(&answer(&invite, 180, &[], ""), t0)[..],
            [Dialing::Ringing]
        ));
        assert!(
            dialer
                .receive(&answer(&invite, 180, &[], ""), t0)
                .is_empty()
        );
        assert!(dialer.poll(t0 + Duration::from_secs(10)).is_empty());
        let ok = answer(
            &invite,
            200,
            &[
                ("Contact", "<sip:bob@127.0.0.1:5090;transport=udp>"),
                ("Record-Route", "<sip:proxy1;lr>"),
                ("Record-Route", "<sip:proxy2;lr>"),
            ],
            "v=1\r\n",
        );
        let actions = dialer.receive(&ok, t0);
        let ack = sent(&actions).remove(0);
        assert_eq!(
            ack.start,
            StartLine::Request {
                method: "ACK".into(),
                uri: "sip:bob@127.0.0.1:5090;transport=udp".into()
            },
            "to the callee's Contact"
        );
        assert_eq!(ack.cseq(), Some((1, "ACK")));
        assert_eq!(ack.param("To", "tag"), Some("callee"));
        assert_ne!(ack.header("Via"), invite.header("Via"), "a new transaction");
        assert_eq!(
            ack.all("Route").collect::<Vec<_>>(),
            ["<sip:proxy2;lr>", "<sip:proxy1;lr>"],
            "the recorded route, reversed"
        );
        let Some(Dialing::Answered(mut call, sdp)) = actions.into_iter().nth(1) else {
            panic!("answered");
        };
        assert_eq!(sdp, b"v=1\r\n");
        assert!(dialer.over());
        // The 200 OK again: its ACK was lost, and is sent again.
        let again = call.receive(&ok, t0);
        assert!(
            matches!(&again[..], [Action::Send(bytes)] if SipMessage::parse(bytes).expect("ACK").method() == Some("ACK"))
        );
        // voxide's BYE is the dialog's next request, with the tags as the caller's.
        let bye = match &call.hang_up(t0)[..] {
            [Action::Send(bytes)] => SipMessage::parse(bytes).expect("BYE"),
            other => panic!("a BYE: {other:?}"),
        };
        assert_eq!(bye.cseq(), Some((2, "BYE")));
        assert_eq!(bye.param("From", "tag"), Some("vx"));
        assert_eq!(bye.param("To", "tag"), Some("callee"));
    }

    #[test]
    fn a_busy_callee_is_acknowledged_within_the_transaction_and_the_call_fails() {
        let t0 = Instant::now();
        let (mut dialer, actions) = Dialer::start(dial(None), t0);
        let invite = sent(&actions).remove(0);
        let actions = dialer.receive(&answer(&invite, 486, &[], ""), t0);
        let ack = sent(&actions).remove(0);
        assert_eq!(ack.method(), Some("ACK"));
        assert_eq!(
            ack.header("Via"),
            invite.header("Via"),
            "the same transaction"
        );
        assert_eq!(ack.cseq(), Some((1, "ACK")));
        assert!(matches!(
            actions.last(),
            Some(Dialing::Failed(Failure::Refused { status: 486, .. }))
        ));
        assert!(dialer.over());
        assert_eq!(dialer.deadline(), None);
    }

    #[test]
    fn a_phone_that_rings_too_long_is_cancelled_and_its_487_ends_the_dialing() {
        let t0 = Instant::now();
        let (mut dialer, actions) = Dialer::start(dial(None), t0);
        let invite = sent(&actions).remove(0);
        dialer.receive(&answer(&invite, 183, &[], ""), t0);
        assert_eq!(dialer.deadline(), Some(t0 + Duration::from_secs(30)));
        let cancel = sent(&dialer.poll(t0 + Duration::from_secs(30))).remove(0);
        assert_eq!(cancel.method(), Some("CANCEL"));
        assert_eq!(cancel.header("Via"), invite.header("Via"));
        assert_eq!(cancel.cseq(), Some((1, "CANCEL")));
        // The CANCEL's 200 says nothing; the INVITE's 487 ends it, acknowledged.
        assert!(
            dialer
                .receive(&answer(&cancel, 200, &[], ""), t0)
                .is_empty()
        );
        let actions = dialer.receive(&answer(&invite, 487, &[], ""), t0);
        assert_eq!(sent(&actions)[0].method(), Some("ACK"));
        assert!(matches!(
            actions.last(),
            Some(Dialing::Failed(Failure::NoAnswer))
        ));
    }

    #[test]
    fn nothing_answering_at_all_is_unreachable_after_timer_b() {
        let t0 = Instant::now();
        let mut dialing = dial(None);
        dialing.ring_for = Duration::from_secs(60);
        let (mut dialer, _) = Dialer::start(dialing, t0);
        assert!(matches!(
            dialer.poll(t0 + TIMER_B)[..],
            [Dialing::Failed(Failure::Unreachable)]
        ));
    }

    #[test]
    fn a_challenge_is_answered_once_with_the_extensions_credentials() {
        let account = Account::parse("sip:1001@127.0.0.1:5090", "secret".into()).expect("account");
        let t0 = Instant::now();
        let (mut dialer, actions) = Dialer::start(dial(Some(account)), t0);
        let invite = sent(&actions).remove(0);
        let challenge = [(
            "Proxy-Authenticate",
            "Digest realm=\"pbx\", nonce=\"n1\", qop=\"auth\"",
        )];
        let actions = dialer.receive(&answer(&invite, 407, &challenge, ""), t0);
        let [ack, again] = &sent(&actions)[..] else {
            panic!("an ACK and the INVITE again: {actions:?}");
        };
        assert_eq!(ack.method(), Some("ACK"));
        assert_eq!(again.cseq(), Some((2, "INVITE")));
        let authorization = again.header("Proxy-Authorization").expect("answered");
        assert!(
            authorization.contains("username=\"1001\""),
            "{authorization}"
        );
        assert!(authorization.contains("nonce=\"n1\""), "{authorization}");
        // The same challenge again: the password is wrong, and the call fails.
        let actions = dialer.receive(&answer(again, 407, &challenge, ""), t0);
        assert!(matches!(
            actions.last(),
            Some(Dialing::Failed(Failure::Refused { status: 407, .. }))
        ));
        // Without credentials a challenge is a failure.
        let (mut plain, actions) = Dialer::start(dial(None), t0);
        let invite = sent(&actions).remove(0);
        let actions = plain.receive(&answer(&invite, 401, &challenge, ""), t0);
        assert!(matches!(
            actions.last(),
            Some(Dialing::Failed(Failure::Refused { status: 401, .. }))
        ));
    }
}
