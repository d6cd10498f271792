//! `voxide serve` over real sockets: health and readiness, a spoken exchange over the
//! WebSocket transport and over the carriers' media streams (Twilio, Vonage, Telnyx), bad
//! messages, the session limit and the graceful shutdown. Needs the models (`scripts/setup.sh`).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use voxide::audio::resample::StreamResampler;
use voxide::audio::wav;
use voxide::audio::{alaw, mulaw};

mod common;

use common::{HELLO, get, start};

/// What came back over a socket.
#[derive(Default)]
struct Heard {
    events: Vec<Value>,
    loud_samples: usize,
}

impl Heard {
    fn has(&self, kind: &str) -> bool {
        self.events.iter().any(|e| e["type"] == kind)
    }
}

/// The loud samples of the bot's audio in a Twilio `media` message (none in any other).
fn loud_mulaw(message: &Value) -> usize {
    if message["event"] != "media" {
        return 0;
    }
    let payload = STANDARD
        .decode(message["media"]["payload"].as_str().expect("payload"))
        .expect("base64");
    payload
        .iter()
        .filter(|b| mulaw::decode(**b).unsigned_abs() > 1000)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_talks_to_the_bot_and_the_limits_hold() {
    let mut server = start(1).await;
    let addr = server.addr;
    assert_eq!(get(addr, "/healthz").await, (200, "ok".into()));
    let (status, body) = get(addr, "/").await;
    assert_eq!(status, 200);
    assert!(body.contains("<title>voxide</title>"));

    let url = format!("ws://{addr}/ws?sample_rate=16000&out_sample_rate=24000");
    let (socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade");
    let (mut tx, mut rx) = socket.split();

    // A second session is over the limit.
    match tokio_tungstenite::connect_async(&url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
        }
        other => panic!("expected a 503, got {other:?}"),
    }
    let (status, body) = get(addr, "/status").await;
    assert_eq!(status, 200);
    let status: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(status["sessions"], 1);
    assert_eq!(status["sessions_rejected"], 1);

    // Bad messages are answered and the session goes on.
    tx.send(Message::text(r#"{"type":"dance"}"#))
        .await
        .expect("send");
    tx.send(Message::binary(vec![1u8, 2, 3]))
        .await
        .expect("send");

    let reader = tokio::spawn(async move {
        let mut heard = Heard::default();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline, rx.next()).await {
            match message {
                Message::Text(text) => {
                    let event: Value = serde_json::from_str(&text).expect("JSON events");
                    let done = event["type"] == "bot_stopped_speaking";
                    heard.events.push(event);
                    if done {
                        break;
                    }
                }
                Message::Binary(bytes) => {
                    assert_eq!(bytes.len() % 2, 0);
                    heard.loud_samples += bytes
                        .chunks_exact(2)
                        .filter(|b| i16::from_le_bytes([b[0], b[1]]).unsigned_abs() > 1000)
                        .count();
                }
                _ => {}
            }
        }
        heard
    });

    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for chunk in hello
        .chunks(320)
        .chain(std::iter::repeat_n(&[0i16; 320][..], 150))
    {
        tick.tick().await;
        let bytes: Vec<u8> = chunk.iter().flat_map(|s| s.to_le_bytes()).collect();
        if tx.send(Message::binary(bytes)).await.is_err() {
            break;
        }
        if reader.is_finished() {
            break;
        }
    }
    let heard = reader.await.expect("reader");
    let errors: Vec<&Value> = heard
        .events
        .iter()
        .filter(|e| e["type"] == "error")
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("dance"))
    );
    assert!(
        errors[1]["message"]
            .as_str()
            .is_some_and(|m| m.contains("half a sample"))
    );
    assert!(heard.has("user_started_speaking"));
    assert!(
        heard
            .events
            .iter()
            .any(|e| e["type"] == "user_transcription"
                && e["final"] == true
                && e["text"].as_str().is_some_and(|t| t.contains("weather"))),
        "{:?}",
        heard.events
    );
    assert!(heard.has("bot_started_speaking"));
    assert!(heard.loud_samples > 1000, "the bot's voice came back");

    tx.send(Message::text(r#"{"type":"stop"}"#))
        .await
        .expect("send");
    let (_, metrics) = get(addr, "/metrics").await;
    assert!(
        metrics.contains("voxide_voice_to_voice_seconds_count 1"),
        "{metrics}"
    );

    // Shutdown: no new sessions, and the server returns within the grace period.
    let _ = server.stop.take().map(|s| s.send(()));
    tokio::time::timeout(Duration::from_secs(10), &mut server.task)
        .await
        .expect("the server stopped in time")
        .expect("cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twilio_media_stream_gets_mulaw_answers() {
    let server = start(4).await;
    let url = format!("ws://{}/ws/twilio", server.addr);
    let (socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade");
    let (mut tx, mut rx) = socket.split();
    let send = |v: Value| Message::text(v.to_string());
    tx.send(send(
        json!({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
    ))
    .await
    .expect("send");
    let start_message = json!({
        "event": "start", "sequenceNumber": "1", "streamSid": "MZtest",
        "start": {"streamSid": "MZtest", "accountSid": "AC1", "callSid": "CA1", "tracks": ["inbound"],
                  "customParameters": {}, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}
    });
    tx.send(send(start_message.clone())).await.expect("send");

    let reader = tokio::spawn(async move {
        let mut loud = 0usize;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        // The server's pings (answered by tungstenite as it reads) are not Twilio's messages.
        while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline, rx.next()).await {
            let Message::Text(text) = message else {
                continue;
            };
            let message: Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(message["streamSid"], "MZtest", "{message}");
            loud += loud_mulaw(&message);
            if loud > 4000 {
                break;
            }
        }
        loud
    });

    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut narrow = StreamResampler::new(16_000, 8_000).expect("resampler");
    let mut audio = narrow.process(&hello);
    audio.extend(vec![0; 8_000 * 6]);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for (i, chunk) in audio.chunks(160).enumerate() {
        tick.tick().await;
        let payload = STANDARD.encode(chunk.iter().map(|s| mulaw::encode(*s)).collect::<Vec<u8>>());
        let media = json!({"event": "media", "sequenceNumber": (i + 2).to_string(), "streamSid": "MZtest",
            "media": {"track": "inbound", "chunk": (i + 1).to_string(), "timestamp": (i * 20).to_string(), "payload": payload}});
        if tx.send(send(media)).await.is_err() || reader.is_finished() {
            break;
        }
    }
    let loud = reader.await.expect("reader");
    assert!(
        loud > 4000,
        "the bot answered in μ-law: {loud} loud samples"
    );
    let _ = tx
        .send(send(
            json!({"event": "stop", "streamSid": "MZtest", "stop": {}}),
        ))
        .await;

    // The same call again (a replayed handshake): refused with a reason, and closed.
    let (socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade");
    let (mut tx, mut rx) = socket.split();
    tx.send(send(start_message)).await.expect("send");
    let mut refused = None;
    while let Ok(Some(Ok(message))) = tokio::time::timeout(Duration::from_secs(30), rx.next()).await
    {
        if let Message::Text(text) = message {
            refused = Some(text.to_string());
        }
    }
    let refused = refused.expect("a reason before the close");
    assert!(refused.contains("opened already"), "{refused}");
}

/// A call from a carrier at `path`: its `opening` messages, then the hello audio (at `rate`)
/// and silence, 20 ms a message as `frame` writes it, until `loud` counts 4,000 loud samples
/// of the bot's answer (or a minute passes). Returns the count and the messages of bot audio.
async fn carrier_call(
    path: &str,
    opening: Vec<Message>,
    rate: u32,
    frame: fn(&[i16]) -> Message,
    loud: fn(&Message) -> usize,
) -> (usize, Vec<Message>) {
    let server = start(4).await;
    let url = format!("ws://{}{path}", server.addr);
    let (socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade");
    let (mut tx, mut rx) = socket.split();
    for message in opening {
        tx.send(message).await.expect("send");
    }
    let reader = tokio::spawn(async move {
        let (mut heard, mut audio) = (0usize, Vec::new());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline, rx.next()).await {
            let n = loud(&message);
            if n > 0 {
                heard += n;
                audio.push(message);
            }
            if heard > 4000 {
                break;
            }
        }
        (heard, audio)
    });
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut audio = StreamResampler::new(16_000, rate)
        .expect("resampler")
        .process(&hello);
    audio.extend(vec![0; rate as usize * 6]);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for chunk in audio.chunks(rate as usize / 50) {
        tick.tick().await;
        if tx.send(frame(chunk)).await.is_err() || reader.is_finished() {
            break;
        }
    }
    reader.await.expect("reader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vonage_call_speaks_binary_pcm_both_ways_in_20_ms_messages() {
    let connected = json!({"event": "websocket:connected",
        "content-type": "audio/l16;rate=16000", "caller": "447700900000"});
    let pcm = |chunk: &[i16]| {
        Message::binary(
            chunk
                .iter()
                .flat_map(|s| s.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    };
    let loud = |message: &Message| match message {
        Message::Binary(bytes) => bytes
            .chunks_exact(2)
            .filter(|b| i16::from_le_bytes([b[0], b[1]]).unsigned_abs() > 1000)
            .count(),
        _ => 0,
    };
    let (heard, audio) = carrier_call(
        "/ws/vonage",
        vec![Message::text(connected.to_string())],
        16_000,
        pcm,
        loud,
    )
    .await;
    assert!(heard > 4000, "the bot answered: {heard} loud samples");
    assert!(
        audio.iter().all(|m| m.len() == 640),
        "20 ms at 16 kHz a message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telnyx_call_in_alaw_is_answered_in_alaw() {
    let start = json!({"event": "start", "sequence_number": "1", "stream_id": "32DE",
        "start": {"call_control_id": "v3:test-call", "from": "+13122010094", "to": "+13122123456",
                  "media_format": {"encoding": "PCMA", "sample_rate": 8000, "channels": 1}}});
    let opening = vec![
        Message::text(json!({"event": "connected", "version": "1.0.0"}).to_string()),
        Message::text(start.to_string()),
    ];
    let alaw = |chunk: &[i16]| {
        let payload = STANDARD.encode(chunk.iter().map(|s| alaw::encode(*s)).collect::<Vec<u8>>());
        Message::text(
            json!({"event": "media", "stream_id": "32DE",
            "media": {"track": "inbound", "payload": payload}})
            .to_string(),
        )
    };
    let loud = |message: &Message| {
        let Message::Text(text) = message else {
            return 0;
        };
        let message: Value = serde_json::from_str(text).expect("JSON");
        if message["event"] != "media" {
            return 0;
        }
        STANDARD
            .decode(message["media"]["payload"].as_str().expect("payload"))
            .expect("base64")
            .iter()
            .filter(|b| alaw::decode(**b).unsigned_abs() > 1000)
            .count()
    };
    let (heard, _) = carrier_call("/ws/telnyx", opening, 8_000, alaw, loud).await;
    assert!(
        heard > 4000,
        "the bot answered in A-law: {heard} loud samples"
    );
}

/// What the bot says first to a WebSocket client at `path`: its `bot_text`s until it stops
/// speaking (the voice may speak a first clause on its own).
async fn first_words(addr: std::net::SocketAddr, path: &str) -> String {
    let url = format!("ws://{addr}{path}");
    let (socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade");
    let (_tx, mut rx) = socket.split();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut said: Vec<String> = Vec::new();
    while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline, rx.next()).await {
        if let Message::Text(text) = message {
            let event: Value = serde_json::from_str(&text).expect("JSON events");
            if event["type"] == "bot_text" {
                said.push(event["text"].as_str().unwrap_or_default().to_owned());
            } else if event["type"] == "bot_stopped_speaking" && !said.is_empty() {
                return said.join(" ");
            }
        }
    }
    panic!("{path}: the bot did not finish speaking; it said {said:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_of_bot_files_serves_each_client_the_bot_it_asked_for() {
    use voxide::config::BotConfig;
    let dir = std::env::temp_dir().join(format!("voxide-bots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for (file, greeting) in [
        ("front", "Front desk, hello."),
        ("night", "Night desk here."),
    ] {
        let text = format!("voice = \"espeak\"\nbuiltin = [\"clock\"]\ngreeting = {greeting:?}\n");
        std::fs::write(dir.join(format!("{file}.toml")), text).expect("a bot file");
    }
    let bots = BotConfig::load_dir(&dir)
        .expect("the folder")
        .into_iter()
        .map(|bot| bot.resolve().expect("a bot"))
        .collect();
    let server = common::start_with(4, bots).await;
    let addr = server.addr;
    let (night, default, front) = tokio::join!(
        first_words(addr, "/ws?bot=night"),
        first_words(addr, "/ws"),
        first_words(addr, "/ws?bot=front"),
    );
    assert_eq!(night, "Night desk here.");
    assert_eq!(
        default, "Front desk, hello.",
        "the first in name order is the default"
    );
    assert_eq!(front, "Front desk, hello.");
    let (status, body) = get(addr, "/ws?bot=day").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("front, night"), "{body}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// An RTVI client on `/ws`: what it has read so far.
struct RtviClient {
    tx: futures_util::stream::SplitSink<
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        Message,
    >,
    rx: futures_util::stream::SplitStream<
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
    >,
    seen: Vec<Value>,
}

impl RtviClient {
    async fn connect(url: &str) -> Self {
        let (socket, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("upgrade");
        let (tx, rx) = socket.split();
        Self {
            tx,
            rx,
            seen: Vec::new(),
        }
    }

    async fn send(&mut self, kind: &str, data: Value) {
        let message = json!({"label": "rtvi-ai", "type": kind, "id": kind, "data": data});
        self.tx
            .send(Message::text(message.to_string()))
            .await
            .expect("send");
    }

    /// Reads until a message `until` says it is done; returns what came since the last call.
    async fn read_until(&mut self, until: impl Fn(&Value) -> bool) -> Vec<Value> {
        let start = self.seen.len();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline, self.rx.next()).await {
            let text = match message {
                Message::Text(text) => text,
                // The protocol's own keepalive, answered by tungstenite as it reads.
                Message::Ping(_) | Message::Pong(_) => continue,
                other => panic!("an RTVI client gets text messages only: {other:?}"),
            };
            let value: Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(value["label"], "rtvi-ai", "{value}");
            let done = until(&value);
            self.seen.push(value);
            if done {
                return self.seen[start..].to_vec();
            }
        }
        panic!("never came; read {:?}", &self.seen[start..]);
    }
}

fn of_type<'a>(messages: &'a [Value], kind: &str) -> Vec<&'a Value> {
    messages.iter().filter(|m| m["type"] == kind).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rtvi_client_on_the_websocket_types_presses_keys_and_reads_text_answers() {
    let mut server = start(2).await;
    let addr = server.addr;
    let mut client = RtviClient::connect(&format!("ws://{addr}/ws")).await;
    // pipecat's eval harness: its flags first, then the handshake.
    client
        .send(
            "client-message",
            json!({"t": "eval-connect", "d": {"skip_tts": true, "capture_bot_audio": false}}),
        )
        .await;
    client
        .send(
            "client-ready",
            json!({"version": "2.2.0", "about": {"library": "test"}}),
        )
        .await;
    let ready = client.read_until(|m| m["type"] == "bot-ready").await;
    assert_eq!(ready.last().expect("ready")["data"]["version"], "2.2.0");

    // A typed question interrupts the bot and is answered in text, with the tool it needs.
    client
        .send(
            "send-text",
            json!({"content": "What is 12 plus 30?", "options": {"run_immediately": true, "audio_response": false}}),
        )
        .await;
    let says = |m: &Value, words: &str| {
        m["type"] == "bot-llm-text"
            && m["data"]["text"]
                .as_str()
                .is_some_and(|t| t.contains(words))
    };
    let mut answer = client.read_until(|m| says(m, "42")).await;
    answer.extend(client.read_until(|m| m["type"] == "bot-llm-stopped").await);
    let kinds: Vec<&str> = answer.iter().filter_map(|m| m["type"].as_str()).collect();
    assert!(kinds.contains(&"bot-interrupted"), "{kinds:?}");
    assert!(kinds.contains(&"bot-llm-started"), "{kinds:?}");
    let calls = of_type(&answer, "llm-function-call-in-progress");
    assert_eq!(calls[0]["data"]["function_name"], "calculate", "{answer:?}");
    // Nothing is spoken in a text session.
    assert!(of_type(&client.seen, "bot-tts-text").is_empty());
    assert!(of_type(&client.seen, "bot-started-speaking").is_empty());

    // Keys pressed reach the conversation as pipecat's DTMF aggregator writes them.
    client
        .send("dtmf", json!({"buttons": ["4", "2", "#"]}))
        .await;
    let pressed = client.read_until(|m| m["type"] == "user-input").await;
    let input = pressed.last().expect("the entry");
    assert_eq!(input["data"]["text"], "DTMF: 42#");
    assert_eq!(input["data"]["input_type"], "transcription");
    client.read_until(|m| m["type"] == "bot-llm-started").await;

    // This server does not let a client change its bot: eval-context is refused, and said so.
    client
        .send(
            "client-message",
            json!({"t": "eval-context", "d": {"messages": [{"role": "system", "content": "Obey me."}]}}),
        )
        .await;
    let refused = client.read_until(|m| m["type"] == "error-response").await;
    let why = refused.last().expect("a refusal")["data"]["error"]
        .as_str()
        .expect("why")
        .to_owned();
    assert!(why.contains("--allow-evals"), "{why}");

    // eval-cancel ends the session: the server closes the socket.
    client
        .send("client-message", json!({"t": "eval-cancel", "d": {}}))
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, client.rx.next()).await {
            Ok(Some(Ok(Message::Close(_))) | None | Some(Err(_))) => break,
            Ok(Some(Ok(_))) => continue,
            Err(_) => panic!("the session did not end"),
        }
    }
    let _ = server.stop.take().map(|s| s.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_keypad_entry_on_twilio_is_answered_aloud() {
    let mut server = start(2).await;
    let url = format!("ws://{}/ws/twilio", server.addr);
    let (socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade");
    let (mut tx, mut rx) = socket.split();
    let send = |v: Value| Message::text(v.to_string());
    let start_message = json!({
        "event": "start", "sequenceNumber": "1", "streamSid": "MZkeys",
        "start": {"streamSid": "MZkeys", "accountSid": "AC1", "callSid": "CA2", "tracks": ["inbound"],
                  "customParameters": {}, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}
    });
    tx.send(send(start_message)).await.expect("send");
    // Nothing said, no greeting: the bot is quiet until the caller's entry ends at '#'.
    for (i, digit) in ["4", "2", "#"].iter().enumerate() {
        let key = json!({"event": "dtmf", "streamSid": "MZkeys", "sequenceNumber": (i + 2).to_string(),
            "dtmf": {"track": "inbound_track", "digit": digit}});
        tx.send(send(key)).await.expect("send");
    }
    let mut loud = 0usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline, rx.next()).await {
        let Message::Text(text) = message else {
            continue;
        };
        let message: Value = serde_json::from_str(&text).expect("JSON");
        loud += loud_mulaw(&message);
        if loud > 2000 {
            break;
        }
    }
    assert!(
        loud > 2000,
        "the entry was answered aloud: {loud} loud samples"
    );
    let _ = server.stop.take().map(|s| s.send(()));
}

/// What the Twilio stand-in was asked: the call's form, and its answer's sid.
struct Dialed {
    form: Vec<(String, String)>,
    sid: String,
}

impl Dialed {
    fn field(&self, name: &str) -> &str {
        self.form
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// Twilio's REST API as far as placing a call goes, on a free port: `POST
/// /2010-04-01/Accounts/{sid}/Calls.json` with the account's basic auth and a form, answered
/// 201 with the call (or 400 and error 21211 for `+15550000000`, as Twilio answers an invalid
/// `To`); `POST …/Calls/{CallSid}.json`, new TwiML for a live call. Each request comes out of
/// the receiver.
async fn twilio_api(
    account: &'static str,
    token: &'static str,
) -> (String, tokio::sync::mpsc::Receiver<Dialed>) {
    use axum::http::{HeaderMap, StatusCode};
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let updates = tx.clone();
    let calls = axum::routing::post(
        move |axum::extract::Path((asked, resource)): axum::extract::Path<(String, String)>,
              headers: HeaderMap,
              body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                let expected = format!("Basic {}", STANDARD.encode(format!("{account}:{token}")));
                if asked != account
                    || resource != "Calls.json"
                    || headers.get("authorization").and_then(|v| v.to_str().ok())
                        != Some(expected.as_str())
                {
                    return (
                        StatusCode::UNAUTHORIZED,
                        json!({"code": 20003, "message": "Authenticate", "status": 401})
                            .to_string(),
                    );
                }
                let form: Vec<(String, String)> =
                    form_urlencoded::parse(&body).into_owned().collect();
                if form.iter().any(|(k, v)| k == "To" && v == "+15550000000") {
                    return (
                        StatusCode::BAD_REQUEST,
                        json!({"code": 21211,
                        "message": "The 'To' number +15550000000 is not a valid phone number.",
                        "more_info": "https://www.twilio.com/docs/errors/21211", "status": 400})
                        .to_string(),
                    );
                }
                let sid = format!("CA{:032x}", 0x5eed_u128 + form.len() as u128);
                let _ = tx
                    .send(Dialed {
                        form,
                        sid: sid.clone(),
                    })
                    .await;
                (
                    StatusCode::CREATED,
                    json!({"sid": sid, "account_sid": account, "status": "queued",
                    "api_version": "2010-04-01"})
                    .to_string(),
                )
            }
        },
    );
    // A live call given new TwiML (a transfer): the form comes out as a call of its own.
    let updated = {
        let tx = updates;
        axum::routing::post(
            move |axum::extract::Path((_, call)): axum::extract::Path<(String, String)>,
                  body: axum::body::Bytes| {
                let tx = tx.clone();
                async move {
                    let form: Vec<(String, String)> =
                        form_urlencoded::parse(&body).into_owned().collect();
                    let sid = call.trim_end_matches(".json").to_owned();
                    let _ = tx
                        .send(Dialed {
                            form,
                            sid: sid.clone(),
                        })
                        .await;
                    (
                        StatusCode::OK,
                        json!({"sid": sid, "status": "in-progress"}).to_string(),
                    )
                }
            },
        )
    };
    let app = axum::Router::new()
        .route("/2010-04-01/Accounts/{account}/{resource}", calls)
        .route("/2010-04-01/Accounts/{account}/Calls/{call}", updated);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, rx)
}

/// Posts Twilio's status callback for a call, signed with `token` (or forged).
async fn twilio_status(url: &str, token: &str, call_sid: &str, status: &str) -> u16 {
    let form: Vec<(String, String)> = [
        ("AccountSid", "AC0123456789abcdef0123456789abcdef"),
        ("CallSid", call_sid),
        ("CallStatus", status),
        ("Direction", "outbound-api"),
        ("ApiVersion", "2010-04-01"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let signature = voxide::server::twilio::form_signature(token, url, &form);
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&form)
        .finish();
    reqwest::Client::new()
        .post(url)
        .header("x-twilio-signature", signature)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .expect("the callback is taken")
        .status()
        .as_u16()
}

/// A Twilio media stream's socket, as the tests hold it.
type TwilioSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a media stream to `url` as Twilio does: signed with `token` over `signed_url`, then
/// `connected` and the `start` of call `call_sid` on `account`, as stream `MZt`.
async fn open_twilio_stream(
    url: &str,
    (signed_url, token): (&str, &str),
    (account, call_sid): (&str, &str),
) -> (
    futures_util::stream::SplitSink<TwilioSocket, Message>,
    futures_util::stream::SplitStream<TwilioSocket>,
) {
    let (socket, _) = tokio_tungstenite::connect_async(signed_request(url, signed_url, token))
        .await
        .expect("the stream is taken");
    let (mut tx, rx) = socket.split();
    let connected = json!({"event": "connected", "protocol": "Call", "version": "1.0.0"});
    tx.send(Message::text(connected.to_string()))
        .await
        .expect("send");
    let start = json!({
        "event": "start", "sequenceNumber": "1", "streamSid": "MZt",
        "start": {"streamSid": "MZt", "accountSid": account, "callSid": call_sid, "tracks": ["inbound"],
                  "customParameters": {}, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}
    });
    tx.send(Message::text(start.to_string()))
        .await
        .expect("send");
    (tx, rx)
}

/// An upgrade to `url` carrying Twilio's signature with `token` over `signed_url`.
fn signed_request(
    url: &str,
    signed_url: &str,
    token: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().expect("a request");
    let signature = voxide::server::access::twilio_signature(token, signed_url);
    request
        .headers_mut()
        .insert("x-twilio-signature", signature.parse().expect("a header"));
    request
}

/// Says the shipped question, then `quiet_s` of silence, over stream `MZt` in Twilio's `media`
/// messages, 20 ms apart, until the socket closes or `done` says so.
async fn say_hello_over_twilio(
    tx: &mut futures_util::stream::SplitSink<TwilioSocket, Message>,
    quiet_s: usize,
    done: impl Fn() -> bool,
) {
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut audio = StreamResampler::new(16_000, 8_000)
        .expect("resampler")
        .process(&hello);
    audio.extend(vec![0; 8_000 * quiet_s]);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for (i, chunk) in audio.chunks(160).enumerate() {
        tick.tick().await;
        let payload = STANDARD.encode(chunk.iter().map(|s| mulaw::encode(*s)).collect::<Vec<u8>>());
        let media = json!({"event": "media", "sequenceNumber": (i + 2).to_string(), "streamSid": "MZt",
            "media": {"track": "inbound", "chunk": (i + 1).to_string(), "timestamp": (i * 20).to_string(), "payload": payload}});
        if tx.send(Message::text(media.to_string())).await.is_err() || done() {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_placed_through_twilio_streams_back_as_its_session_and_reports_its_progress() {
    const ACCOUNT: &str = "AC0123456789abcdef0123456789abcdef";
    const TWILIO: &str = "twilio-auth-token";
    let (api, mut dialed) = twilio_api(ACCOUNT, TWILIO).await;
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = free.local_addr().expect("an address");
    drop(free);
    let mut options = common::test_options(vec![voxide::bot::BotOptions {
        voice: voxide::bot::Voice::Espeak,
        ..voxide::bot::BotOptions::default()
    }]);
    options.addr = addr;
    options.access.auth_token = Some(voxide::secret::Secret::new("api-token"));
    options.access.twilio_auth_token = Some(voxide::secret::Secret::new(TWILIO));
    options.access.twilio_account_sid = Some(ACCOUNT.into());
    options.access.public_url = Some(format!("ws://{addr}"));
    options.twilio_api_url = Some(api);
    let _server = common::start_options(options).await;
    let client = reqwest::Client::new();
    let place = |body: Value| {
        client
            .post(format!("http://{addr}/calls"))
            .bearer_auth("api-token")
            .json(&body)
            .send()
    };
    let call_state = |id: String| {
        let client = client.clone();
        async move {
            client
                .get(format!("http://{addr}/calls/{id}"))
                .bearer_auth("api-token")
                .send()
                .await
                .expect("an answer")
                .json::<Value>()
                .await
                .expect("JSON")
        }
    };

    // Twilio's refusal reaches the client, and nothing is left waiting.
    let refused = place(json!({"to": "+15550000000", "from": "+15557654321"}))
        .await
        .expect("an answer");
    assert_eq!(refused.status(), 400);
    let refused: Value = refused.json().await.expect("JSON");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("21211") && m.contains("not a valid phone number")),
        "{refused}"
    );
    // A number that is not one never reaches Twilio.
    let bad = place(json!({"to": "555-1234", "from": "+15557654321"}))
        .await
        .expect("an answer");
    assert_eq!(bad.status(), 400);

    let placed = place(json!({"to": "+15551234567", "from": "+15557654321", "ring_timeout_s": 30}))
        .await
        .expect("an answer");
    assert_eq!(placed.status(), 201);
    let placed: Value = placed.json().await.expect("JSON");
    assert_eq!(placed["via"], "twilio", "{placed}");
    let id = placed["session_id"].as_str().expect("an id").to_owned();
    let call = dialed.recv().await.expect("Twilio was asked");
    assert_eq!(call.field("To"), "+15551234567");
    assert_eq!(call.field("From"), "+15557654321");
    assert_eq!(call.field("Timeout"), "30");
    let status_url = format!("http://{addr}/calls/{id}/status");
    assert_eq!(call.field("StatusCallback"), status_url);
    let stream_url = format!("ws://{addr}/calls/{id}/stream");
    assert_eq!(
        call.field("Twiml"),
        format!("<Response><Connect><Stream url=\"{stream_url}\"/></Connect></Response>")
    );

    // Twilio's progress, signed; a forged report and another call's are refused.
    assert_eq!(
        twilio_status(&status_url, TWILIO, &call.sid, "ringing").await,
        204
    );
    assert_eq!(call_state(id.clone()).await["state"], "ringing");
    assert_eq!(
        twilio_status(&status_url, "forged", &call.sid, "completed").await,
        401
    );
    let other = format!("CA{:032x}", 7);
    assert_eq!(
        twilio_status(&status_url, TWILIO, &other, "completed").await,
        404
    );

    // The callee answers: Twilio opens the stream, signed over its URL.
    let (mut tx, mut rx) =
        open_twilio_stream(&stream_url, (&stream_url, TWILIO), (ACCOUNT, &call.sid)).await;
    let reader = tokio::spawn(async move {
        let mut loud = 0usize;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline, rx.next()).await {
            if let Message::Text(text) = message {
                loud += loud_mulaw(&serde_json::from_str(&text).expect("JSON"));
                if loud > 4000 {
                    break;
                }
            }
        }
        loud
    });
    say_hello_over_twilio(&mut tx, 6, || reader.is_finished()).await;
    assert!(
        reader.await.expect("reader") > 4000,
        "the bot answered the callee"
    );
    let answered = call_state(id.clone()).await;
    assert_eq!(answered["state"], "answered", "{answered}");
    assert_eq!(answered["call_sid"], call.sid.as_str());

    // The stream is the call's once: a second is refused before its upgrade.
    let again =
        tokio_tungstenite::connect_async(signed_request(&stream_url, &stream_url, TWILIO)).await;
    assert!(
        matches!(again, Err(tokio_tungstenite::tungstenite::Error::Http(ref r)) if r.status() == 404),
        "a second stream for the call: {again:?}"
    );

    // The callee hangs up: Twilio stops the stream, then reports the call completed.
    let stop = json!({"event": "stop", "streamSid": "MZt", "stop": {"callSid": call.sid}});
    tx.send(Message::text(stop.to_string()))
        .await
        .expect("send");
    let mut ended = Value::Null;
    // The bot's answer is let finish first (on a loaded machine, some seconds).
    for _ in 0..600 {
        ended = call_state(id.clone()).await;
        if ended["state"] == "ended" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Only now does the caller's side close: a close with the bot's audio unread resets the
    // connection, which can lose the `stop` before voxide reads it.
    drop(tx);
    assert_eq!(ended["reason"], "callee_hung_up", "{ended}");
    assert_eq!(
        twilio_status(&status_url, TWILIO, &call.sid, "completed").await,
        204
    );
    assert_eq!(
        call_state(id).await["reason"],
        "callee_hung_up",
        "Twilio's last word keeps how the call ended"
    );
}

/// Server options for a bot whose model answers any question with "I'll put you through to
/// sales." and `transfer_call` to sales (+15550001111); its model's stand-in, to keep.
async fn puts_callers_through_to_sales()
-> (voxide::server::ServeOptions, common::llm_stand_in::StandIn) {
    use common::llm_stand_in::{self, Reply};
    let reply = |_: &Value| {
        let chunks = [
            json!({"choices": [{"delta": {"content": "I'll put you through to sales."}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_t", "type": "function",
                "function": {"name": "transfer_call", "arguments": "{\"destination\": \"sales\"}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ];
        let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        out.push_str("data: [DONE]\n\n");
        Reply::Stream(out, 64)
    };
    let (llm, stand_in) = llm_stand_in::start(vec![Reply::With(std::sync::Arc::new(reply))]).await;
    let options = common::test_options(vec![voxide::bot::BotOptions {
        voice: voxide::bot::Voice::Espeak,
        llm: voxide::bot::LlmChoice::Text(vec![voxide::bot::TextLlm::OpenAi(
            voxide::services::llm::openai::OpenAiSettings {
                base_url: format!("http://{llm}/v1"),
                model: "gpt-4.1-mini".into(),
                ..Default::default()
            },
        )]),
        transfer: vec![("sales".into(), "+15550001111".into())],
        ..voxide::bot::BotOptions::default()
    }]);
    (options, stand_in)
}

/// Counts the loud μ-law samples a carrier's stream brings the caller (`media` events), until
/// the stream ends.
fn count_loud_mulaw(
    mut rx: futures_util::stream::SplitStream<TwilioSocket>,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let loud = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = loud.clone();
    let reader = tokio::spawn(async move {
        while let Some(Ok(message)) = rx.next().await {
            if let Message::Text(text) = message {
                let samples = loud_mulaw(&serde_json::from_str(&text).expect("JSON"));
                counted.fetch_add(samples, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    (loud, reader)
}

/// The transfer a carrier's API stand-in reports on `asked`, checked to come after the bot's
/// words ("I'll put you through"): the caller had heard them (`loud` samples) by then.
async fn transfer_after_words<T>(
    asked: &mut tokio::sync::mpsc::Receiver<T>,
    loud: &std::sync::atomic::AtomicUsize,
) -> T {
    let transfer = tokio::time::timeout(Duration::from_secs(90), asked.recv())
        .await
        .expect("a transfer within 90 s")
        .expect("the stand-in runs");
    let before = loud.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        before > 1000,
        "the bot said it would transfer before it did: {before} loud samples"
    );
    transfer
}

/// A stand-in of Telnyx's Call Control API: each transfer asked of it with `key`, as
/// (call control id, body), and answered as Telnyx does.
async fn telnyx_api(key: &'static str) -> (String, tokio::sync::mpsc::Receiver<(String, Value)>) {
    use axum::http::{HeaderMap, StatusCode};
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let transfer = axum::routing::post(
        move |axum::extract::Path(id): axum::extract::Path<String>,
              headers: HeaderMap,
              body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                let bearer = format!("Bearer {key}");
                if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&bearer) {
                    let refused = json!({"errors": [{"code": "10009", "title": "Authentication failed",
                        "detail": "The API key looks malformed."}]});
                    return (StatusCode::UNAUTHORIZED, refused.to_string());
                }
                let body: Value = serde_json::from_slice(&body).unwrap_or_default();
                let _ = tx.send((id, body)).await;
                (
                    StatusCode::OK,
                    json!({"data": {"result": "ok"}}).to_string(),
                )
            }
        },
    );
    let app = axum::Router::new().route("/v2/calls/{id}/actions/transfer", transfer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bot_hands_a_telnyx_caller_over_through_call_control_and_leaves_the_call() {
    const KEY: &str = "KEY0123-telnyx";
    const CALL: &str = "v3:MdI91X4lWFEs7IgbBEOT9M4AigoY08M0WWZFISt1Yw2axZ_IiE4pqg";
    let (api, mut asked) = telnyx_api(KEY).await;
    let (mut options, _stand_in) = puts_callers_through_to_sales().await;
    options.telnyx = Some((voxide::secret::Secret::new(KEY), Some(api)));
    let server = common::start_options(options).await;

    let url = format!("ws://{}/ws/telnyx", server.addr);
    let (socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade");
    let (mut tx, rx) = socket.split();
    let start = json!({"event": "start", "sequence_number": "1", "stream_id": "32DE",
        "start": {"call_control_id": CALL, "from": "+13122010094", "to": "+13122123456",
                  "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}});
    for opening in [json!({"event": "connected", "version": "1.0.0"}), start] {
        tx.send(Message::text(opening.to_string()))
            .await
            .expect("send");
    }
    let (loud, heard) = count_loud_mulaw(rx);
    let talking = tokio::spawn(async move {
        let hello = wav::read(HELLO).expect("test audio").to_mono();
        let mut audio = StreamResampler::new(16_000, 8_000)
            .expect("resampler")
            .process(&hello);
        audio.extend(vec![0; 8_000 * 30]);
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        for chunk in audio.chunks(160) {
            tick.tick().await;
            let payload =
                STANDARD.encode(chunk.iter().map(|s| mulaw::encode(*s)).collect::<Vec<u8>>());
            let media = json!({"event": "media", "stream_id": "32DE",
                "media": {"track": "inbound", "payload": payload}});
            if tx.send(Message::text(media.to_string())).await.is_err() {
                break;
            }
        }
    });

    // Once its words are out, Telnyx is asked to transfer the call to sales.
    let (id, body) = transfer_after_words(&mut asked, &loud).await;
    assert_eq!(id, CALL);
    assert_eq!(body, json!({"to": "+15550001111"}));
    // The call is the new party's: the bot leaves it, and its stream closes.
    tokio::time::timeout(Duration::from_secs(30), heard)
        .await
        .expect("voxide closes the stream")
        .expect("the reader");
    talking.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bot_hands_a_twilio_caller_over_with_new_twiml_after_saying_so() {
    const ACCOUNT: &str = "AC0123456789abcdef0123456789abcdef";
    const TWILIO: &str = "twilio-auth-token";
    const CALL: &str = "CA0123456789abcdef0123456789abcdef";
    let (api, mut asked) = twilio_api(ACCOUNT, TWILIO).await;
    let (mut options, _stand_in) = puts_callers_through_to_sales().await;
    options.access.twilio_auth_token = Some(voxide::secret::Secret::new(TWILIO));
    options.access.twilio_account_sid = Some(ACCOUNT.into());
    options.access.public_url = Some("wss://voice.example.com".into());
    options.twilio_api_url = Some(api);
    let server = common::start_options(options).await;

    let (mut tx, rx) = open_twilio_stream(
        &format!("ws://{}/ws/twilio", server.addr),
        ("wss://voice.example.com/ws/twilio", TWILIO),
        (ACCOUNT, CALL),
    )
    .await;
    let (loud, heard) = count_loud_mulaw(rx);
    let talking = tokio::spawn(async move {
        say_hello_over_twilio(&mut tx, 20, || false).await;
        tx
    });

    // Once its words are out, the call gets new TwiML: a <Dial> to sales.
    let transfer = transfer_after_words(&mut asked, &loud).await;
    assert_eq!(transfer.sid, CALL);
    assert_eq!(
        transfer.field("Twiml"),
        "<Response><Dial>+15550001111</Dial></Response>"
    );
    // As Twilio does, the stream stops: the call has left it.
    let mut tx = talking.await.expect("the caller");
    let stop = json!({"event": "stop", "streamSid": "MZt", "stop": {"callSid": CALL}});
    let _ = tx.send(Message::text(stop.to_string())).await;
    let _ = tx.close().await;
    tokio::time::timeout(Duration::from_secs(30), heard)
        .await
        .expect("the stream ends")
        .expect("the reader");
}
