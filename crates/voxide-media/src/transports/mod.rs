//! The edges of a session: audio in, audio out.
//!
//! Every transport feeds input audio frames into its session and plays the bot's audio through
//! the shared [`AudioOutput`] stage, which paces it and stops it on interruption.

pub mod audiosocket;
pub mod carriers;
pub mod dtmf;
pub mod file;
pub mod heartbeat;
pub mod jitter;
#[cfg(feature = "local")]
pub mod local;
pub mod opus_in;
pub mod output;
pub mod pace;
pub mod phone_in;
pub mod phone_out;
pub mod red;
pub mod rtvi;
pub mod signalling;
pub mod sip;
pub mod socket;
pub mod talkspurt;
#[cfg(feature = "webrtc")]
pub mod webrtc;
pub mod websocket;

pub use output::{AudioOutput, AudioSink, OutputOptions, Pacing};
