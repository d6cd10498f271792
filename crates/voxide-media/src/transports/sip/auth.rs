//! Callers let in by digest authentication (RFC 3261 §22, RFC 2617's MD5 with `qop=auth`):
//! a caller from outside `--sip-allow` is challenged, and taken when its answer proves it holds
//! a password of `--sip-users`. Sans-IO and stateless: a nonce carries its own time, and a
//! keyed hash of that time, the realm and the caller's address, so it needs no table, is good
//! for [`NONCE_LIFETIME`] and from that address only (an overheard answer does not work from
//! another host).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;

use super::message::SipMessage;
use super::register::{digest_fields, md5_hex};
use crate::secret::same_secret;

/// How long a nonce is good for; an answer to an older one is refused as stale, so the caller
/// answers a fresh challenge without asking its user again.
pub const NONCE_LIFETIME: Duration = Duration::from_secs(300);
/// The realm voxide's challenges name.
pub const REALM: &str = "voxide";
/// Users a file may list at most, and the longest line it may hold.
const MAX_USERS: usize = 10_000;
const MAX_LINE: usize = 512;

/// Why a users file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    /// It could not be read.
    #[error("{path}: {reason}")]
    Unreadable {
        /// The file.
        path: String,
        /// What the system said.
        reason: String,
    },
    /// A line is not `user:password`.
    #[error("{path}:{line}: {reason} (each line is user:password; # starts a comment)")]
    Bad {
        /// The file.
        path: String,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// The users who may call from anywhere, and the key their nonces are signed with.
pub struct Callers {
    passwords: HashMap<String, String>,
    key: hmac::Key,
}

impl std::fmt::Debug for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callers")
            .field("users", &self.passwords.len())
            .finish_non_exhaustive()
    }
}

/// What an INVITE from outside the allowed networks comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its answer holds: the caller is this user.
    Welcome(String),
    /// No answer, or one to a nonce past its time: challenge it with this
    /// `WWW-Authenticate` value.
    Challenge(String),
    /// An answer that does not hold (a wrong password, an unknown user, a nonce not ours or
    /// from another address).
    Wrong,
}

