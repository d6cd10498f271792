//! Server-sent events, as the HTML standard defines the stream: a sans-IO decoder that takes
//! bytes in whatever pieces the network gives them and returns whole events.
//!
//! Lines end in LF, CRLF or CR; a line starting with `:` is a comment (`: ping` keepalives); a
//! `data:` field loses one leading space and several of them join with LF; a blank line ends the
//! event. An event with no data is not dispatched, nor is one the stream ended in the middle of.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when there was one.
    pub event: Option<String>,
    /// The `data:` lines, joined with LF.
    pub data: String,
}

/// A line longer than this is an error: a stream that never ends a line would grow forever.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Why the stream cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line ran past [`MAX_LINE_BYTES`].
    #[error("an event-stream line is longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong,
    /// A line is not UTF-8.
    #[error("an event-stream line is not UTF-8")]
    NotUtf8,
}

/// The decoder's state between pieces.
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    /// The last byte was a CR: an LF right after it belongs to the same line end.
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
}

impl SseDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next piece of the stream; returns the events it completed.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut events = Vec::new();
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    let line = String::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
                    if let Some(event) = self.line_done(&line) {
                        events.push(event);
                    }
                }
                _ => {
                    if self.line.len() >= MAX_LINE_BYTES {
                        return Err(SseError::LineTooLong);
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(events)
    }

    fn line_done(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let data = self.data.take();
            let event = self.event.take();
            return data.map(|data| SseEvent { event, data });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "event" => self.event = Some(value.to_owned()),
            // `id` and `retry` matter to reconnecting browsers, not to one request's stream.
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces(stream: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut decoder = SseDecoder::new();
        stream
            .chunks(piece)
            .flat_map(|p| decoder.push(p).expect("valid stream"))
            .collect()
    }

    #[test]
    fn events_come_out_whole_however_the_bytes_are_split() {
        let stream = "data: {\"a\":1}\n\nevent: message_stop\ndata: {}\n\ndata: [DONE]\n\n";
        let whole = decode_in_pieces(stream.as_bytes(), stream.len());
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].data, "{\"a\":1}");
        assert_eq!(whole[1].event.as_deref(), Some("message_stop"));
        assert_eq!(whole[2].data, "[DONE]");
        for piece in 1..8 {
            assert_eq!(decode_in_pieces(stream.as_bytes(), piece), whole, "{piece}");
        }
    }

    #[test]
    fn crlf_and_cr_line_ends_comments_and_multi_line_data() {
        let stream = b": ping\r\n\r\ndata:first\r\ndata: second\r\rdata: x\r\n\r\n";
        for piece in [1, 2, 3, 100] {
            let events = decode_in_pieces(stream, piece);
            assert_eq!(events.len(), 2, "{piece}");
            assert_eq!(events[0].data, "first\nsecond");
            assert_eq!(events[1].data, "x");
        }
    }

    #[test]
    fn an_event_the_stream_ended_inside_is_not_dispatched() {
        assert!(decode_in_pieces(b"data: half", 3).is_empty());
    }

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        assert_eq!(
            SseDecoder::new().push(b"data: \xff\xfe\n\n"),
            Err(SseError::NotUtf8)
        );
        let long = vec![b'a'; MAX_LINE_BYTES + 1];
        assert_eq!(SseDecoder::new().push(&long), Err(SseError::LineTooLong));
    }
}
