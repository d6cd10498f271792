//! A caller over SmallWebRTC, as pipecat's JS client connects: a peer connection with a
//! microphone track (Opus) and the `chat` data channel, the offer `POST`ed to `/api/offer` (or,
//! through pipecat's runner, `POST /start` and then `/sessions/{id}/api/offer`) as soon as it is
//! made, its ICE candidates trickled after the answer with `PATCH` on the same URL (batched, as
//! the JS transport's `waitForICEGathering: false` default does), RTVI `client-ready` answered
//! by `bot-ready`, the JS transport's `ping` once a second. RED is offered after Opus, as Chrome
//! offers it, and sent (with [`Plan::red`] copies in each packet) when the answer lists it
//! first. The bot's Opus is decoded and followed like any other audio.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rtc::peer_connection::configuration::RTCConfigurationBuilder;
use rtc::peer_connection::sdp::RTCSessionDescription;
use rtc::rtcp::receiver_report::ReceiverReport;
use rtc::rtcp::reception_report::ReceptionReport;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use webrtc::data_channel::{DataChannel, DataChannelEvent};
use webrtc::media_stream::track_local::TrackLocal;
use webrtc::media_stream::track_local::static_sample::TrackLocalStaticSample;
use webrtc::media_stream::track_remote::{TrackRemote, TrackRemoteEvent};
use webrtc::peer_connection::{
    PeerConnection, PeerConnectionBuilder, PeerConnectionEventHandler, RTCPeerConnectionIceEvent,
};

use super::impair::{Fate, Network};
use super::plan::{Heard, Plan};
use super::{Protocol, Recorder};
use crate::ids::random_u32;
use crate::transports::opus_in::OpusInput;
use crate::transports::red;
use crate::transports::webrtc::{AudioPayloads, Reports, audio_track, opus_media, sleep_until};

struct Events {
    /// Candidates as they are gathered, for the trickle.
    candidates: mpsc::Sender<Value>,
    heard: Arc<Mutex<Heard>>,
    recorder: Recorder,
    index: usize,
    origin: Instant,
    /// The caller's SSRC, which its receiver reports come from.
    ssrc: u32,
    /// What the network does to the bot's voice on its way here; `None`: nothing.
    received: Option<Network>,
    /// The payload types of the bot's voice, once the answer is read.
    payloads: Arc<std::sync::OnceLock<AudioPayloads>>,
}

#[async_trait::async_trait]
impl PeerConnectionEventHandler for Events {
    async fn on_ice_candidate(&self, event: RTCPeerConnectionIceEvent) {
        match event.candidate.to_json() {
            // As a browser writes it: on the first (bundled) m-line.
            Ok(init) => {
                let candidate = json!({"candidate": init.candidate, "sdp_mid": "0",
                    "sdp_mline_index": 0});
                let _ = self.candidates.send(candidate).await;
            }
            Err(e) => tracing::debug!(error = %e, "a candidate that cannot be written"),
        }
    }

    async fn on_track(&self, track: Arc<dyn TrackRemote>) {
        let Ok(input) = OpusInput::new(48_000) else {
            return;
        };
        let listener = BotVoice {
            input,
            network: self.received.clone(),
            held: BTreeMap::new(),
            next_order: 0,
            losses: Losses::default(),
            heard: self.heard.clone(),
            recorder: self.recorder.clone(),
            index: self.index,
            origin: self.origin,
            ssrc: self.ssrc,
            payloads: self.payloads.clone(),
        };
        tokio::spawn(listener.listen(track));
    }
}

/// How often a caller that loses the bot's packets on purpose reports it (RTCP receiver
/// reports, as a browser sends about once a second).
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The bot's voice as the caller hears it: through the impaired network, the caller's jitter
/// buffer and into the voice follower.
struct BotVoice {
    input: OpusInput,
    network: Option<Network>,
    /// Packets the network holds back, by when they arrive (and in what order they came).
    held: BTreeMap<(std::time::Instant, u64), rtc::rtp::Packet>,
    next_order: u64,
    losses: Losses,
    heard: Arc<Mutex<Heard>>,
    recorder: Recorder,
    index: usize,
    origin: Instant,
    ssrc: u32,
    payloads: Arc<std::sync::OnceLock<AudioPayloads>>,
}

