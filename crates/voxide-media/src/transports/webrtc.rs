//! WebRTC (webrtc-rs, Opus): one peer connection per session, compatible with pipecat's
//! SmallWebRTC signalling, so its browser client works against voxide unchanged.
//!
//! The browser's microphone arrives as Opus over RTP and is decoded to 16 kHz mono input audio;
//! when the offer has RED (`red/48000/2`, RFC 2198) the answer puts it first, so Chrome sends
//! each packet with a copy of the one before and a lost packet arrives again in the next. The
//! bot's voice goes back as 20 ms Opus frames with in-band FEC. A data channel carries RTVI
//! messages (see [`super::rtvi`]).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rtc::interceptor::{
    Attribute, Interceptor, Packet as InterceptorPacket, Registry, Slot, StreamInfo, TaggedPacket,
};
use rtc::media_stream::MediaStreamTrack;
use rtc::peer_connection::configuration::RTCConfigurationBuilder;
use rtc::peer_connection::configuration::interceptor_registry::{
    configure_nack, configure_simulcast_extension_headers, configure_twcc_receiver_only,
    register_default_interceptors,
};
use rtc::peer_connection::configuration::media_engine::{MIME_TYPE_OPUS, MediaEngine};
use rtc::peer_connection::configuration::setting_engine::SettingEngineBuilder;
use rtc::peer_connection::sdp::RTCSessionDescription;
use rtc::peer_connection::transport::{RTCIceCandidateType, RTCIceServer};
use rtc::rtcp::receiver_report::ReceiverReport;
use rtc::rtp_transceiver::rtp_sender::{
    RTCRtpCodec, RTCRtpCodecParameters, RTCRtpCodingParameters, RTCRtpEncodingParameters,
    RtpCodecKind,
};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use webrtc::data_channel::{DataChannel, DataChannelEvent};
use webrtc::media_stream::track_local::static_sample::TrackLocalStaticSample;
use webrtc::media_stream::track_local::{TrackLocal, TrackLocalEvent};
use webrtc::media_stream::track_remote::{TrackRemote, TrackRemoteEvent};
use webrtc::peer_connection::{
    PeerConnection, PeerConnectionBuilder, PeerConnectionEventHandler, RTCIceGatheringState,
    RTCPeerConnectionState,
};

use super::jitter::NetworkStats;
use super::opus_in::OpusInput;
use super::output::AudioSink;
use super::red;
use super::talkspurt::Talkspurts;
use crate::ids::random_u32;

/// Opus's clock, and the rate the bot's audio is encoded from.
pub const OPUS_RATE: u32 = 48_000;
/// The rate the user's audio is decoded to: the rate the VAD, Smart Turn and the speech
/// recognisers take, so no stage has to resample it. An Opus decoder gives any of 8 to 48 kHz
/// from the same stream (RFC 6716 §2), and at 16 kHz it skips the upsampling to 48.
pub const INPUT_RATE: u32 = 16_000;
/// Samples in one 20 ms Opus frame.
const FRAME: usize = 960;
/// How long an answer waits for ICE candidates to be gathered.
const GATHER_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum WebRtcError {
    /// The offer is not usable.
    #[error("invalid offer: {0}")]
    Offer(String),
    /// webrtc-rs failed.
    #[error("WebRTC failed: {0}")]
    Rtc(String),
    /// Opus could not start.
    #[error("the Opus codec failed: {0}")]
    Opus(String),
    /// A trickled ICE candidate is not usable.
    #[error("invalid ICE candidate: {0}")]
    Candidate(String),
}

fn rtc_err(e: impl std::fmt::Display) -> WebRtcError {
    WebRtcError::Rtc(e.to_string())
}

/// What a new connection needs.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// The IP its UDP sockets bind (loopback in tests; a routable address in production).
    pub bind: IpAddr,
    /// STUN/TURN servers, as URLs; none for host candidates only.
    pub ice_servers: Vec<String>,
    /// The UDP ports a connection may bind, each its own (a firewall or a pod opens just
    /// these); none: any free port.
    pub udp_ports: Option<std::ops::RangeInclusive<u16>>,
    /// The address callers reach this host at, when it is behind a 1:1 NAT (a cloud VM's
    /// public IP, a pod's node IP): host candidates carry it instead of the bound one.
    pub public_ip: Option<IpAddr>,
    /// Asks a client that offers RED to send it (the answer lists `red/48000/2` before Opus).
    pub red: bool,
    /// When the bot's voice goes in RED, where the answer put it first.
    pub red_voice: RedVoice,
}

/// When the bot's voice goes in RED (a copy of the frame before in each packet), where the
/// answer put RED first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RedVoice {
    /// Once the client reports losing some of it (RTCP receiver reports): a clean path pays
    /// nothing.
    #[default]
    OnLoss,
    /// From the first packet, as Chrome sends its microphone: a call's first losses come
    /// before its first report.
    Always,
}