impl Callers {
    /// The users of a `user:password` file (blank lines and `#` comments aside).
    pub fn load(path: &Path) -> Result<Self, UsersError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| UsersError::Unreadable {
            path: name.clone(),
            reason: e.to_string(),
        })?;
        Self::parse(&text).map_err(|(line, reason)| UsersError::Bad {
            path: name,
            line,
            reason,
        })
    }

    /// The users of a file's text; a bad line is `(its number, why)`.
    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut passwords = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.len() > MAX_LINE {
                return Err((line_no, format!("longer than {MAX_LINE} bytes")));
            }
            let Some((user, password)) = line.split_once(':') else {
                return Err((line_no, "no ':' between the user and the password".into()));
            };
            let user = user.trim();
            let fits = |c: char| c.is_ascii_alphanumeric() || "-_.!~*'()&=+$,;?/%".contains(c);
            if user.is_empty() || !user.chars().all(fits) {
                return Err((line_no, format!("{user:?} is not a SIP user name")));
            }
            if password.is_empty() {
                return Err((line_no, format!("{user} has an empty password")));
            }
            if passwords.len() == MAX_USERS {
                return Err((line_no, format!("more than {MAX_USERS} users")));
            }
            if passwords
                .insert(user.to_owned(), password.to_owned())
                .is_some()
            {
                return Err((line_no, format!("{user} is listed twice")));
            }
        }
        if passwords.is_empty() {
            return Err((0, "no users".into()));
        }
        let rng = ring::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)
            .map_err(|_| (0, "no randomness for the nonce key".to_owned()))?;
        Ok(Self { passwords, key })
    }

    /// Judges `invite` from `from` at `now` by its `Authorization` header.
    pub fn judge(&self, invite: &SipMessage, from: IpAddr, now: SystemTime) -> Verdict {
        let Some(answer) = invite
            .all("Authorization")
            .filter_map(digest_fields)
            .find(|f| f.get("realm").is_some_and(|r| r == REALM))
        else {
            return Verdict::Challenge(self.challenge(from, now, false));
        };
        let field = |name: &str| answer.get(name).map(String::as_str).unwrap_or_default();
        let Some(issued) = self.issued(field("nonce"), from) else {
            return Verdict::Wrong;
        };
        let Some(password) = self.passwords.get(field("username")) else {
            return Verdict::Wrong;
        };
        let method = invite.method().unwrap_or("INVITE");
        let ha1 = md5_hex(&format!("{}:{REALM}:{password}", field("username")));
        let ha2 = md5_hex(&format!("{method}:{}", field("uri")));
        let expected = match field("qop") {
            "auth" => md5_hex(&format!(
                "{ha1}:{}:{}:{}:auth:{ha2}",
                field("nonce"),
                field("nc"),
                field("cnonce")
            )),
            "" => md5_hex(&format!("{ha1}:{}:{ha2}", field("nonce"))),
            _ => return Verdict::Wrong,
        };
        let algorithm = field("algorithm");
        let md5 = algorithm.is_empty() || algorithm.eq_ignore_ascii_case("MD5");
        let right = md5
            && same_secret(
                field("response").to_ascii_lowercase().as_bytes(),
                expected.as_bytes(),
            );
        if !right {
            return Verdict::Wrong;
        }
        let age = now.duration_since(issued).unwrap_or(Duration::ZERO);
        if age > NONCE_LIFETIME {
            // The right password on an old nonce: a fresh one, without asking the user again.
            return Verdict::Challenge(self.challenge(from, now, true));
        }
        Verdict::Welcome(field("username").to_owned())
    }

    /// A `WWW-Authenticate` value challenging a caller at `from`.
    pub fn challenge(&self, from: IpAddr, now: SystemTime, stale: bool) -> String {
        let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let nonce = format!("{secs:x}.{}", self.sign(secs, from));
        let stale = if stale { ", stale=true" } else { "" };
        format!("Digest realm=\"{REALM}\", nonce=\"{nonce}\", algorithm=MD5, qop=\"auth\"{stale}")
    }

    /// When `nonce` was issued to `from`, if it is one of ours for that address.
    fn issued(&self, nonce: &str, from: IpAddr) -> Option<SystemTime> {
        let (secs, signature) = nonce.split_once('.')?;
        let secs = u64::from_str_radix(secs, 16).ok()?;
        let expected = self.sign(secs, from);
        if !same_secret(signature.as_bytes(), expected.as_bytes()) {
            return None;
        }
        UNIX_EPOCH.checked_add(Duration::from_secs(secs))
    }

    fn sign(&self, secs: u64, from: IpAddr) -> String {
        let tag = hmac::sign(&self.key, format!("{secs}:{REALM}:{from}").as_bytes());
        tag.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transports::sip::register::{Account, Challenge};

    const URI: &str = "sip:agent@127.0.0.1:5080";

    fn callers() -> Callers {
        Callers::parse("# who may call\nalice:wonderland\n\nbob:builder\n").expect("users")
    }

    fn invite(authorization: Option<String>) -> SipMessage {
        let mut text = format!(
            "INVITE {URI} SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.5:5060;branch=z9hG4bK1\r\n\
             From: <sip:alice@10.0.0.5>;tag=1\r\nTo: <{URI}>\r\nCall-ID: c1\r\nCSeq: 2 INVITE\r\n"
        );
        if let Some(value) = authorization {
            text.push_str(&format!("Authorization: {value}\r\n"));
        }
        text.push_str("Content-Length: 0\r\n\r\n");
        SipMessage::parse(text.as_bytes()).expect("an INVITE")
    }

    /// The answer a caller with `user` and `password` gives to `challenge`.
    fn answer(challenge: &str, user: &str, password: &str) -> String {
        let account =
            Account::parse(&format!("sip:{user}@127.0.0.1"), password.into()).expect("an account");
        Challenge::parse(challenge)
            .expect("a challenge")
            .answer(&account, "INVITE", URI, 1)
    }

    #[test]
    fn a_caller_is_challenged_then_welcomed_with_the_right_password_only() {
        let (callers, from) = (callers(), IpAddr::from([10, 0, 0, 5]));
        let now = SystemTime::now();
        let Verdict::Challenge(challenge) = callers.judge(&invite(None), from, now) else {
            panic!("no challenge")
        };
        assert!(challenge.contains("qop=\"auth\"") && !challenge.contains("stale"));
        let right = invite(Some(answer(&challenge, "alice", "wonderland")));
        assert_eq!(
            callers.judge(&right, from, now),
            Verdict::Welcome("alice".into())
        );
        let wrong = invite(Some(answer(&challenge, "alice", "looking-glass")));
        assert_eq!(callers.judge(&wrong, from, now), Verdict::Wrong);
        let stranger = invite(Some(answer(&challenge, "mallory", "wonderland")));
        assert_eq!(callers.judge(&stranger, from, now), Verdict::Wrong);
        // The same answer, overheard and sent from another host.
        assert_eq!(
            callers.judge(&right, IpAddr::from([10, 0, 0, 6]), now),
            Verdict::Wrong
        );
        // A nonce voxide never gave.
        let forged = challenge.replace("nonce=\"", "nonce=\"1");
        let forged = invite(Some(answer(&forged, "alice", "wonderland")));
        assert_eq!(callers.judge(&forged, from, now), Verdict::Wrong);
        // Another scheme is no answer: challenged again.
        let basic = invite(Some("Basic YWxpY2U6d29uZGVybGFuZA==".into()));
        assert!(matches!(
            callers.judge(&basic, from, now),
            Verdict::Challenge(_)
        ));
    }

    #[test]
    fn the_right_answer_on_an_old_nonce_is_challenged_again_as_stale() {
        let (callers, from) = (callers(), IpAddr::from([10, 0, 0, 5]));
        let then = SystemTime::now();
        let Verdict::Challenge(challenge) = callers.judge(&invite(None), from, then) else {
            panic!("no challenge")
        };
        let right = invite(Some(answer(&challenge, "bob", "builder")));
        let later = then + NONCE_LIFETIME + Duration::from_secs(1);
        let Verdict::Challenge(again) = callers.judge(&right, from, later) else {
            panic!("not challenged again")
        };
        assert!(again.contains("stale=true"), "{again}");
        let fresh = invite(Some(answer(&again, "bob", "builder")));
        assert_eq!(
            callers.judge(&fresh, from, later),
            Verdict::Welcome("bob".into())
        );
    }

    #[test]
    fn a_users_file_says_which_line_is_wrong() {
        assert_eq!(Callers::parse("alice").err().map(|e| e.0), Some(1));
        assert_eq!(Callers::parse("# x\nalice:\n").err().map(|e| e.0), Some(2));
        assert_eq!(Callers::parse("a:b\na:c").err().map(|e| e.0), Some(2));
        assert_eq!(Callers::parse("a b:c").err().map(|e| e.0), Some(1));
        assert_eq!(Callers::parse("# nobody\n").err().map(|e| e.0), Some(0));
        let long = format!("a:{}", "x".repeat(MAX_LINE));
        assert_eq!(Callers::parse(&long).err().map(|e| e.0), Some(1));
    }
}