/// The packets the impaired network lost, for the receiver reports.
#[derive(Debug, Default)]
struct Losses {
    /// Since the last report: packets that came, and those the network lost.
    came: u32,
    lost: u32,
    total_lost: u32,
    /// The sender's SSRC and its highest sequence number seen.
    source: Option<(u32, u16)>,
}

impl BotVoice {
    async fn listen(mut self, track: Arc<dyn TrackRemote>) {
        let mut reports = tokio::time::interval(REPORT_EVERY);
        loop {
            let deadline = [self.input.deadline(), self.held.keys().next().map(|k| k.0)]
                .into_iter()
                .flatten()
                .min();
            tokio::select! {
                event = track.poll() => match event {
                    Some(TrackRemoteEvent::OnRtpPacket(packet)) => self.arrive(packet),
                    Some(_) => continue,
                    None => break,
                },
                () = sleep_until(deadline), if deadline.is_some() => {}
                _ = reports.tick(), if self.network.is_some() => {
                    self.report(track.as_ref()).await;
                    continue;
                }
            }
            let now = std::time::Instant::now();
            while let Some(entry) = self.held.first_entry()
                && entry.key().0 <= now
            {
                let packet = entry.remove();
                self.play(&packet, now);
            }
            let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
            while let Some(piece) = self.input.pop(now) {
                // What was made up for time that has passed (a quiet bot's gaps, concealment)
                // is not fed: the voice follower takes each chunk as starting when it arrives.
                if !piece.sent {
                    continue;
                }
                let at = Instant::now().duration_since(self.origin).as_secs_f64();
                let changes = heard.voice.feed(&piece.samples, at);
                heard.note(changes, self.index, &self.recorder);
            }
            heard.caller_network = Some(self.input.stats().into());
        }
    }

    /// A packet off the wire, through the impaired network.
    fn arrive(&mut self, packet: rtc::rtp::Packet) {
        let now = std::time::Instant::now();
        self.losses.source = Some((packet.header.ssrc, packet.header.sequence_number));
        let fate = self.network.as_mut().map_or(
            Fate::Sent {
                delay: Duration::ZERO,
                copy: None,
            },
            Network::fate,
        );
        let Fate::Sent { delay, copy } = fate else {
            self.losses.lost += 1;
            self.losses.total_lost += 1;
            return;
        };
        self.losses.came += 1;
        for after in std::iter::once(delay).chain(copy) {
            if after.is_zero() {
                self.play(&packet, now);
            } else {
                self.held
                    .insert((now + after, self.next_order), packet.clone());
                self.next_order += 1;
            }
        }
    }

    fn play(&mut self, packet: &rtc::rtp::Packet, now: std::time::Instant) {
        let h = &packet.header;
        match self.payloads.get() {
            Some(AudioPayloads {
                red: Some(red),
                opus: Some(opus),
            }) if h.payload_type == *red => {
                self.input
                    .push_red(h.sequence_number, h.timestamp, &packet.payload, *opus, now);
            }
            _ => self
                .input
                .push(h.sequence_number, h.timestamp, &packet.payload, now),
        }
    }

