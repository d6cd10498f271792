//! A voxide server on a free loopback port, for the tests that talk to it over sockets.
#![allow(dead_code)]

pub mod bot_run;
pub mod llm_stand_in;
pub mod otlp;
pub mod scripted;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use voxide::bot::{BotOptions, Voice};
use voxide::server::{ServeOptions, serve_until};

/// The shipped question: 1 s of silence, "Hello there. What is the weather like in Paris
/// today?", 1 s of silence, at 16 kHz.
pub const HELLO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav");

pub struct Server {
    pub addr: SocketAddr,
    pub stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<()>,
}

pub async fn start(max_sessions: usize) -> Server {
    let bot = BotOptions {
        voice: Voice::Espeak,
        ..BotOptions::default()
    };
    start_with(max_sessions, vec![bot]).await
}

/// A server of `bots` (the first the default), ready.
pub async fn start_with(max_sessions: usize, bots: Vec<BotOptions>) -> Server {
    start_options(ServeOptions {
        max_sessions,
        ..test_options(bots)
    })
    .await
}

/// The options the tests' servers share: a loopback port, a short drain.
pub fn test_options(bots: Vec<BotOptions>) -> ServeOptions {
    ServeOptions {
        drain_timeout: Duration::from_secs(2),
        node_id: "test".parse().expect("a node id"),
        ..ServeOptions::new("127.0.0.1:0".parse().expect("addr"), bots)
    }
}

/// A server with `options`, ready.
pub async fn start_options(options: ServeOptions) -> Server {
    let (stop, stopped) = oneshot::channel::<()>();
    let (addr_tx, addr_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
            Ok(())
        };
        serve_until(options, shutdown, move |addr| {
            let _ = addr_tx.send(addr);
        })
        .await
        .expect("the server runs");
    });
    let addr = addr_rx.await.expect("listening");
    // Ready once the models are loaded.
    for _ in 0..600 {
        if get(addr, "/readyz").await.0 == 200 {
            return Server {
                addr,
                stop: Some(stop),
                task,
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the server never became ready");
}

/// A plain HTTP/1.1 request: status and body.
pub async fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    request_with(addr, method, path, &[], body).await
}

/// [`request`] with more headers.
pub async fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A plain HTTP/1.1 GET: status and body.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    request(addr, "GET", path, "").await
}
