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

/// Kills the browser and removes its files however the test ends.
struct Browser {
    child: Child,
    dir: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
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

fn launch(url: &str, dir: &Path) -> Browser {
    let microphone = microphone_file(dir);
    let profile = dir.join("profile");
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
        dir: dir.to_owned(),
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
    /// Closes the page, as closing its tab would: no goodbye from its scripts.
    async fn close(&mut self) {
        self.next_id += 1;
        let command = json!({"id": self.next_id, "method": "Page.close"});
        self.socket
            .send(WsMessage::Text(command.to_string().into()))
            .await
            .expect("send");
    }

    /// Evaluates `expression` (awaiting a promise) and returns its value.
    async fn eval(&mut self, expression: &str) -> Value {
        let reply = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
            )
            .await;
        if let Some(exception) = reply.get("exceptionDetails") {
            panic!("the page threw: {exception}");
        }
        reply
            .pointer("/result/value")
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// A DevTools command's result.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let command = json!({"id": id, "method": method, "params": params});
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
                return reply["result"].clone();
            }
        }
        panic!("DevTools closed");
    }

    /// A screenshot of the page, kept under `target/test-artifacts/` as `name`.
    async fn screenshot(&mut self, name: &str) -> PathBuf {
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            shot["data"].as_str().expect("a screenshot"),
        )
        .expect("base64");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
        std::fs::create_dir_all(&dir).expect("the artifacts folder");
        let path = dir.join(name);
        std::fs::write(&path, png).expect("the screenshot");
        path
    }
}

/// What the page shows and how much audio its track has received.
const PROBE: &str = r#"(async () => {
  let energy = 0, packets = 0, discarded = 0;
  if (pc) {
    const stats = await pc.getStats();
    stats.forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "audio") {
        energy = r.totalAudioEnergy || 0;
        packets = r.packetsReceived || 0;
        discarded = r.packetsDiscarded || 0;
      }
    });
  }
  return {
    state: document.getElementById("state").textContent,
    log: document.getElementById("log").innerText,
    connection: pc ? pc.connectionState : "none",
    energy,
    packets,
    // Packets Chrome's jitter buffer threw away: in RED, the copy in each packet of the one
    // it already has.
    discarded,
    // Each turn's voice to voice, as its card shows it, and the parts of its bar.
    v2v: [...document.querySelectorAll(".turn .v2vtext")].map((e) => Number(e.dataset.ms || 0)),
    segments: document.querySelectorAll(".turn .v2v span").length,
  };
})()"#;

/// A browser on voxide's page, its fake microphone playing the shipped question, and a
/// DevTools connection to the page once the page's script has loaded.
struct Opened {
    page: Page,
    _browser: Browser,
}

async fn open(server: &common::Server, name: &str) -> Opened {
    open_url(&format!("http://{}/", server.addr), name).await
}

