//! WebRTC signalling, as pipecat's SmallWebRTC clients expect it: `POST /api/offer` (new,
//! renegotiated or restarted connection), `PATCH /api/offer` (trickled ICE), `POST /start` and
//! the session-scoped `/sessions/{id}/api/offer`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rtc::peer_connection::transport::RTCIceCandidateInit;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::App;
use crate::context::Message as ChatMessage;
use crate::events::Event;
use crate::frames::{AudioFrame, DataFrame, SystemFrame};
use crate::pipeline::Session;
use crate::transports::OutputOptions;
use crate::transports::rtvi::{self, ClientMessage};
use crate::transports::webrtc::{OPUS_RATE, Peer, PeerEvent, PeerOptions, WebRtcError, connect};

/// An SDP offer.
#[derive(Debug, Deserialize)]
pub(crate) struct OfferRequest {
    sdp: String,
    #[serde(rename = "type")]
    kind: String,
    pc_id: Option<String>,
    #[serde(default)]
    restart_pc: bool,
    // `request_data` (app data the client may send) is accepted and not used.
}

#[derive(Debug, Serialize)]
struct OfferAnswer {
    sdp: String,
    #[serde(rename = "type")]
    kind: &'static str,
    pc_id: String,
}

/// Trickled ICE candidates.
#[derive(Debug, Deserialize)]
pub(crate) struct CandidatesRequest {
    pc_id: String,
    candidates: Vec<Candidate>,
}

#[derive(Debug, Deserialize)]
struct Candidate {
    candidate: String,
    sdp_mid: Option<String>,
    sdp_mline_index: Option<u16>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

fn webrtc_error(e: WebRtcError) -> Response {
    match e {
        WebRtcError::Offer(_) => error(StatusCode::BAD_REQUEST, e.to_string()),
        _ => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

pub(crate) async fn offer(
    State(app): State<Arc<App>>,
    Json(request): Json<OfferRequest>,
) -> Response {
    if request.kind != "offer" {
        return error(
            StatusCode::BAD_REQUEST,
            format!("type must be \"offer\", not {:?}", request.kind),
        );
    }
    if let Some(pc_id) = &request.pc_id {
        let known = app.lock_peers().get(pc_id).cloned();
        match known {
            Some(peer) if !request.restart_pc => {
                return match peer.renegotiate(request.sdp).await {
                    Ok(sdp) => Json(OfferAnswer {
                        sdp,
                        kind: "answer",
                        pc_id: pc_id.clone(),
                    })
                    .into_response(),
                    Err(e) => webrtc_error(e),
                };
            }
            Some(peer) => {
                // A restart replaces the connection: the old one and its session end first.
                app.lock_peers().remove(pc_id);
                peer.close().await;
            }
            None if !request.restart_pc => {
                return error(StatusCode::NOT_FOUND, format!("no connection {pc_id}"));
            }
            None => {}
        }
    }
    let admission = match app.admit() {
        Ok(admission) => admission,
        Err(refusal) => return refusal.into_response(),
    };
    let options = PeerOptions {
        bind: app.options.addr.ip(),
        ice_servers: app.options.ice_servers.clone(),
    };
    let (peer, sink, mut peer_events, sdp) = match connect(request.sdp, &options).await {
        Ok(connected) => connected,
        Err(e) => return webrtc_error(e),
    };
    let mut bot_options = app.options.bot.clone();
    bot_options.audio_out_sample_rate = OPUS_RATE;
    let bot = match crate::bot::build(&bot_options, sink, OutputOptions::default()) {
        Ok(bot) => bot,
        Err(e) => {
            peer.close().await;
            return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
        }
    };
    let builder = Session::builder(bot.pipeline).params(bot.params);
    let mut events = builder.subscribe();
    let session = builder.spawn();
    let handle = session.handle();
    admission.attach(handle.clone());

    let pc_id = format!(
        "pc-{:016x}",
        u64::from(crate::transports::webrtc::random_u32()) << 32
            | u64::from(crate::transports::webrtc::random_u32())
    );
    let peer = Arc::new(peer);
    app.lock_peers().insert(pc_id.clone(), peer.clone());

    let drive_app = app.clone();
    let drive_id = pc_id.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                event = peer_events.recv() => match event {
                    Some(PeerEvent::Audio(samples)) => {
                        let audio = AudioFrame::new(samples, OPUS_RATE, 1);
                        if handle.queue_frame(SystemFrame::InputAudio(audio)).await.is_err() {
                            break;
                        }
                    }
                    Some(PeerEvent::Message(text)) => match rtvi::parse(&text) {
                        ClientMessage::Ready(reply) | ClientMessage::Invalid(reply) => {
                            let _ = peer.outgoing.send(reply);
                        }
                        ClientMessage::Text(text) => {
                            let append = DataFrame::LlmMessagesAppend {
                                messages: vec![ChatMessage::user(text)],
                                run_llm: true,
                            };
                            let _ = handle.queue_frame(append).await;
                        }
                        ClientMessage::Disconnect => break,
                    },
                    Some(PeerEvent::Closed) | None => break,
                },
                event = events.recv() => match event {
                    Ok(event) => {
                        drive_app.metrics.observe(&event.event);
                        if matches!(event.event, Event::SessionEnded { .. }) {
                            break;
                        }
                        if let Some(message) = rtvi::render(&event.event) {
                            let _ = peer.outgoing.send(message);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => break,
                },
            }
        }
        handle.cancel();
        let _ = session.join().await;
        peer.close().await;
        drive_app.lock_peers().remove(&drive_id);
        drop(admission);
    });
    Json(OfferAnswer {
        sdp,
        kind: "answer",
        pc_id,
    })
    .into_response()
}

pub(crate) async fn candidates(
    State(app): State<Arc<App>>,
    Json(request): Json<CandidatesRequest>,
) -> Response {
    let Some(peer) = app.lock_peers().get(&request.pc_id).cloned() else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no connection {}", request.pc_id),
        );
    };
    let candidates = request
        .candidates
        .into_iter()
        .map(|c| RTCIceCandidateInit {
            candidate: c.candidate,
            sdp_mid: c.sdp_mid,
            sdp_mline_index: c.sdp_mline_index,
            ..Default::default()
        })
        .collect();
    match peer.add_candidates(candidates).await {
        Ok(()) => Json(json!({"status": "success"})).into_response(),
        Err(e) => webrtc_error(e),
    }
}

pub(crate) async fn start(State(app): State<Arc<App>>) -> Response {
    let id = format!(
        "{:08x}-{:08x}",
        crate::transports::webrtc::random_u32(),
        crate::transports::webrtc::random_u32()
    );
    let servers: Vec<Value> = app
        .options
        .ice_servers
        .iter()
        .map(|url| json!({"urls": [url]}))
        .collect();
    Json(json!({"sessionId": id, "iceConfig": {"iceServers": servers}})).into_response()
}

/// Shared type so the registry can hold peers.
pub(crate) type PeerHandle = Arc<Peer>;
