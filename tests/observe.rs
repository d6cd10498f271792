//! Seeing a session afterwards, over real sockets: `voxide serve --record-dir` writes a
//! stereo recording aligned with what the session reported and a transcript, exports the
//! session's trace to an OTLP collector, and a recording that cannot be written leaves the
//! call running. Needs the models (`scripts/setup.sh`).

use std::path::PathBuf;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use voxide::audio::wav;
use voxide::bot::{BotOptions, Voice};
use voxide::observe::journal::Journal;
use voxide::observe::trace::TraceOptions;

mod common;

use common::otlp::{attribute, collector};
use common::{HELLO, get, start_options, test_options};

fn bot() -> Vec<BotOptions> {
    vec![BotOptions {
        voice: Voice::Espeak,
        ..BotOptions::default()
    }]
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("voxide-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder");
    dir
}

/// Says HELLO over `/ws` (`query` added to the URL) and returns the events until the bot has
/// answered, then asks the bot to finish and waits for the socket to close.
async fn say_hello(
    addr: std::net::SocketAddr,
    query: &str,
    traceparent: Option<&str>,
) -> Vec<Value> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("ws://{addr}/ws?sample_rate=16000&out_sample_rate=24000{query}");
    let mut request = url.into_client_request().expect("a request");
    if let Some(traceparent) = traceparent {
        request
            .headers_mut()
            .insert("traceparent", traceparent.parse().expect("a header"));
    }
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    let (mut tx, mut rx) = socket.split();
    let reader = tokio::spawn(async move {
        let mut events = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline, rx.next()).await {
            if let Message::Text(text) = message {
                let event: Value = serde_json::from_str(&text).expect("JSON events");
                let done = event["type"] == "bot_stopped_speaking";
                events.push(event);
                if done {
                    break;
                }
            }
        }
        (events, rx)
    });
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for chunk in hello
        .chunks(320)
        .chain(std::iter::repeat_n(&[0i16; 320][..], 400))
    {
        tick.tick().await;
        let bytes: Vec<u8> = chunk.iter().flat_map(|s| s.to_le_bytes()).collect();
        if tx.send(Message::binary(bytes)).await.is_err() || reader.is_finished() {
            break;
        }
    }
    let (events, mut rx) = reader.await.expect("reader");
    tx.send(Message::text(r#"{"type":"stop"}"#))
        .await
        .expect("send");
    // The session ends, then the socket closes.
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(Ok(_)) = rx.next().await {}
    })
    .await;
    events
}

