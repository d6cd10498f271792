//! Registering voxide as a PBX's extension (RFC 3261 §10), sans-IO: REGISTER with its Contact,
//! the registrar's digest challenge answered (RFC 7616, MD5, with or without `qop=auth`), the
//! binding renewed before it expires, and a failure retried a minute later. Time goes in;
//! datagrams to send come out.

use std::time::{Duration, Instant};

use md5::{Digest, Md5};

use super::message::{SipMessage, StartLine};

/// How long a binding is asked for.
pub const EXPIRES: Duration = Duration::from_secs(300);
/// How long after a failure the next try comes.
const RETRY: Duration = Duration::from_secs(60);
/// How long a REGISTER waits for its answer, resent every [`RESEND`] meanwhile.
const GIVE_UP: Duration = Duration::from_secs(32);
const RESEND: Duration = Duration::from_millis(500);

/// Who voxide registers as, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct Account {
    /// The address of record: `sip:1001@pbx.example.com`.
    pub aor: String,
    /// The user the registrar knows (the AOR's user unless given).
    pub user: String,
    /// Its password.
    pub password: String,
}

impl Account {
    /// An account for `aor` (`sip:user@host[:port]`) with `password`.
    pub fn parse(aor: &str, password: String) -> Result<Self, String> {
        let rest = aor
            .strip_prefix("sip:")
            .ok_or_else(|| format!("--sip-register {aor:?}: write sip:user@host[:port]"))?;
        let (user, _) = rest
            .split_once('@')
            .filter(|(u, h)| !u.is_empty() && !h.is_empty())
            .ok_or_else(|| format!("--sip-register {aor:?}: write sip:user@host[:port]"))?;
        Ok(Self {
            aor: aor.to_owned(),
            user: user.to_owned(),
            password,
        })
    }

    /// The registrar's `host[:port]`.
    pub fn registrar(&self) -> &str {
        self.aor.split_once('@').map_or("", |(_, host)| host)
    }
}

/// Where the registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not registered yet, or failed: the next try is due then.
    Unregistered,
    /// Registered until the binding expires.
    Registered,
}

/// One registration: its dialog identifiers and where it stands.
#[derive(Debug)]
pub struct Registration {
    account: Account,
    /// `host:port` voxide's Contact names.
    contact: String,
    call_id: String,
    tag: String,
    cseq: u32,
    /// The REGISTER waiting for its answer, and when it was sent first and last.
    pending: Option<(Vec<u8>, Instant, Instant)>,
    /// The challenge answered last (a second 401 to the same nonce means a wrong password).
    answered: Option<String>,
    next: Instant,
    standing: Standing,
}

impl Registration {
    /// A registration of `account` with voxide's signalling at `contact` (`host:port`); the
    /// first REGISTER is due at once.
    pub fn new(account: Account, contact: String, ids: (String, String), now: Instant) -> Self {
        Self {
            account,
            contact,
            call_id: ids.0,
            tag: ids.1,
            cseq: 0,
            pending: None,
            answered: None,
            next: now,
            standing: Standing::Unregistered,
        }
    }

    /// Whether a message belongs to this registration (its Call-ID).
    pub fn owns(&self, message: &SipMessage) -> bool {
        message.call_id() == Some(self.call_id.as_str())
    }

    /// Where it stands.
    pub fn standing(&self) -> Standing {
        self.standing
    }

    /// When [`Registration::poll`] has something to do.
    pub fn deadline(&self) -> Instant {
        match &self.pending {
            Some((_, _, last)) => *last + RESEND,
            None => self.next,
        }
    }

    /// A REGISTER to send, when one is due (the first, a renewal, a resend, a retry).
    pub fn poll(&mut self, now: Instant) -> Option<Vec<u8>> {
        if let Some((bytes, first, last)) = &mut self.pending {
            if now >= *first + GIVE_UP {
                tracing::warn!(aor = %self.account.aor, "the registrar did not answer: retrying in a minute");
                self.fail(now);
                return None;
            }
            if now >= *last + RESEND {
                *last = now;
                return Some(bytes.clone());
            }
            return None;
        }
        if now < self.next {
            return None;
        }
        Some(self.send(None, now))
    }

