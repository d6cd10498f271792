//! Clients that abuse a session: audio at ten times real time, messages over the size limit.
//! Each is told why and closed, while a caller beside it is still answered. (A client that never
//! reads is given up on after `CLIENT_WRITE_TIMEOUT`: `server::ws`'s unit test; sessions opened
//! in a loop meet the per-address limit: `tests/api.rs`.) Needs the models
//! (`scripts/setup.sh`).

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use voxide::audio::wav;

mod common;

use common::{HELLO, start};

/// 20 ms frames of the shipped question, as `/ws` takes them.
fn frames() -> Vec<Vec<u8>> {
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    hello
        .chunks(320)
        .chain(std::iter::repeat_n(&[0i16; 320][..], 100))
        .map(|chunk| chunk.iter().flat_map(|s| s.to_le_bytes()).collect())
        .collect()
}

/// What a client heard until the socket closed (or `within` ran out): the server's events, and
/// whether the server closed it.
async fn listen(
    mut rx: impl futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
    + Unpin,
    within: Duration,
    until: &str,
) -> (Vec<Value>, bool) {
    let deadline = tokio::time::Instant::now() + within;
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => {
                let event: Value = serde_json::from_str(&text).expect("JSON events");
                let done = event["type"] == until;
                events.push(event);
                if done {
                    return (events, false);
                }
            }
            Ok(Some(Ok(Message::Close(_))) | None | Some(Err(_))) => return (events, true),
            Ok(Some(Ok(_))) => {}
            Err(_) => return (events, false),
        }
    }
}

mod whole_bot {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn audio_at_ten_times_real_time_is_refused_with_a_reason_and_a_caller_beside_it_is_answered()
     {
        let server = start(2).await;
        let url = format!("ws://{}/ws?sample_rate=16000", server.addr);
        let frames = frames();

        let (abuser, _) = tokio_tungstenite::connect_async(&url)
            .await
            .expect("upgrade");
        let (mut abuser_tx, abuser_rx) = abuser.split();
        let abuser_frames = frames.clone();
        let flood = tokio::spawn(async move {
            // A frame every 2 ms: ten times real time, over and over.
            let mut tick = tokio::time::interval(Duration::from_millis(2));
            for frame in abuser_frames.iter().cycle().take(20_000) {
                tick.tick().await;
                if abuser_tx
                    .send(Message::binary(frame.clone()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });

        let (caller, _) = tokio_tungstenite::connect_async(&url)
            .await
            .expect("upgrade");
        let (mut caller_tx, caller_rx) = caller.split();
        let heard = tokio::spawn(listen(
            caller_rx,
            Duration::from_secs(90),
            "bot_started_speaking",
        ));
        let talk = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            for frame in frames {
                tick.tick().await;
                if caller_tx.send(Message::binary(frame)).await.is_err() {
                    return;
                }
            }
        });

        let (events, closed) = listen(abuser_rx, Duration::from_secs(30), "").await;
        assert!(closed, "the flooding client is closed: {events:?}");
        let said = events
            .iter()
            .find(|e| e["type"] == "error")
            .and_then(|e| e["message"].as_str())
            .unwrap_or_default();
        assert!(said.starts_with("audio_too_fast"), "{events:?}");
        flood.abort();

        let (events, _) = heard.await.expect("the caller's reader");
        assert!(
            events.iter().any(|e| e["type"] == "bot_started_speaking"),
            "the caller beside it is answered: {events:?}"
        );
        talk.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_over_a_megabyte_closes_the_socket() {
        let server = start(1).await;
        let url = format!("ws://{}/ws?sample_rate=16000", server.addr);
        let (socket, _) = tokio_tungstenite::connect_async(&url)
            .await
            .expect("upgrade");
        let (mut tx, rx) = socket.split();
        let huge = format!(
            r#"{{"type":"text","text":"{}"}}"#,
            "a".repeat(voxide::server::MAX_WS_MESSAGE)
        );
        // The server may close before the whole message is written.
        let _ = tx.send(Message::text(huge)).await;
        let (_, closed) = listen(rx, Duration::from_secs(30), "").await;
        assert!(closed);
        // The server still takes callers.
        let (status, _) = common::get(server.addr, "/readyz").await;
        assert_eq!(status, 200);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn typed_text_faster_than_a_person_or_longer_than_a_page_is_dropped_with_a_reason() {
        use voxide::transports::pace::{MAX_TYPED_CHARS, TYPED_BURST};
        let server = start(1).await;
        let url = format!("ws://{}/ws?sample_rate=16000", server.addr);
        let (socket, _) = tokio_tungstenite::connect_async(&url)
            .await
            .expect("upgrade");
        let (mut tx, rx) = socket.split();
        let typed = |text: &str| {
            Message::text(serde_json::json!({"type": "text", "text": text}).to_string())
        };
        tx.send(typed(&"a".repeat(MAX_TYPED_CHARS + 1)))
            .await
            .expect("send");
        for _ in 0..TYPED_BURST + 3 {
            tx.send(typed("What time is it?")).await.expect("send");
        }
        let (events, closed) = listen(rx, Duration::from_secs(5), "never").await;
        assert!(!closed, "the session goes on");
        let errors: Vec<&str> = events
            .iter()
            .filter(|e| e["type"] == "error")
            .filter_map(|e| e["message"].as_str())
            .collect();
        assert_eq!(
            errors
                .iter()
                .filter(|e| e.starts_with("text_too_long"))
                .count(),
            1,
            "{errors:?}"
        );
        assert_eq!(
            errors
                .iter()
                .filter(|e| e.starts_with("text_too_fast"))
                .count(),
            3,
            "{errors:?}"
        );
    }
}
