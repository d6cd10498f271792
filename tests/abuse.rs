//! Clients that abuse a session: audio at ten times real time, messages over the size limit,
//! a client that never reads. Each is closed (told why where it still reads), while a caller
//! beside it is still answered. (A write stuck for `CLIENT_WRITE_TIMEOUT` is given up on:
//! `server::ws`'s unit test; sessions opened in a loop meet the per-address limit:
//! `tests/api.rs`.) Needs the models (`scripts/setup.sh`).

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

    /// A counter's value in the server's `/metrics`.
    async fn counter(addr: std::net::SocketAddr, name: &str) -> f64 {
        let (_, text) = common::get(addr, "/metrics").await;
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until `name` reaches `at_least`, within `within`; its last value.
    async fn counter_reaches(
        addr: std::net::SocketAddr,
        name: &str,
        at_least: f64,
        within: Duration,
    ) -> f64 {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let value = counter(addr, name).await;
            if value >= at_least || tokio::time::Instant::now() >= deadline {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_reads_nothing_is_not_listened_to_then_closed_and_kept_out_a_while() {
        let server = start(2).await;
        let url = format!("ws://{}/ws?sample_rate=16000", server.addr);
        let (deaf, _) = tokio_tungstenite::connect_async(&url)
            .await
            .expect("upgrade");
        // It talks in real time and never reads, so it never answers the server's pings.
        let (mut tx, rx) = deaf.split();
        let frames = frames();
        let talk = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            for frame in frames.iter().cycle() {
                tick.tick().await;
                if tx.send(Message::binary(frame.clone())).await.is_err() {
                    return;
                }
            }
        });
        let unheard = counter_reaches(
            server.addr,
            "voxide_unheard_audio_frames_total",
            10.0,
            Duration::from_secs(20),
        )
        .await;
        assert!(unheard >= 10.0, "its audio is dropped: {unheard}");
        let closed = counter_reaches(
            server.addr,
            "voxide_sessions_not_reading_total",
            1.0,
            Duration::from_secs(40),
        )
        .await;
        assert_eq!(closed, 1.0, "it is closed for reading nothing");
        talk.abort();
        drop(rx);

        // Its address waits a while for its next session.
        let again = tokio_tungstenite::connect_async(&url).await;
        match again {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 429);
            }
            other => panic!(
                "the address is kept out for a while: {:?}",
                other.map(|_| ())
            ),
        }
    }
}