/// The payload types an answer gave the user's audio.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AudioPayloads {
    /// Opus's.
    pub opus: Option<u8>,
    /// RED's, when the answer has it.
    pub red: Option<u8>,
}

impl AudioPayloads {
    /// The payload types of Opus and RED in the audio section of `sdp`, in its own numbering.
    pub fn of(sdp: &str) -> Self {
        let mut payloads = Self::default();
        let mut audio = false;
        for line in sdp.lines() {
            if let Some(media) = line.strip_prefix("m=") {
                audio = media.starts_with("audio");
                continue;
            }
            let Some(map) = line.strip_prefix("a=rtpmap:").filter(|_| audio) else {
                continue;
            };
            let Some((number, name)) = map.split_once(' ') else {
                continue;
            };
            let Ok(number) = number.parse::<u8>() else {
                continue;
            };
            let name = name.to_ascii_lowercase();
            if name.starts_with("opus/48000") {
                payloads.opus.get_or_insert(number);
            } else if name.starts_with("red/48000") {
                payloads.red.get_or_insert(number);
            }
        }
        payloads
    }

    /// Whether the audio section of `sdp` lists RED first: what the side that reads it sends.
    pub fn red_first(sdp: &str) -> bool {
        let first = sdp
            .lines()
            .find_map(|line| line.strip_prefix("m=audio "))
            .and_then(|media| media.split_whitespace().nth(2))
            .and_then(|number| number.parse::<u8>().ok());
        first.is_some() && first == Self::of(sdp).red
    }
}

/// Where the next connection starts looking for a free port in [`PeerOptions::udp_ports`].
static NEXT_PORT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// What happens on a connection, for the session that owns it.
#[derive(Debug)]
pub enum PeerEvent {
    /// Decoded microphone audio, mono at 48 kHz.
    Audio(Vec<i16>),
    /// A data-channel text message.
    Message(String),
    /// The connection failed or closed.
    Closed,
}

/// What the data channel's writer is asked to do, in order.
enum Outgoing {
    /// Send a text message.
    Text(String),
    /// Answer once everything before has reached the client (or could not).
    Flush(oneshot::Sender<()>),
}

/// Data-channel messages a connection holds for its client.
const OUTGOING_QUEUE: usize = 1024;

/// How long a farewell waits for the data channel to deliver what was sent.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// One live peer connection.
pub struct Peer {
    connection: Arc<dyn PeerConnection>,
    /// The tasks that serve it; closing the peer (or dropping it) ends them all, so the pacer
    /// stops taking the bot's voice from a sink a restarted connection now shares.
    tasks: PeerTasks,
    /// Data-channel messages to send, in order (queued until the client opens the channel, at
    /// most [`OUTGOING_QUEUE`]: a client that takes none loses messages, not the server memory).
    outgoing: mpsc::Sender<Outgoing>,
    network: NetworkLog,
    /// Whether its answers ask for RED.
    red: bool,
}

/// The tasks of one connection: the pacer of the bot's voice, the decoder of the user's track,
/// and the data channel's sender and reader.
#[derive(Clone, Default)]
struct PeerTasks(Arc<Mutex<JoinSet<()>>>);

impl PeerTasks {
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Reap the finished ones, so a long connection holds no dead entries.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    fn abort(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).abort_all();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.tasks.abort();
    }
}

impl Peer {
    /// Queues a data-channel text message (RTVI or signalling).
    pub fn send(&self, text: String) {
        if let Err(mpsc::error::TrySendError::Full(_)) =
            self.outgoing.try_send(Outgoing::Text(text))
        {
            crate::warnings::audio_dropped("data_channel_out");
        }
    }

    /// Sends `text` and waits, at most a second, until the client has received everything sent
    /// so far: the last word before [`close`](Self::close).
    pub async fn send_last(&self, text: String) {
        let (done, flushed) = oneshot::channel();
        self.send(text);
        if self.outgoing.try_send(Outgoing::Flush(done)).is_ok() {
            let _ = tokio::time::timeout(FLUSH_TIMEOUT, flushed).await;
        }
    }

    /// Applies a renegotiation offer; returns the answer's SDP.
    pub async fn renegotiate(&self, offer_sdp: String) -> Result<String, WebRtcError> {
        answer(self.connection.as_ref(), offer_sdp, self.red).await
    }

    /// Adds trickled ICE candidates.
    pub async fn add_candidates(
        &self,
        candidates: Vec<rtc::peer_connection::transport::RTCIceCandidateInit>,
    ) -> Result<(), WebRtcError> {
        for candidate in candidates {
            self.connection
                .add_ice_candidate(candidate)
                .await
                .map_err(|e| WebRtcError::Candidate(e.to_string()))?;
        }
        Ok(())
    }

    /// What the network has done to the connection's audio so far.
    pub fn network(&self) -> NetworkReport {
        self.network.get()
    }

