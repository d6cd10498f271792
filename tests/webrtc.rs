//! WebRTC end to end over loopback: a webrtc-rs client plays the shipped question as Opus
//! through `POST /api/offer`, talks RTVI on the data channel, and hears the bot answer on the
//! returned track. Plus the signalling's bad inputs. Needs the models (`scripts/setup.sh`).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rtc::interceptor::Registry;
use rtc::media::Sample;
use rtc::media_stream::MediaStreamTrack;
use rtc::peer_connection::configuration::RTCConfigurationBuilder;
use rtc::peer_connection::configuration::interceptor_registry::register_default_interceptors;
use rtc::peer_connection::configuration::media_engine::{MIME_TYPE_OPUS, MediaEngine};
use rtc::peer_connection::sdp::RTCSessionDescription;
use rtc::rtp_transceiver::rtp_sender::{
    RTCRtpCodec, RTCRtpCodecParameters, RTCRtpCodingParameters, RTCRtpEncodingParameters,
    RtpCodecKind,
};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use webrtc::data_channel::DataChannelEvent;
use webrtc::media_stream::track_local::TrackLocal;
use webrtc::media_stream::track_local::static_sample::TrackLocalStaticSample;
use webrtc::media_stream::track_remote::{TrackRemote, TrackRemoteEvent};
use webrtc::peer_connection::{
    PeerConnection, PeerConnectionBuilder, PeerConnectionEventHandler, RTCIceGatheringState,
};

use common::{HELLO, request, start};
use voxide::audio::resample::StreamResampler;
use voxide::audio::wav;

struct Client {
    gathered: std::sync::Mutex<Option<oneshot::Sender<()>>>,
    loud: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl PeerConnectionEventHandler for Client {
    async fn on_ice_gathering_state_change(&self, state: RTCIceGatheringState) {
        if state == RTCIceGatheringState::Complete
            && let Some(done) = self.gathered.lock().expect("lock").take()
        {
            let _ = done.send(());
        }
    }

    async fn on_track(&self, track: Arc<dyn TrackRemote>) {
        let loud = self.loud.clone();
        tokio::spawn(async move {
            let mut decoder =
                opus::Decoder::new(48_000, opus::Channels::Mono).expect("opus decoder");
            let mut pcm = vec![0i16; 5760];
            while let Some(event) = track.poll().await {
                if let TrackRemoteEvent::OnRtpPacket(packet) = event
                    && let Ok(n) = decoder.decode(&packet.payload, &mut pcm, false)
                {
                    let count = pcm[..n].iter().filter(|s| s.unsigned_abs() > 1000).count();
                    loud.fetch_add(count, Ordering::Relaxed);
                }
            }
        });
    }
}

fn opus_codec() -> RTCRtpCodec {
    RTCRtpCodec {
        mime_type: MIME_TYPE_OPUS.to_owned(),
        clock_rate: 48_000,
        channels: 2,
        sdp_fmtp_line: "minptime=10;useinbandfec=1".to_owned(),
        rtcp_feedback: vec![],
    }
}

/// A webrtc-rs client connected to voxide: a microphone track, the data channel, and what
/// comes back on both.
struct Connected {
    pc: Arc<dyn PeerConnection>,
    pc_id: String,
    mic: Arc<TrackLocalStaticSample>,
    ssrc: u32,
    payload_type: u8,
    channel: Arc<dyn webrtc::data_channel::DataChannel>,
    /// Data-channel messages from the server, JSON or not.
    messages: mpsc::UnboundedReceiver<String>,
    /// Fires once the data channel is open.
    opened: Option<oneshot::Receiver<()>>,
    /// Samples of the bot's voice louder than silence.
    loud: Arc<AtomicUsize>,
    encoder: opus::Encoder,
    seen: Vec<String>,
    /// Sends the JS transport's keepalive once a second while playing.
    pinging: bool,
}

impl Connected {
    async fn new(addr: std::net::SocketAddr) -> Self {
        Self::offer_at(addr, "/api/offer").await
    }

