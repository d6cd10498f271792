//! What travels on a client's WebSocket, whatever its dialect: the messages and why one could
//! not be used.

/// A message on the socket, either way.
#[derive(Debug, Clone, PartialEq)]
pub enum WsMessage {
    /// A text message.
    Text(String),
    /// A binary message.
    Binary(Vec<u8>),
}

/// Why a client message could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FramingError {
    /// Not valid JSON, or not the expected shape.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A message type this dialect does not know.
    #[error("unknown message type {0:?}")]
    Unknown(String),
    /// Audio that cannot be PCM16 (an odd number of bytes).
    #[error("audio must be 16-bit PCM: a binary message of {0} bytes has half a sample")]
    OddAudio(usize),
    /// Audio in a format this dialect does not take.
    #[error("unsupported audio format: {0}")]
    Format(String),
}