    /// Closes the connection and ends its tasks.
    pub async fn close(&self) {
        self.tasks.abort();
        let _ = self.connection.close().await;
    }
}

/// The bot's voice, queued for whichever connection carries it: a restarted connection takes
/// over the same sink, so the session's output never notices the swap.
#[derive(Clone, Default)]
pub struct TrackSink {
    queue: Arc<Mutex<VecDeque<i16>>>,
    /// Wakes the pacer of a quiet track when audio comes.
    queued: Arc<Notify>,
}

impl TrackSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }
}

impl AudioSink for TrackSink {
    fn write(&mut self, samples: &[i16], sample_rate: u32) {
        if sample_rate != OPUS_RATE {
            crate::warnings::warn(
                "webrtc_output_rate",
                format_args!("bot audio at {sample_rate} Hz, not 48 kHz; dropped"),
            );
            return;
        }
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(samples);
        self.queued.notify_one();
    }

    fn clear(&mut self) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

struct Handler {
    tasks: PeerTasks,
    network: NetworkLog,
    /// The user's payload types, once the answer is made.
    payloads: Arc<std::sync::OnceLock<AudioPayloads>>,
    events: mpsc::Sender<PeerEvent>,
    gathered: Mutex<Option<oneshot::Sender<()>>>,
    channel: Arc<Mutex<Option<mpsc::Receiver<Outgoing>>>>,
}

#[async_trait::async_trait]
impl PeerConnectionEventHandler for Handler {
    async fn on_ice_gathering_state_change(&self, state: RTCIceGatheringState) {
        if state == RTCIceGatheringState::Complete
            && let Some(done) = self
                .gathered
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
        {
            let _ = done.send(());
        }
    }

    async fn on_connection_state_change(&self, state: RTCPeerConnectionState) {
        tracing::debug!(%state, "peer connection state");
        if matches!(
            state,
            RTCPeerConnectionState::Failed | RTCPeerConnectionState::Closed
        ) {
            let _ = self.events.send(PeerEvent::Closed).await;
        }
    }

    async fn on_track(&self, track: Arc<dyn TrackRemote>) {
        if track.kind().await != RtpCodecKind::Audio {
            return;
        }
        let events = self.events.clone();
        let network = self.network.clone();
        let payloads = self.payloads.clone();
        self.tasks.spawn(async move {
            let input = match OpusInput::new(INPUT_RATE) {
                Ok(input) => input,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the Opus decoder");
                    return;
                }
            };
            let user = User {
                track,
                payloads,
                events,
                network,
            };
            user.listen(input).await;
        });
    }

    async fn on_data_channel(&self, channel: Arc<dyn DataChannel>) {
        let Some(mut outgoing) = self
            .channel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let events = self.events.clone();
        let sender = channel.clone();
        self.tasks.spawn(async move {
            while let Some(next) = outgoing.recv().await {
                match next {
                    Outgoing::Text(text) => {
                        // One message the channel refused (it is closing) is not the end of
                        // the ones after it: a restarted connection has a channel of its own.
                        if let Err(e) = sender.send_text(&text).await {
                            tracing::debug!(error = %e, "data-channel message not sent");
                        }
                    }
                    Outgoing::Flush(done) => {
                        // Until SCTP has every byte acknowledged, or the channel is gone.
                        while matches!(sender.outstanding_bytes().await, Ok(n) if n > 0) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        let _ = done.send(());
                    }
                }
            }
        });
        self.tasks.spawn(async move {
            while let Some(event) = channel.poll().await {
                match event {
                    DataChannelEvent::OnMessage(message) => {
                        match String::from_utf8(message.data.to_vec()) {
                            Ok(text) => {
                                let _ = events.send(PeerEvent::Message(text)).await;
                            }
                            Err(_) => tracing::debug!("binary data-channel message ignored"),
                        }
                    }
                    DataChannelEvent::OnClose => break,
                    _ => {}
                }
            }
        });
    }
}

/// The user's track, and where what it carries goes.
struct User {
    track: Arc<dyn TrackRemote>,
    payloads: Arc<std::sync::OnceLock<AudioPayloads>>,
    events: mpsc::Sender<PeerEvent>,
    network: NetworkLog,
}