    fn fail(&mut self, now: Instant) {
        self.pending = None;
        self.standing = Standing::Unregistered;
        self.next = now + RETRY;
    }

    /// A REGISTER, with an authorization header (`Authorization` or `Proxy-Authorization`) when
    /// answering a challenge.
    fn send(&mut self, authorization: Option<(&str, String)>, now: Instant) -> Vec<u8> {
        self.cseq += 1;
        let registrar = format!("sip:{}", self.account.registrar());
        let mut register = SipMessage {
            start: StartLine::Request {
                method: "REGISTER".into(),
                uri: registrar,
            },
            headers: Vec::new(),
            body: Vec::new(),
        }
        .with(
            "Via",
            format!(
                "SIP/2.0/UDP {};branch=z9hG4bK{:08x}{:08x};rport",
                self.contact,
                crate::ids::random_u32(),
                self.cseq
            ),
        )
        .with("Max-Forwards", "70")
        .with("From", format!("<{}>;tag={}", self.account.aor, self.tag))
        .with("To", format!("<{}>", self.account.aor))
        .with("Call-ID", self.call_id.clone())
        .with("CSeq", format!("{} REGISTER", self.cseq))
        .with(
            "Contact",
            format!("<sip:{}@{}>", self.account.user, self.contact),
        )
        .with("Expires", EXPIRES.as_secs().to_string())
        .with("User-Agent", "voxide");
        if let Some((header, value)) = authorization {
            register = register.with(header, value);
        }
        let bytes = register.render();
        self.pending = Some((bytes.clone(), now, now));
        bytes
    }

    /// The registrar's answer: a challenge answered (the REGISTER to send), the binding kept,
    /// or a failure retried later.
    pub fn receive(&mut self, response: &SipMessage, now: Instant) -> Option<Vec<u8>> {
        let StartLine::Response { status, .. } = response.start else {
            return None;
        };
        if response.cseq().map(|(n, _)| n) != Some(self.cseq) || self.pending.is_none() {
            return None;
        }
        match status {
            100..=199 => None,
            200..=299 => {
                // The registrar may grant less time than asked: renew at four fifths of it.
                let granted = response
                    .header("Expires")
                    .and_then(|e| e.trim().parse::<u64>().ok())
                    .map_or(EXPIRES, Duration::from_secs)
                    .max(Duration::from_secs(10));
                self.pending = None;
                self.answered = None;
                self.standing = Standing::Registered;
                self.next = now + granted.mul_f64(0.8);
                tracing::info!(aor = %self.account.aor, expires_s = granted.as_secs(), "registered");
                None
            }
            401 | 407 => {
                let header = if status == 401 {
                    "WWW-Authenticate"
                } else {
                    "Proxy-Authenticate"
                };
                let Some(challenge) = response.header(header).and_then(Challenge::parse) else {
                    tracing::warn!(aor = %self.account.aor, status, "the registrar's challenge is unreadable");
                    self.fail(now);
                    return None;
                };
                if self.answered.as_deref() == Some(challenge.nonce.as_str()) && !challenge.stale {
                    tracing::warn!(aor = %self.account.aor, "the registrar refused the password");
                    self.fail(now);
                    return None;
                }
                self.answered = Some(challenge.nonce.clone());
                let uri = format!("sip:{}", self.account.registrar());
                let answer = challenge.answer(&self.account, "REGISTER", &uri, self.cseq);
                let field = if status == 401 {
                    "Authorization"
                } else {
                    "Proxy-Authorization"
                };
                Some(self.send(Some((field, answer)), now))
            }
            _ => {
                tracing::warn!(aor = %self.account.aor, status, "the registrar refused the registration");
                self.fail(now);
                None
            }
        }
    }
}