/// A browser on the page at `url` (voxide's page, served by whichever server).
async fn open_url(url: &str, name: &str) -> Opened {
    let dir = std::env::temp_dir().join(format!("voxide-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let browser = launch(url, &dir);
    eprintln!("{name}: server ready, Chromium started");
    let port = devtools_port(&dir.join("profile")).await;
    let page_url = page_socket(port).await;
    let (socket, _) = tokio_tungstenite::connect_async(page_url)
        .await
        .expect("DevTools socket");
    let mut page = Page { socket, next_id: 0 };
    eprintln!("{name}: attached to the page");
    let started = Instant::now();
    while page.eval("typeof connect === 'function'").await != json!(true) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the page never loaded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Opened {
        page,
        _browser: browser,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_talks_to_the_bot_over_webrtc() {
    // The bot's voice goes in RED from its first packet, so Chrome decodes RED as well as
    // sending it (on this loopback it reports no loss, which is what turns it on by default).
    let bot = voxide::bot::BotOptions {
        voice: voxide::bot::Voice::Espeak,
        ..voxide::bot::BotOptions::default()
    };
    let server = common::start_options(voxide::server::ServeOptions {
        max_sessions: 2,
        webrtc_red_voice: voxide::transports::webrtc::RedVoice::Always,
        ..common::test_options(vec![bot])
    })
    .await;
    let mut opened = open(&server, "browser").await;
    let page = &mut opened.page;
    // Connect over WebRTC (the page's default transport).
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
        // Bot audio: energy well above what the idle silent track gives, after the transcript,
        // and enough of its packets to tell RED from plain Opus.
        let packets = last["packets"].as_u64().unwrap_or(0);
        if heard && log.contains("bot:") && energy > energy_at_transcript + 0.01 && packets > 20 {
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
    // Chrome heard the bot's voice in RED: it took each packet apart and threw away the copy
    // of the packet before, which it had (with plain Opus it discards none), and the audio came
    // through (the energy above).
    let (packets, discarded) = (
        last["packets"].as_u64().unwrap_or(0),
        last["discarded"].as_u64().unwrap_or(0),
    );
    assert!(
        packets > 10 && discarded * 2 > packets,
        "Chrome did not take the bot's voice as RED: {last:#}"
    );
    // The turn's card: its voice to voice (the server's figure, over RTVI) and its bar.
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until
        && !last["v2v"]
            .as_array()
            .is_some_and(|v| v.iter().any(|ms| ms.as_f64().unwrap_or(0.0) > 0.0))
    {
        tokio::time::sleep(Duration::from_millis(300)).await;
        last = page.eval(PROBE).await;
    }
    assert!(
        last["v2v"]
            .as_array()
            .is_some_and(|v| v.iter().any(|ms| ms.as_f64().unwrap_or(0.0) > 0.0)),
        "no turn showed its voice to voice: {last:#}"
    );
    assert!(last["segments"].as_u64().unwrap_or(0) >= 5, "{last:#}");
    let shot = page.screenshot("console-webrtc.png").await;
    eprintln!("browser: {last}; screenshot {}", shot.display());
    let summary = disconnect(page).await;
    assert!(
        summary.contains("voice to voice, p95") && summary.contains("download"),
        "{summary}"
    );
    // The answer put RED first, so Chrome sent the microphone in RED (RFC 2198), each packet
    // with a copy of the one before.
    let red = |metrics: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("voxide_webrtc_packets_total{outcome=\"red\"} "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let until = Instant::now() + Duration::from_secs(10);
    let mut metrics = String::new();
    while Instant::now() < until {
        metrics = common::get(server.addr, "/metrics").await.1;
        if red(&metrics) > 50 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        red(&metrics) > 50,
        "Chrome's packets did not come in RED: {}",
        metrics
            .lines()
            .filter(|l| l.starts_with("voxide_webrtc_packets_total"))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

/// Disconnects the console; the session's summary it then shows, in lower case.
async fn disconnect(page: &mut Page) -> String {
    page.eval("document.getElementById('disconnect').click(); true")
        .await;
    let summary = page
        .eval("document.getElementById('summary').innerText")
        .await;
    summary.as_str().unwrap_or_default().to_lowercase()
}

/// What the console shows of its turns: each card's text, the tool cards', the struck words.
const CONSOLE: &str = r#"(() => ({
  state: document.getElementById("state").textContent,
  turns: [...document.querySelectorAll(".turn")].map((t) => t.innerText),
  tools: [...document.querySelectorAll(".tool")].map((t) => t.innerText),
  cut: document.querySelectorAll(".turn .cutmark").length,
  struck: document.querySelectorAll(".bubble .cut").length,
  log: document.getElementById("log").innerText,
}))()"#;

/// Polls the console until `done` holds of what it shows; fails with the last of it.
async fn console_until(
    page: &mut Page,
    what: &str,
    secs: u64,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let shown = page.eval(CONSOLE).await;
        if done(&shown) {
            return shown;
        }
        assert!(Instant::now() < until, "{what}: {shown:#}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Types `text` into the console and sends it.
async fn type_in(page: &mut Page, text: &str) {
    page.eval(&format!(
        "document.getElementById('text').value = {}; document.getElementById('send').click(); true",
        json!(text)
    ))
    .await;
}

fn any_contains(shown: &Value, key: &str, needle: &str) -> bool {
    shown[key].as_array().is_some_and(|items| {
        items
            .iter()
            .any(|i| i.as_str().unwrap_or_default().contains(needle))
    })
}

/// Runs its function when the test ends by a panic.
struct Asked(Box<dyn Fn()>);

impl Drop for Asked {
    fn drop(&mut self) {
        if std::thread::panicking() {
            (self.0)();
        }
    }
}

/// A bot on the OpenAI stand-in: the microphone's question gets a long answer, a question about
/// the time a `get_current_time` call, and the call's result a line. The page is under test,
/// not the model's choices.
async fn scripted_bot() -> (voxide::bot::BotOptions, common::llm_stand_in::StandIn) {
    use common::llm_stand_in::{self, Reply};
    use std::sync::Arc;
    fn stream(chunks: &[Value]) -> Reply {
        let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        out.push_str("data: [DONE]\n\n");
        Reply::Stream(out, 64)
    }
    fn words(text: &str) -> Reply {
        stream(&[
            json!({"choices": [{"delta": {"content": text}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
        ])
    }
    let reply = Reply::With(Arc::new(|body: &Value| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        // The user's words since the bot last spoke: the looping microphone may say its
        // question again after the typed one, in a message of its own.
        let since_bot = messages
            .iter()
            .rev()
            .take_while(|m| m["role"] != "assistant" && m["role"] != "tool")
            .filter_map(|m| m["content"].as_str())
            .collect::<String>()
            .to_lowercase();
        match messages.last().and_then(|m| m["role"].as_str()) {
            Some("tool") => words("It is a quarter past ten in the morning."),
            Some("user") if since_bot.contains("time") => stream(&[
                json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_clock", "type": "function",
                    "function": {"name": "get_current_time", "arguments": "{}"}}]}}]}),
                json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
            ]),
            _ => words(
                "Paris today is mild and mostly cloudy, with a light breeze from the west. \
                 The morning stays grey, the afternoon brings some sun, and the evening turns \
                 cool, so take a jacket if you walk along the river after dinner. Tomorrow \
                 looks much the same, with a chance of rain late in the day.",
            ),
        }
    }));
    let (addr, stand_in) = llm_stand_in::start(vec![reply]).await;
    let bot = voxide::bot::BotOptions {
        llm: voxide::bot::LlmChoice::Text(vec![voxide::bot::TextLlm::OpenAi(
            voxide::services::llm::openai::OpenAiSettings {
                base_url: format!("http://{addr}/v1"),
                model: "gpt-4.1-mini".into(),
                ..Default::default()
            },
        )]),
        voice: voxide::bot::Voice::Espeak,
        ..Default::default()
    };
    (bot, stand_in)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_typed_turn_cut_off_and_its_tool_card() {
    let (bot, stand_in) = scripted_bot().await;
    let server = common::start_with(2, vec![bot]).await;
    // Should the clock card not come, the test's output shows what the model was asked.
    let asked = stand_in.clone();
    let _asked = Asked(Box::new(move || {
        for post in asked.posts() {
            let turns: Vec<String> = post.body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| format!("{}: {}", m["role"], m["content"]))
                .collect();
            eprintln!("asked: {turns:?}");
        }
    }));
    let mut opened = open(&server, "console-webrtc").await;
    let page = &mut opened.page;
    page.eval("document.getElementById('connect').click(); true")
        .await;
    // The microphone's question is answered; typing over the answer cuts it off.
    console_until(page, "the bot never spoke", 100, |s| {
        s["state"] == "speaking"
    })
    .await;
    type_in(page, "What time is it?").await;
    let shown = console_until(page, "no interruption on the page", 30, |s| {
        s["cut"].as_u64().unwrap_or(0) >= 1 && s["struck"].as_u64().unwrap_or(0) >= 1
    })
    .await;
    eprintln!("console: {shown}");
    // The typed question calls the clock: its card, in its turn.
    let shown = console_until(page, "no clock card", 60, |s| {
        any_contains(s, "tools", "get_current_time")
    })
    .await;
    assert!(
        shown["turns"].as_array().is_some_and(|t| t.len() >= 2),
        "{shown:#}"
    );
    let shot = page.screenshot("console-interrupted.png").await;
    eprintln!("console: {shown}; screenshot {}", shot.display());
    page.eval("document.getElementById('disconnect').click(); true")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_an_async_tools_progress_and_result_over_the_websocket_and_the_recording()
{
    // A recording server: the summary links the session's recording.
    let records = std::env::temp_dir().join(format!("voxide-console-rec-{}", std::process::id()));
    std::fs::create_dir_all(&records).expect("a folder for the recordings");
    let bot = voxide::bot::BotOptions {
        voice: voxide::bot::Voice::Espeak,
        ..Default::default()
    };
    let server = common::start_options(voxide::server::ServeOptions {
        max_sessions: 2,
        record_dir: Some(records.clone()),
        ..common::test_options(vec![bot])
    })
    .await;
    let mut opened = open(&server, "console-ws").await;
    let page = &mut opened.page;
    page.eval("document.getElementById('transport').value = 'ws'; document.getElementById('connect').click(); true")
        .await;
    console_until(page, "never connected", 30, |s| {
        s["state"]
            .as_str()
            .is_some_and(|t| t.starts_with("connected"))
    })
    .await;
    // The timer runs on while the talk goes on: its card shows it started, its progress at
    // 5 s, and its ring at 7 s.
    type_in(page, "Set a timer for 7 seconds.").await;
    let shown = console_until(page, "no timer card", 60, |s| {
        any_contains(s, "tools", "set_timer")
    })
    .await;
    eprintln!("console: {shown}");
    let shown = console_until(page, "no progress and result on the card", 60, |s| {
        any_contains(s, "tools", "…") && any_contains(s, "tools", "→")
    })
    .await;
    assert!(
        shown["log"]
            .as_str()
            .is_some_and(|l| l.to_lowercase().contains("you: set a timer"))
    );
    let shot = page.screenshot("console-async-tool.png").await;
    eprintln!("console: {shown}; screenshot {}", shot.display());
    page.eval("document.getElementById('disconnect').click(); true")
        .await;

    // The summary links the recording, and the link gives the session's stereo WAV once the
    // server has finished it.
    let href = poll_until(
        page,
        "[...document.querySelectorAll('#summary a')].map((a) => a.href).find((h) => h.includes('/audio')) || ''",
        30,
        |v| v.as_str().is_some_and(|h| !h.is_empty()),
    )
    .await;
    let href = href.as_str().unwrap_or_default().to_owned();
    assert!(!href.is_empty(), "the summary links the recording");
    let fetch = format!(
        "fetch({href:?}).then(async (r) => r.status + ' ' + new TextDecoder().decode((await r.arrayBuffer()).slice(0, 4)))"
    );
    let got = poll_until(page, &fetch, 30, |v| v == "200 RIFF").await;
    assert_eq!(got, "200 RIFF");
    let shot = page.screenshot("console-summary-recorded.png").await;
    eprintln!(
        "console: recording at {href}; screenshot {}",
        shot.display()
    );
    let _ = std::fs::remove_dir_all(&records);
}

/// pipecat's own SmallWebRTC bot with voxide's page in front (`tests/pipecat_bot/serve.py`), in
/// the Python `scripts/evals.sh --setup-only` installs; killed when dropped.
struct PipecatBot(Child);

impl Drop for PipecatBot {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const PIPECAT_PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/venv-evals/bin/python");

/// Starts pipecat's bot on the provider stand-ins at `stand_ins`; its address once it answers.
async fn pipecat_bot(stand_ins: std::net::SocketAddr) -> (PipecatBot, std::net::SocketAddr) {
    assert!(
        Path::new(PIPECAT_PYTHON).exists(),
        "pipecat's bot needs its Python: scripts/evals.sh --setup-only"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(PIPECAT_PYTHON)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/pipecat_bot/serve.py"
        ))
        .args(["--port", &port.to_string()])
        .env("STAND_INS", stand_ins.to_string())
        .env("LOG_LEVEL", "WARNING")
        .stdout(Stdio::null())
        .spawn()
        .expect("pipecat's bot starts");
    let bot = PipecatBot(child);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_err()
        || common::get(addr, "/healthz").await.0 != 200
    {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "pipecat's bot never answered"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (bot, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_talks_to_pipecats_own_smallwebrtc_bot() {
    use voxide::bench::providers::Protocol;
    use voxide::bench::providers::stand_ins::{Delays, Faults, StandIns};
    let (_stand_ins, stand_ins, _serving) = StandIns::serve(
        "127.0.0.1:0".parse().expect("addr"),
        Delays::all(Duration::from_millis(150)),
        Protocol::Openai,
        Faults::NONE,
    )
    .await
    .expect("the stand-ins listen");
    let (_bot, addr) = pipecat_bot(stand_ins).await;
    let mut opened = open_url(&format!("http://{addr}/"), "console-pipecat").await;
    let page = &mut opened.page;
    // The page's default transport, WebRTC, to pipecat's own request handler.
    page.eval("document.getElementById('connect').click(); true")
        .await;
    console_until(page, "pipecat's bot never got ready", 60, |s| {
        s["state"]
            .as_str()
            .is_some_and(|t| t.starts_with("connected"))
    })
    .await;
    // The microphone's question: pipecat's transcription, its answer, and the turn's card with
    // what pipecat's RTVI carries: no voice to voice, so the page's own from the turn's end to
    // the bot's first sound, and the services' times to first byte.
    let shown = console_until(page, "no spoken turn from pipecat's bot", 90, |s| {
        let log = s["log"].as_str().unwrap_or_default().to_lowercase();
        log.contains("you: ")
            && log.contains("bot: ")
            && any_contains(s, "turns", "ms from the turn's end")
            && any_contains(s, "turns", "LLM")
    })
    .await;
    eprintln!("console on pipecat: {shown}");
    // A typed turn (RTVI send-text, which pipecat takes too) is answered in a turn of its own.
    let answered = shown["turns"].as_array().map_or(0, Vec::len);
    type_in(page, "What is the weather like in Paris?").await;
    let shown = console_until(page, "the typed turn was not answered", 60, |s| {
        let log = s["log"].as_str().unwrap_or_default().to_lowercase();
        let after = log
            .split("you: what is the weather")
            .nth(1)
            .unwrap_or_default();
        s["turns"].as_array().map_or(0, Vec::len) > answered
            && after
                .lines()
                .any(|l| l.starts_with("bot: ") && l.len() > "bot: ".len())
    })
    .await;
    let shot = page.screenshot("console-pipecat.png").await;
    eprintln!("console on pipecat: {shown}; screenshot {}", shot.display());
    let summary = disconnect(page).await;
    assert!(
        summary.contains("turns") && summary.contains("download"),
        "{summary}"
    );
}

/// pipecat's official client (`@pipecat-ai/client-js` with `@pipecat-ai/small-webrtc-transport`),
/// bundled by `scripts/setup.sh --test` from `tests/pipecat_client`.
const OFFICIAL_BUNDLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/pipecat-client/pipecat-client.js"
);

/// Starts the official client the way pipecat's examples do (`POST /start`, then the
/// session's offer URL). Its default media manager fetches a bundle from a CDN, so it gets the
/// transport's plain `getUserMedia` one.
const OFFICIAL_CONNECT: &str = r#"(() => {
  const { PipecatClient, SmallWebRTCTransport, WavMediaManager } = window.PipecatOfficial;
  const seen = (window.official = { ready: null, user: [], bot: [], errors: [], messageErrors: [],
    tracks: 0, botStarted: 0, botStopped: 0, muteStarted: 0, muteStopped: 0, botLeft: 0 });
  const audio = (window.officialAudio = document.createElement("audio"));
  audio.autoplay = true;
  document.body.appendChild(audio);
  const transport = new SmallWebRTCTransport({ mediaManager: new WavMediaManager() });
  const client = new PipecatClient({
    transport,
    enableMic: true,
    enableCam: false,
    callbacks: {
      onBotReady: (data) => { seen.ready = data; },
      onUserTranscript: (data) => { if (data.final) seen.user.push(data.text); },
      onBotOutput: (data) => { seen.bot.push(data.text); },
      onTrackStarted: (track, participant) => {
        if (track.kind === "audio" && !(participant && participant.local)) {
          seen.tracks += 1;
          audio.srcObject = new MediaStream([track]);
        }
      },
      onError: (message) => { seen.errors.push(JSON.stringify(message)); },
      onMessageError: (message) => { seen.messageErrors.push(JSON.stringify(message)); },
      onBotStartedSpeaking: () => { seen.botStarted += 1; },
      onBotStoppedSpeaking: () => { seen.botStopped += 1; },
      onUserMuteStarted: () => { seen.muteStarted += 1; },
      onUserMuteStopped: () => { seen.muteStopped += 1; },
      onBotDisconnected: () => { seen.botLeft += 1; },
    },
  });
  window.officialClient = client;
  window.officialTransport = transport;
  client.startBotAndConnect({ endpoint: "/start" }).catch((e) => seen.errors.push(String(e)));
  return true;
})()"#;

/// What the official client has seen, and the audio energy its current connection received.
const OFFICIAL_PROBE: &str = r#"(async () => {
  const pc = window.officialTransport.pc;
  let energy = 0, packets = 0;
  if (pc) {
    (await pc.getStats()).forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "audio") {
        energy = r.totalAudioEnergy || 0;
        packets = r.packetsReceived || 0;
      }
    });
  }
  return { ...window.official, energy, packets, connection: pc ? pc.connectionState : "none",
           state: window.officialClient.state,
           directions: pc ? pc.getTransceivers().map((t) => t.mid + ":" + t.currentDirection) : [] };
})()"#;