impl User {
    /// Plays the track through its jitter buffer into the session: each packet as it comes,
    /// each hole at its deadline.
    async fn listen(self, mut input: OpusInput) {
        loop {
            let deadline = input.deadline();
            tokio::select! {
                event = self.track.poll() => match event {
                    Some(TrackRemoteEvent::OnRtpPacket(packet)) => self.push(&mut input, &packet),
                    Some(_) => continue,
                    None => break,
                },
                () = sleep_until(deadline), if deadline.is_some() => {}
            }
            while let Some(piece) = input.pop(Instant::now()) {
                match self.events.try_send(PeerEvent::Audio(piece.samples)) {
                    Ok(()) => {}
                    // The session fell behind: it loses 20 ms, not memory.
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        crate::warnings::audio_dropped("webrtc_in");
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            self.network.record(input.stats());
        }
    }

    /// One packet into the buffer: taken apart first when it came in RED.
    fn push(&self, input: &mut OpusInput, packet: &rtc::rtp::Packet) {
        let header = &packet.header;
        let (sequence, timestamp, now) = (header.sequence_number, header.timestamp, Instant::now());
        match self.payloads.get() {
            Some(AudioPayloads {
                red: Some(red),
                opus: Some(opus),
            }) if header.payload_type == *red => {
                input.push_red(sequence, timestamp, &packet.payload, *opus, now);
            }
            _ => input.push(sequence, timestamp, &packet.payload, now),
        }
    }
}

/// Sleeps until `deadline`, or for ever without one.
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

/// Answers `offer_sdp` with a new connection whose outgoing track plays what `sink` is given.
/// Returns the peer, the connection's events, and the answer's SDP.
pub async fn connect(
    offer_sdp: String,
    options: &PeerOptions,
    sink: &TrackSink,
) -> Result<(Peer, mpsc::Receiver<PeerEvent>, String), WebRtcError> {
    if !offer_sdp.contains("m=audio") {
        return Err(WebRtcError::Offer("the offer has no audio section".into()));
    }
    let (events_tx, events) = mpsc::channel(crate::audio::AUDIO_QUEUE);
    let (gathered_tx, gathered) = oneshot::channel();
    let (outgoing, outgoing_rx) = mpsc::channel(OUTGOING_QUEUE);
    let tasks = PeerTasks::default();
    let network = NetworkLog::default();
    let payloads = Arc::new(std::sync::OnceLock::new());
    let handler = Arc::new(Handler {
        tasks: tasks.clone(),
        network: network.clone(),
        payloads: payloads.clone(),
        events: events_tx.clone(),
        gathered: Mutex::new(Some(gathered_tx)),
        channel: Arc::new(Mutex::new(Some(outgoing_rx))),
    });
    let connection = peer_connection(options, handler).await?;
    let ssrc = random_u32();
    let track = audio_track("voxide".into(), "voxide-audio", "voxide bot", ssrc)
        .map_err(WebRtcError::Rtc)?;
    let sender = connection
        .add_track(track.clone() as Arc<dyn TrackLocal>)
        .await
        .map_err(rtc_err)?;

    let sdp = answer(connection.as_ref(), offer_sdp, options.red).await?;
    let _ = payloads.set(AudioPayloads::of(&sdp));
    let _ = tokio::time::timeout(GATHER_TIMEOUT, gathered).await;
    let sdp = connection
        .local_description()
        .await
        .map(|d| d.sdp)
        .unwrap_or(sdp);

    // The bot speaks plain Opus, even where the user sends RED.
    let payload_type = sender
        .get_parameters()
        .await
        .map_err(rtc_err)?
        .rtp_parameters
        .codecs
        .iter()
        .find(|c| c.rtp_codec.mime_type.eq_ignore_ascii_case(MIME_TYPE_OPUS))
        .map(|c| c.payload_type)
        .ok_or_else(|| WebRtcError::Rtc("no codec was negotiated for the bot's audio".into()))?;
    let mut encoder = opus::Encoder::new(OPUS_RATE, opus::Channels::Mono, opus::Application::Voip)
        .map_err(|e| WebRtcError::Opus(e.to_string()))?;
    encoder
        .set_inband_fec(true)
        .map_err(|e| WebRtcError::Opus(e.to_string()))?;
    let pacer = Pacer {
        sink: sink.clone(),
        encoder,
        track: track.clone(),
        ssrc,
        payload_type,
        red: AudioPayloads::red_first(&sdp)
            .then_some(AudioPayloads::of(&sdp).red)
            .flatten()
            .map(|red| (red, red::Sender::new(0))),
        red_voice: options.red_voice,
        network: network.clone(),
        protection: None,
    };
    tasks.spawn(pacer.run(events_tx));
    tasks.spawn(receiver_reports(track, ssrc, network.clone()));
    Ok((
        Peer {
            connection,
            tasks,
            outgoing,
            network,
            red: options.red,
        },
        events,
        sdp,
    ))
}

/// RED's MIME type.
pub const MIME_TYPE_RED: &str = "audio/red";

/// RED (RFC 2198) around Opus (payload type 111), as Chrome offers it: `a=fmtp:63 111/111`.
pub fn red_codec() -> RTCRtpCodec {
    RTCRtpCodec {
        mime_type: MIME_TYPE_RED.to_owned(),
        clock_rate: OPUS_RATE,
        channels: 2,
        sdp_fmtp_line: "111/111".to_owned(),
        rtcp_feedback: vec![],
    }
}

/// Opus at 48 kHz, as both sides send it.
pub fn opus_codec() -> RTCRtpCodec {
    RTCRtpCodec {
        mime_type: MIME_TYPE_OPUS.to_owned(),
        clock_rate: OPUS_RATE,
        channels: 2,
        sdp_fmtp_line: "minptime=10;useinbandfec=1".to_owned(),
        rtcp_feedback: vec![],
    }
}

/// Who writes the RTCP receiver reports about the audio a connection receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reports {
    /// webrtc-rs's interceptor, from the packets that arrived.
    Interceptor,
    /// The application itself (a load tester that loses packets on purpose reports the loss
    /// it made).
    Application,
}

/// A media engine that speaks Opus (payload type 111) and RED around it (63, offered after Opus
/// as Chrome offers it), with webrtc-rs's default interceptors
/// (the receiver reports' generator only when `reports` says so) and the one that lets the
/// remote's receiver reports through to the application.
pub fn opus_media(reports: Reports) -> Result<(MediaEngine, Registry), String> {
    let mut media = MediaEngine::default();
    media
        .register_codec(
            RTCRtpCodecParameters {
                rtp_codec: opus_codec(),
                payload_type: 111,
            },
            RtpCodecKind::Audio,
        )
        .map_err(|e| e.to_string())?;
    media
        .register_codec(
            RTCRtpCodecParameters {
                rtp_codec: red_codec(),
                payload_type: 63,
            },
            RtpCodecKind::Audio,
        )
        .map_err(|e| e.to_string())?;
    let registry = match reports {
        Reports::Interceptor => register_default_interceptors(Registry::new(), &mut media),
        Reports::Application => {
            let registry = configure_nack(Registry::new(), &mut media);
            configure_simulcast_extension_headers(&mut media)
                .and_then(|()| configure_twcc_receiver_only(registry, &mut media))
        }
    }
    .map_err(|e| e.to_string())?
    .with(
        Slot::from(REPORTS_SLOT),
        ReceiverReportsToApplication {
            read: VecDeque::new(),
            write: VecDeque::new(),
        },
    );
    Ok((media, registry))
}

/// An Opus track to send audio on, with the given ids and SSRC.
pub fn audio_track(
    id: String,
    stream_id: &str,
    label: &str,
    ssrc: u32,
) -> Result<Arc<TrackLocalStaticSample>, String> {
    let track = TrackLocalStaticSample::new(
        Instant::now(),
        MediaStreamTrack::new(
            id,
            stream_id.to_owned(),
            label.to_owned(),
            RtpCodecKind::Audio,
            vec![RTCRtpEncodingParameters {
                rtp_coding_parameters: RTCRtpCodingParameters {
                    ssrc: Some(ssrc),
                    ..Default::default()
                },
                codec: opus_codec(),
                ..Default::default()
            }],
        ),
    )
    .map_err(|e| e.to_string())?;
    Ok(Arc::new(track))
}

/// A peer connection that speaks Opus, with the ICE servers `options` names, bound to its
/// address, its events to `handler`.
async fn peer_connection(
    options: &PeerOptions,
    handler: Arc<Handler>,
) -> Result<Arc<dyn PeerConnection>, WebRtcError> {
    let (media, registry) = opus_media(Reports::Interceptor).map_err(WebRtcError::Rtc)?;
    let ice_servers = options
        .ice_servers
        .iter()
        .map(|url| RTCIceServer {
            urls: vec![url.clone()],
            ..Default::default()
        })
        .collect();
    let config = RTCConfigurationBuilder::new()
        .with_ice_servers(ice_servers)
        .build();
    let runtime = webrtc::runtime::default_runtime()
        .ok_or_else(|| WebRtcError::Rtc("no async runtime for webrtc-rs".into()))?;
    let mut settings = SettingEngineBuilder::new();
    if let Some(ip) = options.public_ip {
        settings = settings.with_nat_1to1_ips(vec![ip.to_string()], RTCIceCandidateType::Host);
    }
    let settings = settings.build();
    let port = udp_port(options)?;
    let connection = PeerConnectionBuilder::new()
        .with_configuration(config)
        .with_media_engine(media)
        .with_setting_engine(settings)
        .with_interceptor_registry(registry)
        .with_handler(handler)
        .with_runtime(runtime)
        .with_udp_addrs(vec![
            std::net::SocketAddr::new(options.bind, port).to_string(),
        ])
        .build()
        .await
        .map_err(rtc_err)?;
    Ok(Arc::new(connection))
}

/// A port for a new connection's UDP socket: 0 (any) without a range, else the next one in it
/// that is free right now (taken in turn, so a port just freed is not reused at once).
fn udp_port(options: &PeerOptions) -> Result<u16, WebRtcError> {
    let Some(range) = options.udp_ports.clone() else {
        return Ok(0);
    };
    let ports: Vec<u16> = range.collect();
    let start = NEXT_PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for i in 0..ports.len() {
        let port = ports[(start + i) % ports.len()];
        if std::net::UdpSocket::bind((options.bind, port)).is_ok() {
            NEXT_PORT.store(start + i + 1, std::sync::atomic::Ordering::Relaxed);
            return Ok(port);
        }
    }
    Err(WebRtcError::Rtc(format!(
        "every UDP port of --webrtc-udp-ports is in use ({} connections)",
        ports.len()
    )))
}

/// Sends the bot's voice as talkspurts: 20 ms of Opus at a time while it speaks, nothing while
/// it is quiet ([`Talkspurts`]).
struct Pacer {
    sink: TrackSink,
    encoder: opus::Encoder,
    track: Arc<TrackLocalStaticSample>,
    ssrc: u32,
    payload_type: u8,
    /// RED's payload type and the voice in it, where the answer put RED first; it carries
    /// copies while the client reports loss ([`Protection::copies`]).
    red: Option<(u8, red::Sender)>,
    /// Whether those copies wait for a loss report.
    red_voice: RedVoice,
    /// Where the client's loss reports arrive.
    network: NetworkLog,
    /// The FEC and bitrate the encoder runs at now; `None` before the first packet (Opus's own
    /// defaults: a bitrate of twice what speech needs here).
    protection: Option<Protection>,
}

impl Pacer {
    /// Runs until the session stops listening (`unheard` closes) or the track closes.
    async fn run(mut self, unheard: mpsc::Sender<PeerEvent>) {
        let random = random_u32();
        let mut spurts = Talkspurts::new(random as u16, random.rotate_left(11));
        let mut packet = vec![0u8; 1500];
        loop {
            match spurts.due() {
                Some(due) => tokio::select! {
                    () = tokio::time::sleep_until(due.into()) => {}
                    () = unheard.closed() => break,
                },
                None => tokio::select! {
                    () = self.sink.queued.notified() => {}
                    () = unheard.closed() => break,
                },
            }
            let (header, frame) = {
                let mut queue = self.sink.queue.lock().unwrap_or_else(|p| p.into_inner());
                let Some(header) = spurts.poll(Instant::now(), !queue.is_empty()) else {
                    continue;
                };
                let take = FRAME.min(queue.len());
                let mut frame: Vec<i16> = queue.drain(..take).collect();
                frame.resize(FRAME, 0);
                (header, frame)
            };
            self.protect();
            let Ok(n) = self.encoder.encode(&frame, &mut packet) else {
                continue;
            };
            let (payload_type, payload) = match &mut self.red {
                Some((red, sender)) if sender.copies() > 0 => (
                    *red,
                    sender.wrap(self.payload_type, header.timestamp, &packet[..n]),
                ),
                _ => (self.payload_type, &packet[..n]),
            };
            let rtp = rtc::rtp::Packet {
                header: rtc::rtp::Header {
                    version: 2,
                    marker: header.marker,
                    payload_type,
                    sequence_number: header.sequence_number,
                    timestamp: header.timestamp,
                    ssrc: self.ssrc,
                    ..Default::default()
                },
                payload: Bytes::copy_from_slice(payload),
            };
            if let Err(e) = self.track.write_rtp(rtp).await {
                tracing::debug!(error = %e, "the bot's audio track closed");
                break;
            }
        }
    }
}

impl Pacer {
    /// Sets the encoder for the loss the client last reported, when that changed its setting.
    fn protect(&mut self) {
        let wanted =
            Protection::for_loss(self.network.get().sent_loss.unwrap_or(0.0)).with(self.red_voice);
        if self.protection == Some(wanted) {
            return;
        }
        let set = self
            .encoder
            .set_packet_loss_perc(wanted.loss_percent)
            .and_then(|()| {
                self.encoder
                    .set_bitrate(opus::Bitrate::Bits(wanted.bits_per_second))
            });
        match set {
            Ok(()) => self.protection = Some(wanted),
            Err(e) => tracing::debug!(error = %e, "cannot set the Opus encoder's protection"),
        }
        if let Some((_, sender)) = &mut self.red {
            sender.set_copies(wanted.copies);
        }
    }
}

/// How the bot's voice is protected against the loss the client reports: Opus in-band FEC
/// sized for that loss, a bitrate that leaves it room without growing without bound, and, where
/// the client takes RED, a copy of the frame before in each packet once any loss is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Protection {
    /// The loss the encoder expects, in percent (`OPUS_SET_PACKET_LOSS_PERC`).
    loss_percent: i32,
    bits_per_second: i32,
    /// Copies of earlier frames in each packet (RED).
    copies: usize,
}