    /// Tells the bot what its voice lost on the way (RFC 3550 §6.4.2's fraction lost).
    async fn report(&mut self, track: &dyn TrackRemote) {
        let Some((source, highest)) = self.losses.source else {
            return;
        };
        let sent = self.losses.came + self.losses.lost;
        let fraction_lost = (self.losses.lost * 256)
            .checked_div(sent)
            .map_or(0, |f| f.min(255) as u8);
        let report = ReceiverReport {
            ssrc: self.ssrc,
            reports: vec![ReceptionReport {
                ssrc: source,
                fraction_lost,
                total_lost: self.losses.total_lost,
                last_sequence_number: u32::from(highest),
                ..ReceptionReport::default()
            }],
            ..ReceiverReport::default()
        };
        self.losses.came = 0;
        self.losses.lost = 0;
        if let Err(e) = track.write_rtcp(vec![Box::new(report)]).await {
            tracing::debug!(error = %e, "a receiver report not sent");
        }
    }
}

/// The caller's peer connection: Opus, bound to loopback for a local server.
async fn peer_connection(
    plan: &Plan,
    events: Arc<Events>,
) -> Result<Arc<dyn PeerConnection>, String> {
    // A caller that loses the bot's packets on purpose says so in receiver reports of its own.
    let reports = if plan.received.is_clean() {
        Reports::Interceptor
    } else {
        Reports::Application
    };
    let (media, registry) = opus_media(reports).map_err(|e| failed("webrtc_setup", e))?;
    let loopback = plan.url.contains("://127.") || plan.url.contains("://localhost");
    let bind = if loopback { "127.0.0.1:0" } else { "0.0.0.0:0" };
    let runtime = webrtc::runtime::default_runtime().ok_or_else(|| "webrtc_setup".to_owned())?;
    let pc = PeerConnectionBuilder::new()
        .with_configuration(RTCConfigurationBuilder::new().build())
        .with_media_engine(media)
        .with_interceptor_registry(registry)
        .with_handler(events)
        .with_runtime(runtime)
        .with_udp_addrs(vec![bind.to_owned()])
        .build()
        .await
        .map_err(|e| failed("webrtc_setup", e))?;
    Ok(Arc::new(pc))
}

/// Makes the offer, sends it as soon as it is made (whatever candidates it has; the rest
/// trickle once the answer names the connection) and applies the answer; the answer's SDP.
async fn negotiate(
    plan: &Plan,
    pc: &dyn PeerConnection,
    candidates: mpsc::Receiver<Value>,
    heard: Arc<Mutex<Heard>>,
) -> Result<String, String> {
    let offer = pc
        .create_offer(None)
        .await
        .map_err(|e| failed("webrtc_setup", e))?;
    pc.set_local_description(offer)
        .await
        .map_err(|e| failed("webrtc_setup", e))?;
    let offer_sdp = pc
        .local_description()
        .await
        .ok_or_else(|| "webrtc_setup".to_owned())?
        .sdp;
    let traceparent = lock(&heard).traceparent.clone();
    let (answer, offer_url, node) = signal(plan, &offer_sdp, &traceparent).await?;
    lock(&heard).node = node;
    if let Some(pc_id) = answer["pc_id"].as_str() {
        let to = Trickled {
            url: offer_url,
            pc_id: pc_id.to_owned(),
            auth_token: plan.auth_token.clone(),
            heard,
        };
        tokio::spawn(trickle(to, candidates));
    }
    let sdp = answer["sdp"]
        .as_str()
        .ok_or_else(|| "offer_bad_answer".to_owned())?;
    let description =
        RTCSessionDescription::answer(sdp.to_owned()).map_err(|e| failed("offer_bad_answer", e))?;
    pc.set_remote_description(description)
        .await
        .map_err(|e| failed("offer_bad_answer", e))?;
    Ok(sdp.to_owned())
}

/// The caller's microphone track.
fn mic_track(index: usize, ssrc: u32) -> Result<Arc<TrackLocalStaticSample>, String> {
    audio_track(format!("loadtest-{index}"), "mic-audio", "microphone", ssrc)
        .map_err(|e| failed("webrtc_setup", e))
}

/// Where the server's data-channel messages go.
struct Listener {
    origin: Instant,
    index: usize,
    recorder: Recorder,
    heard: Arc<Mutex<Heard>>,
}

