//! SIP messages (RFC 3261 §7): read from a datagram and written back, bounded in size and in
//! header count. Header names are matched case-insensitively and in their compact forms.

use std::fmt::Write as _;

use super::SipError;

/// The largest message read: a UDP datagram's payload.
pub const MAX_MESSAGE: usize = 65_507;
/// The most header lines one message may carry.
pub const MAX_HEADERS: usize = 64;

/// A request or a response.
#[derive(Debug, Clone, PartialEq)]
pub enum StartLine {
    /// `METHOD uri SIP/2.0`.
    Request {
        /// `INVITE`, `ACK`, `BYE`, …, upper-case.
        method: String,
        /// The Request-URI, as written.
        uri: String,
    },
    /// `SIP/2.0 code reason`.
    Response {
        /// The status code.
        status: u16,
        /// Its reason phrase.
        reason: String,
    },
}

/// One SIP message: its first line, its headers in order, and its body.
#[derive(Debug, Clone, PartialEq)]
pub struct SipMessage {
    /// The request or status line.
    pub start: StartLine,
    /// The headers as (name, value), names as written (compact forms expanded).
    pub headers: Vec<(String, String)>,
    /// The body (an SDP offer or answer, a DTMF relay, …).
    pub body: Vec<u8>,
}

/// A header's full name for its compact form (RFC 3261 §7.3.3).
fn expand(name: &str) -> &str {
    match name {
        "i" | "I" => "Call-ID",
        "m" | "M" => "Contact",
        "l" | "L" => "Content-Length",
        "c" | "C" => "Content-Type",
        "f" | "F" => "From",
        "t" | "T" => "To",
        "v" | "V" => "Via",
        "k" | "K" => "Supported",
        "s" | "S" => "Subject",
        "e" | "E" => "Content-Encoding",
        other => other,
    }
}

