//! Streaming STT providers against local stand-ins that speak each WebSocket protocol as the
//! provider documents it, faults included: a slow handshake, a socket dropped mid-utterance, a
//! rejected key, an idle close.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::mpsc;

use voxide::services::stt::deepgram::{DeepgramSettings, DeepgramStt};
use voxide::services::stt::{SttEngine, SttEvent, SttInput, SttStream};
use voxide::services::ws::ReconnectPolicy;

/// How the Deepgram stand-in misbehaves.
#[derive(Clone, Copy, Default)]
struct Faults {
    /// Wait this long before accepting the socket.
    handshake_delay: Duration,
    /// On the first socket: finalize the first half second once a second came, then drop the
    /// socket after this many samples without a close frame.
    drop_first_after: Option<usize>,
    /// Close the first socket at once with 1011 NET-0001, as Deepgram does an idle one.
    idle_close_first: bool,
    /// Answer the socket's first finalize of real speech with these words, later ones with
    /// none (else each with "heard N").
    words: Option<&'static str>,
}

#[derive(Clone)]
struct Deepgram {
    faults: Faults,
    /// Sockets accepted, and handshakes seen (accepted or not).
    sockets: Arc<Mutex<usize>>,
    handshakes: Arc<Mutex<usize>>,
    /// The query of the last handshake.
    query: Arc<Mutex<String>>,
}

async fn listen(
    State(stand_in): State<Deepgram>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    upgrade: WebSocketUpgrade,
) -> Response {
    *stand_in.handshakes.lock().expect("lock") += 1;
    *stand_in.query.lock().expect("lock") = uri.query().unwrap_or_default().to_owned();
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Token dg-test") {
        return (StatusCode::UNAUTHORIZED, "INVALID_AUTH").into_response();
    }
    tokio::time::sleep(stand_in.faults.handshake_delay).await;
    let socket_index = {
        let mut sockets = stand_in.sockets.lock().expect("lock");
        *sockets += 1;
        *sockets
    };
    let faults = stand_in.faults;
    upgrade.on_upgrade(move |socket| serve(socket, faults, socket_index == 1))
}

/// One socket: counts the audio; a `Finalize` is answered with a final, `from_finalize`, whose
/// transcript says how many samples came since the socket's last final.
async fn serve(mut socket: WebSocket, faults: Faults, first: bool) {
    if first && faults.idle_close_first {
        let _ = socket
            .send(Message::Close(Some(CloseFrame {
                code: 1011,
                reason: "Deepgram did not receive audio data or a text message within the timeout window. See https://dpgr.am/net0001".into(),
            })))
            .await;
        return;
    }
    let (mut received, mut finalized) = (0usize, 0usize);
    let mut sent_part = false;
    let mut words = faults.words;
    while let Some(Ok(message)) = socket.recv().await {
        match message {
            Message::Binary(bytes) => {
                assert!(!bytes.is_empty(), "never an empty audio frame");
                received += bytes.len() / 2;
                if first && let Some(limit) = faults.drop_first_after {
                    if received >= 16_000 && !sent_part {
                        sent_part = true;
                        finalized = 8_000;
                        let part = results(0.0, 0.5, "part one", false);
                        let _ = socket.send(Message::Text(part.into())).await;
                    }
                    if received >= limit {
                        // Gone without a close frame.
                        return;
                    }
                }
            }
            Message::Text(text) => {
                let message: serde_json::Value =
                    serde_json::from_str(&text).expect("client messages are JSON");
                match message["type"].as_str() {
                    Some("Finalize") => {
                        let start = finalized as f64 / 16_000.0;
                        let duration = (received - finalized) as f64 / 16_000.0;
                        let text = match faults.words {
                            // A turn's worth of audio is speech; a sliver is not.
                            Some(_) if received - finalized > 8_000 => {
                                words.take().unwrap_or_default().to_owned()
                            }
                            Some(_) => String::new(),
                            None => format!("heard {}", received - finalized),
                        };
                        finalized = received;
                        let answer = results(start, duration, &text, true);
                        let _ = socket.send(Message::Text(answer.into())).await;
                    }
                    Some("KeepAlive") => {}
                    Some("CloseStream") => {
                        let metadata = json!({"type": "Metadata", "request_id": "r", "duration": received as f64 / 16_000.0, "channels": 1});
                        let _ = socket
                            .send(Message::Text(metadata.to_string().into()))
                            .await;
                        return;
                    }
                    other => panic!("unknown client message {other:?}"),
                }
            }
            _ => {}
        }
    }
}