/// A digest challenge (`WWW-Authenticate: Digest realm="…", nonce="…", qop="auth"`).
#[derive(Debug, Clone, PartialEq)]
pub struct Challenge {
    realm: String,
    nonce: String,
    opaque: Option<String>,
    /// `qop=auth` offered.
    auth: bool,
    stale: bool,
}

impl Challenge {
    /// Reads a Digest challenge with MD5 (the algorithm SIP registrars use).
    pub fn parse(value: &str) -> Option<Self> {
        let fields = digest_fields(value)?;
        if let Some(algorithm) = fields.get("algorithm")
            && !algorithm.eq_ignore_ascii_case("MD5")
        {
            return None;
        }
        Some(Self {
            realm: fields.get("realm")?.clone(),
            nonce: fields.get("nonce")?.clone(),
            opaque: fields.get("opaque").cloned(),
            auth: fields
                .get("qop")
                .is_some_and(|q| q.split(',').any(|q| q.trim() == "auth")),
            stale: fields
                .get("stale")
                .is_some_and(|s| s.eq_ignore_ascii_case("true")),
        })
    }

    /// Its nonce.
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// Whether it says the last answer's nonce went stale (the password itself was right).
    pub fn stale(&self) -> bool {
        self.stale
    }

    /// The Authorization header's value for `method` on `uri` (`nc` is the request's count).
    pub fn answer(&self, account: &Account, method: &str, uri: &str, nc: u32) -> String {
        let ha1 = md5_hex(&format!(
            "{}:{}:{}",
            account.user, self.realm, account.password
        ));
        let ha2 = md5_hex(&format!("{method}:{uri}"));
        let mut header = format!(
            "Digest username=\"{}\", realm=\"{}\", nonce=\"{}\", uri=\"{uri}\", algorithm=MD5",
            account.user, self.realm, self.nonce
        );
        let response = if self.auth {
            let cnonce = format!("{:08x}", crate::ids::random_u32());
            let nc = format!("{nc:08x}");
            header.push_str(&format!(", qop=auth, nc={nc}, cnonce=\"{cnonce}\""));
            md5_hex(&format!("{ha1}:{}:{nc}:{cnonce}:auth:{ha2}", self.nonce))
        } else {
            md5_hex(&format!("{ha1}:{}:{ha2}", self.nonce))
        };
        header.push_str(&format!(", response=\"{response}\""));
        if let Some(opaque) = &self.opaque {
            header.push_str(&format!(", opaque=\"{opaque}\""));
        }
        header
    }
}

/// The fields of a `Digest` challenge or answer (`Digest realm="…", nonce="…"`), names in lower
/// case and values unquoted; `None` for another scheme or a broken list.
pub(super) fn digest_fields(value: &str) -> Option<std::collections::HashMap<String, String>> {
    let rest = value.trim().strip_prefix("Digest")?;
    let mut fields = std::collections::HashMap::new();
    for part in split_params(rest) {
        let (key, value) = part.split_once('=')?;
        fields.insert(
            key.trim().to_ascii_lowercase(),
            value.trim().trim_matches('"').to_owned(),
        );
    }
    Some(fields)
}