/// Reads the data channel: says when it opens and when the bot is ready, and records every
/// server message; a channel that closes drops the call.
async fn read_channel(
    channel: Arc<dyn DataChannel>,
    to: Listener,
    opened: oneshot::Sender<()>,
    ready: mpsc::Sender<()>,
) {
    let mut opened = Some(opened);
    while let Some(event) = channel.poll().await {
        match event {
            DataChannelEvent::OnOpen => {
                if let Some(tx) = opened.take() {
                    let _ = tx.send(());
                }
            }
            DataChannelEvent::OnMessage(message) => {
                let Ok(value) = serde_json::from_slice::<Value>(&message.data) else {
                    continue;
                };
                let Some(kind) = value["type"].as_str() else {
                    continue;
                };
                let now = Instant::now().duration_since(to.origin).as_secs_f64();
                if kind == "bot-ready" {
                    let _ = ready.try_send(());
                }
                to.recorder
                    .event(now, to.index, "server", json!({"type": kind}));
                let mut heard = to.heard.lock().unwrap_or_else(|p| p.into_inner());
                heard.event(now, kind);
                heard.message(kind, &value);
            }
            DataChannelEvent::OnClose => break,
            _ => {}
        }
    }
    to.heard.lock().unwrap_or_else(|p| p.into_inner()).closed = Some("dropped".into());
}

/// A connected WebRTC caller.
pub(super) struct Call {
    pc: Arc<dyn PeerConnection>,
    mic: Arc<TrackLocalStaticSample>,
    ssrc: u32,
    payload_type: u8,
    /// RED's payload type and the caller's packets in it, when the answer asked for it.
    red: Option<(u8, red::Sender)>,
    /// The RTP numbers of frame 0 (random, per RFC 3550).
    first_sequence: u16,
    first_timestamp: u32,
    channel: Arc<dyn DataChannel>,
    reader: tokio::task::JoinHandle<()>,
}

impl Call {
    /// Connects and waits for the bot's `bot-ready`.
    pub(super) async fn connect(
        plan: &Plan,
        index: usize,
        heard: Arc<Mutex<Heard>>,
        recorder: Recorder,
    ) -> Result<Self, String> {
        let (candidates_tx, candidates) = mpsc::channel(TRICKLE_QUEUE);
        let ssrc = 0x10ad_0000 | (index as u32 & 0xffff);
        let payloads = Arc::new(std::sync::OnceLock::new());
        let events = Arc::new(Events {
            candidates: candidates_tx,
            heard: heard.clone(),
            recorder: recorder.clone(),
            index,
            origin: plan.origin,
            ssrc,
            received: (!plan.received.is_clean()).then(|| plan.received.network(index)),
            payloads: payloads.clone(),
        });
        let pc = peer_connection(plan, events).await?;
        let mic = mic_track(index, ssrc)?;
        pc.add_track(mic.clone() as Arc<dyn TrackLocal>)
            .await
            .map_err(|e| failed("webrtc_setup", e))?;
        // The bot's receiver reports about the caller's voice queue on the track until read;
        // unread, the queue fills and webrtc-rs logs an error for every report after.
        let reports = mic.clone();
        tokio::spawn(async move { while reports.poll().await.is_some() {} });
        // pipecat's JS transport names its channel "chat".
        let channel = pc
            .create_data_channel("chat", None)
            .await
            .map_err(|e| failed("webrtc_setup", e))?;
        let answer = negotiate(plan, pc.as_ref(), candidates, heard.clone()).await?;
        let _ = payloads.set(AudioPayloads::of(&answer));
        let payloads = AudioPayloads::of(&answer);
        let payload_type = payloads.opus.unwrap_or(111);
        let red = match payloads.red {
            Some(red) if plan.red > 0 && AudioPayloads::red_first(&answer) => {
                Some((red, red::Sender::new(plan.red)))
            }
            _ => None,
        };

        let (opened_tx, opened) = oneshot::channel();
        let (ready_tx, ready) = mpsc::channel::<()>(1);
        let reader = tokio::spawn(read_channel(
            channel.clone(),
            Listener {
                origin: plan.origin,
                index,
                recorder,
                heard,
            },
            opened_tx,
            ready_tx,
        ));
        let random = random_u32();
        let call = Self {
            pc,
            mic,
            ssrc,
            payload_type,
            red,
            first_sequence: random as u16,
            first_timestamp: random.rotate_left(13),
            channel,
            reader,
        };
        call.greet(index, opened, ready).await
    }

