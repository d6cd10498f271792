//! Clients that abuse a voxide server's `/ws`, for `scripts/abuse.sh`: each kind runs in a loop
//! for `--seconds`, from its own address (`X-Forwarded-For`, for a server started with
//! `--trust-forwarded-for`), and what the server did to it is counted. Prints one JSON line.
//!
//! - `fast`: sends the question at ten times real time until the server closes it;
//! - `deaf`: a 4 KiB receive buffer, the question in real time, and never a read;
//! - `big`: a 2 MB text message (over the 1 MB limit);
//! - `churn`: opens a session and drops it at once, as fast as it can.
//!
//! ```bash
//! cargo run --release --example abusive_clients -- --target 127.0.0.1:7960 \
//!     --audio assets/test/hello_16k.wav --seconds 60 [--fast 2] [--deaf 2] [--big 1] [--churn 1]
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// What the server did to the abusers, by kind.
#[derive(Default)]
struct Counts {
    /// Sessions opened (the upgrade answered 101).
    opened: AtomicUsize,
    /// Upgrades refused with 429 (the per-address limit).
    rate_limited: AtomicUsize,
    /// Upgrades refused otherwise.
    refused: AtomicUsize,
    /// Sessions the server closed.
    closed_by_server: AtomicUsize,
    /// Of those, with an error that says why.
    told_why: AtomicUsize,
    /// Sessions still open when the run ended.
    still_open: AtomicUsize,
}

impl Counts {
    fn json(&self) -> serde_json::Value {
        let get = |n: &AtomicUsize| n.load(Ordering::Relaxed);
        json!({"opened": get(&self.opened), "rate_limited": get(&self.rate_limited),
            "refused": get(&self.refused), "closed_by_server": get(&self.closed_by_server),
            "told_why": get(&self.told_why), "still_open": get(&self.still_open)})
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Fast,
    Deaf,
    Big,
    Churn,
}

struct Run {
    target: SocketAddr,
    frames: Vec<Vec<u8>>,
    end: Instant,
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

impl Run {
    /// Opens `/ws` from `client` (its address as `X-Forwarded-For`); `None` when refused.
    async fn open(
        &self,
        client: &str,
        receive_buffer: Option<u32>,
        counts: &Counts,
    ) -> Option<Socket> {
        let socket = tokio::net::TcpSocket::new_v4().ok()?;
        if let Some(size) = receive_buffer {
            let _ = socket.set_recv_buffer_size(size);
        }
        let stream = socket.connect(self.target).await.ok()?;
        let url = format!("ws://{}/ws?sample_rate=16000", self.target);
        let mut request = url.into_client_request().ok()?;
        request
            .headers_mut()
            .insert("x-forwarded-for", client.parse().ok()?);
        match tokio_tungstenite::client_async(request, stream).await {
            Ok((socket, _)) => {
                counts.opened.fetch_add(1, Ordering::Relaxed);
                Some(socket)
            }
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                let counter = if response.status() == 429 {
                    &counts.rate_limited
                } else {
                    &counts.refused
                };
                counter.fetch_add(1, Ordering::Relaxed);
                // Refused: back off a little before the next try.
                tokio::time::sleep(Duration::from_millis(200)).await;
                None
            }
            Err(_) => None,
        }
    }

