//! Streaming STT and TTS providers against local stand-ins that speak each WebSocket protocol as
//! the provider documents it, faults included: a slow handshake, a socket dropped mid-utterance
//! or between a text and its audio, an idle close, a rejected key, an interruption with audio
//! still on its way; then the whole bot on them, and its fallback to the embedded engines.

mod common;

/// Serves `app` on a free loopback port.
async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Reconnects that do not slow a test down.
fn quick_reconnects() -> voxide::services::ws::ReconnectPolicy {
    voxide::services::ws::ReconnectPolicy {
        initial_delay: std::time::Duration::from_millis(50),
        ..Default::default()
    }
}

/// Everything a voice's context says until it ends (done, an error or a failure).
async fn until_end(
    context: &mut voxide::services::tts::TtsContext,
) -> Vec<voxide::services::tts::TtsEvent> {
    use voxide::services::tts::TtsEvent;
    let mut events = Vec::new();
    loop {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), context.events.recv())
            .await
            .expect("events in time");
        let Some(event) = event else {
            return events;
        };
        let last = matches!(
            event,
            TtsEvent::Done | TtsEvent::Error(_) | TtsEvent::Failed(_)
        );
        events.push(event);
        if last {
            return events;
        }
    }
}

/// Samples of audio in `events`, every one of them `level`: only this context's audio.
fn samples_at(events: &[voxide::services::tts::TtsEvent], level: i16) -> usize {
    events
        .iter()
        .map(|e| match e {
            voxide::services::tts::TtsEvent::Audio(samples) => {
                assert!(
                    samples.iter().all(|s| *s == level),
                    "only this context's audio"
                );
                samples.len()
            }
            _ => 0,
        })
        .sum()
}

/// Sends `samples` samples of speech (a level of 300) in 20 ms frames.
async fn speak(stream: &voxide::services::stt::SttStream, samples: usize) {
    for _ in 0..samples / 320 {
        stream
            .input
            .send(voxide::services::stt::SttInput::Audio(vec![300; 320]))
            .await
            .expect("the stream takes audio");
        tokio::task::yield_now().await;
    }
}

/// The next event of `stream` that `wanted` picks (10 s at most).
async fn next_event<T>(
    stream: &mut voxide::services::stt::SttStream,
    wanted: impl Fn(voxide::services::stt::SttEvent) -> Option<T>,
) -> T {
    loop {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), stream.events.recv())
            .await
            .expect("an event in time")
            .expect("the stream is open");
        if let Some(found) = wanted(event) {
            return found;
        }
    }
}

/// Asks `stream` to finalize; returns the answer.
async fn finalize(stream: &mut voxide::services::stt::SttStream) -> String {
    stream
        .input
        .send(voxide::services::stt::SttInput::Finalize)
        .await
        .expect("the stream takes the finalize");
    next_event(stream, |e| match e {
        voxide::services::stt::SttEvent::Finalized(text) => Some(text),
        _ => None,
    })
    .await
}

/// Sends `samples` samples of speech, then a finalize; returns the answer.
async fn speak_and_finalize(
    stream: &mut voxide::services::stt::SttStream,
    samples: usize,
) -> String {
    speak(stream, samples).await;
    finalize(stream).await
}

/// A listener whose key the provider refuses fails at once, naming the 401, with no second
/// handshake (no retry storm); a finalize still gets its (empty) answer, so the turn logic is
/// never left waiting.
async fn refused_at_once(
    engine: &dyn voxide::services::stt::SttEngine,
    handshakes: &std::sync::Mutex<usize>,
) {
    let mut stream = engine.start();
    let failure = match stream.events.recv().await.expect("an event") {
        voxide::services::stt::SttEvent::Failed(message) => message,
        other => panic!("a failure first: {other:?}"),
    };
    assert!(failure.contains("401"), "{failure}");
    assert_eq!(*handshakes.lock().expect("lock"), 1, "no retry storm");
    stream
        .input
        .send(voxide::services::stt::SttInput::SpeechStarted)
        .await
        .expect("input");
    assert_eq!(speak_and_finalize(&mut stream, 320).await, "");
}

mod deepgram {
    use super::speak_and_finalize;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::extract::State;
    use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use serde_json::json;

    use voxide::services::stt::SttEngine;
    use voxide::services::stt::deepgram::{DeepgramSettings, DeepgramStt};

    /// How the Deepgram stand-in misbehaves.
    #[derive(Clone, Copy, Default)]
    pub(super) struct Faults {
        /// Wait this long before accepting the socket.
        pub(super) handshake_delay: Duration,
        /// On the first socket: finalize the first half second once a second came, then drop the
        /// socket at the finalize without a close frame (once the client sent all it had: a
        /// socket reset while it still sends could discard the final before it is read).
        pub(super) drop_first: bool,
        /// Close the first socket at once with 1011 NET-0001, as Deepgram does an idle one.
        pub(super) idle_close_first: bool,
        /// Answer the socket's first finalize of real speech with these words, later ones with
        /// none (else each with "heard N").
        pub(super) words: Option<&'static str>,
    }