impl Default for Protection {
    /// Before any report: no loss expected, and the bitrate of a clean path.
    fn default() -> Self {
        Self::for_loss(0.0)
    }
}

impl Protection {
    /// For a loss of `fraction` (0 to 1), rounded to whole percent and capped at 25 %.
    fn for_loss(fraction: f64) -> Self {
        let loss_percent = ((fraction * 100.0).round() as i32).clamp(0, 25);
        // 24 kb/s of wideband speech; FEC's redundant copy takes up to a third more.
        let bits_per_second = match loss_percent {
            0 => 24_000,
            1..=4 => 28_000,
            _ => 32_000,
        };
        Self {
            loss_percent,
            bits_per_second,
            copies: usize::from(loss_percent > 0),
        }
    }

    /// With a copy in each packet whatever the loss, when `red_voice` says so.
    fn with(mut self, red_voice: RedVoice) -> Self {
        if red_voice == RedVoice::Always {
            self.copies = self.copies.max(1);
        }
        self
    }
}

/// What the network has done to one connection: the user's audio as the jitter buffer saw
/// it, and the loss the client reports of the bot's voice.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct NetworkReport {
    /// The user's audio.
    pub incoming: NetworkStats,
    /// The share of the bot's voice lost on the way to the client, smoothed (RTCP receiver
    /// reports); `None` before the first report.
    pub sent_loss: Option<f64>,
}