impl SipMessage {
    /// Reads one message.
    pub fn parse(bytes: &[u8]) -> Result<Self, SipError> {
        if bytes.len() > MAX_MESSAGE {
            return Err(SipError::Malformed(format!(
                "{} bytes: larger than a datagram",
                bytes.len()
            )));
        }
        let split = find(bytes, b"\r\n\r\n")
            .map(|at| (at, at + 4))
            .or_else(|| find(bytes, b"\n\n").map(|at| (at, at + 2)))
            .ok_or_else(|| SipError::Malformed("no blank line after the headers".into()))?;
        let head = std::str::from_utf8(&bytes[..split.0])
            .map_err(|_| SipError::Malformed("headers are not UTF-8".into()))?;
        let mut lines = head.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
        let first = lines
            .next()
            .filter(|l| !l.is_empty())
            .ok_or_else(|| SipError::Malformed("no start line".into()))?;
        let start = start_line(first)?;
        let mut headers: Vec<(String, String)> = Vec::new();
        for line in lines {
            if line.starts_with([' ', '\t']) {
                // A folded line continues the header before it.
                let Some((_, value)) = headers.last_mut() else {
                    return Err(SipError::Malformed("a folded line with no header".into()));
                };
                value.push(' ');
                value.push_str(line.trim());
                continue;
            }
            let (name, value) = line.split_once(':').ok_or_else(|| {
                SipError::Malformed(format!("a header without a colon: {line:?}"))
            })?;
            let name = name.trim();
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(SipError::Malformed(format!("a bad header name: {name:?}")));
            }
            if headers.len() == MAX_HEADERS {
                return Err(SipError::Malformed(format!(
                    "more than {MAX_HEADERS} headers"
                )));
            }
            headers.push((expand(name).to_owned(), value.trim().to_owned()));
        }
        let mut message = Self {
            start,
            headers,
            body: Vec::new(),
        };
        let rest = &bytes[split.1..];
        let length = match message.header("Content-Length") {
            Some(value) => value
                .parse::<usize>()
                .map_err(|_| SipError::Malformed(format!("Content-Length {value:?}")))?,
            None => rest.len(),
        };
        if length > rest.len() {
            return Err(SipError::Malformed(format!(
                "Content-Length {length} past the datagram's {} bytes",
                rest.len()
            )));
        }
        message.body = rest[..length].to_vec();
        Ok(message)
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name`, in order (a header may be repeated, or hold a list).
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The method of a request, `None` for a response.
    pub fn method(&self) -> Option<&str> {
        match &self.start {
            StartLine::Request { method, .. } => Some(method),
            StartLine::Response { .. } => None,
        }
    }

    /// `Call-ID`.
    pub fn call_id(&self) -> Option<&str> {
        self.header("Call-ID")
    }

    /// `CSeq`'s number and method.
    pub fn cseq(&self) -> Option<(u32, &str)> {
        let (number, method) = self.header("CSeq")?.split_once(char::is_whitespace)?;
        Some((number.trim().parse().ok()?, method.trim()))
    }

    /// A parameter of a header whose value is a name-addr (`<sip:a@b>;tag=x`): `tag` of `To`.
    pub fn param(&self, header: &str, name: &str) -> Option<&str> {
        let value = self.header(header)?;
        // Parameters follow the address (after `>` when it is bracketed).
        let params = match value.rfind('>') {
            Some(at) => &value[at + 1..],
            None => value.split_once(';').map_or("", |(_, p)| p),
        };
        params.split(';').find_map(|p| {
            let (key, val) = p.split_once('=').unwrap_or((p, ""));
            key.trim().eq_ignore_ascii_case(name).then_some(val.trim())
        })
    }

    /// The response to this request: its Via, From, To (with `to_tag` added if it has none),
    /// Call-ID and CSeq, as RFC 3261 §8.2.6 copies them.
    pub fn response(&self, status: u16, reason: &str, to_tag: Option<&str>) -> SipMessage {
        let mut headers = Vec::new();
        for (name, value) in &self.headers {
            let copied = ["Via", "From", "Call-ID", "CSeq", "Record-Route"]
                .iter()
                .any(|h| name.eq_ignore_ascii_case(h));
            if copied {
                headers.push((name.clone(), value.clone()));
            } else if name.eq_ignore_ascii_case("To") {
                let value = match to_tag {
                    Some(tag) if self.param("To", "tag").is_none() => format!("{value};tag={tag}"),
                    _ => value.clone(),
                };
                headers.push(("To".into(), value));
            }
        }
        SipMessage {
            start: StartLine::Response {
                status,
                reason: reason.into(),
            },
            headers,
            body: Vec::new(),
        }
    }

    /// Adds a header.
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the body and its type.
    pub fn with_body(mut self, content_type: &str, body: Vec<u8>) -> Self {
        self.headers
            .push(("Content-Type".into(), content_type.into()));
        self.body = body;
        self
    }

    /// The message as bytes, with its Content-Length.
    pub fn render(&self) -> Vec<u8> {
        let mut out = String::new();
        match &self.start {
            StartLine::Request { method, uri } => {
                let _ = write!(out, "{method} {uri} SIP/2.0\r\n");
            }
            StartLine::Response { status, reason } => {
                let _ = write!(out, "SIP/2.0 {status} {reason}\r\n");
            }
        }
        for (name, value) in &self.headers {
            if !name.eq_ignore_ascii_case("Content-Length") {
                let _ = write!(out, "{name}: {value}\r\n");
            }
        }
        let _ = write!(out, "Content-Length: {}\r\n\r\n", self.body.len());
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

fn start_line(line: &str) -> Result<StartLine, SipError> {
    let mut parts = line.splitn(3, ' ');
    let (a, b, c) = (parts.next(), parts.next(), parts.next());
    match (a, b, c) {
        (Some("SIP/2.0"), Some(code), Some(reason)) => Ok(StartLine::Response {
            status: code
                .parse()
                .ok()
                .filter(|c| (100..700).contains(c))
                .ok_or_else(|| SipError::Malformed(format!("a bad status: {code:?}")))?,
            reason: reason.to_owned(),
        }),
        (Some(method), Some(uri), Some("SIP/2.0"))
            if !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase()) =>
        {
            Ok(StartLine::Request {
                method: method.to_owned(),
                uri: uri.to_owned(),
            })
        }
        _ => Err(SipError::Malformed(format!(
            "not a SIP/2.0 start line: {line:?}"
        ))),
    }
}

pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INVITE: &str = "INVITE sip:agent@127.0.0.1:5080 SIP/2.0\r\n\
        Via: SIP/2.0/UDP 127.0.0.1:5091;branch=z9hG4bK-1\r\n\
        f: sipp <sip:sipp@127.0.0.1:5091>;tag=1SIPpTag09\r\n\
        To: agent <sip:agent@127.0.0.1:5080>\r\n\
        Call-ID: 1-42@127.0.0.1\r\n\
        CSeq: 1 INVITE\r\n\
        Contact: sip:sipp@127.0.0.1:5091\r\n\
        Content-Type: application/sdp\r\n\
        Content-Length: 4\r\n\r\nv=0\n";

    #[test]
    fn an_invite_reads_with_compact_headers_and_its_body_by_content_length() {
        let message = SipMessage::parse(INVITE.as_bytes()).expect("INVITE");
        assert_eq!(message.method(), Some("INVITE"));
        assert_eq!(message.call_id(), Some("1-42@127.0.0.1"));
        assert_eq!(message.cseq(), Some((1, "INVITE")));
        assert_eq!(message.param("From", "tag"), Some("1SIPpTag09"));
        assert_eq!(message.param("To", "tag"), None);
        assert_eq!(message.body, b"v=0\n");
    }

    #[test]
    fn a_response_copies_the_dialog_headers_and_tags_the_callee() {
        let invite = SipMessage::parse(INVITE.as_bytes()).expect("INVITE");
        let ok = invite.response(200, "OK", Some("vx1"));
        let back = SipMessage::parse(&ok.render()).expect("round trip");
        assert_eq!(
            back.start,
            StartLine::Response {
                status: 200,
                reason: "OK".into()
            }
        );
        assert_eq!(back.param("To", "tag"), Some("vx1"));
        assert_eq!(back.header("Via"), invite.header("Via"));
        assert_eq!(back.cseq(), Some((1, "INVITE")));
        assert_eq!(back.header("Content-Length"), Some("0"));
        assert_eq!(back.header("Contact"), None);
    }

    #[test]
    fn what_is_not_sip_is_refused_not_guessed() {
        for bad in [
            &b"hello"[..],
            b"INVITE sip:a SIP/3.0\r\n\r\n",
            b"SIP/2.0 99 Too Low\r\n\r\n",
            b"invite sip:a SIP/2.0\r\n\r\n",
            b"BYE sip:a SIP/2.0\r\nno colon\r\n\r\n",
            b"BYE sip:a SIP/2.0\r\nContent-Length: 10\r\n\r\nshort",
            b"BYE sip:a SIP/2.0\r\n\tfolded first\r\n\r\n",
        ] {
            assert!(
                SipMessage::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: y\r\n")).collect();
        let flood = format!("OPTIONS sip:a SIP/2.0\r\n{many}\r\n");
        assert!(SipMessage::parse(flood.as_bytes()).is_err());
    }
}