/// Where a channel first gets loud after `from`, and where it last is before `to`, in ms.
fn loud_span_ms(samples: &[i16], rate: u32, from: usize, to: usize) -> Option<(f64, f64)> {
    let ms = |i: usize| i as f64 * 1e3 / f64::from(rate);
    let to = to.min(samples.len());
    let first = (from..to).find(|&i| samples[i].unsigned_abs() > 2_000)?;
    let last = (first..to)
        .rev()
        .find(|&i| samples[i].unsigned_abs() > 2_000)?;
    Some((ms(first), ms(last)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_session_is_aligned_with_what_it_reported_and_its_trace_reaches_the_collector() {
    let dir = fresh_dir("record");
    let (endpoint, received) = collector().await;
    let traces = TraceOptions::resolve(Some(&endpoint), 1.0, |_| None)
        .expect("options")
        .expect("an endpoint");
    let mut server = start_options(voxide::server::ServeOptions {
        record_dir: Some(dir.clone()),
        traces: Some(traces),
        ..test_options(bot())
    })
    .await;
    let addr = server.addr;
    // The caller's trace: the server's spans of the session join it.
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let events = say_hello(addr, "", Some(caller)).await;
    assert!(
        events.iter().any(|e| e["type"] == "bot_started_speaking"),
        "{events:?}"
    );

    // The transcript: the turn, its words, its latency, and the file beside it.
    let transcript = std::fs::read_dir(&dir)
        .expect("the folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "json"));
    // Written before the session's socket closed.
    let transcript = transcript.expect("a transcript");
    let journal: Journal =
        serde_json::from_str(&std::fs::read_to_string(&transcript).expect("read"))
            .expect("a journal");
    let turn = journal
        .turns
        .iter()
        .find(|t| t.user_text.iter().any(|w| w.contains("weather")))
        .unwrap_or_else(|| panic!("the question's turn: {journal:#?}"));
    let v2v = turn.voice_to_voice_ms.expect("its voice-to-voice");
    let bot_start = turn.bot.expect("the bot answered").start_ms as f64;
    assert_eq!(journal.transport, "websocket");
    assert!(journal.ended.is_some());

    // The recording: the user on the left, the bot on the right, where the session said.
    let audio = transcript.with_file_name(journal.audio.as_deref().expect("a recording"));
    let stereo = wav::read(&audio).expect("a WAV");
    assert_eq!((stereo.channels, stereo.sample_rate), (2, 16_000));
    let left: Vec<i16> = stereo.samples.iter().step_by(2).copied().collect();
    let right: Vec<i16> = stereo.samples.iter().skip(1).step_by(2).copied().collect();
    let (bot_onset, _) = loud_span_ms(&right, 16_000, 0, right.len()).expect("the bot's voice");
    assert!(
        (bot_onset - bot_start).abs() <= 80.0,
        "the bot's first sound at {bot_onset:.0} ms in the file, {bot_start:.0} ms in the events"
    );
    let (_, user_end) =
        loud_span_ms(&left, 16_000, 0, (bot_onset * 16.0) as usize).expect("the user's voice");
    let heard_v2v = bot_onset - user_end;
    assert!(
        (heard_v2v - v2v).abs() <= 150.0,
        "voice to voice {heard_v2v:.0} ms in the file, {v2v:.0} ms reported"
    );

    // The trace: the session's root, its turns under it, the LLM request under a turn.
    let trace_id = journal.trace_id.clone().expect("traced");
    assert_eq!(
        trace_id, "4bf92f3577b34da6a3ce929d0e0e4736",
        "the caller's trace"
    );
    let mut spans = Vec::new();
    for _ in 0..100 {
        spans = received.spans();
        if spans.iter().any(|(_, s)| s.name == "voxide.session") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hex = |id: &[u8]| id.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert!(
        spans
            .iter()
            .all(|(service, s)| service == "voxide" && hex(&s.trace_id) == trace_id)
    );
    let root = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name == "voxide.session")
        .expect("the session's span");
    assert_eq!(
        root.parent_span_id,
        [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7],
        "under the caller's span"
    );
    let turn_span = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| {
            s.name == "voxide.turn"
                && matches!(
                    attribute(s, "voxide.turn.user_text"),
                    Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(t)) if t.contains("weather")
                )
        })
        .expect("the question's turn span");
    assert_eq!(turn_span.parent_span_id, root.span_id);
    assert!(matches!(
        attribute(turn_span, "voxide.turn.voice_to_voice_ms"),
        Some(opentelemetry_proto::tonic::common::v1::any_value::Value::DoubleValue(ms)) if (ms - v2v).abs() < 1.0
    ));
    let chat = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name.starts_with("chat ") && s.parent_span_id == turn_span.span_id)
        .expect("the LLM request under the turn");
    assert!(attribute(chat, "gen_ai.request.model").is_some());
    assert!(attribute(chat, "voxide.ttfb_ms").is_some());
    for name in ["voxide.user_speaking", "voxide.stt", "voxide.bot_speaking"] {
        assert!(
            spans
                .iter()
                .any(|(_, s)| s.name == name && s.parent_span_id == turn_span.span_id),
            "{name} under the turn"
        );
    }

    let (_, metrics) = get(addr, "/metrics").await;
    assert!(
        metrics.contains("voxide_recordings_total{outcome=\"written\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("voxide_trace_spans_total{outcome=\"dropped\"} 0"));

    // The operator's pages: the report draws it, the transcript is the file's.
    let (status, page) = get(addr, &format!("/admin/sessions/{}/report", journal.session)).await;
    assert_eq!(status, 200);
    assert!(page.contains("voice to voice") && page.contains("src=\"audio\""));
    let (status, body) = get(
        addr,
        &format!("/admin/sessions/{}/transcript", journal.session),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Journal>(&body).expect("a journal"),
        journal
    );
    for bad in ["..%2F..%2Fetc%2Fpasswd", "ws-unknown"] {
        let (status, _) = get(addr, &format!("/admin/sessions/{bad}/transcript")).await;
        assert_eq!(status, 404, "{bad}");
    }

    let _ = server.stop.take().map(|s| s.send(()));
    let _ = tokio::time::timeout(Duration::from_secs(10), &mut server.task).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_that_cannot_be_written_or_is_refused_leaves_the_call_running() {
    // A folder that is a file: nobody, root included, can write under it.
    let base = fresh_dir("unwritable");
    let file = base.join("not-a-folder");
    std::fs::write(&file, b"").expect("a file");
    let mut server = start_options(voxide::server::ServeOptions {
        record_dir: Some(file.clone()),
        ..test_options(bot())
    })
    .await;
    let events = say_hello(server.addr, "", None).await;
    let error = events
        .iter()
        .find(|e| e["type"] == "error")
        .unwrap_or_else(|| panic!("an error event: {events:?}"));
    assert_eq!(error["processor"], "recorder");
    assert_eq!(error["fatal"], false);
    assert!(
        events.iter().any(|e| e["type"] == "bot_started_speaking"),
        "the bot answered all the same"
    );
    let (_, metrics) = get(server.addr, "/metrics").await;
    assert!(metrics.contains("voxide_recordings_total{outcome=\"failed\"} 1"));
    let _ = server.stop.take().map(|s| s.send(()));
    let _ = tokio::time::timeout(Duration::from_secs(10), &mut server.task).await;

    // A caller who says no is not recorded.
    let dir = fresh_dir("refused");
    let mut server = start_options(voxide::server::ServeOptions {
        record_dir: Some(dir.clone()),
        ..test_options(bot())
    })
    .await;
    let events = say_hello(server.addr, "&record=false", None).await;
    assert!(events.iter().any(|e| e["type"] == "bot_started_speaking"));
    assert!(events.iter().all(|e| e["type"] != "error"), "{events:?}");
    assert_eq!(
        std::fs::read_dir(&dir).expect("the folder").count(),
        0,
        "nothing recorded"
    );
    let _ = server.stop.take().map(|s| s.send(()));
    let _ = tokio::time::timeout(Duration::from_secs(10), &mut server.task).await;
    let _ = std::fs::remove_dir_all(&base);
    let _ = std::fs::remove_dir_all(&dir);
}