    /// Waits for the data channel, says `client-ready` and waits for `bot-ready`.
    async fn greet(
        self,
        index: usize,
        opened: oneshot::Receiver<()>,
        mut ready: mpsc::Receiver<()>,
    ) -> Result<Self, String> {
        let call = self;
        if tokio::time::timeout(Duration::from_secs(15), opened)
            .await
            .is_err()
        {
            call.close().await;
            return Err("ice_failed".into());
        }
        let hello = json!({"label": "rtvi-ai", "type": "client-ready", "id": format!("ready-{index}"),
            "data": {"version": "1.0.0", "about": {"library": "voxide-loadtest"}}});
        if call.channel.send_text(&hello.to_string()).await.is_err() {
            call.close().await;
            return Err("dropped".into());
        }
        if tokio::time::timeout(Duration::from_secs(15), ready.recv())
            .await
            .ok()
            .flatten()
            .is_none()
        {
            call.close().await;
            return Err("no_bot_ready".into());
        }
        Ok(call)
    }

    /// Sends Opus frame `n` as one RTP packet through the network, as `fate` has it (a delayed
    /// packet goes from a task of its own, so later ones can overtake it), and the JS
    /// transport's ping once a second.
    pub(super) async fn send(&mut self, frame: &[u8], n: usize, fate: Fate) -> Result<(), ()> {
        if n.is_multiple_of(50) {
            let _ = self.channel.send_text(&format!("ping: {n}")).await;
        }
        let timestamp = self
            .first_timestamp
            .wrapping_add((n * crate::wire::OPUS_FRAME) as u32);
        // The copies go into every packet the encoder makes, lost on the way or not.
        let (payload_type, payload) = match &mut self.red {
            Some((red, sender)) => (
                *red,
                Bytes::copy_from_slice(sender.wrap(self.payload_type, timestamp, frame)),
            ),
            None => (self.payload_type, Bytes::copy_from_slice(frame)),
        };
        let Fate::Sent { delay, copy } = fate else {
            return Ok(());
        };
        let packet = rtc::rtp::Packet {
            header: rtc::rtp::Header {
                version: 2,
                marker: n == 0,
                payload_type,
                sequence_number: self.first_sequence.wrapping_add(n as u16),
                timestamp,
                ssrc: self.ssrc,
                ..Default::default()
            },
            payload,
        };
        for after in std::iter::once(delay).chain(copy) {
            if after.is_zero() {
                self.mic.write_rtp(packet.clone()).await.map_err(|_| ())?;
            } else {
                let (mic, packet) = (self.mic.clone(), packet.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = mic.write_rtp(packet).await;
                });
            }
        }
        Ok(())
    }

    /// Hangs up.
    pub(super) async fn close(self) {
        self.reader.abort();
        let _ = self.pc.close().await;
    }
}

/// The kind of a failure, with its detail in the debug log.
fn failed(kind: &str, error: impl std::fmt::Display) -> String {
    tracing::debug!(%error, kind, "the WebRTC caller failed");
    kind.to_owned()
}

/// Posts the offer the way `plan`'s protocol does; the answer, or the error's kind.
/// Candidates gathered and not yet sent, at most.
const TRICKLE_QUEUE: usize = 64;

/// How long the trickle gathers candidates into one `PATCH` (the JS transport's 200 ms).
const TRICKLE_BATCH: Duration = Duration::from_millis(200);

