//! voxide's media: how audio reaches a session and leaves it.
//!
//! [`transports`] are the edges (WebRTC, WebSocket, the carriers' media streams, SIP and RTP,
//! AudioSocket, the sound card, files) with their jitter buffers and codecs; [`audio`] holds the
//! stages audio passes before anything listens to it (echo cancellation, denoising, voice
//! activity, the echo guard) and the sink the bot's voice leaves through.

// The core's modules under the names the rest of voxide knows them by.
use voxide_core::{context, events, frames, ids, pipeline, secret, text, warnings};

pub mod audio;
pub mod transports;
