//! AssemblyAI's Universal-Streaming v3 messages (`/v3/ws`), as its API documents them.

use serde::{Deserialize, Serialize};

/// A text message from the client.
#[derive(Debug, Serialize, PartialEq)]
#[serde(tag = "type")]
pub enum ClientMessage {
    /// Ends the current turn now; a final `Turn` answers it.
    ForceEndpoint,
    /// Keeps a socket with no audio open.
    KeepAlive,
    /// Ends the session: the last turns, then `Termination`.
    Terminate,
}

impl ClientMessage {
    /// The message as the JSON text AssemblyAI reads.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A message from the server.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
pub enum ServerMessage {
    /// The session is ready: audio may go.
    Begin {
        #[serde(default)]
        id: String,
    },
    /// Speech began.
    SpeechStarted,
    /// The current turn's words so far, or all of them when it ends.
    Turn(Turn),
    /// The session's summary, last.
    Termination,
    /// What went wrong, just before the server closes the socket with the same code.
    Error {
        #[serde(default)]
        error_code: Option<u16>,
        #[serde(default)]
        error: String,
    },
    /// Messages added after this was written are skipped.
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Deserialize)]
pub struct Turn {
    /// The whole turn's transcript so far.
    #[serde(default)]
    pub transcript: String,
    /// The turn ended.
    #[serde(default)]
    pub end_of_turn: bool,
    /// The transcript is formatted (with `format_turns`, an ended turn comes twice: raw, then
    /// formatted).
    #[serde(default)]
    pub turn_is_formatted: bool,
    #[serde(default)]
    pub words: Vec<Word>,
}

#[derive(Debug, Deserialize)]
pub struct Word {
    /// Milliseconds from the start of the socket's audio.
    #[serde(default)]
    pub end: u64,
}

impl Turn {
    /// Milliseconds from the socket's start to the end of the turn's last word.
    pub fn end_ms(&self) -> Option<u64> {
        self.words.iter().map(|w| w.end).max()
    }
}