/// A connection's [`NetworkReport`], written by its tasks and read by its session.
#[derive(Clone, Default)]
pub struct NetworkLog(Arc<Mutex<NetworkReport>>);

impl NetworkLog {
    fn get(&self) -> NetworkReport {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, incoming: NetworkStats) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).incoming = incoming;
    }

    /// Takes one receiver report's fraction lost (0 to 1): a rise is believed at once, a fall
    /// a fifth at a time, so one lucky second does not drop the protection.
    fn reported_loss(&self, fraction: f64) {
        let mut report = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let smoothed = match report.sent_loss {
            Some(last) if fraction < last => 0.8 * last + 0.2 * fraction,
            _ => fraction,
        };
        report.sent_loss = Some(smoothed);
    }
}

/// Reads the client's RTCP receiver reports about the bot's voice (`ssrc`) into `network`.
async fn receiver_reports(track: Arc<TrackLocalStaticSample>, ssrc: u32, network: NetworkLog) {
    while let Some(event) = track.poll().await {
        let TrackLocalEvent::OnRtcpPacket(packets) = event else {
            continue;
        };
        for packet in &packets {
            let Some(report) = packet.as_any().downcast_ref::<ReceiverReport>() else {
                continue;
            };
            for block in report.reports.iter().filter(|b| b.ssrc == ssrc) {
                network.reported_loss(f64::from(block.fraction_lost) / 256.0);
            }
        }
    }
}