/// Where a connection's candidates trickle to, and where what became of them is noted.
struct Trickled {
    url: String,
    pc_id: String,
    auth_token: Option<String>,
    heard: Arc<Mutex<Heard>>,
}

fn lock(heard: &Mutex<Heard>) -> std::sync::MutexGuard<'_, Heard> {
    heard.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends the connection's candidates as they are gathered, in batches, until gathering ends
/// (the peer connection drops its handler). A refused `PATCH` is counted, not fatal: the server
/// can still learn the caller's address from its connectivity checks.
async fn trickle(to: Trickled, mut candidates: mpsc::Receiver<Value>) {
    let Ok(client) = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
    else {
        return;
    };
    while let Some(first) = candidates.recv().await {
        let mut batch = vec![first];
        let until = Instant::now() + TRICKLE_BATCH;
        while let Ok(Some(more)) = tokio::time::timeout_at(until, candidates.recv()).await {
            batch.push(more);
        }
        let body = json!({"pc_id": to.pc_id, "candidates": batch});
        let mut request = client.patch(to.url.as_str()).json(&body);
        if let Some(token) = &to.auth_token {
            request = request.bearer_auth(token);
        }
        let refused = match request.send().await {
            Ok(response) if !response.status().is_success() => {
                tracing::debug!(status = %response.status(), "the server refused trickled candidates");
                Some(response.status().as_u16())
            }
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(error = %e, "cannot trickle candidates");
                Some(0)
            }
        };
        let mut heard = lock(&to.heard);
        heard.trickle_sent += 1;
        heard.trickle_refused.extend(refused);
    }
}

/// Posts the offer (after `POST /start` for the runner's flavour); the answer, the URL it
/// was posted to (where candidates trickle) and the node that answered.
async fn signal(
    plan: &Plan,
    sdp: &str,
    traceparent: &str,
) -> Result<(Value, String, Option<String>), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(value) = reqwest::header::HeaderValue::from_str(traceparent) {
        headers.insert("traceparent", value);
    }
    if let Some(token) = &plan.auth_token {
        let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "bad_auth_token".to_owned())?;
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .default_headers(headers)
        .build()
        .map_err(|_| "webrtc_setup".to_owned())?;
    let offer_url = match plan.protocol {
        Protocol::WebRtcStart => {
            let started: Value = client
                .post(plan.url.as_str())
                .json(&json!({"enableDefaultIceServers": false}))
                .send()
                .await
                .map_err(|_| "connect_refused".to_owned())?
                .error_for_status()
                .map_err(|e| http_kind("start", e.status()))?
                .json()
                .await
                .map_err(|_| "start_bad_answer".to_owned())?;
            let id = started["sessionId"]
                .as_str()
                .ok_or_else(|| "start_bad_answer".to_owned())?;
            let base = plan.url.trim_end_matches("/start");
            format!("{base}/sessions/{id}/api/offer")
        }
        _ => plan.url.clone(),
    };
    let body = json!({"sdp": sdp, "type": "offer", "pc_id": null, "restart_pc": false,
        "requestData": {}});
    let response = client
        .post(offer_url.as_str())
        .json(&body)
        .send()
        .await
        .map_err(|_| "connect_refused".to_owned())?
        .error_for_status()
        .map_err(|e| http_kind("offer", e.status()))?;
    let node = answering_node(response.headers());
    let answer = response
        .json::<Value>()
        .await
        .map_err(|_| "offer_bad_answer".to_owned())?;
    Ok((answer, offer_url, node))
}

/// The node that answered, as a voxide server names itself.
pub(super) fn answering_node(headers: &reqwest::header::HeaderMap) -> Option<String> {
    headers
        .get("x-voxide-node")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn http_kind(step: &str, status: Option<reqwest::StatusCode>) -> String {
    match status {
        Some(status) => format!("{step}_http_{}", status.as_u16()),
        None => format!("{step}_failed"),
    }
}
