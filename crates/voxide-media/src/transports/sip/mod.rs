//! Telephone calls over SIP, without a carrier in between: a user agent that answers and places
//! calls on UDP or TCP and speaks Opus, G.722 or G.711 over RTP, sans-IO. `server::sip` drives
//! it with the sockets.
//!
//! - [`message`]: SIP messages read and written (bounded, compact headers expanded).
//! - [`sdp`]: the caller's offer read, Opus, G.722, PCMU or PCMA chosen in the caller's order
//!   (488 when none is offered), and voxide's answer with RFC 4733 telephone-events when
//!   offered.
//! - [`call`]: one answered call: the 200 OK resent until the ACK, requests within the call
//!   (BYE, re-INVITE, INFO keys, OPTIONS, CANCEL), voxide's own BYE.
//! - [`dial`]: a call voxide places: the INVITE resent, a challenge answered, the ringing
//!   given up with a CANCEL; answered, it is a [`call::Call`] like one voxide answered.
//! - [`auth`]: callers from outside the allowed networks let in by digest authentication.
//! - [`register`]: voxide as a PBX's extension: REGISTER, the digest challenge answered, the
//!   binding renewed.
//! - [`stream`]: messages cut out of a TCP stream by their Content-Length, keepalives told.
//! - [`rtp`]: packets read and written, keys of telephone-events heard once, stale or repeated
//!   packets told apart.

pub mod auth;
pub mod call;
pub mod dial;
pub mod message;
pub mod register;
pub mod rtp;
pub mod sdp;
pub mod stream;

/// Why a SIP message, an SDP offer or an RTP packet could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SipError {
    /// Not a SIP message, or a broken one.
    #[error("malformed SIP message: {0}")]
    Malformed(String),
    /// An SDP offer without what a call needs.
    #[error("unusable SDP offer: {0}")]
    BadOffer(String),
    /// A datagram that is not an RTP packet.
    #[error("not an RTP packet: {0}")]
    BadRtp(String),
}
