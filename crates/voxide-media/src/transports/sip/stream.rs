//! SIP over a stream (TCP, RFC 3261 §18.3): messages cut out of the bytes by their headers'
//! end and their Content-Length, sans-IO. The driver pushes what it reads and takes whole
//! messages; a message larger than a datagram's, or one without a readable length, ends the
//! connection (there is no resynchronising a stream after it).

use super::SipError;
use super::message::{MAX_MESSAGE, find};

/// The bytes read from one connection, cut into messages.
#[derive(Debug, Default)]
pub struct Framer {
    buffer: Vec<u8>,
    /// The other side sent a keepalive (a blank line, RFC 5626 §4.4.1) that wants an answer.
    pinged: bool,
}

/// What the bytes read so far hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framed {
    /// One whole message's bytes, to parse.
    Message(Vec<u8>),
    /// A double CRLF keepalive: answer with one CRLF.
    Ping,
}

impl Framer {
    /// Takes bytes read from the connection. Bytes past [`MAX_MESSAGE`] that are not yet a
    /// message are refused.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), SipError> {
        if self.buffer.len() + bytes.len() > MAX_MESSAGE * 2 {
            return Err(SipError::Malformed(
                "more than two messages' bytes unread on a stream".into(),
            ));
        }
        self.buffer.extend_from_slice(bytes);
        Ok(())
    }

    /// The next whole message or keepalive, `None` until more bytes come. An error means the
    /// stream cannot be read on.
    pub fn take(&mut self) -> Result<Option<Framed>, SipError> {
        // CRLFs between messages: "\r\n\r\n" is a ping, a lone "\r\n" a pong (§4.4.1).
        let blank = self
            .buffer
            .iter()
            .take_while(|b| matches!(b, b'\r' | b'\n'))
            .count();
        if blank > 0 {
            if self.buffer[..blank].windows(4).any(|w| w == b"\r\n\r\n") {
                self.pinged = true;
            }
            if blank == self.buffer.len() && !self.pinged {
                // Perhaps the start of a ping: wait for the rest.
                return Ok(None);
            }
            self.buffer.drain(..blank);
        }
        if std::mem::take(&mut self.pinged) {
            return Ok(Some(Framed::Ping));
        }
        let Some(end) = find(&self.buffer, b"\r\n\r\n") else {
            if self.buffer.len() > MAX_MESSAGE {
                return Err(SipError::Malformed("headers longer than a message".into()));
            }
            return Ok(None);
        };
        let head = std::str::from_utf8(&self.buffer[..end])
            .map_err(|_| SipError::Malformed("headers are not UTF-8".into()))?;
        let length = content_length(head)?;
        let total = end + 4 + length;
        if total > MAX_MESSAGE {
            return Err(SipError::Malformed(format!(
                "a message of {total} bytes on a stream"
            )));
        }
        if self.buffer.len() < total {
            return Ok(None);
        }
        let message: Vec<u8> = self.buffer.drain(..total).collect();
        Ok(Some(Framed::Message(message)))
    }

    /// Whether part of a message has been read and not yet all of it.
    pub fn partial(&self) -> bool {
        !self.buffer.is_empty()
    }
}

/// The Content-Length of a message's headers (its compact form `l` too); a stream needs it,
/// and one that is absent is 0.
fn content_length(head: &str) -> Result<usize, SipError> {
    let mut length = None;
    for line in head.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("l") {
            let value = value
                .trim()
                .parse::<usize>()
                .map_err(|_| SipError::Malformed(format!("Content-Length {value:?}")))?;
            if length.is_some_and(|l| l != value) {
                return Err(SipError::Malformed("two Content-Lengths".into()));
            }
            length = Some(value);
        }
    }
    Ok(length.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transports::sip::message::SipMessage;

    const OPTIONS: &str = "OPTIONS sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:5999;branch=z9hG4bK-1\r\n\
        Call-ID: probe\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n";
    const INFO: &str = "INFO sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:5999;branch=z9hG4bK-2\r\n\
        Call-ID: call\r\nCSeq: 2 INFO\r\nContent-Type: application/dtmf-relay\r\nl: 20\r\n\r\n\
        Signal=#\r\nDuration=1";

    fn drain(framer: &mut Framer) -> Vec<Framed> {
        std::iter::from_fn(|| framer.take().expect("readable")).collect()
    }

    #[test]
    fn messages_split_across_reads_or_sharing_one_come_out_whole_by_their_length() {
        let stream = format!("{OPTIONS}{INFO}{OPTIONS}");
        // Every cut of the stream into two reads gives the same three messages.
        for cut in 0..stream.len() {
            let mut framer = Framer::default();
            let mut out = Vec::new();
            for part in [&stream.as_bytes()[..cut], &stream.as_bytes()[cut..]] {
                framer.push(part).expect("room");
                out.extend(drain(&mut framer));
            }
            let expected: Vec<Framed> = [OPTIONS, INFO, OPTIONS]
                .iter()
                .map(|m| Framed::Message(m.as_bytes().to_vec()))
                .collect();
            assert_eq!(out, expected, "cut at {cut}");
            assert!(!framer.partial());
        }
        let info = SipMessage::parse(INFO.as_bytes()).expect("parses");
        assert_eq!(info.body, b"Signal=#\r\nDuration=1");
    }

    #[test]
    fn a_double_crlf_between_messages_is_a_ping_and_a_single_one_is_skipped() {
        let mut framer = Framer::default();
        framer.push(b"\r\n").expect("room");
        assert_eq!(framer.take().expect("readable"), None);
        framer.push(b"\r\n").expect("room");
        assert_eq!(framer.take().expect("readable"), Some(Framed::Ping));
        framer
            .push(format!("\r\n{OPTIONS}").as_bytes())
            .expect("room");
        assert_eq!(
            drain(&mut framer),
            vec![Framed::Message(OPTIONS.as_bytes().to_vec())]
        );
    }

    #[test]
    fn a_message_past_the_limit_or_with_a_bad_length_ends_the_stream() {
        let mut framer = Framer::default();
        let huge = OPTIONS.replace("Content-Length: 0", "Content-Length: 70000");
        framer.push(huge.as_bytes()).expect("room");
        assert!(framer.take().is_err());
        let mut framer = Framer::default();
        let bad = OPTIONS.replace("Content-Length: 0", "Content-Length: ten");
        framer.push(bad.as_bytes()).expect("room");
        assert!(framer.take().is_err());
        let mut framer = Framer::default();
        let two = OPTIONS.replace("Content-Length: 0", "Content-Length: 0\r\nl: 4");
        framer.push(two.as_bytes()).expect("room");
        assert!(framer.take().is_err());
        // Headers that never end, a message's worth: refused rather than held.
        let mut framer = Framer::default();
        let endless = format!("OPTIONS sip:a SIP/2.0\r\n{}", "X: y\r\n".repeat(11_000));
        framer.push(endless.as_bytes()).expect("room");
        assert!(framer.take().is_err());
        assert!(framer.push(&vec![b'x'; MAX_MESSAGE * 2]).is_err());
    }
}
