//! SmallWebRTC's own data-channel traffic, beside RTVI: keepalive pings and `signalling`
//! messages, as pipecat's server and its JS transport exchange them.
//!
//! - The client sends a text message starting with `ping` about once a second. Pipecat's server
//!   takes it as the client's pulse; a client that never pings is never judged by it.
//! - Both sides send `{"type": "signalling", "message": {...}}`: the client says `trackStatus`
//!   (`receiver_index`, `enabled`) when the user mutes or unmutes the microphone (index 0) or the
//!   camera (index 1); the server says `peerLeft` before it ends the session itself, and
//!   `renegotiate` to ask the client for a new offer.
//!
//! Transport-level messages never get an RTVI `error-response`: one that is malformed is dropped
//! and logged. Everything else is RTVI and goes to [`super::rtvi`].
//!
//! [`Liveness`] is the sans-IO clock that turns pings and connection losses into one deadline;
//! [`plan_offer`] decides what an SDP offer to `/api/offer` asks for.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The `type` of a signalling envelope.
const SIGNALLING: &str = "signalling";
/// The transceiver index of the user's microphone (the client adds audio first).
pub const AUDIO_RECEIVER: u32 = 0;

/// A signalling message, in either direction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Signal {
    /// Client → server: a track was enabled or disabled.
    TrackStatus {
        /// Which transceiver: 0 the microphone, 1 the camera, 2 the screen.
        receiver_index: u32,
        /// Whether the user's track is on.
        enabled: bool,
    },
    /// Server → client: make a new offer for this connection.
    Renegotiate,
    /// Server → client: the bot is leaving (it hung up; the network did not fail).
    PeerLeft,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    message: serde_json::Value,
}

/// What an SDP offer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfferPlan {
    /// A new connection for a new session.
    New,
    /// A new offer on the live connection it names (a track added, a codec changed).
    Renegotiate,
    /// A new connection for the live session it names (`restart_pc`): the conversation and
    /// the bot's voice carry over.
    Restart,
    /// It names a connection that does not exist and asks for no restart.
    Unknown,
}

/// What an offer of `kind` naming `pc_id` asks for, given whether that connection is `live`;
/// an offer that is not an offer is an error saying so.
///
/// A restart of a connection that is gone (the server restarted, or the session ended) is a
/// new session, as pipecat's server treats it.
pub fn plan_offer(
    kind: &str,
    pc_id: Option<&str>,
    restart_pc: bool,
    live: bool,
) -> Result<OfferPlan, String> {
    if kind != "offer" {
        return Err(format!("type must be \"offer\", not {kind:?}"));
    }
    Ok(match (pc_id, live, restart_pc) {
        (None, _, _) | (Some(_), false, true) => OfferPlan::New,
        (Some(_), true, true) => OfferPlan::Restart,
        (Some(_), true, false) => OfferPlan::Renegotiate,
        (Some(_), false, false) => OfferPlan::Unknown,
    })
}

/// What one data-channel text message is.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// The client's keepalive.
    Ping,
    /// A signalling message.
    Signal(Signal),
    /// A transport-level message that could not be read: dropped, never answered.
    BadSignal(String),
    /// Anything else: RTVI (which answers what it cannot read).
    Rtvi,
}

/// Sorts one data-channel text message.
pub fn classify(text: &str) -> Inbound {
    if text.starts_with("ping") {
        return Inbound::Ping;
    }
    // Only a JSON object whose `type` is "signalling" is ours; the rest is RTVI's to judge.
    let Ok(envelope) = serde_json::from_str::<Envelope>(text) else {
        return Inbound::Rtvi;
    };
    if envelope.kind != SIGNALLING {
        return Inbound::Rtvi;
    }
    match serde_json::from_value::<Signal>(envelope.message) {
        Ok(signal) => Inbound::Signal(signal),
        Err(e) => Inbound::BadSignal(e.to_string()),
    }
}

/// A signalling message as the server sends it.
pub fn render(signal: &Signal) -> String {
    serde_json::json!({"type": SIGNALLING, "message": signal}).to_string()
}

/// How long a pinging client may fall silent before it is taken for gone. Pipecat's server
/// notices after about 3 s; this also gives a `restart_pc` time to land.
pub const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a session whose connection failed or closed waits for a `restart_pc`.
pub const RESTART_GRACE: Duration = Duration::from_secs(5);

/// When the client is to be taken for gone: a pinging client that falls silent for
/// [`PING_TIMEOUT`], or a connection that failed and was not restarted within [`RESTART_GRACE`].
/// A client that never pings is judged by its connection alone.
#[derive(Debug, Default, Clone)]
pub struct Liveness {
    last_ping: Option<Instant>,
    lost_at: Option<Instant>,
}

impl Liveness {
    /// A client that has not pinged yet, on a live connection.
    pub fn new() -> Self {
        Self::default()
    }

    /// The client pinged at `now`.
    pub fn ping(&mut self, now: Instant) {
        self.last_ping = Some(now);
    }

    /// The connection failed or closed at `now` (the first loss counts).
    pub fn connection_lost(&mut self, now: Instant) {
        self.lost_at.get_or_insert(now);
    }