fn results(start: f64, duration: f64, text: &str, from_finalize: bool) -> String {
    json!({"type": "Results", "channel_index": [0, 1], "duration": duration, "start": start,
        "is_final": true, "speech_final": from_finalize, "from_finalize": from_finalize,
        "channel": {"alternatives": [{"transcript": text, "confidence": 0.98, "words": []}]},
        "metadata": {"request_id": "r", "model_info": {"name": "nova-3", "version": "1", "arch": "x"}, "model_uuid": "u"}})
    .to_string()
}

async fn deepgram(faults: Faults, key: &str) -> (DeepgramStt, Deepgram) {
    let stand_in = Deepgram {
        faults,
        sockets: Arc::default(),
        handshakes: Arc::default(),
        query: Arc::default(),
    };
    let app = axum::Router::new()
        .route("/v1/listen", axum::routing::get(listen))
        .with_state(stand_in.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let engine = DeepgramStt::new(DeepgramSettings {
        url: format!("ws://{addr}"),
        reconnect: ReconnectPolicy {
            initial_delay: Duration::from_millis(50),
            ..ReconnectPolicy::default()
        },
        ..DeepgramSettings::new(key)
    });
    (engine, stand_in)
}

/// Sends `samples` samples of audio in 20 ms frames, then a finalize; returns the answer.
async fn speak_and_finalize(stream: &mut SttStream, samples: usize) -> String {
    for _ in 0..samples / 320 {
        stream
            .input
            .send(SttInput::Audio(vec![300; 320]))
            .await
            .expect("the stream takes audio");
        tokio::task::yield_now().await;
    }
    stream
        .input
        .send(SttInput::Finalize)
        .await
        .expect("the stream takes the finalize");
    finalized(&mut stream.events).await
}

async fn finalized(events: &mut mpsc::Receiver<SttEvent>) -> String {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("an answer in time")
            .expect("the stream is open");
        if let SttEvent::Finalized(text) = event {
            return text;
        }
    }
}

#[tokio::test]
async fn the_first_words_are_not_lost_to_a_slow_handshake() {
    let faults = Faults {
        handshake_delay: Duration::from_millis(800),
        ..Faults::default()
    };
    let (engine, stand_in) = deepgram(faults, "dg-test").await;
    assert_eq!(engine.sample_rate(), 16_000);
    let mut stream = engine.start();
    // A second of speech before the socket is open, all of it answered.
    assert_eq!(speak_and_finalize(&mut stream, 16_000).await, "heard 16000");
    assert_eq!(*stand_in.sockets.lock().expect("lock"), 1);
    let query = stand_in.query.lock().expect("lock").clone();
    for part in [
        "model=nova-3",
        "encoding=linear16",
        "sample_rate=16000",
        "interim_results=true",
    ] {
        assert!(query.contains(part), "{query}");
    }
    // The next turn on the same socket.
    assert_eq!(speak_and_finalize(&mut stream, 3_200).await, "heard 3200");
}

#[tokio::test]
async fn a_socket_dropped_mid_utterance_loses_no_words() {
    let faults = Faults {
        drop_first_after: Some(20_000),
        ..Faults::default()
    };
    let (engine, stand_in) = deepgram(faults, "dg-test").await;
    let mut stream = engine.start();
    // 2 s of speech: the first half second is final before the drop; everything after it is
    // sent again on the new socket.
    let text = speak_and_finalize(&mut stream, 32_000).await;
    assert_eq!(text, "part one heard 24000");
    assert_eq!(*stand_in.sockets.lock().expect("lock"), 2);
}

