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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webrtc_client_hears_the_bot_answer() {
    let server = start(2).await;
    let addr = server.addr;

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
    let registry = register_default_interceptors(Registry::new(), &mut media).expect("registry");
    let (gathered_tx, gathered) = oneshot::channel();
    let loud = Arc::new(AtomicUsize::new(0));
    let client = Arc::new(Client {
        gathered: std::sync::Mutex::new(Some(gathered_tx)),
        loud: loud.clone(),
    });
    let pc = PeerConnectionBuilder::new()
        .with_configuration(RTCConfigurationBuilder::new().build())
        .with_media_engine(media)
        .with_interceptor_registry(registry)
        .with_handler(client)
        .with_runtime(webrtc::runtime::default_runtime().expect("runtime"))
        .with_udp_addrs(vec!["127.0.0.1:0".to_owned()])
        .build()
        .await
        .expect("peer connection");
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
    let channel = pc
        .create_data_channel("rtvi-ai", None)
        .await
        .expect("data channel");
    let offer = pc.create_offer(None).await.expect("offer");
    pc.set_local_description(offer)
        .await
        .expect("local description");
    let _ = tokio::time::timeout(Duration::from_secs(3), gathered).await;
    let offer_sdp = pc.local_description().await.expect("offer").sdp;

    let body = json!({"sdp": offer_sdp, "type": "offer"}).to_string();
    let (status, answer) = request(addr, "POST", "/api/offer", &body).await;
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

    // RTVI on the data channel: client-ready, then collect what comes back.
    let (messages_tx, mut messages) = mpsc::unbounded_channel::<Value>();
    {
        let channel = channel.clone();
        tokio::spawn(async move {
            while let Some(event) = channel.poll().await {
                match event {
                    DataChannelEvent::OnOpen => {
                        let ready = json!({"label": "rtvi-ai", "type": "client-ready", "id": "r1",
                            "data": {"version": "1.0.0"}});
                        let _ = channel.send_text(&ready.to_string()).await;
                        let _ = channel
                            .send_text(r#"{"label":"rtvi-ai","type":"dance","id":"d1"}"#)
                            .await;
                    }
                    DataChannelEvent::OnMessage(message) => {
                        if let Ok(value) = serde_json::from_slice(&message.data) {
                            let _ = messages_tx.send(value);
                        }
                    }
                    DataChannelEvent::OnClose => break,
                    _ => {}
                }
            }
        });
    }

    // The question as Opus, at real-time pace, then silence while the bot answers.
    let payload_type = sender
        .get_parameters()
        .await
        .expect("parameters")
        .rtp_parameters
        .codecs
        .first()
        .map(|c| c.payload_type)
        .expect("negotiated codec");
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut up = StreamResampler::new(16_000, 48_000).expect("resampler");
    let mut audio = up.process(&hello);
    audio.extend(vec![0; 48_000 * 12]);
    let mut encoder =
        opus::Encoder::new(48_000, opus::Channels::Mono, opus::Application::Voip).expect("encoder");
    let mut packet = vec![0u8; 1500];
    let heard_the_question = |seen: &[Value]| {
        seen.iter().any(|m| {
            m["type"] == "user-transcription"
                && m["data"]["final"] == true
                && m["data"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("weather"))
        })
    };
    let mut seen = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for frame in audio.chunks_exact(960) {
        tick.tick().await;
        let n = encoder.encode(frame, &mut packet).expect("encode");
        let sample = Sample {
            data: Bytes::copy_from_slice(&packet[..n]),
            duration: Duration::from_millis(20),
            ..Sample::new(Instant::now())
        };
        let _ = mic
            .sample_writer(ssrc, payload_type)
            .write_sample(&sample)
            .await;
        while let Ok(message) = messages.try_recv() {
            seen.push(message);
        }
        // Under load the bot may start on the first sentence ("Hello there.") before the
        // question: wait for both the question's transcript and the bot's voice.
        if loud.load(Ordering::Relaxed) > 20_000 && heard_the_question(&seen) {
            break;
        }
    }
    while let Ok(message) = messages.try_recv() {
        seen.push(message);
    }
    let kinds: Vec<&str> = seen.iter().filter_map(|m| m["type"].as_str()).collect();
    assert!(
        seen.iter()
            .any(|m| m["type"] == "bot-ready" && m["id"] == "r1"),
        "{kinds:?}"
    );
    assert!(
        seen.iter()
            .any(|m| m["type"] == "error-response" && m["id"] == "d1"),
        "{kinds:?}"
    );
    assert!(kinds.contains(&"user-started-speaking"), "{kinds:?}");
    assert!(heard_the_question(&seen), "{seen:?}");
    assert!(kinds.contains(&"bot-started-speaking"), "{kinds:?}");
    assert!(
        loud.load(Ordering::Relaxed) > 20_000,
        "the bot's voice came back over the track"
    );

    // Trickled candidates for a live connection are taken; an unknown one is a 404.
    let patch = json!({"pc_id": pc_id, "candidates": []}).to_string();
    assert_eq!(request(addr, "PATCH", "/api/offer", &patch).await.0, 200);
    let _ = pc.close().await;
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
    assert_eq!(request(addr, "POST", "/api/offer", &huge).await.0, 413);
    let (status, body) = request(addr, "POST", "/start", "{}").await;
    assert_eq!(status, 200);
    assert!(body.contains("sessionId"), "{body}");
    // None of that cost a session.
    let (_, status) = request(addr, "GET", "/status", "").await;
    assert!(status.contains("\"sessions\":0"), "{status}");
}
