//! The browser end to end: `serve` on loopback, headless Chromium whose fake microphone plays the
//! shipped question, the page connecting over WebRTC. The test drives the page through the
//! DevTools protocol and waits until it shows the user's transcript and has received bot audio
//! (energy above silence) on the WebRTC track.
//!
//! Needs the models and Chromium (`scripts/setup.sh --test` installs both; the README's test
//! command runs it).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use common::{HELLO, start};
use voxide::audio::resample::StreamResampler;
use voxide::audio::wav;

const CHROMIUM: &str = "chromium";

/// Kills the browser however the test ends.
struct Browser {
    child: Child,
    profile: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The question at 48 kHz (what Chrome's fake capture expects), then long silence so that the
/// bot answers before the file loops.
fn microphone_file(dir: &Path) -> PathBuf {
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut up = StreamResampler::new(16_000, 48_000).expect("resampler");
    let mut audio = vec![0i16; 48_000 / 2];
    audio.extend(up.process(&hello));
    audio.extend(vec![0i16; 48_000 * 20]);
    let path = dir.join("microphone.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 48_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(&path, spec).expect("wav");
    for s in audio {
        writer.write_sample(s).expect("sample");
    }
    writer.finalize().expect("wav");
    path
}

fn launch(url: &str, microphone: &Path, profile: &Path) -> Browser {
    let child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            "--autoplay-policy=no-user-gesture-required",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!(
            "--use-file-for-fake-audio-capture={}",
            microphone.display()
        ))
        .arg(url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start {CHROMIUM} ({e}); `scripts/setup.sh --test` installs it")
        });
    Browser {
        child,
        profile: profile.to_owned(),
    }
}

/// The DevTools port Chromium chose, from the file it writes into its profile.
async fn devtools_port(profile: &Path) -> u16 {
    let file = profile.join("DevToolsActivePort");
    for _ in 0..300 {
        if let Ok(text) = std::fs::read_to_string(&file)
            && let Some(port) = text.lines().next().and_then(|l| l.trim().parse().ok())
        {
            return port;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("Chromium never opened its DevTools port");
}

/// The page's DevTools WebSocket URL, from `/json/list`.
async fn page_socket(port: u16) -> String {
    for _ in 0..100 {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            // Chromium builds the socket URLs from the Host header.
            let request = format!("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
            stream.write_all(request.as_bytes()).await.expect("write");
            // Chromium keeps the connection open: read as far as Content-Length says.
            let body = read_body(&mut stream).await;
            if let Ok(Value::Array(targets)) = serde_json::from_str::<Value>(&body)
                && let Some(url) = targets
                    .iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            {
                return url.to_owned();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("Chromium never listed the page");
}

/// The body of one HTTP/1.1 response with a Content-Length.
async fn read_body(stream: &mut tokio::net::TcpStream) -> String {
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&data).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                return body.to_owned();
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return String::new(),
            Ok(n) => data.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A DevTools connection to the page.
struct Page {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl Page {
    /// Evaluates `expression` (awaiting a promise) and returns its value.
    async fn eval(&mut self, expression: &str) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let command = json!({
            "id": id,
            "method": "Runtime.evaluate",
            "params": {"expression": expression, "awaitPromise": true, "returnByValue": true},
        });
        self.socket
            .send(WsMessage::Text(command.to_string().into()))
            .await
            .expect("send");
        while let Some(message) = self.socket.next().await {
            let Ok(WsMessage::Text(text)) = message else {
                continue;
            };
            let reply: Value = serde_json::from_str(&text).expect("DevTools JSON");
            if reply["id"] == id {
                if let Some(exception) = reply.pointer("/result/exceptionDetails") {
                    panic!("the page threw: {exception}");
                }
                return reply
                    .pointer("/result/result/value")
                    .cloned()
                    .unwrap_or(Value::Null);
            }
        }
        panic!("DevTools closed");
    }
}

/// What the page shows and how much audio its track has received.
const PROBE: &str = r#"(async () => {
  let energy = 0, packets = 0;
  if (pc) {
    const stats = await pc.getStats();
    stats.forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "audio") {
        energy = r.totalAudioEnergy || 0;
        packets = r.packetsReceived || 0;
      }
    });
  }
  return {
    state: document.getElementById("state").textContent,
    log: document.getElementById("log").innerText,
    connection: pc ? pc.connectionState : "none",
    energy,
    packets,
  };
})()"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_talks_to_the_bot_over_webrtc() {
    let server = start(2).await;
    let dir = std::env::temp_dir().join(format!("voxide-browser-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let microphone = microphone_file(&dir);
    let profile = dir.join("profile");
    let _browser = launch(&format!("http://{}/", server.addr), &microphone, &profile);
    eprintln!("browser: server ready, Chromium started");
    let port = devtools_port(&profile).await;
    eprintln!("browser: DevTools on port {port}");
    let page_url = page_socket(port).await;
    eprintln!("browser: page at {page_url}");
    let (socket, _) = tokio_tungstenite::connect_async(page_url)
        .await
        .expect("DevTools socket");
    let mut page = Page { socket, next_id: 0 };
    eprintln!("browser: attached to the page");
    // Wait for the page's script, then connect over WebRTC (the page's default transport).
    let started = Instant::now();
    while page.eval("typeof connect === 'function'").await != json!(true) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the page never loaded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        page.eval("document.getElementById('transport').value")
            .await,
        "webrtc"
    );
    page.eval("document.getElementById('connect').click(); true")
        .await;

    let deadline = Instant::now() + Duration::from_secs(100);
    let mut last = Value::Null;
    let mut heard = false;
    let mut energy_at_transcript = 0.0;
    let mut polls = 0u32;
    while Instant::now() < deadline {
        last = page.eval(PROBE).await;
        polls += 1;
        if polls.is_multiple_of(20) {
            eprintln!(
                "browser after {:?}: {last}",
                deadline.saturating_duration_since(Instant::now())
            );
        }
        let log = last["log"].as_str().unwrap_or_default().to_lowercase();
        let energy = last["energy"].as_f64().unwrap_or(0.0);
        if !heard && log.contains("you: ") {
            heard = true;
            energy_at_transcript = energy;
        }
        // Bot audio: energy well above what the idle silent track gives, after the transcript.
        if heard && log.contains("bot:") && energy > energy_at_transcript + 0.01 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = last["log"].as_str().unwrap_or_default().to_lowercase();
    // The words themselves vary with Chrome's microphone processing; that some arrived is the
    // point here (the file and WebRTC tests check what was heard).
    assert!(
        log.contains("you: "),
        "the page never showed the user's transcript: {last:#}"
    );
    assert!(
        log.contains("bot:"),
        "the page never showed the bot's words: {last:#}"
    );
    let energy = last["energy"].as_f64().unwrap_or(0.0);
    assert!(
        energy > energy_at_transcript + 0.01,
        "no bot audio energy on the track: {last:#}"
    );
    assert_eq!(last["connection"], "connected", "{last:#}");
    eprintln!("browser: {last}");
    page.eval("document.getElementById('disconnect').click(); true")
        .await;
    let _ = std::fs::remove_dir_all(&dir);
}
