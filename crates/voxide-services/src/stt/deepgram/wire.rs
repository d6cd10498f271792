//! Deepgram's live transcription messages (`/v1/listen`), as its API documents them.

use serde::Deserialize;

/// A text message from the client.
#[derive(Debug, PartialEq)]
pub enum ClientMessage {
    /// Keeps an idle socket open (Deepgram closes one silent for 10 s).
    KeepAlive,
    /// Turns what is buffered into final results; the last one answers with `from_finalize`.
    Finalize,
    /// Flushes, sends the last results and closes.
    CloseStream,
}

impl ClientMessage {
    /// The message as the JSON text Deepgram reads.
    pub fn json(&self) -> String {
        match self {
            ClientMessage::KeepAlive => r#"{"type":"KeepAlive"}"#,
            ClientMessage::Finalize => r#"{"type":"Finalize"}"#,
            ClientMessage::CloseStream => r#"{"type":"CloseStream"}"#,
        }
        .to_owned()
    }
}

/// A message from the server.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
pub enum ServerMessage {
    /// A transcript of a segment.
    Results(Results),
    /// Speech began (with `vad_events=true`).
    SpeechStarted,
    /// A gap after the last word (with `utterance_end_ms`).
    UtteranceEnd,
    /// The stream's summary, last.
    Metadata,
    /// Messages added after this was written are skipped.
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Deserialize)]
pub struct Results {
    /// Seconds from the start of this socket's audio.
    #[serde(default)]
    pub start: f64,
    #[serde(default)]
    pub duration: f64,
    /// The segment will not change again.
    #[serde(default)]
    pub is_final: bool,
    /// This final answers a `Finalize`.
    #[serde(default)]
    pub from_finalize: bool,
    pub channel: Channel,
}

#[derive(Debug, Deserialize)]
pub struct Channel {
    #[serde(default)]
    pub alternatives: Vec<Alternative>,
}

#[derive(Debug, Deserialize)]
pub struct Alternative {
    #[serde(default)]
    pub transcript: String,
}

impl Results {
    /// The best alternative's words.
    pub fn transcript(&self) -> &str {
        self.channel
            .alternatives
            .first()
            .map_or("", |a| a.transcript.trim())
    }

    /// Seconds from the socket's start to the end of this segment.
    pub fn end(&self) -> f64 {
        self.start + self.duration
    }
}