    /// Connects with an offer to `path`.
    async fn offer_at(addr: std::net::SocketAddr, path: &str) -> Self {
        let mut media = MediaEngine::default();
        media
            .register_codec(
                RTCRtpCodecParameters {
                    rtp_codec: opus_codec(),
                    payload_type: 111,
                },
                RtpCodecKind::Audio,
            )
            .expect("codec");
        let registry =
            register_default_interceptors(Registry::new(), &mut media).expect("registry");
        let (gathered_tx, gathered) = oneshot::channel();
        let loud = Arc::new(AtomicUsize::new(0));
        let client = Arc::new(Client {
            gathered: std::sync::Mutex::new(Some(gathered_tx)),
            loud: loud.clone(),
        });
        let pc: Arc<dyn PeerConnection> = Arc::new(
            PeerConnectionBuilder::new()
                .with_configuration(RTCConfigurationBuilder::new().build())
                .with_media_engine(media)
                .with_interceptor_registry(registry)
                .with_handler(client)
                .with_runtime(webrtc::runtime::default_runtime().expect("runtime"))
                .with_udp_addrs(vec!["127.0.0.1:0".to_owned()])
                .build()
                .await
                .expect("peer connection"),
        );
        let ssrc = 0x5eed_u32;
        let mic = Arc::new(
            TrackLocalStaticSample::new(
                Instant::now(),
                MediaStreamTrack::new(
                    "mic".into(),
                    "mic-audio".into(),
                    "microphone".into(),
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
            .expect("track"),
        );
        let sender = pc
            .add_track(mic.clone() as Arc<dyn TrackLocal>)
            .await
            .expect("add track");
        // pipecat's JS transport names its channel "chat".
        let channel = pc
            .create_data_channel("chat", None)
            .await
            .expect("data channel");
        let offer = pc.create_offer(None).await.expect("offer");
        pc.set_local_description(offer)
            .await
            .expect("local description");
        let _ = tokio::time::timeout(Duration::from_secs(3), gathered).await;
        let offer_sdp = pc.local_description().await.expect("offer").sdp;

        let body = json!({"sdp": offer_sdp, "type": "offer"}).to_string();
        let (status, answer) = request(addr, "POST", path, &body).await;
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).expect("JSON answer");
        assert_eq!(answer["type"], "answer");
        let pc_id = answer["pc_id"].as_str().expect("pc_id").to_owned();
        pc.set_remote_description(
            RTCSessionDescription::answer(answer["sdp"].as_str().expect("sdp").to_owned())
                .expect("answer"),
        )
        .await
        .expect("remote description");

        let (messages_tx, messages) = mpsc::unbounded_channel();
        let (opened_tx, opened) = oneshot::channel();
        {
            let channel = channel.clone();
            tokio::spawn(async move {
                let mut opened_tx = Some(opened_tx);
                while let Some(event) = channel.poll().await {
                    match event {
                        DataChannelEvent::OnOpen => {
                            if let Some(tx) = opened_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                        DataChannelEvent::OnMessage(message) => {
                            let text = String::from_utf8_lossy(&message.data).into_owned();
                            let _ = messages_tx.send(text);
                        }
                        DataChannelEvent::OnClose => break,
                        _ => {}
                    }
                }
            });
        }
        let payload_type = sender
            .get_parameters()
            .await
            .expect("parameters")
            .rtp_parameters
            .codecs
            .first()
            .map(|c| c.payload_type)
            .expect("negotiated codec");
        let encoder = opus::Encoder::new(48_000, opus::Channels::Mono, opus::Application::Voip)
            .expect("encoder");
        Self {
            pc,
            pc_id,
            mic,
            ssrc,
            payload_type,
            channel,
            messages,
            opened: Some(opened),
            loud,
            encoder,
            seen: Vec::new(),
            pinging: false,
        }
    }

    /// Waits for the data channel to open, then says `client-ready`.
    async fn ready(&mut self) {
        if let Some(opened) = self.opened.take() {
            tokio::time::timeout(Duration::from_secs(20), opened)
                .await
                .expect("the data channel opens")
                .expect("the data channel opens");
        }
        self.send(
            json!({"label": "rtvi-ai", "type": "client-ready", "id": "r1",
            "data": {"version": "1.0.0"}}),
        )
        .await;
    }

    async fn send(&self, message: Value) {
        self.send_text(&message.to_string()).await;
    }

    async fn send_text(&self, text: &str) {
        self.channel.send_text(text).await.expect("send");
    }

    /// The microphone's track status, as pipecat's JS transport sends it.
    async fn microphone(&self, enabled: bool) {
        self.send(json!({"type": "signalling",
            "message": {"type": "trackStatus", "receiver_index": 0, "enabled": enabled}}))
            .await;
    }

    fn collect(&mut self) {
        while let Ok(message) = self.messages.try_recv() {
            self.seen.push(message);
        }
    }

    /// The server's messages so far, as JSON.
    fn seen_json(&mut self) -> Vec<Value> {
        self.collect();
        self.seen
            .iter()
            .filter_map(|m| serde_json::from_str(m).ok())
            .collect()
    }

    fn types(&mut self) -> Vec<String> {
        self.seen_json()
            .iter()
            .filter_map(|m| m["type"].as_str().map(str::to_owned))
            .collect()
    }

    /// Plays `audio` (48 kHz mono) as Opus at real-time pace until it ends or `done` holds.
    async fn play(&mut self, audio: &[i16], done: impl Fn(&mut Self) -> bool) {
        let mut packet = vec![0u8; 1500];
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        for (k, frame) in audio.chunks_exact(960).enumerate() {
            tick.tick().await;
            if self.pinging && k % 50 == 0 {
                self.send_text(&format!("ping: {k}")).await;
            }
            let n = self.encoder.encode(frame, &mut packet).expect("encode");
            let sample = Sample {
                data: Bytes::copy_from_slice(&packet[..n]),
                duration: Duration::from_millis(20),
                ..Sample::new(Instant::now())
            };
            let _ = self
                .mic
                .sample_writer(self.ssrc, self.payload_type)
                .write_sample(&sample)
                .await;
            if done(self) {
                break;
            }
        }
    }

    /// Waits, playing silence, until a message of `kind` has come.
    async fn wait_for(&mut self, kind: &str, seconds: u64) {
        let silence = vec![0i16; 48 * 20 * 50 * seconds as usize];
        self.play(&silence, |c| c.types().iter().any(|t| t == kind))
            .await;
        let types = self.types();
        assert!(types.iter().any(|t| t == kind), "no {kind}: {types:?}");
    }
}

/// The shipped question at 48 kHz.
fn question() -> Vec<i16> {
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut up = StreamResampler::new(16_000, 48_000).expect("resampler");
    up.process(&hello)
}

fn heard_the_question(seen: &[Value]) -> bool {
    seen.iter().any(|m| {
        m["type"] == "user-transcription"
            && m["data"]["final"] == true
            && m["data"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("weather"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webrtc_client_hears_the_bot_answer() {
    let server = start(2).await;
    let addr = server.addr;
    let mut client = Connected::new(addr).await;
    client.ready().await;
    // What pipecat's JS transport sends beside RTVI: its keepalive once a second, and the
    // tracks' status.
    client.pinging = true;
    client.microphone(true).await;
    client
        .send(json!({"type": "signalling",
            "message": {"type": "trackStatus", "receiver_index": 1, "enabled": false}}))
        .await;
    client
        .send_text(r#"{"label":"rtvi-ai","type":"dance","id":"d1"}"#)
        .await;

    // The question, then silence while the bot answers. Under load the bot may start on the
    // first sentence ("Hello there.") before the question: wait for both the question's
    // transcript and the bot's voice.
    let mut audio = question();
    audio.extend(vec![0; 48_000 * 30]);
    client
        .play(&audio, |c| {
            c.loud.load(Ordering::Relaxed) > 20_000 && heard_the_question(&c.seen_json())
        })
        .await;
    let seen = client.seen_json();
    let kinds = client.types();
    assert!(
        seen.iter()
            .any(|m| m["type"] == "bot-ready" && m["id"] == "r1"),
        "{kinds:?}"
    );
    // The one error is the unknown RTVI message's: pings and signalling are no errors.
    let errors: Vec<&Value> = seen
        .iter()
        .filter(|m| m["type"] == "error-response")
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["id"], "d1");
    assert!(
        kinds.iter().any(|k| k == "user-started-speaking"),
        "{kinds:?}"
    );
    assert!(heard_the_question(&seen), "{seen:?}");
    assert!(
        kinds.iter().any(|k| k == "bot-started-speaking"),
        "{kinds:?}"
    );
    assert!(
        client.loud.load(Ordering::Relaxed) > 20_000,
        "the bot's voice came back over the track"
    );

    // Trickled candidates for a live connection are taken; an unknown one is a 404.
    let patch = json!({"pc_id": client.pc_id, "candidates": []}).to_string();
    assert_eq!(request(addr, "PATCH", "/api/offer", &patch).await.0, 200);
    // A candidate that cannot be used is the client's error, and so are too many at once.
    let candidate = |line: String| json!({"candidate": line, "sdp_mid": "0", "sdp_mline_index": 0});
    let bad =
        json!({"pc_id": client.pc_id, "candidates": [candidate("candidate:nonsense".into())]});
    assert_eq!(
        request(addr, "PATCH", "/api/offer", &bad.to_string())
            .await
            .0,
        400
    );
    let many: Vec<Value> = (0..33)
        .map(|i| {
            candidate(format!(
                "candidate:{i} 1 udp 2130706431 127.0.0.1 {} typ host",
                20_000 + i
            ))
        })
        .collect();
    let many = json!({"pc_id": client.pc_id, "candidates": many});
    assert_eq!(
        request(addr, "PATCH", "/api/offer", &many.to_string())
            .await
            .0,
        400
    );
    // Restarts past the session's burst are refused until its allowance refills.
    let restart = json!({"sdp": "v=0", "type": "offer", "pc_id": client.pc_id, "restart_pc": true});
    let mut statuses = Vec::new();
    for _ in 0..=voxide::server::CHANGE_BURST {
        statuses.push(
            request(addr, "POST", "/api/offer", &restart.to_string())
                .await
                .0,
        );
    }
    assert!(
        statuses[..statuses.len() - 1].iter().all(|s| *s == 400),
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    let _ = client.pc.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_muted_microphone_starts_no_turn_and_unmuting_brings_the_turns_back() {
    let server = start(2).await;
    let mut client = Connected::new(server.addr).await;
    client.ready().await;
    client.wait_for("bot-ready", 20).await;

    // Muted: the question reaches the server and is not listened to.
    client.microphone(false).await;
    client.wait_for("user-mute-started", 5).await;
    let mut audio = question();
    audio.extend(vec![0; 48_000 * 3]);
    client.play(&audio, |_| false).await;
    let kinds = client.types();
    assert!(
        !kinds.iter().any(|k| k == "user-started-speaking"),
        "a turn started on a muted microphone: {kinds:?}"
    );
    assert!(!heard_the_question(&client.seen_json()), "{kinds:?}");

    // Unmuted: the same question starts a turn and is heard.
    client.microphone(true).await;
    client.wait_for("user-mute-stopped", 5).await;
    let mut audio = question();
    audio.extend(vec![0; 48_000 * 30]);
    client
        .play(&audio, |c| heard_the_question(&c.seen_json()))
        .await;
    let kinds = client.types();
    assert!(
        kinds.iter().any(|k| k == "user-started-speaking"),
        "{kinds:?}"
    );
    assert!(heard_the_question(&client.seen_json()), "{kinds:?}");
    let _ = client.pc.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_pinging_is_gone_within_seconds() {
    let server = start(2).await;
    let addr = server.addr;
    let mut client = Connected::new(addr).await;
    client.ready().await;
    client.wait_for("bot-ready", 20).await;
    for k in 0..3 {
        client.send_text(&format!("ping: {k}")).await;
        client.play(&vec![0i16; 48_000], |_| false).await;
    }
    // The client falls silent with its connection up (a frozen or closed tab).
    let stopped = Instant::now();
    let status = loop {
        let (_, body) = request(addr, "GET", "/status", "").await;
        let status: Value = serde_json::from_str(&body).expect("status JSON");
        if status["sessions"] == 0 || stopped.elapsed() > Duration::from_secs(20) {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status["sessions"], 0, "{status}");
    assert_eq!(status["sessions_ended"]["client_gone"], 1, "{status}");
    // About the keepalive timeout after the last ping (which was a second before `stopped`).
    assert!(
        stopped.elapsed() < Duration::from_secs(9),
        "took {:?}",
        stopped.elapsed()
    );
    // Nobody was there to say goodbye to.
    let seen = client.seen_json();
    assert!(!seen.iter().any(|m| m["type"] == "signalling"), "{seen:?}");
    let _ = client.pc.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_that_ends_the_session_says_peer_left_first() {
    let mut server = start(2).await;
    let mut client = Connected::new(server.addr).await;
    client.ready().await;
    client.wait_for("bot-ready", 20).await;
    // The server shuts down: the bot leaves, and says so before the connection closes.
    let _ = server.stop.take().map(|stop| stop.send(()));
    client.wait_for("signalling", 10).await;
    let left = client
        .seen_json()
        .into_iter()
        .find(|m| m["type"] == "signalling")
        .expect("a signalling message");
    assert_eq!(left["message"]["type"], "peerLeft", "{left}");
    let _ = client.pc.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_signalling_gets_clear_errors() {
    let server = start(2).await;
    let addr = server.addr;
    let (status, _) = request(addr, "POST", "/api/offer", "{not json").await;
    assert!((400..500).contains(&status), "{status}");
    let no_audio =
        json!({"sdp": "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n", "type": "offer"});
    let (status, body) = request(addr, "POST", "/api/offer", &no_audio.to_string()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no audio"), "{body}");
    let answer = json!({"sdp": "v=0\r\n", "type": "answer"});
    assert_eq!(
        request(addr, "POST", "/api/offer", &answer.to_string())
            .await
            .0,
        400
    );
    let garbage = json!({"sdp": "m=audio this is not SDP", "type": "offer"});
    let (status, body) = request(addr, "POST", "/api/offer", &garbage.to_string()).await;
    assert_eq!(status, 400, "{body}");
    let unknown = json!({"pc_id": "pc-nope", "candidates": []});
    assert_eq!(
        request(addr, "PATCH", "/api/offer", &unknown.to_string())
            .await
            .0,
        404
    );
    let renegotiate = json!({"sdp": "m=audio", "type": "offer", "pc_id": "pc-nope"});
    assert_eq!(
        request(addr, "POST", "/api/offer", &renegotiate.to_string())
            .await
            .0,
        404
    );
    let huge = "x".repeat(voxide::server::MAX_BODY_BYTES + 1);
    let (status, body) = request(addr, "POST", "/api/offer", &huge).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("\"too_large\""), "{body}");
    let (status, body) = request(addr, "POST", "/start", "{}").await;
    assert_eq!(status, 200);
    assert!(body.contains("sessionId"), "{body}");
    // None of that cost a session.
    let (_, status) = request(addr, "GET", "/status", "").await;
    assert!(status.contains("\"sessions\":0"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_picks_the_bot_and_its_session_offer_gets_it() {
    let bots = ["front", "night"]
        .into_iter()
        .map(|name| voxide::bot::BotOptions {
            name: Some(name.to_owned()),
            voice: voxide::bot::Voice::Espeak,
            greeting: Some(format!("This is the {name} desk.")),
            ..voxide::bot::BotOptions::default()
        })
        .collect();
    let server = common::start_with(2, bots).await;
    let body = json!({"createDailyRoom": false, "body": {"bot": "night", "room": 12}}).to_string();
    let (status, started) = request(server.addr, "POST", "/start", &body).await;
    assert_eq!(status, 200, "{started}");
    let started: Value = serde_json::from_str(&started).expect("JSON");
    let id = started["sessionId"].as_str().expect("a session id");
    let mut client = Connected::offer_at(server.addr, &format!("/sessions/{id}/api/offer")).await;
    client.ready().await;
    client.wait_for("bot-tts-text", 20).await;
    let said: Vec<String> = client
        .seen_json()
        .iter()
        .filter(|m| m["type"] == "bot-tts-text")
        .filter_map(|m| m["data"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        said.first().map(String::as_str),
        Some("This is the night desk.")
    );
}