/// Lets the receiver reports the remote sends through to the application (the interceptors
/// that act on RTCP have read them by then): they tell how much of the bot's voice is lost.
struct ReceiverReportsToApplication {
    read: VecDeque<TaggedPacket>,
    write: VecDeque<TaggedPacket>,
}

impl rtc::sansio::Protocol<TaggedPacket, TaggedPacket, ()> for ReceiverReportsToApplication {
    type Rout = TaggedPacket;
    type Wout = TaggedPacket;
    type Eout = ();
    type Error = rtc::shared::error::Error;
    type Time = Instant;

    fn handle_read(&mut self, mut msg: TaggedPacket) -> Result<(), Self::Error> {
        if let InterceptorPacket::Rtcp(packets) = &msg.message.packet
            && packets.iter().any(|p| p.as_any().is::<ReceiverReport>())
        {
            msg.message.add(Attribute::DeliverToApplication);
        }
        self.read.push_back(msg);
        Ok(())
    }

    fn poll_read(&mut self) -> Option<TaggedPacket> {
        self.read.pop_front()
    }

    fn handle_write(&mut self, msg: TaggedPacket) -> Result<(), Self::Error> {
        self.write.push_back(msg);
        Ok(())
    }

    fn poll_write(&mut self) -> Option<TaggedPacket> {
        self.write.pop_front()
    }
}

impl Interceptor for ReceiverReportsToApplication {
    fn bind_local_stream(&mut self, _info: &StreamInfo) {}
    fn unbind_local_stream(&mut self, _info: &StreamInfo) {}
    fn bind_remote_stream(&mut self, _info: &StreamInfo) {}
    fn unbind_remote_stream(&mut self, _info: &StreamInfo) {}
}

/// The slot of [`ReceiverReportsToApplication`]: after every default interceptor.
const REPORTS_SLOT: usize = 14_000;