/// Splits `a="x, y", b=z` at the commas outside quotes.
fn split_params(text: &str) -> Vec<&str> {
    let (mut parts, mut start, mut quoted) = (Vec::new(), 0, false);
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(text[start..].trim());
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

pub(super) fn md5_hex(text: &str) -> String {
    Md5::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> Account {
        Account::parse("sip:1001@127.0.0.1:5070", "secret".into()).expect("account")
    }

    #[test]
    fn the_digest_answer_is_rfc_2617s_own_example() {
        // RFC 2617 §3.5: Mufasa, "Circle Of Life", with qop=auth and the cnonce it gives.
        let ha1 = md5_hex("Mufasa:testrealm@host.com:Circle Of Life");
        let ha2 = md5_hex("GET:/dir/index.html");
        let response = md5_hex(&format!(
            "{ha1}:dcd98b7102dd2f0e8b11d0f600bfb0c093:00000001:0a4f113b:auth:{ha2}"
        ));
        assert_eq!(response, "6629fae49393a05397450978507c4ef1");
    }

    #[test]
    fn a_challenge_reads_with_quoted_commas_and_says_what_it_offers() {
        let challenge = Challenge::parse(
            "Digest realm=\"asterisk, west\", nonce=\"4c8a\", qop=\"auth,auth-int\", opaque=\"x\"",
        )
        .expect("a challenge");
        assert_eq!(challenge.realm, "asterisk, west");
        assert!(challenge.auth);
        assert_eq!(challenge.opaque.as_deref(), Some("x"));
        assert!(Challenge::parse("Basic realm=\"x\"").is_none());
        assert!(Challenge::parse("Digest realm=\"x\", nonce=\"n\", algorithm=SHA-256").is_none());
    }

    fn registration(t0: Instant) -> Registration {
        Registration::new(
            account(),
            "127.0.0.1:5080".into(),
            ("reg-1".into(), "t".into()),
            t0,
        )
    }

    fn response(status: u16, cseq: u32, extra: &str) -> SipMessage {
        SipMessage::parse(
            format!(
                "SIP/2.0 {status} X\r\nCall-ID: reg-1\r\nCSeq: {cseq} REGISTER\r\n{extra}Content-Length: 0\r\n\r\n"
            )
            .as_bytes(),
        )
        .expect("response")
    }

    #[test]
    fn a_challenge_is_answered_then_the_binding_is_renewed_before_it_expires() {
        let t0 = Instant::now();
        let mut registration = registration(t0);
        let first = SipMessage::parse(&registration.poll(t0).expect("REGISTER")).expect("SIP");
        assert_eq!(first.method(), Some("REGISTER"));
        assert_eq!(first.header("Contact"), Some("<sip:1001@127.0.0.1:5080>"));
        assert_eq!(registration.poll(t0), None, "not resent at once");
        let challenge = "WWW-Authenticate: Digest realm=\"sipp\", nonce=\"abc\"\r\n";
        let second = registration
            .receive(&response(401, 1, challenge), t0)
            .expect("the answered REGISTER");
        let second = SipMessage::parse(&second).expect("SIP");
        let authorization = second.header("Authorization").expect("Authorization");
        let ha1 = md5_hex("1001:sipp:secret");
        let ha2 = md5_hex("REGISTER:sip:127.0.0.1:5070");
        let expected = md5_hex(&format!("{ha1}:abc:{ha2}"));
        assert!(
            authorization.contains(&format!("response=\"{expected}\"")),
            "{authorization}"
        );
        assert_eq!(second.cseq(), Some((2, "REGISTER")));
        assert_eq!(
            registration.receive(&response(200, 2, "Expires: 100\r\n"), t0),
            None
        );
        assert_eq!(registration.standing(), Standing::Registered);
        // Renewed at 80 s of the 100 granted.
        assert_eq!(registration.poll(t0 + Duration::from_secs(79)), None);
        assert!(registration.poll(t0 + Duration::from_secs(80)).is_some());
    }

    #[test]
    fn a_wrong_password_or_a_refusal_is_retried_a_minute_later() {
        let t0 = Instant::now();
        let mut registration = registration(t0);
        registration.poll(t0);
        let challenge = "WWW-Authenticate: Digest realm=\"sipp\", nonce=\"abc\"\r\n";
        assert!(
            registration
                .receive(&response(401, 1, challenge), t0)
                .is_some()
        );
        assert_eq!(registration.receive(&response(401, 2, challenge), t0), None);
        assert_eq!(registration.standing(), Standing::Unregistered);
        assert_eq!(registration.deadline(), t0 + RETRY);
        assert!(registration.poll(t0 + RETRY).is_some());
        assert_eq!(
            registration.receive(&response(403, 3, ""), t0 + RETRY),
            None
        );
        assert_eq!(registration.deadline(), t0 + RETRY + RETRY);
    }
}