    /// One abuser of `kind`, in a loop until the run ends.
    async fn abuse(&self, kind: Kind, client: String, counts: &Counts) {
        while Instant::now() < self.end {
            let receive_buffer = matches!(kind, Kind::Deaf).then_some(4096);
            let Some(socket) = self.open(&client, receive_buffer, counts).await else {
                continue;
            };
            let (mut tx, mut rx) = socket.split();
            match kind {
                Kind::Churn => {
                    drop((tx, rx));
                    continue;
                }
                Kind::Big => {
                    let huge = format!(r#"{{"type":"text","text":"{}"}}"#, "a".repeat(2 << 20));
                    let _ = tx.send(Message::text(huge)).await;
                }
                Kind::Fast | Kind::Deaf => {}
            }
            let pace = match kind {
                Kind::Fast => Duration::from_millis(2),
                _ => Duration::from_millis(20),
            };
            let mut tick = tokio::time::interval(pace);
            let mut frames = self.frames.iter().cycle();
            let (mut closed, mut told_why) = (false, false);
            while Instant::now() < self.end && !closed {
                tokio::select! {
                    _ = tick.tick(), if !matches!(kind, Kind::Big) => {
                        let frame = frames.next().cloned().unwrap_or_default();
                        if tx.send(Message::binary(frame)).await.is_err() {
                            closed = true;
                        }
                    }
                    message = rx.next(), if !matches!(kind, Kind::Deaf) => match message {
                        Some(Ok(Message::Text(text))) => {
                            told_why |= text.contains("\"error\"");
                        }
                        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => closed = true,
                        Some(Ok(_)) => {}
                    },
                    () = tokio::time::sleep_until(self.end) => {}
                }
            }
            if closed && !matches!(kind, Kind::Deaf) {
                // A write can fail before the reason already sent is read: read what is left.
                let drain = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some(Ok(message)) = rx.next().await {
                        if let Message::Text(text) = message {
                            told_why |= text.contains("\"error\"");
                        }
                    }
                });
                let _ = drain.await;
            }
            if closed {
                counts.closed_by_server.fetch_add(1, Ordering::Relaxed);
                counts
                    .told_why
                    .fetch_add(usize::from(told_why), Ordering::Relaxed);
            } else {
                counts.still_open.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn arg(args: &[String], flag: &str) -> Option<String> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

fn number(args: &[String], flag: &str, default: u64) -> Result<u64, String> {
    arg(args, flag).map_or(Ok(default), |v| {
        v.parse().map_err(|_| format!("{flag} takes a number"))
    })
}

fn frames(path: &str) -> Result<Vec<Vec<u8>>, String> {
    let audio = voxide::audio::wav::read(path).map_err(|e| format!("{path}: {e}"))?;
    if audio.sample_rate != 16_000 {
        return Err(format!("{path}: 16 kHz audio, please"));
    }
    Ok(audio
        .to_mono()
        .chunks(320)
        .map(|c| c.iter().flat_map(|s| s.to_le_bytes()).collect())
        .collect())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let parsed = (|| {
        let target: SocketAddr = arg(&args, "--target")
            .ok_or("--target HOST:PORT is needed")?
            .parse()
            .map_err(|_| "--target takes HOST:PORT".to_owned())?;
        let frames = frames(&arg(&args, "--audio").ok_or("--audio FILE is needed")?)?;
        let seconds = number(&args, "--seconds", 60)?;
        let kinds = [
            ("fast", Kind::Fast, number(&args, "--fast", 2)?),
            ("deaf", Kind::Deaf, number(&args, "--deaf", 2)?),
            ("big", Kind::Big, number(&args, "--big", 1)?),
            ("churn", Kind::Churn, number(&args, "--churn", 1)?),
        ];
        Ok::<_, String>((target, frames, seconds, kinds))
    })();
    let (target, frames, seconds, kinds) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let run = Arc::new(Run {
        target,
        frames,
        end: Instant::now() + Duration::from_secs(seconds),
    });
    let mut tasks = Vec::new();
    let mut kept = Vec::new();
    for (k, (name, kind, count)) in kinds.into_iter().enumerate() {
        let counts = Arc::new(Counts::default());
        for i in 0..count as usize {
            let (run, counts) = (run.clone(), counts.clone());
            // Each abuser its own documentation address (RFC 5737).
            let client = format!("203.0.113.{}", k * 50 + i + 1);
            tasks.push(tokio::spawn(async move {
                run.abuse(kind, client, &counts).await;
            }));
        }
        kept.push((name, count, counts));
    }
    for task in tasks {
        let _ = task.await;
    }
    let mut report = serde_json::Map::new();
    for (name, count, counts) in kept {
        let mut entry = counts.json();
        entry["clients"] = json!(count);
        report.insert(name.to_owned(), entry);
    }
    println!("{}", serde_json::Value::Object(report));
}