/// Answers `offer_sdp`; with `red`, RED first where the offer has it, so the client sends it.
async fn answer(
    connection: &dyn PeerConnection,
    offer_sdp: String,
    red: bool,
) -> Result<String, WebRtcError> {
    let offers_red = AudioPayloads::of(&offer_sdp).red.is_some();
    let offer =
        RTCSessionDescription::offer(offer_sdp).map_err(|e| WebRtcError::Offer(e.to_string()))?;
    connection
        .set_remote_description(offer)
        .await
        .map_err(|e| WebRtcError::Offer(e.to_string()))?;
    if red && offers_red {
        let preferred = [(red_codec(), 63), (opus_codec(), 111)]
            .map(|(rtp_codec, payload_type)| RTCRtpCodecParameters {
                rtp_codec,
                payload_type,
            })
            .to_vec();
        for transceiver in connection.get_transceivers().await {
            // A transceiver of another kind refuses audio codecs; it keeps its own.
            if let Err(e) = transceiver.set_codec_preferences(preferred.clone()).await {
                tracing::debug!(error = %e, "codec preferences not set");
            }
        }
    }
    let answer = connection.create_answer(None).await.map_err(rtc_err)?;
    let sdp = answer.sdp.clone();
    connection
        .set_local_description(answer)
        .await
        .map_err(rtc_err)?;
    Ok(sdp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bot_protects_its_voice_for_the_loss_the_client_reports_believing_a_rise_at_once() {
        let log = NetworkLog::default();
        assert_eq!(log.get().sent_loss, None);
        assert_eq!(Protection::default(), Protection::for_loss(0.0));
        log.reported_loss(0.10);
        assert_eq!(log.get().sent_loss, Some(0.10));
        let lossy = Protection::for_loss(0.10);
        assert_eq!(lossy.loss_percent, 10);
        assert!(lossy.bits_per_second > Protection::default().bits_per_second);
        // A client that takes RED gets a copy of the frame before once it reports loss, or from
        // the first packet when told so; the copies never replace what the loss asks for.
        assert_eq!((Protection::default().copies, lossy.copies), (0, 1));
        let always = Protection::default().with(RedVoice::Always);
        assert_eq!(always.copies, 1);
        assert_eq!(
            always.bits_per_second,
            Protection::default().bits_per_second
        );
        assert_eq!(lossy.with(RedVoice::Always), lossy);
        assert_eq!(Protection::default().with(RedVoice::OnLoss).copies, 0);
        // One clean report lowers the expectation a fifth of the way, not to nothing.
        log.reported_loss(0.0);
        let after = log.get().sent_loss.expect("a loss");
        assert!((after - 0.08).abs() < 1e-9, "{after}");
        assert_eq!(Protection::for_loss(0.9).loss_percent, 25, "capped");
        assert_eq!(
            Protection::for_loss(0.9).bits_per_second,
            lossy.bits_per_second,
            "the bitrate stops growing"
        );
    }

    #[test]
    fn each_connection_takes_a_free_port_of_the_range_and_a_full_range_says_so() {
        let taken = std::net::UdpSocket::bind("127.0.0.1:0").expect("a port");
        let busy = taken.local_addr().expect("an address").port();
        let options = |ports| PeerOptions {
            bind: [127, 0, 0, 1].into(),
            ice_servers: Vec::new(),
            udp_ports: Some(ports),
            public_ip: None,
            red: true,
            red_voice: RedVoice::OnLoss,
        };
        assert!(
            udp_port(&options(busy..=busy)).is_err(),
            "its one port is taken"
        );
        let free = std::net::UdpSocket::bind("127.0.0.1:0").expect("a port");
        let open = free.local_addr().expect("an address").port();
        drop(free);
        let (low, high) = (busy.min(open), busy.max(open));
        let range = options(low..=high);
        for _ in 0..3 {
            let port = udp_port(&range).expect("a free port");
            assert!((low..=high).contains(&port) && port != busy, "{port}");
        }
        let any = PeerOptions {
            udp_ports: None,
            ..options(1..=1)
        };
        assert_eq!(udp_port(&any).expect("any"), 0);
    }

    /// The audio section of Chrome's offer, as it writes it (trimmed).
    const CHROME_OFFER: &str = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126\r\n\
        a=rtpmap:111 opus/48000/2\r\na=fmtp:111 minptime=10;useinbandfec=1\r\n\
        a=rtpmap:63 red/48000/2\r\na=fmtp:63 111/111\r\na=rtpmap:9 G722/8000\r\n\
        m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=rtpmap:63 other/90000\r\n";

    #[test]
    fn the_payload_types_of_opus_and_red_are_read_from_the_audio_section_and_red_first_seen() {
        assert_eq!(
            AudioPayloads::of(CHROME_OFFER),
            AudioPayloads {
                opus: Some(111),
                red: Some(63)
            }
        );
        assert!(
            !AudioPayloads::red_first(CHROME_OFFER),
            "Chrome offers Opus first"
        );
        let answer = "m=audio 9 UDP/TLS/RTP/SAVPF 63 111\r\na=rtpmap:63 red/48000/2\r\n\
            a=rtpmap:111 opus/48000/2\r\n";
        assert!(AudioPayloads::red_first(answer));
        assert_eq!(
            AudioPayloads::of("m=audio 9 RTP/AVP 0\r\n"),
            AudioPayloads::default()
        );
    }
}