    /// Whether the connection is lost and waiting for a restart.
    pub fn is_lost(&self) -> bool {
        self.lost_at.is_some()
    }

    /// A new connection replaced the old one at `now`: the grace starts over, and a pinging
    /// client gets a full timeout to ping on the new channel.
    pub fn restarted(&mut self, now: Instant) {
        self.lost_at = None;
        if self.last_ping.is_some() {
            self.last_ping = Some(now);
        }
    }

    /// When the client is gone unless something happens first; `None` while nothing is due.
    pub fn deadline(&self) -> Option<Instant> {
        let silent = self.last_ping.map(|at| at + PING_TIMEOUT);
        let lost = self.lost_at.map(|at| at + RESTART_GRACE);
        match (silent, lost) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the client is gone at `now`.
    pub fn is_gone(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|at| now >= at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_is_new_renegotiated_restarted_or_unknown() {
        let plan = |pc_id, restart, live| plan_offer("offer", pc_id, restart, live);
        assert_eq!(plan(None, false, false), Ok(OfferPlan::New));
        assert_eq!(plan(None, true, false), Ok(OfferPlan::New));
        assert_eq!(plan(Some("pc-1"), false, true), Ok(OfferPlan::Renegotiate));
        assert_eq!(plan(Some("pc-1"), true, true), Ok(OfferPlan::Restart));
        assert_eq!(plan(Some("pc-1"), false, false), Ok(OfferPlan::Unknown));
        assert_eq!(plan(Some("pc-1"), true, false), Ok(OfferPlan::New));
        let error = plan_offer("answer", None, false, false).expect_err("not an offer");
        assert!(error.contains("\"answer\""), "{error}");
    }

    #[test]
    fn pings_are_the_transports_not_rtvi() {
        assert_eq!(classify("ping: 1732380000000"), Inbound::Ping);
        assert_eq!(classify("ping"), Inbound::Ping);
    }

    #[test]
    fn track_status_is_read_as_the_js_transport_sends_it() {
        let text = r#"{"type":"signalling","message":{"type":"trackStatus","receiver_index":0,"enabled":false}}"#;
        assert_eq!(
            classify(text),
            Inbound::Signal(Signal::TrackStatus {
                receiver_index: AUDIO_RECEIVER,
                enabled: false
            })
        );
    }

    #[test]
    fn a_malformed_signalling_message_is_dropped_not_taken_for_rtvi() {
        for bad in [
            r#"{"type":"signalling","message":{"type":"trackStatus","enabled":"yes"}}"#,
            r#"{"type":"signalling","message":{"type":"dance"}}"#,
            r#"{"type":"signalling","message":7}"#,
        ] {
            assert!(matches!(classify(bad), Inbound::BadSignal(_)), "{bad}");
        }
    }

    #[test]
    fn everything_else_is_rtvi() {
        for text in [
            r#"{"label":"rtvi-ai","type":"client-ready","id":"1","data":{}}"#,
            "not json",
            r#"{"type":"signallingx","message":{}}"#,
            "[1,2]",
        ] {
            assert_eq!(classify(text), Inbound::Rtvi, "{text}");
        }
    }

    #[test]
    fn server_signals_render_in_the_clients_shape() {
        let left: serde_json::Value =
            serde_json::from_str(&render(&Signal::PeerLeft)).expect("json");
        assert_eq!(
            left,
            serde_json::json!({"type": "signalling", "message": {"type": "peerLeft"}})
        );
        let again: serde_json::Value =
            serde_json::from_str(&render(&Signal::Renegotiate)).expect("json");
        assert_eq!(again["message"]["type"], "renegotiate");
    }

    #[test]
    fn a_client_that_never_pings_is_never_timed_out() {
        let liveness = Liveness::new();
        assert_eq!(liveness.deadline(), None);
        assert!(!liveness.is_gone(Instant::now() + Duration::from_secs(3600)));
    }

    #[test]
    fn a_pinging_client_that_falls_silent_is_gone_after_the_timeout() {
        let t0 = Instant::now();
        let mut liveness = Liveness::new();
        liveness.ping(t0);
        liveness.ping(t0 + Duration::from_secs(1));
        assert!(!liveness.is_gone(t0 + Duration::from_secs(5)));
        assert!(liveness.is_gone(t0 + Duration::from_secs(1) + PING_TIMEOUT));
    }

    #[test]
    fn a_lost_connection_waits_the_grace_and_a_restart_cancels_it() {
        let t0 = Instant::now();
        let mut liveness = Liveness::new();
        liveness.connection_lost(t0);
        liveness.connection_lost(t0 + Duration::from_secs(2));
        assert_eq!(liveness.deadline(), Some(t0 + RESTART_GRACE));
        liveness.restarted(t0 + Duration::from_secs(4));
        assert!(!liveness.is_lost());
        assert_eq!(liveness.deadline(), None);
    }

    #[test]
    fn a_restart_gives_a_pinging_client_a_fresh_timeout() {
        let t0 = Instant::now();
        let mut liveness = Liveness::new();
        liveness.ping(t0);
        liveness.restarted(t0 + Duration::from_secs(4));
        assert_eq!(
            liveness.deadline(),
            Some(t0 + Duration::from_secs(4) + PING_TIMEOUT)
        );
    }
}