/// Polls `probe` until `done` holds or `seconds` pass; returns the last answer.
async fn poll_until(
    page: &mut Page,
    probe: &str,
    seconds: u64,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut last = page.eval(probe).await;
    let mut polls = 0u32;
    while !done(&last) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        last = page.eval(probe).await;
        polls += 1;
        if polls.is_multiple_of(20) {
            eprintln!("official client: {last}");
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipecats_official_client_talks_to_voxide_and_survives_a_restart() {
    let bundle = std::fs::read_to_string(OFFICIAL_BUNDLE)
        .unwrap_or_else(|e| panic!("{OFFICIAL_BUNDLE}: {e}; `scripts/setup.sh --test` builds it"));
    let server = start(2).await;
    let mut opened = open(&server, "official").await;
    let page = &mut opened.page;
    page.eval(&format!("{bundle}\n;true")).await;
    page.eval(OFFICIAL_CONNECT).await;

    // The spoken question is heard and answered in voice.
    let seen = poll_until(page, OFFICIAL_PROBE, 100, |s| {
        s["user"].as_array().is_some_and(|u| !u.is_empty())
            && s["bot"].as_array().is_some_and(|b| !b.is_empty())
            && s["energy"].as_f64().unwrap_or(0.0) > 0.01
    })
    .await;
    assert!(seen["ready"].is_object(), "no bot-ready: {seen:#}");
    assert_eq!(seen["state"], "ready", "{seen:#}");
    assert!(
        seen["user"].as_array().is_some_and(|u| !u.is_empty()),
        "the client never got a final user transcript: {seen:#}"
    );
    assert!(
        seen["bot"].as_array().is_some_and(|b| !b.is_empty()),
        "the client never got the bot's words: {seen:#}"
    );
    assert!(
        seen["energy"].as_f64().unwrap_or(0.0) > 0.01,
        "no bot audio on the track: {seen:#}"
    );
    assert_eq!(seen["errors"], json!([]), "{seen:#}");
    // The transport's keepalive pings and track-status messages are no errors.
    assert_eq!(seen["messageErrors"], json!([]), "{seen:#}");
    let answers = seen["bot"].as_array().map_or(0, Vec::len);

    // A typed question; while the bot speaks its answer, the client replaces its peer
    // connection (`restart_pc`, what it does when ICE fails). The session lives on: the answer
    // goes on over the new connection, and its end is told there.
    let started = seen["botStarted"].as_u64().unwrap_or(0);
    let stopped = seen["botStopped"].as_u64().unwrap_or(0);
    page.eval("window.officialClient.sendText('What is two plus two?').then(() => true)")
        .await;
    let seen = poll_until(page, OFFICIAL_PROBE, 60, |s| {
        s["botStarted"].as_u64().unwrap_or(0) > started
    })
    .await;
    assert!(
        seen["botStarted"].as_u64().unwrap_or(0) > started,
        "the bot never started its answer: {seen:#}"
    );
    page.eval("window.officialTransport.attemptReconnection(true).then(() => true)")
        .await;
    let seen = poll_until(page, OFFICIAL_PROBE, 30, |s| s["connection"] == "connected").await;
    assert_eq!(seen["connection"], "connected", "{seen:#}");
    // The transport reports a remote track when it unmutes, which a replaced connection's track
    // need not do: play the new connection's track directly (Chrome measures what it plays).
    page.eval(
        "window.officialAudio.srcObject = new MediaStream(window.officialTransport.pc\
         .getReceivers().map((r) => r.track).filter((t) => t.kind === 'audio')); true",
    )
    .await;
    let seen = poll_until(page, OFFICIAL_PROBE, 60, |s| {
        s["bot"].as_array().map_or(0, Vec::len) > answers
            && s["energy"].as_f64().unwrap_or(0.0) > 0.01
            && s["botStopped"].as_u64().unwrap_or(0) > stopped
    })
    .await;
    assert!(
        seen["bot"].as_array().map_or(0, Vec::len) > answers,
        "no answer after the restart: {seen:#}"
    );
    assert!(
        seen["energy"].as_f64().unwrap_or(0.0) > 0.01,
        "no bot audio on the new connection: {seen:#}"
    );
    assert!(
        seen["botStopped"].as_u64().unwrap_or(0) > stopped,
        "bot-stopped-speaking never came after the restart: {seen:#}"
    );
    // Still the one session the client started: the restart replaced only the connection.
    let (_, status) = common::get(server.addr, "/status").await;
    let status: Value = serde_json::from_str(&status).expect("status JSON");
    assert_eq!(status["sessions_started"], 1, "{status}");
    assert_eq!(status["sessions"], 1, "{status}");

    // The user mutes and unmutes the microphone: the server hears both.
    page.eval("window.officialClient.enableMic(false); true")
        .await;
    let seen = poll_until(page, OFFICIAL_PROBE, 10, |s| s["muteStarted"] == 1).await;
    assert_eq!(seen["muteStarted"], 1, "{seen:#}");
    page.eval("window.officialClient.enableMic(true); true")
        .await;
    let seen = poll_until(page, OFFICIAL_PROBE, 10, |s| s["muteStopped"] == 1).await;
    assert_eq!(seen["muteStopped"], 1, "{seen:#}");
    assert_eq!(seen["errors"], json!([]), "{seen:#}");
    assert_eq!(seen["messageErrors"], json!([]), "{seen:#}");
    eprintln!("official client: {seen}");

    // The tab closes without a goodbye: the session ends within seconds, the client gone.
    page.close().await;
    let closed = Instant::now();
    let status = loop {
        let (_, body) = common::get(server.addr, "/status").await;
        let status: Value = serde_json::from_str(&body).expect("status JSON");
        if status["sessions"] == 0 || closed.elapsed() > Duration::from_secs(30) {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "official client: the session ended {:?} after the tab closed",
        closed.elapsed()
    );
    assert_eq!(status["sessions"], 0, "{status}");
    assert_eq!(status["sessions_ended"]["client_gone"], 1, "{status}");
    assert!(
        closed.elapsed() < Duration::from_secs(10),
        "took {:?}",
        closed.elapsed()
    );
}