    #[derive(Clone)]
    pub(super) struct Deepgram {
        faults: Faults,
        /// Sockets accepted, and handshakes seen (accepted or not).
        pub(super) sockets: Arc<Mutex<usize>>,
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
                    let before = received;
                    received += bytes.len() / 2;
                    // Like Deepgram, an interim result about every second of audio, words or not.
                    if received / 16_000 > before / 16_000 {
                        let interim = json!({"type": "Results", "channel_index": [0, 1],
                            "start": finalized as f64 / 16_000.0,
                            "duration": (received - finalized) as f64 / 16_000.0,
                            "is_final": false, "speech_final": false, "from_finalize": false,
                            "channel": {"alternatives": [{"transcript": "", "confidence": 0.0, "words": []}]}});
                        let _ = socket.send(Message::Text(interim.to_string().into())).await;
                    }
                    if first && faults.drop_first && received >= 16_000 && !sent_part {
                        sent_part = true;
                        finalized = 8_000;
                        let part = results(0.0, 0.5, "part one", false);
                        let _ = socket.send(Message::Text(part.into())).await;
                    }
                }
                Message::Text(text) => {
                    let message: serde_json::Value =
                        serde_json::from_str(&text).expect("client messages are JSON");
                    match message["type"].as_str() {
                        // Gone without a close frame.
                        Some("Finalize") if first && faults.drop_first => return,
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

    pub(super) async fn deepgram(faults: Faults, key: &str) -> (DeepgramStt, Deepgram) {
        let stand_in = Deepgram {
            faults,
            sockets: Arc::default(),
            handshakes: Arc::default(),
            query: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/v1/listen", axum::routing::get(listen))
            .with_state(stand_in.clone());
        let addr = super::serve(app).await;
        let engine = DeepgramStt::new(DeepgramSettings {
            url: format!("ws://{addr}"),
            reconnect: super::quick_reconnects(),
            ..DeepgramSettings::new(key)
        });
        (engine, stand_in)
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
            drop_first: true,
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
        super::refused_at_once(&engine, &stand_in.handshakes).await;
    }
}

mod cartesia {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::extract::State;
    use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use serde_json::{Value, json};

    use voxide::services::tts::cartesia::{CartesiaSettings, CartesiaTts};
    use voxide::services::tts::{TtsContext, TtsEngine, TtsEvent, TtsInput};

    /// Samples of audio the stand-in makes per word.
    const PER_WORD: usize = 2_400;
    /// The value of every sample it makes, so the bot's output can be told from other audio.
    pub(super) const LEVEL: i16 = 1_234;

    #[derive(Clone, Default)]
    pub(super) struct Cartesia {
        /// Drop the first socket on its first text, before any audio.
        drop_first: bool,
        sockets: Arc<Mutex<usize>>,
        /// Every client message, by socket.
        pub(super) seen: Arc<Mutex<Vec<(usize, Value)>>>,
    }

    async fn websocket(
        State(stand_in): State<Cartesia>,
        headers: HeaderMap,
        upgrade: WebSocketUpgrade,
    ) -> Response {
        let key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        let version = headers
            .get("cartesia-version")
            .and_then(|v| v.to_str().ok());
        if key != Some("ct-test") || version != Some("2026-03-01") {
            return (StatusCode::UNAUTHORIZED, "invalid API key").into_response();
        }
        let index = {
            let mut sockets = stand_in.sockets.lock().expect("lock");
            *sockets += 1;
            *sockets
        };
        upgrade.on_upgrade(move |socket| serve(socket, stand_in, index))
    }

    fn b64(samples: &[i16]) -> String {
        use base64::Engine;
        let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// Each transcript piece is answered with its word timestamps and audio; the empty
    /// `continue: false` piece with `done`. After a `cancel`, one late chunk still comes.
    async fn serve(mut socket: WebSocket, stand_in: Cartesia, index: usize) {
        // Seconds of audio made so far, per context.
        let mut made: std::collections::HashMap<String, f64> = Default::default();
        while let Some(Ok(Message::Text(text))) = socket.recv().await {
            let message: Value = serde_json::from_str(&text).expect("client messages are JSON");
            stand_in
                .seen
                .lock()
                .expect("lock")
                .push((index, message.clone()));
            let context = message["context_id"]
                .as_str()
                .expect("a context")
                .to_owned();
            if message["cancel"] == true {
                let late = json!({"type": "chunk", "data": b64(&[LEVEL; 480]), "done": false,
                    "status_code": 206, "step_time": 5, "context_id": context});
                let _ = socket.send(Message::Text(late.to_string().into())).await;
                continue;
            }
            if stand_in.drop_first && index == 1 {
                return;
            }
            let transcript = message["transcript"].as_str().expect("a transcript");
            if message["continue"] == false {
                let done = json!({"type": "done", "done": true, "status_code": 206, "context_id": context});
                let _ = socket.send(Message::Text(done.to_string().into())).await;
                continue;
            }
            let words: Vec<&str> = transcript.split_whitespace().collect();
            let at = made.entry(context.clone()).or_default();
            let step = PER_WORD as f64 / 24_000.0;
            let starts: Vec<f64> = (0..words.len()).map(|i| *at + i as f64 * step).collect();
            let ends: Vec<f64> = starts.iter().map(|s| s + step * 0.9).collect();
            *at += words.len() as f64 * step;
            let timestamps = json!({"type": "timestamps", "done": false, "status_code": 206,
                "context_id": context, "word_timestamps": {"words": words, "start": starts, "end": ends}});
            let _ = socket
                .send(Message::Text(timestamps.to_string().into()))
                .await;
            for _ in &words {
                let chunk = json!({"type": "chunk", "data": b64(&[LEVEL; PER_WORD]), "done": false,
                    "status_code": 206, "step_time": 12, "context_id": context});
                let _ = socket.send(Message::Text(chunk.to_string().into())).await;
            }
        }
    }

    pub(super) async fn cartesia(stand_in: Cartesia, key: &str) -> (CartesiaTts, Cartesia) {
        let app = axum::Router::new()
            .route("/tts/websocket", axum::routing::get(websocket))
            .with_state(stand_in.clone());
        let addr = super::serve(app).await;
        let engine = CartesiaTts::new(CartesiaSettings {
            url: format!("ws://{addr}"),
            reconnect: super::quick_reconnects(),
            ..CartesiaSettings::new(key)
        });
        (engine, stand_in)
    }

    async fn say(context: &TtsContext, pieces: &[&str]) {
        for piece in pieces {
            context
                .input
                .send(TtsInput::Text((*piece).to_owned()))
                .await
                .expect("the context takes text");
        }
        context
            .input
            .send(TtsInput::Flush)
            .await
            .expect("the context takes the flush");
    }

    #[tokio::test]
    async fn a_turn_is_spoken_with_word_timings_and_done_after_its_flush() {
        let (engine, stand_in) = cartesia(Cartesia::default(), "ct-test").await;
        let mut context = engine.open();
        say(&context, &["Hello there.", "How are you today?"]).await;
        let events = super::until_end(&mut context).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        assert_eq!(super::samples_at(&events, LEVEL), 6 * PER_WORD);
        let words: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                TtsEvent::Words { words, .. } => Some(words.iter().map(|w| w.word.clone())),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(words, ["Hello", "there.", "How", "are", "you", "today?"]);
        let characters: u64 = events
            .iter()
            .map(|e| match e {
                TtsEvent::Characters(n) => *n,
                _ => 0,
            })
            .sum();
        assert_eq!(characters, 30);
        // The wire: one context, each sentence with `continue`, an empty last piece without.
        let seen = stand_in.seen.lock().expect("lock").clone();
        assert_eq!(seen.len(), 3);
        let first = &seen[0].1;
        assert_eq!(first["model_id"], "sonic-3.5");
        assert_eq!(first["voice"]["mode"], "id");
        assert_eq!(first["continue"], true);
        assert_eq!(first["add_timestamps"], true);
        assert_eq!(
            first["output_format"],
            json!({"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000})
        );
        assert_eq!(seen[1].1["context_id"], first["context_id"]);
        assert_eq!(
            (&seen[2].1["transcript"], &seen[2].1["continue"]),
            (&json!(""), &json!(false))
        );
    }

    #[tokio::test]
    async fn text_sent_before_a_socket_died_is_sent_again_and_spoken() {
        let stand_in = Cartesia {
            drop_first: true,
            ..Cartesia::default()
        };
        let (engine, stand_in) = cartesia(stand_in, "ct-test").await;
        let mut context = engine.open();
        say(&context, &["Nothing is lost."]).await;
        let events = super::until_end(&mut context).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        assert_eq!(
            super::samples_at(&events, LEVEL),
            3 * PER_WORD,
            "the sentence, spoken once"
        );
        let seen = stand_in.seen.lock().expect("lock").clone();
        let again: Vec<&Value> = seen
            .iter()
            .filter(|(socket, m)| *socket == 2 && m["transcript"] == "Nothing is lost.")
            .map(|(_, m)| m)
            .collect();
        assert_eq!(again.len(), 1, "sent again on the new socket: {seen:?}");
    }

    #[tokio::test]
    async fn an_interrupted_turn_is_cancelled_and_its_late_audio_never_heard() {
        let (engine, stand_in) = cartesia(Cartesia::default(), "ct-test").await;
        let mut first = engine.open();
        first
            .input
            .send(TtsInput::Text("This answer is cut short.".into()))
            .await
            .expect("text");
        // Its first audio, then the interruption.
        loop {
            match first.events.recv().await.expect("an event") {
                TtsEvent::Audio(_) => break,
                TtsEvent::Error(e) => panic!("{e}"),
                _ => {}
            }
        }
        drop(first);
        let mut next = engine.open();
        say(&next, &["Yes?"]).await;
        let events = super::until_end(&mut next).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        assert_eq!(
            super::samples_at(&events, LEVEL),
            PER_WORD,
            "none of the cut turn's late audio"
        );
        // The cancel goes out on its own: wait for the stand-in to have it.
        let cancel = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let seen = stand_in.seen.lock().expect("lock").clone();
                if let Some((_, cancel)) = seen.iter().find(|(_, m)| m["cancel"] == true) {
                    return (cancel.clone(), seen[0].1.clone());
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a cancel for the cut turn");
        assert_eq!(cancel.0["context_id"], cancel.1["context_id"]);
    }

    #[tokio::test]
    async fn a_rejected_key_ends_the_turn_with_a_clear_error() {
        let (engine, _) = cartesia(Cartesia::default(), "wrong").await;
        let mut context = engine.open();
        say(&context, &["Hello."]).await;
        let events = super::until_end(&mut context).await;
        match events.last() {
            Some(TtsEvent::Failed(message)) => assert!(message.contains("401"), "{message}"),
            other => panic!("a failure: {other:?}"),
        }
        // Later turns fail at once too, instead of waiting.
        let mut later = engine.open();
        say(&later, &["Again."]).await;
        assert!(matches!(
            super::until_end(&mut later).await.last(),
            Some(TtsEvent::Failed(_))
        ));
    }

    /// Seconds of audio the bench's Cartesia stand-in speaks for `pieces`, with or without
    /// long answers.
    async fn stand_in_speaks(pieces: &[&str], long_answers: Option<usize>) -> f64 {
        use voxide::bench::providers::Protocol;
        use voxide::bench::providers::stand_ins::{Delays, Faults, Options, StandIns};
        let options = Options {
            long_answers,
            ..Options::default()
        };
        let (_stand_ins, addr, _serving) = StandIns::serve_with(
            ([127, 0, 0, 1], 0).into(),
            Delays::all(Duration::ZERO),
            (Protocol::Openai, Faults::NONE),
            options,
        )
        .await
        .expect("the stand-ins listen");
        let engine = CartesiaTts::new(CartesiaSettings {
            url: format!("ws://{addr}"),
            reconnect: super::quick_reconnects(),
            ..CartesiaSettings::new("local")
        });
        let mut context = engine.open();
        say(&context, pieces).await;
        let events = super::until_end(&mut context).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        let samples: usize = events
            .iter()
            .map(|e| match e {
                TtsEvent::Audio(samples) => samples.len(),
                _ => 0,
            })
            .sum();
        samples as f64 / 24_000.0
    }

    #[tokio::test]
    async fn the_stand_in_speaks_a_quarter_second_a_word_with_long_answers() {
        let pieces = ["Once upon a time a dragon baked bread.", "The end."];
        assert_eq!(stand_in_speaks(&pieces, Some(30)).await, 10.0 * 0.25);
        assert_eq!(stand_in_speaks(&pieces, None).await, 2.0 * 0.25);
    }
}

/// AssemblyAI Universal-Streaming v3: audio only after `Begin`, frames of 50 ms to 1 s,
/// `ForceEndpoint` answered by the formatted final `Turn`.
mod assemblyai {
    use super::{next_event, speak, speak_and_finalize};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::extract::State;
    use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use serde_json::json;

    use voxide::services::stt::assemblyai::{AssemblyAiSettings, AssemblyAiStt};
    use voxide::services::stt::{SttEngine, SttEvent};

    /// How the AssemblyAI stand-in misbehaves.
    #[derive(Clone, Copy, Default)]
    pub(super) struct Faults {
        /// Wait this long after the upgrade before `Begin`.
        pub(super) begin_delay: Duration,
        /// On the first socket: end a turn over the first half second once a second came, then
        /// drop the socket at the `ForceEndpoint` without a close frame.
        pub(super) drop_first: bool,
        /// End the socket's first spoken turn with these words (else "heard N").
        pub(super) words: Option<&'static str>,
    }

    #[derive(Clone, Default)]
    pub(super) struct AssemblyAi {
        faults: Faults,
        /// Sockets accepted, and handshakes seen (accepted or not).
        pub(super) sockets: Arc<Mutex<usize>>,
        handshakes: Arc<Mutex<usize>>,
        /// The query of the last handshake.
        query: Arc<Mutex<String>>,
        /// Frames outside 50 ms to 1 s, and audio before `Begin`: AssemblyAI closes with 3007.
        violations: Arc<Mutex<Vec<String>>>,
    }

    async fn socket(
        State(stand_in): State<AssemblyAi>,
        headers: HeaderMap,
        uri: axum::http::Uri,
        upgrade: WebSocketUpgrade,
    ) -> Response {
        *stand_in.handshakes.lock().expect("lock") += 1;
        *stand_in.query.lock().expect("lock") = uri.query().unwrap_or_default().to_owned();
        if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("aai-test") {
            return (StatusCode::UNAUTHORIZED, "Invalid API key").into_response();
        }
        let first = {
            let mut sockets = stand_in.sockets.lock().expect("lock");
            *sockets += 1;
            *sockets == 1
        };
        upgrade.on_upgrade(move |socket| serve(socket, stand_in, first))
    }

    fn turn(
        order: u32,
        transcript: &str,
        end_of_turn: bool,
        formatted: bool,
        end_ms: usize,
    ) -> Message {
        let words: Vec<serde_json::Value> = transcript
            .split_whitespace()
            .map(|w| json!({"start": 0, "end": end_ms, "text": w, "confidence": 0.9, "word_is_final": true}))
            .collect();
        Message::Text(
            json!({"type": "Turn", "turn_order": order, "turn_is_formatted": formatted,
                "end_of_turn": end_of_turn, "transcript": transcript,
                "end_of_turn_confidence": 0.5, "words": words})
            .to_string()
            .into(),
        )
    }

    /// One socket: `Begin` (maybe late), `SpeechStarted` when a turn's first loud frame comes,
    /// a partial every half second of a turn, and at `ForceEndpoint` the turn ended twice, raw
    /// then formatted, its word ending at the last sample heard.
    async fn serve(mut socket: WebSocket, stand_in: AssemblyAi, first: bool) {
        let faults = stand_in.faults;
        let violation = |what: String| stand_in.violations.lock().expect("lock").push(what);
        let early = tokio::time::timeout(faults.begin_delay, socket.recv()).await;
        if let Ok(Some(Ok(Message::Binary(_)))) = early {
            violation("audio before Begin".into());
        }
        let begin = json!({"type": "Begin", "id": "s-1", "expires_at": 1_750_000_000});
        let _ = socket.send(Message::Text(begin.to_string().into())).await;
        let (mut received, mut turn_start, mut order) = (0usize, 0usize, 0u32);
        let mut speaking = false;
        let mut words = faults.words;
        let mut ended_part = false;
        while let Some(Ok(message)) = socket.recv().await {
            match message {
                Message::Binary(bytes) => {
                    let samples = bytes.len() / 2;
                    if !(800..=16_000).contains(&samples) {
                        violation(format!("a frame of {samples} samples"));
                    }
                    let loud = bytes
                        .chunks_exact(2)
                        .any(|b| i16::from_le_bytes([b[0], b[1]]).unsigned_abs() > 200);
                    let before = received;
                    received += samples;
                    if loud && !speaking {
                        speaking = true;
                        let started = json!({"type": "SpeechStarted", "timestamp": before / 16});
                        let _ = socket.send(Message::Text(started.to_string().into())).await;
                    }
                    if speaking && received / 8_000 > before / 8_000 {
                        let partial = format!("heard {}", received - turn_start);
                        let _ = socket
                            .send(turn(order, &partial, false, false, received / 16))
                            .await;
                    }
                    if first && faults.drop_first && received >= 16_000 && !ended_part {
                        ended_part = true;
                        let _ = socket.send(turn(order, "part one", true, true, 500)).await;
                        order += 1;
                        turn_start = 8_000;
                    }
                }
                Message::Text(text) => {
                    let message: serde_json::Value =
                        serde_json::from_str(&text).expect("client messages are JSON");
                    match message["type"].as_str() {
                        Some("ForceEndpoint") if first && faults.drop_first => return,
                        Some("ForceEndpoint") => {
                            let heard = received - turn_start;
                            let text = match faults.words {
                                // A turn's worth of audio is speech; a sliver is not.
                                Some(_) if heard > 8_000 => {
                                    words.take().unwrap_or_default().to_owned()
                                }
                                Some(_) => String::new(),
                                None => format!("heard {heard}"),
                            };
                            let raw = text.to_lowercase().replace(['.', '?', ','], "");
                            let _ = socket
                                .send(turn(order, &raw, true, false, received / 16))
                                .await;
                            let _ = socket
                                .send(turn(order, &text, true, true, received / 16))
                                .await;
                            order += 1;
                            turn_start = received;
                            speaking = false;
                        }
                        Some("KeepAlive") => {}
                        Some("Terminate") => {
                            let end = json!({"type": "Termination",
                                "audio_duration_seconds": received as f64 / 16_000.0,
                                "session_duration_seconds": received as f64 / 16_000.0});
                            let _ = socket.send(Message::Text(end.to_string().into())).await;
                            return;
                        }
                        other => violation(format!("an unknown message {other:?}")),
                    }
                }
                _ => {}
            }
        }
    }

    pub(super) async fn assemblyai(faults: Faults, key: &str) -> (AssemblyAiStt, AssemblyAi) {
        let stand_in = AssemblyAi {
            faults,
            ..AssemblyAi::default()
        };
        let app = axum::Router::new()
            .route("/v3/ws", axum::routing::get(socket))
            .with_state(stand_in.clone());
        let addr = super::serve(app).await;
        let engine = AssemblyAiStt::new(AssemblyAiSettings {
            url: format!("ws://{addr}"),
            reconnect: super::quick_reconnects(),
            ..AssemblyAiSettings::new(key)
        });
        (engine, stand_in)
    }

    #[tokio::test]
    async fn the_first_words_wait_for_begin_and_go_in_frames_it_takes() {
        let faults = Faults {
            begin_delay: Duration::from_millis(800),
            ..Faults::default()
        };
        let (engine, stand_in) = assemblyai(faults, "aai-test").await;
        assert_eq!(engine.sample_rate(), 16_000);
        let mut stream = engine.start();
        // A second of speech before the session began, all of it heard.
        assert_eq!(speak_and_finalize(&mut stream, 16_000).await, "heard 16000");
        // The next turn on the same socket: 60 ms frames, and a 40 ms tail padded to 50 ms.
        assert_eq!(speak_and_finalize(&mut stream, 3_520).await, "heard 3680");
        assert_eq!(*stand_in.sockets.lock().expect("lock"), 1);
        assert!(
            stand_in.violations.lock().expect("lock").is_empty(),
            "{:?}",
            stand_in.violations
        );
        let query = stand_in.query.lock().expect("lock").clone();
        for part in [
            "sample_rate=16000",
            "encoding=pcm_s16le",
            "speech_model=universal-streaming-english",
            "format_turns=true",
        ] {
            assert!(query.contains(part), "{query}");
        }
    }

    #[tokio::test]
    async fn a_socket_dropped_mid_utterance_loses_no_words() {
        let faults = Faults {
            drop_first: true,
            ..Faults::default()
        };
        let (engine, stand_in) = assemblyai(faults, "aai-test").await;
        let mut stream = engine.start();
        // 2 s of speech: the turn AssemblyAI ended over the first half second stands (heard
        // before the rest is sent, as in real time); everything after it is heard again on the
        // new socket (and up to 50 ms of silence padding its last frame).
        // (A frame under 50 ms may wait for the next: 1.08 s sent is more than 1 s received.)
        speak(&stream, 17_280).await;
        next_event(&mut stream, |e| {
            matches!(e, SttEvent::Interim(t) if t == "part one").then_some(())
        })
        .await;
        let text = speak_and_finalize(&mut stream, 14_720).await;
        let heard: usize = text
            .strip_prefix("part one heard ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the words before and after the drop: {text:?}"));
        assert!((24_000..24_800).contains(&heard), "{heard}");
        assert_eq!(*stand_in.sockets.lock().expect("lock"), 2);
        assert!(
            stand_in.violations.lock().expect("lock").is_empty(),
            "{:?}",
            stand_in.violations
        );
    }

    #[tokio::test]
    async fn a_rejected_key_fails_at_once_without_retrying() {
        let (engine, stand_in) = assemblyai(Faults::default(), "wrong").await;
        super::refused_at_once(&engine, &stand_in.handshakes).await;
    }
}

/// OpenAI realtime transcription: the session configured before any audio, each VAD segment
/// committed and answered by its item's transcript.
mod openai_transcription {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::extract::State;
    use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use serde_json::{Value, json};

    use voxide::services::stt::openai::{OpenAiStt, OpenAiSttSettings};
    use voxide::services::stt::{SttEngine, SttInput, SttStream};

    #[derive(Clone, Copy, Default)]
    pub(super) struct Faults {
        /// Wait this long before `session.created`.
        pub(super) created_delay: Duration,
        /// Drop the first socket at its first commit, unanswered.
        pub(super) drop_first: bool,
        /// Answer the first segment of real speech with these words (else "heard N").
        pub(super) words: Option<&'static str>,
    }

    #[derive(Clone, Default)]
    pub(super) struct Transcriber {
        faults: Faults,
        pub(super) sockets: Arc<Mutex<usize>>,
        handshakes: Arc<Mutex<usize>>,
        /// What OpenAI would reject: audio before the session is configured, a `model` in the
        /// URL, a session that is not for transcription at 24 kHz.
        pub(super) violations: Arc<Mutex<Vec<String>>>,
    }

    async fn realtime(
        State(stand_in): State<Transcriber>,
        headers: HeaderMap,
        uri: axum::http::Uri,
        upgrade: WebSocketUpgrade,
    ) -> Response {
        *stand_in.handshakes.lock().expect("lock") += 1;
        if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer oa-test") {
            return (StatusCode::UNAUTHORIZED, "invalid_api_key").into_response();
        }
        let query = uri.query().unwrap_or_default().to_owned();
        if query != "intent=transcription" {
            stand_in
                .violations
                .lock()
                .expect("lock")
                .push(format!("query {query}"));
        }
        let first = {
            let mut sockets = stand_in.sockets.lock().expect("lock");
            *sockets += 1;
            *sockets == 1
        };
        upgrade.on_upgrade(move |socket| serve(socket, stand_in, first))
    }

    async fn send(socket: &mut WebSocket, value: Value) {
        let _ = socket.send(Message::Text(value.to_string().into())).await;
    }

    async fn serve(mut socket: WebSocket, stand_in: Transcriber, first: bool) {
        let faults = stand_in.faults;
        let violation = |what: String| stand_in.violations.lock().expect("lock").push(what);
        tokio::time::sleep(faults.created_delay).await;
        send(&mut socket, json!({"type": "session.created", "event_id": "e0", "session": {"type": "transcription"}})).await;
        let (mut configured, mut buffered, mut items) = (false, 0usize, 0usize);
        let mut words = faults.words;
        while let Some(Ok(Message::Text(text))) = socket.recv().await {
            let event: Value = serde_json::from_str(&text).expect("client events are JSON");
            match event["type"].as_str() {
                Some("session.update") => {
                    let session = &event["session"];
                    let input = &session["audio"]["input"];
                    if session["type"] != "transcription"
                        || input["format"]["rate"] != 24_000
                        || !input["turn_detection"].is_null()
                    {
                        violation(format!("session {session}"));
                    }
                    configured = true;
                    send(
                        &mut socket,
                        json!({"type": "session.updated", "session": session}),
                    )
                    .await;
                }
                Some("input_audio_buffer.append") => {
                    use base64::Engine;
                    if !configured {
                        violation("audio before session.updated".into());
                    }
                    let audio = event["audio"].as_str().expect("audio");
                    buffered += base64::engine::general_purpose::STANDARD
                        .decode(audio)
                        .expect("base64")
                        .len()
                        / 2;
                }
                Some("input_audio_buffer.commit") => {
                    if first && faults.drop_first {
                        return;
                    }
                    if buffered < 2_400 {
                        send(&mut socket, json!({"type": "error", "error": {"type": "invalid_request_error",
                            "code": "input_audio_buffer_commit_empty", "message": "buffer too small"}})).await;
                        continue;
                    }
                    items += 1;
                    let item = format!("item_{items}");
                    send(&mut socket, json!({"type": "input_audio_buffer.committed", "item_id": item, "previous_item_id": null})).await;
                    let transcript = match faults.words {
                        Some(_) if buffered > 12_000 => words.take().unwrap_or_default().to_owned(),
                        Some(_) => String::new(),
                        None => format!("heard {buffered}"),
                    };
                    for piece in transcript.split_inclusive(' ') {
                        send(
                            &mut socket,
                            json!({"type": "conversation.item.input_audio_transcription.delta",
                            "item_id": item, "content_index": 0, "delta": piece}),
                        )
                        .await;
                    }
                    send(
                        &mut socket,
                        json!({"type": "conversation.item.input_audio_transcription.completed",
                        "item_id": item, "content_index": 0, "transcript": transcript,
                        "usage": {"type": "duration", "seconds": buffered as f64 / 24_000.0}}),
                    )
                    .await;
                    buffered = 0;
                }
                other => violation(format!("an unknown event {other:?}")),
            }
        }
    }

    pub(super) async fn transcriber(faults: Faults, key: &str) -> (OpenAiStt, Transcriber) {
        let stand_in = Transcriber {
            faults,
            ..Transcriber::default()
        };
        let app = axum::Router::new()
            .route("/v1/realtime", axum::routing::get(realtime))
            .with_state(stand_in.clone());
        let addr = super::serve(app).await;
        let engine = OpenAiStt::new(OpenAiSttSettings {
            reconnect: super::quick_reconnects(),
            ..OpenAiSttSettings::new(format!("http://{addr}/v1"), Some(key.to_owned()))
        });
        (engine, stand_in)
    }

    /// One VAD segment of `samples` samples of speech at 16 kHz; returns the answer.
    async fn segment(stream: &mut SttStream, samples: usize) -> String {
        stream
            .input
            .send(SttInput::SpeechStarted)
            .await
            .expect("input");
        super::speak_and_finalize(stream, samples).await
    }

    /// The samples a "heard N" answer counts, at 24 kHz.
    fn heard(text: &str) -> usize {
        text.strip_prefix("heard ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{text:?}"))
    }

    #[tokio::test]
    async fn the_session_is_configured_before_any_audio_and_each_segment_transcribed() {
        let faults = Faults {
            created_delay: Duration::from_millis(800),
            ..Faults::default()
        };
        let (engine, stand_in) = transcriber(faults, "oa-test").await;
        assert_eq!(engine.sample_rate(), 16_000);
        let mut stream = engine.start();
        // A second at 16 kHz is a second at 24 kHz, less the resampler's delay.
        let first = heard(&segment(&mut stream, 16_000).await);
        assert!((23_500..=24_000).contains(&first), "{first}");
        // The next segment opens with the pre-roll: no more than 0.15 s before the last stop
        // (the silence the VAD waited out), here 3,600 samples at 24 kHz.
        let second = heard(&segment(&mut stream, 8_000).await);
        assert!((15_100..=15_600).contains(&second), "{second}");
        assert_eq!(*stand_in.sockets.lock().expect("lock"), 1);
        assert!(
            stand_in.violations.lock().expect("lock").is_empty(),
            "{:?}",
            stand_in.violations
        );
    }

    #[tokio::test]
    async fn a_socket_dropped_before_the_transcript_sends_the_segment_again() {
        let faults = Faults {
            drop_first: true,
            ..Faults::default()
        };
        let (engine, stand_in) = transcriber(faults, "oa-test").await;
        let mut stream = engine.start();
        let first = heard(&segment(&mut stream, 16_000).await);
        assert!((23_500..=24_000).contains(&first), "{first}");
        assert_eq!(*stand_in.sockets.lock().expect("lock"), 2);
        assert!(
            stand_in.violations.lock().expect("lock").is_empty(),
            "{:?}",
            stand_in.violations
        );
    }

    #[tokio::test]
    async fn a_rejected_key_fails_at_once_without_retrying() {
        let (engine, stand_in) = transcriber(Faults::default(), "wrong").await;
        super::refused_at_once(&engine, &stand_in.handshakes).await;
    }
}

/// ElevenLabs' multi-context socket: voice settings once per socket, at most five open contexts,
/// `close_context` answered by `isFinal`, alignment keys spelled both ways.
mod elevenlabs {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use serde_json::{Value, json};

    use voxide::services::tts::elevenlabs::{ElevenLabsSettings, ElevenLabsTts};
    use voxide::services::tts::{TtsEngine, TtsEvent, TtsInput};

    /// Samples of audio the stand-in makes per word.
    const PER_WORD: usize = 2_400;
    /// The value of every sample it makes.
    pub(super) const LEVEL: i16 = 2_345;

    #[derive(Clone, Default)]
    pub(super) struct ElevenLabs {
        /// Drop the first socket on its first text, before any audio.
        drop_first: bool,
        pub(super) sockets: Arc<Mutex<usize>>,
        handshakes: Arc<Mutex<usize>>,
        /// The voice in the path and the query of the last handshake.
        pub(super) request: Arc<Mutex<(String, String)>>,
        /// What ElevenLabs closes a socket with 1008 for.
        pub(super) violations: Arc<Mutex<Vec<String>>>,
        /// The most contexts open at once on a socket.
        pub(super) most_open: Arc<Mutex<usize>>,
    }

    async fn websocket(
        State(stand_in): State<ElevenLabs>,
        Path(voice): Path<String>,
        headers: HeaderMap,
        uri: axum::http::Uri,
        upgrade: WebSocketUpgrade,
    ) -> Response {
        *stand_in.handshakes.lock().expect("lock") += 1;
        *stand_in.request.lock().expect("lock") =
            (voice, uri.query().unwrap_or_default().to_owned());
        if headers.get("xi-api-key").and_then(|v| v.to_str().ok()) != Some("el-test") {
            return (StatusCode::UNAUTHORIZED, "invalid_api_key").into_response();
        }
        let first = {
            let mut sockets = stand_in.sockets.lock().expect("lock");
            *sockets += 1;
            *sockets == 1
        };
        upgrade.on_upgrade(move |socket| serve(socket, stand_in, first))
    }

    fn audio(context: &str, word: &str, n: usize) -> Message {
        use base64::Engine;
        let bytes: Vec<u8> = [LEVEL; PER_WORD]
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        let chars: Vec<String> = format!("{word} ").chars().map(String::from).collect();
        let starts: Vec<f64> = (0..chars.len()).map(|i| i as f64 * 10.0).collect();
        let durations = vec![10.0; chars.len()];
        // Servers have spelled these keys both ways.
        let (context_key, starts_key, durations_key) = if n.is_multiple_of(2) {
            ("contextId", "charStartTimesMs", "charDurationsMs")
        } else {
            ("context_id", "charsStartTimesMs", "charsDurationsMs")
        };
        Message::Text(
            json!({"audio": base64::engine::general_purpose::STANDARD.encode(bytes), "isFinal": null,
                context_key: context,
                "alignment": {"chars": chars, starts_key: starts, durations_key: durations},
                "normalizedAlignment": {"chars": [], "charStartTimesMs": [], "charDurationsMs": []}})
            .to_string()
            .into(),
        )
    }

    async fn refuse(socket: &mut WebSocket, stand_in: &ElevenLabs, reason: &str) {
        stand_in
            .violations
            .lock()
            .expect("lock")
            .push(reason.to_owned());
        let frame = CloseFrame {
            code: 1008,
            reason: reason.to_owned().into(),
        };
        let _ = socket.send(Message::Close(Some(frame))).await;
    }

    /// Each text is spoken at once (auto mode), a word a message. `close_context` on a flushed
    /// context is answered with `isFinal` at once; on one cut short (an interruption) with a late
    /// chunk, and its `isFinal` 200 ms later, the slot held until then.
    async fn serve(mut socket: WebSocket, stand_in: ElevenLabs, first: bool) {
        let mut open: HashMap<String, bool> = HashMap::new();
        let mut finals: Vec<(tokio::time::Instant, String)> = Vec::new();
        let mut messages = 0usize;
        let mut chunks = 0usize;
        loop {
            let due = finals.iter().map(|(at, _)| *at).min();
            let text = tokio::select! {
                message = socket.recv() => match message {
                    Some(Ok(Message::Text(text))) => text,
                    _ => return,
                },
                () = async { tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)).await }, if due.is_some() => {
                    let now = tokio::time::Instant::now();
                    let (ready, later): (Vec<_>, Vec<_>) = finals.drain(..).partition(|(at, _)| *at <= now);
                    finals = later;
                    for (_, context) in ready {
                        open.remove(&context);
                        let done = json!({"isFinal": true, "contextId": context});
                        let _ = socket.send(Message::Text(done.to_string().into())).await;
                    }
                    continue;
                }
            };
            let message: Value = serde_json::from_str(&text).expect("client messages are JSON");
            messages += 1;
            let has_settings = message.get("voice_settings").is_some();
            if messages == 1 && !has_settings {
                return refuse(
                    &mut socket,
                    &stand_in,
                    "voice_settings field must be provided in the first message",
                )
                .await;
            }
            if messages > 1 && has_settings {
                return refuse(
                    &mut socket,
                    &stand_in,
                    "voice_settings may only be provided in the first message",
                )
                .await;
            }
            if message["close_socket"] == true {
                return;
            }
            let context = message["context_id"]
                .as_str()
                .expect("a context")
                .to_owned();
            if message["close_context"] == true {
                let flushed = open.get(&context).copied().unwrap_or(true);
                if flushed {
                    open.remove(&context);
                    let done = json!({"isFinal": true, "contextId": context});
                    let _ = socket.send(Message::Text(done.to_string().into())).await;
                } else {
                    let _ = socket.send(audio(&context, "late", chunks)).await;
                    finals.push((
                        tokio::time::Instant::now() + Duration::from_millis(200),
                        context,
                    ));
                }
                continue;
            }
            if message["flush"] == true {
                open.insert(context, true);
                continue;
            }
            let text = message["text"].as_str().expect("a text");
            if text == " " {
                open.insert(context, false);
                {
                    let mut most = stand_in.most_open.lock().expect("lock");
                    *most = (*most).max(open.len());
                }
                if open.len() > 5 {
                    return refuse(
                        &mut socket,
                        &stand_in,
                        "Maximum simultaneous contexts per WebSocket connection exceeded (5)",
                    )
                    .await;
                }
                continue;
            }
            if text.is_empty() {
                continue;
            }
            assert!(text.ends_with(' '), "each text ends in a space: {text:?}");
            if first && stand_in.drop_first {
                return;
            }
            for word in text.split_whitespace() {
                let _ = socket.send(audio(&context, word, chunks)).await;
                chunks += 1;
            }
        }
    }

    pub(super) async fn elevenlabs(stand_in: ElevenLabs, key: &str) -> (ElevenLabsTts, ElevenLabs) {
        let app = axum::Router::new()
            .route(
                "/v1/text-to-speech/{voice}/multi-stream-input",
                axum::routing::get(websocket),
            )
            .with_state(stand_in.clone());
        let addr = super::serve(app).await;
        let engine = ElevenLabsTts::new(ElevenLabsSettings {
            url: format!("ws://{addr}"),
            reconnect: super::quick_reconnects(),
            ..ElevenLabsSettings::new(key)
        });
        (engine, stand_in)
    }

    async fn say(engine: &ElevenLabsTts, pieces: &[&str]) -> Vec<TtsEvent> {
        let mut context = engine.open();
        for piece in pieces {
            context
                .input
                .send(TtsInput::Text((*piece).to_owned()))
                .await
                .expect("text");
        }
        context.input.send(TtsInput::Flush).await.expect("flush");
        super::until_end(&mut context).await
    }

    fn words(events: &[TtsEvent]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                TtsEvent::Words { words, .. } => Some(words.iter().map(|w| w.word.clone())),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[tokio::test]
    async fn turns_are_spoken_with_timed_words_and_end_with_their_final() {
        let (engine, stand_in) = elevenlabs(ElevenLabs::default(), "el-test").await;
        let events = say(&engine, &["Hello there.", "How are you?"]).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        assert_eq!(super::samples_at(&events, LEVEL), 5 * PER_WORD);
        assert_eq!(words(&events), ["Hello", "there.", "How", "are", "you?"]);
        let starts: Vec<f64> = events
            .iter()
            .filter_map(|e| match e {
                TtsEvent::Words { words, .. } => Some(words[0].start_secs),
                _ => None,
            })
            .collect();
        assert!(
            starts.windows(2).all(|w| (w[1] - w[0] - 0.1).abs() < 1e-9),
            "each word 100 ms after the one before: {starts:?}"
        );
        // The second turn on the same socket sends no voice settings.
        let events = say(&engine, &["Fine."]).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        assert_eq!(*stand_in.sockets.lock().expect("lock"), 1);
        assert!(
            stand_in.violations.lock().expect("lock").is_empty(),
            "{:?}",
            stand_in.violations
        );
        let (voice, query) = stand_in.request.lock().expect("lock").clone();
        assert_eq!(voice, "21m00Tcm4TlvDq8ikWAM");
        for part in [
            "model_id=eleven_flash_v2_5",
            "output_format=pcm_24000",
            "auto_mode=true",
        ] {
            assert!(query.contains(part), "{query}");
        }
    }

    #[tokio::test]
    async fn rapid_barge_ins_never_hold_more_than_five_contexts() {
        let (engine, stand_in) = elevenlabs(ElevenLabs::default(), "el-test").await;
        for n in 0..8 {
            let mut context = engine.open();
            context
                .input
                .send(TtsInput::Text(format!("Turn {n} is cut short.")))
                .await
                .expect("text");
            // The first audio shows the context is open at ElevenLabs; then the user barges in.
            loop {
                match context.events.recv().await.expect("an event") {
                    TtsEvent::Audio(_) => break,
                    TtsEvent::Words { .. } | TtsEvent::Characters(_) => {}
                    other => panic!("speech first: {other:?}"),
                }
            }
        }
        let events = say(&engine, &["Still here."]).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        assert_eq!(
            words(&events),
            ["Still", "here."],
            "no late audio of a cut turn"
        );
        assert!(
            stand_in.violations.lock().expect("lock").is_empty(),
            "{:?}",
            stand_in.violations
        );
        assert_eq!(*stand_in.most_open.lock().expect("lock"), 5);
        assert_eq!(*stand_in.sockets.lock().expect("lock"), 1);
    }

    #[tokio::test]
    async fn text_whose_socket_died_before_any_audio_is_sent_again() {
        let stand_in = ElevenLabs {
            drop_first: true,
            ..ElevenLabs::default()
        };
        let (engine, stand_in) = elevenlabs(stand_in, "el-test").await;
        let events = say(&engine, &["Nothing is lost."]).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        assert_eq!(words(&events), ["Nothing", "is", "lost."]);
        assert_eq!(*stand_in.sockets.lock().expect("lock"), 2);
        assert!(
            stand_in.violations.lock().expect("lock").is_empty(),
            "{:?}",
            stand_in.violations
        );
    }

    #[tokio::test]
    async fn a_rejected_key_fails_at_once_without_retrying() {
        let (engine, stand_in) = elevenlabs(ElevenLabs::default(), "wrong").await;
        let events = say(&engine, &["Hello."]).await;
        assert!(
            matches!(events.last(), Some(TtsEvent::Failed(m)) if m.contains("401")),
            "{events:?}"
        );
        assert_eq!(
            *stand_in.handshakes.lock().expect("lock"),
            1,
            "no retry storm"
        );
    }
}

/// `voxide run --stt deepgram --tts cartesia` against the stand-ins: transcripts, bot audio and
/// events as with the embedded engines; and the embedded engines taking over when a provider
/// refuses the key.
mod whole_bot {
    use voxide::bot::{BotOptions, SttChoice, TtsChoice, Voice};

    use super::cartesia::{Cartesia, LEVEL, cartesia};
    use super::common::HELLO;
    use super::common::bot_run::{Ran, event, run_bot};
    use super::deepgram::{Faults, deepgram};

    async fn ask(stt: Vec<SttChoice>, tts: Vec<TtsChoice>, name: &str) -> Ran {
        let bot = BotOptions {
            stt,
            tts,
            voice: Voice::Piper,
            ..BotOptions::default()
        };
        run_bot(bot, HELLO.as_ref(), name).await
    }

    fn heard_once() -> Faults {
        Faults {
            words: Some("Hello there. What time is it?"),
            ..Faults::default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bot_hears_the_turn_from_deepgram_and_answers_it() {
        let (listener, stand_in) = deepgram(heard_once(), "dg-test").await;
        let ran = ask(
            vec![SttChoice::Deepgram(listener.settings().clone())],
            vec![TtsChoice::Embedded],
            "deepgram",
        )
        .await;
        assert_eq!(ran.summary.transcripts, ["Hello there. What time is it?"]);
        assert!(ran.summary.errors.is_empty(), "{:?}", ran.summary.errors);
        assert_eq!(
            ran.summary.voice_to_voice_ms.len(),
            1,
            "the turn is answered"
        );
        assert_eq!(*stand_in.sockets.lock().expect("lock"), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rejected_deepgram_key_hands_the_listening_to_whisper_and_says_so() {
        let (listener, _) = deepgram(Faults::default(), "wrong").await;
        let ran = ask(
            vec![
                SttChoice::Deepgram(listener.settings().clone()),
                SttChoice::Whisper,
            ],
            vec![TtsChoice::Embedded],
            "stt_fallback",
        )
        .await;
        let fallback = event(&ran.events, "stt_fallback").expect("an stt_fallback event");
        assert_eq!(fallback["from"], "deepgram");
        assert_eq!(fallback["to"], "whisper");
        assert!(fallback["reason"].as_str().expect("reason").contains("401"));
        let heard = ran.summary.transcripts.join(" ").to_lowercase();
        assert!(heard.contains("weather"), "Whisper heard {heard:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deepgram_listens_and_cartesia_speaks_the_answer() {
        let (listener, _) = deepgram(heard_once(), "dg-test").await;
        let (voice, seen) = cartesia(Cartesia::default(), "ct-test").await;
        let ran = ask(
            vec![SttChoice::Deepgram(listener.settings().clone())],
            vec![TtsChoice::Cartesia(voice.settings().clone())],
            "deepgram_cartesia",
        )
        .await;
        let summary = &ran.summary;
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(summary.transcripts, ["Hello there. What time is it?"]);
        assert_eq!(summary.voice_to_voice_ms.len(), 1, "the turn is answered");
        assert!(
            !summary.bot_text.is_empty(),
            "the bot's words, as Cartesia timed them"
        );
        let voiced = ran.audio.iter().filter(|s| **s == LEVEL).count();
        assert!(
            voiced > 2_400,
            "Cartesia's audio is what was played: {voiced} samples"
        );
        assert!(event(&ran.events, "bot_started_speaking").is_some());
        let spoken: String = seen
            .seen
            .lock()
            .expect("lock")
            .iter()
            .filter_map(|(_, m)| m["transcript"].as_str().map(str::to_owned))
            .collect();
        assert!(!spoken.is_empty(), "the answer went to Cartesia");
        // What each service cost, in the metrics events.
        let metrics: Vec<&serde_json::Value> = ran
            .events
            .iter()
            .filter(|e| e["type"] == "metrics")
            .flat_map(|e| e["data"].as_array().into_iter().flatten())
            .collect();
        let priced = |kind: &str, model: &str| {
            metrics
                .iter()
                .find(|m| m["type"] == kind && m["model"] == model)
                .and_then(|m| m["cost_usd"].as_f64())
        };
        assert!(
            priced("stt_usage", "nova-3").is_some_and(|c| c > 0.0),
            "{metrics:?}"
        );
        assert!(
            priced("tts_usage", "sonic-3.5").is_some_and(|c| c > 0.0),
            "{metrics:?}"
        );
        let stt_ttfb = metrics
            .iter()
            .find(|m| {
                m["type"] == "ttfb"
                    && m["processor"]
                        .as_str()
                        .is_some_and(|p| p.starts_with("SttService"))
            })
            .and_then(|m| m["seconds"].as_f64())
            .expect("the STT's time to its final");
        assert!(
            stt_ttfb >= 0.2,
            "timed from the estimated end of speech: {stt_ttfb}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn assemblyai_listens_and_elevenlabs_speaks_the_answer() {
        let faults = super::assemblyai::Faults {
            words: Some("Hello there. What time is it?"),
            ..Default::default()
        };
        let (listener, _) = super::assemblyai::assemblyai(faults, "aai-test").await;
        let (voice, seen) = super::elevenlabs::elevenlabs(Default::default(), "el-test").await;
        let ran = ask(
            vec![SttChoice::AssemblyAi(listener.settings().clone())],
            vec![TtsChoice::ElevenLabs(voice.settings().clone())],
            "assemblyai_elevenlabs",
        )
        .await;
        let summary = &ran.summary;
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(summary.transcripts, ["Hello there. What time is it?"]);
        assert_eq!(summary.voice_to_voice_ms.len(), 1, "the turn is answered");
        assert!(
            !summary.bot_text.is_empty(),
            "the bot's words, as ElevenLabs timed them"
        );
        let voiced = ran
            .audio
            .iter()
            .filter(|s| **s == super::elevenlabs::LEVEL)
            .count();
        assert!(
            voiced > 2_400,
            "ElevenLabs' audio is what was played: {voiced} samples"
        );
        assert!(seen.violations.lock().expect("lock").is_empty());
        let metrics: Vec<&serde_json::Value> = ran
            .events
            .iter()
            .filter(|e| e["type"] == "metrics")
            .flat_map(|e| e["data"].as_array().into_iter().flatten())
            .collect();
        let priced = |kind: &str, model: &str| {
            metrics
                .iter()
                .find(|m| m["type"] == kind && m["model"] == model)
                .and_then(|m| m["cost_usd"].as_f64())
        };
        assert!(priced("stt_usage", "universal-streaming-english").is_some_and(|c| c > 0.0));
        assert!(priced("tts_usage", "eleven_flash_v2_5").is_some_and(|c| c > 0.0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn openai_transcribes_the_turn_the_vad_cut() {
        let faults = super::openai_transcription::Faults {
            words: Some("Hello there. What time is it?"),
            ..Default::default()
        };
        let (listener, stand_in) =
            super::openai_transcription::transcriber(faults, "oa-test").await;
        let ran = ask(
            vec![SttChoice::OpenAi(listener.settings().clone())],
            vec![TtsChoice::Embedded],
            "openai_stt",
        )
        .await;
        assert!(ran.summary.errors.is_empty(), "{:?}", ran.summary.errors);
        assert_eq!(ran.summary.transcripts, ["Hello there. What time is it?"]);
        assert_eq!(
            ran.summary.voice_to_voice_ms.len(),
            1,
            "the turn is answered"
        );
        assert!(stand_in.violations.lock().expect("lock").is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rejected_cartesia_key_hands_the_voice_to_piper_and_says_so() {
        let (voice, _) = cartesia(Cartesia::default(), "wrong").await;
        let ran = ask(
            vec![SttChoice::Whisper],
            vec![
                TtsChoice::Cartesia(voice.settings().clone()),
                TtsChoice::Embedded,
            ],
            "tts_fallback",
        )
        .await;
        let fallback = event(&ran.events, "tts_fallback").expect("a tts_fallback event");
        assert_eq!(fallback["from"], "cartesia");
        assert_eq!(fallback["to"], "piper");
        assert_eq!(
            ran.summary.voice_to_voice_ms.len(),
            1,
            "the turn is answered"
        );
        assert!(
            ran.audio.iter().any(|s| s.unsigned_abs() > 1_000),
            "Piper's voice was played"
        );
    }
}

/// OpenAI-compatible speech over HTTP: raw PCM streamed back per sentence, with odd byte splits.
mod openai_speech {
    use std::sync::{Arc, Mutex};

    use axum::body::{Body, Bytes};
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use serde_json::Value;

    use voxide::services::tts::openai::{OpenAiSpeech, OpenAiSpeechSettings};
    use voxide::services::tts::{TtsEngine, TtsEvent, TtsInput};

    const LEVEL: i16 = -2_345;
    const PER_WORD: usize = 4_800;

    #[derive(Clone, Default)]
    struct Speech {
        bodies: Arc<Mutex<Vec<Value>>>,
    }

    async fn speech(
        State(stand_in): State<Speech>,
        headers: HeaderMap,
        axum::Json(body): axum::Json<Value>,
    ) -> Response {
        if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer sk-test") {
            return (
                StatusCode::UNAUTHORIZED,
                r#"{"error":{"message":"Incorrect API key provided"}}"#,
            )
                .into_response();
        }
        let words = body["input"]
            .as_str()
            .unwrap_or_default()
            .split_whitespace()
            .count();
        stand_in.bodies.lock().expect("lock").push(body);
        let bytes: Vec<u8> = std::iter::repeat_n(LEVEL, words * PER_WORD)
            .flat_map(i16::to_le_bytes)
            .collect();
        // Pieces of an odd length: samples split between chunks.
        let pieces: Vec<Result<Bytes, std::convert::Infallible>> = bytes
            .chunks(1_001)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        Body::from_stream(futures_util::stream::iter(pieces)).into_response()
    }

    async fn engine(key: &str) -> (OpenAiSpeech, Speech) {
        let stand_in = Speech::default();
        let app = axum::Router::new()
            .route("/v1/audio/speech", axum::routing::post(speech))
            .with_state(stand_in.clone());
        let addr = super::serve(app).await;
        let engine = OpenAiSpeech::new(OpenAiSpeechSettings {
            base_url: format!("http://{addr}/v1"),
            api_key: Some(key.into()),
            model: "gpt-4o-mini-tts".into(),
            voice: "alloy".into(),
            first_chunk_timeout: std::time::Duration::from_secs(5),
        })
        .expect("engine");
        (engine, stand_in)
    }

    async fn speak(engine: &OpenAiSpeech, sentences: &[&str]) -> Vec<TtsEvent> {
        let mut context = engine.open();
        for sentence in sentences {
            context
                .input
                .send(TtsInput::Text((*sentence).to_owned()))
                .await
                .expect("text");
        }
        context.input.send(TtsInput::Flush).await.expect("flush");
        super::until_end(&mut context).await
    }

    #[tokio::test]
    async fn each_sentence_is_spoken_whole_with_its_words_timed_where_its_audio_starts() {
        let (engine, stand_in) = engine("sk-test").await;
        assert_eq!(engine.sample_rate(), 24_000);
        let events = speak(&engine, &["Hello there.", "It is noon."]).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        let audio: Vec<i16> = events
            .iter()
            .filter_map(|e| match e {
                TtsEvent::Audio(samples) => Some(samples.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(audio.len(), 5 * PER_WORD, "every sample, none split");
        assert!(audio.iter().all(|s| *s == LEVEL));
        let starts: Vec<f64> = events
            .iter()
            .filter_map(|e| match e {
                TtsEvent::Words { words, .. } => words.first().map(|w| w.start_secs),
                _ => None,
            })
            .collect();
        // The second sentence starts where the first one's audio ended.
        assert_eq!(starts.len(), 2);
        assert_eq!(starts[0], 0.0);
        assert!(
            (starts[1] - 2.0 * PER_WORD as f64 / 24_000.0).abs() < 1e-9,
            "{starts:?}"
        );
        let bodies = stand_in.bodies.lock().expect("lock").clone();
        assert_eq!(bodies.len(), 2);
        assert_eq!(bodies[0]["input"], "Hello there.");
        assert_eq!(bodies[0]["response_format"], "pcm");
        assert_eq!(bodies[0]["voice"], "alloy");
    }

    #[tokio::test]
    async fn a_rejected_key_fails_the_voice_for_good() {
        let (engine, _) = engine("wrong").await;
        match speak(&engine, &["Hello."]).await.last() {
            Some(TtsEvent::Failed(message)) => {
                assert!(
                    message.contains("401") && message.contains("Incorrect API key"),
                    "{message}"
                )
            }
            other => panic!("a failure: {other:?}"),
        }
    }
}

/// Deepgram Aura's streaming voice: `Speak` per sentence, one `Flush` per turn, `Clear` on an
/// interruption with audio still on its way.
mod aura {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::extract::State;
    use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use serde_json::{Value, json};

    use voxide::services::tts::deepgram::{AuraSettings, AuraTts};
    use voxide::services::tts::{TtsEngine, TtsEvent, TtsInput};

    const LEVEL: i16 = 3_456;
    const PER_WORD: usize = 2_400;

    #[derive(Clone, Default)]
    struct Aura {
        seen: Arc<Mutex<Vec<Value>>>,
        query: Arc<Mutex<String>>,
    }

    async fn speak(
        State(stand_in): State<Aura>,
        headers: HeaderMap,
        uri: axum::http::Uri,
        upgrade: WebSocketUpgrade,
    ) -> Response {
        if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Token dg-test") {
            return (StatusCode::UNAUTHORIZED, "INVALID_AUTH").into_response();
        }
        *stand_in.query.lock().expect("lock") = uri.query().unwrap_or_default().to_owned();
        upgrade.on_upgrade(move |socket| serve(socket, stand_in))
    }

    fn pcm(samples: usize) -> Message {
        let bytes: Vec<u8> = std::iter::repeat_n(LEVEL, samples)
            .flat_map(i16::to_le_bytes)
            .collect();
        Message::Binary(bytes.into())
    }

    /// Audio per word for each `Speak`; `Flushed` per `Flush`; a `Clear` is answered after one
    /// more chunk of the cleared speech.
    async fn serve(mut socket: WebSocket, stand_in: Aura) {
        let mut sequence = 0;
        while let Some(Ok(Message::Text(text))) = socket.recv().await {
            let message: Value = serde_json::from_str(&text).expect("client messages are JSON");
            stand_in.seen.lock().expect("lock").push(message.clone());
            let reply = match message["type"].as_str() {
                Some("Speak") => {
                    let words = message["text"]
                        .as_str()
                        .unwrap_or_default()
                        .split_whitespace()
                        .count();
                    for _ in 0..words {
                        let _ = socket.send(pcm(PER_WORD)).await;
                    }
                    continue;
                }
                Some("Flush") => json!({"type": "Flushed", "sequence_id": sequence}),
                Some("Clear") => {
                    let _ = socket.send(pcm(480)).await;
                    json!({"type": "Cleared", "sequence_id": sequence})
                }
                Some("Close") => return,
                other => panic!("unknown client message {other:?}"),
            };
            sequence += 1;
            let _ = socket.send(Message::Text(reply.to_string().into())).await;
        }
    }

    async fn aura() -> (AuraTts, Aura) {
        let stand_in = Aura::default();
        let app = axum::Router::new()
            .route("/v1/speak", axum::routing::get(speak))
            .with_state(stand_in.clone());
        let addr = super::serve(app).await;
        let engine = AuraTts::new(AuraSettings {
            url: format!("ws://{addr}"),
            reconnect: super::quick_reconnects(),
            ..AuraSettings::new("dg-test")
        });
        (engine, stand_in)
    }

    #[tokio::test]
    async fn a_turn_is_spoken_sentence_by_sentence_and_flushed_once() {
        let (engine, stand_in) = aura().await;
        let mut context = engine.open();
        for sentence in ["Hello there.", "How are you?"] {
            context
                .input
                .send(TtsInput::Text(sentence.into()))
                .await
                .expect("text");
        }
        context.input.send(TtsInput::Flush).await.expect("flush");
        let events = super::until_end(&mut context).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        assert_eq!(super::samples_at(&events, LEVEL), 5 * PER_WORD);
        let seen = stand_in.seen.lock().expect("lock").clone();
        let kinds: Vec<&str> = seen.iter().filter_map(|m| m["type"].as_str()).collect();
        assert_eq!(kinds, ["Speak", "Speak", "Flush"]);
        let query = stand_in.query.lock().expect("lock").clone();
        assert!(
            query.contains("encoding=linear16") && query.contains("sample_rate=24000"),
            "{query}"
        );
    }

    #[tokio::test]
    async fn an_interrupted_turn_is_cleared_and_its_late_audio_never_heard() {
        let (engine, stand_in) = aura().await;
        let mut first = engine.open();
        first
            .input
            .send(TtsInput::Text("This answer is cut short.".into()))
            .await
            .expect("text");
        loop {
            if let TtsEvent::Audio(_) = first.events.recv().await.expect("an event") {
                break;
            }
        }
        drop(first);
        // The clear goes out on its own: the next turn starts once the stand-in has it.
        tokio::time::timeout(Duration::from_secs(10), async {
            while !stand_in
                .seen
                .lock()
                .expect("lock")
                .iter()
                .any(|m| m["type"] == "Clear")
            {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a Clear for the cut turn");
        let mut next = engine.open();
        next.input
            .send(TtsInput::Text("Yes?".into()))
            .await
            .expect("text");
        next.input.send(TtsInput::Flush).await.expect("flush");
        let events = super::until_end(&mut next).await;
        assert_eq!(events.last(), Some(&TtsEvent::Done));
        assert_eq!(
            super::samples_at(&events, LEVEL),
            PER_WORD,
            "none of the cut turn's audio"
        );
    }
}