#[tokio::test]
async fn an_idle_close_reconnects_without_a_gap() {
    let faults = Faults {
        idle_close_first: true,
        ..Faults::default()
    };
    let (engine, stand_in) = deepgram(faults, "dg-test").await;
    let mut stream = engine.start();
    assert_eq!(speak_and_finalize(&mut stream, 8_000).await, "heard 8000");
    assert_eq!(*stand_in.sockets.lock().expect("lock"), 2);
}

#[tokio::test]
async fn a_rejected_key_fails_at_once_without_retrying() {
    let (engine, stand_in) = deepgram(Faults::default(), "wrong").await;
    let mut stream = engine.start();
    let failure = match stream.events.recv().await.expect("an event") {
        SttEvent::Failed(message) => message,
        other => panic!("a failure first: {other:?}"),
    };
    assert!(failure.contains("401"), "{failure}");
    assert_eq!(
        *stand_in.handshakes.lock().expect("lock"),
        1,
        "no retry storm"
    );
    // The turn logic is never left waiting: a finalize still gets its (empty) answer.
    assert_eq!(speak_and_finalize(&mut stream, 320).await, "");
}

/// The whole bot with Deepgram listening, on the recorded question.
mod whole_bot {
    use super::*;
    use voxide::bot::{BotOptions, SttChoice, Voice};
    use voxide::transports::file::{RunOptions, run};

    const HELLO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav");

    async fn ask(
        stt: Vec<SttChoice>,
        name: &str,
    ) -> (voxide::transports::file::RunSummary, Vec<serde_json::Value>) {
        let dir = std::env::temp_dir().join(format!("voxide-stt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let log = dir.join(format!("{name}_events.jsonl"));
        let summary = run(RunOptions {
            input: HELLO.into(),
            output: dir.join(format!("{name}_answer.wav")),
            events: Some(log.clone()),
            fast: false,
            max_tail: Duration::from_secs(30),
            settle: Duration::from_secs(2),
            bot: BotOptions {
                stt,
                voice: Voice::Espeak,
                ..BotOptions::default()
            },
        })
        .await
        .expect("the run");
        let events = std::fs::read_to_string(&log)
            .expect("the event log")
            .lines()
            .map(|line| serde_json::from_str(line).expect("an event"))
            .collect();
        (summary, events)
    }

    fn settings(engine: &DeepgramStt) -> DeepgramSettings {
        engine.settings().clone()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bot_hears_the_turn_from_deepgram_and_answers_it() {
        let faults = Faults {
            words: Some("Hello there. What time is it?"),
            ..Faults::default()
        };
        let (engine, stand_in) = deepgram(faults, "dg-test").await;
        let (summary, _) = ask(vec![SttChoice::Deepgram(settings(&engine))], "deepgram").await;
        assert_eq!(summary.transcripts, ["Hello there. What time is it?"]);
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(summary.voice_to_voice_ms.len(), 1, "the turn is answered");
        assert_eq!(*stand_in.sockets.lock().expect("lock"), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rejected_deepgram_key_hands_the_listening_to_whisper_and_says_so() {
        let (engine, _) = deepgram(Faults::default(), "wrong").await;
        let (summary, events) = ask(
            vec![SttChoice::Deepgram(settings(&engine)), SttChoice::Whisper],
            "fallback",
        )
        .await;
        let fallback = events
            .iter()
            .find(|e| e["type"] == "stt_fallback")
            .expect("an stt_fallback event");
        assert_eq!(fallback["from"], "deepgram");
        assert_eq!(fallback["to"], "whisper");
        assert!(fallback["reason"].as_str().expect("reason").contains("401"));
        let heard = summary.transcripts.join(" ").to_lowercase();
        assert!(heard.contains("weather"), "Whisper heard {heard:?}");
    }
}
