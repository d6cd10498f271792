//! Local providers for benchmarks, load tests and soaks, each speaking its wire protocol with a
//! realistic delay before it answers, and noting when it wrote what the bench times:
//! - Deepgram live transcription: a `Finalize` is answered [`Delays::stt`] later with a final
//!   naming the session (from its key, `bench-N`, or else the socket's number, `sN`) and the
//!   question (the socket's count of finalizes), punctuated as a sentence as Deepgram's
//!   `punctuate=true` writes it (`session N question T.`);
//! - an OpenAI-compatible or Anthropic chat stream: the first token [`Delays::llm`] after the
//!   request. Offered the tool [`TOOL`], the OpenAI stream calls it once a conversation;
//! - Cartesia's TTS socket: a context's first audio [`Delays::tts`] after its first text, a
//!   quarter second of tone for each text it is sent;
//! - the tool [`TOOL`] itself, as an HTTP tool, answering [`TOOL_DELAY`] after it is called.
//!
//! Every turn is named `session N question T` on all three, so the legs line up across them.
//! Served with a Whisper ([`Options::hearing`]), Deepgram's final is instead what the
//! embedded Whisper hears in the audio since the last finalize (16 kHz linear16, as voxide's
//! and pipecat's clients send it), so that two bots behind the same stand-ins can be scored on
//! the words their transports delivered. With [`Options::long_answers`], every answer is a story
//! of that many words, spoken a quarter second a word, long enough to talk over.
//! With [`Faults`] they also fail on purpose (sockets dropped, first tokens late, requests and
//! upgrades refused), and `GET /stand-in/stats` tells what failed and whether the bot made up for
//! it: each final answered once, each finished tool result delivered ([`audit`]). The chat
//! stream refuses, as the real APIs do, a request that breaks their rules ([`strict`]).
//! `cargo run --release --example stand_in_providers` serves them for a whole bot.

pub mod audit;
mod chat;
mod sockets;
pub mod strict;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use serde_json::json;
use tokio::time::Instant;

use super::Protocol;
use audit::{Fault, FaultState, Ledger};
pub use audit::{FaultCounts, Faults, LedgerCounts};
pub use chat::{TOOL, TOOL_DELAY};

/// What the stand-ins saw and wrote, by turn name.
#[derive(Default)]
pub struct Log {
    /// Deepgram wrote the turn's final.
    pub final_sent: HashMap<String, Instant>,
    /// The LLM stand-in held the whole request.
    pub request_arrived: HashMap<String, Instant>,
    /// It wrote the first token.
    pub first_token_sent: HashMap<String, Instant>,
    /// Cartesia held the turn's first text.
    pub text_arrived: HashMap<String, Instant>,
    /// It wrote the turn's first audio.
    pub audio_sent: HashMap<String, Instant>,
}

/// How long each stand-in takes to answer.
#[derive(Debug, Clone, Copy)]
pub struct Delays {
    /// From a `Finalize` to its final.
    pub stt: Duration,
    /// From a request to its first token.
    pub llm: Duration,
    /// From a context's first text to its first audio.
    pub tts: Duration,
}

impl Delays {
    /// The same delay everywhere.
    pub fn all(delay: Duration) -> Self {
        Self {
            stt: delay,
            llm: delay,
            tts: delay,
        }
    }
}

/// The stand-ins' shared state.
#[derive(Clone)]
pub struct StandIns {
    /// What they saw and wrote.
    pub log: Arc<Mutex<Log>>,
    delays: Delays,
    protocol: Protocol,
    faults: Arc<FaultState>,
    ledger: Arc<Mutex<Ledger>>,
    /// Sockets opened, to name those whose key names no session.
    sockets: Arc<AtomicUsize>,
    options: Options,
}

/// What the stand-ins do beyond the providers' plain answers.
#[derive(Clone, Default)]
pub struct Options {
    /// Transcribes Deepgram's audio, when given.
    pub hearing: Option<Arc<voxide_engines::stt::whisper::Whisper>>,
    /// Every answer is a story of this many words, and Cartesia speaks each word of a text for
    /// a quarter second (rather than a quarter second a text).
    pub long_answers: Option<usize>,
}

/// What `GET /stand-in/stats` answers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    /// What failed on purpose.
    pub faults: FaultCounts,
    /// Whether the bot made up for it.
    pub ledger: LedgerCounts,
}

impl StandIns {
    /// Serves all of them on `addr` (port 0 for any).
    pub async fn serve(
        addr: std::net::SocketAddr,
        delays: Delays,
        protocol: Protocol,
        faults: Faults,
    ) -> std::io::Result<(Self, std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
        Self::serve_with(addr, delays, (protocol, faults), Options::default()).await
    }

    /// Serves all of them on `addr`, doing what `options` say beyond the plain answers.
    pub async fn serve_with(
        addr: std::net::SocketAddr,
        delays: Delays,
        (protocol, faults): (Protocol, Faults),
        options: Options,
    ) -> std::io::Result<(Self, std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
        let stand_ins = Self {
            log: Arc::default(),
            delays,
            protocol,
            faults: Arc::new(FaultState::new(faults)),
            ledger: Arc::default(),
            sockets: Arc::default(),
            options,
        };
        let app = axum::Router::new()
            .route("/v1/listen", axum::routing::get(sockets::listen))
            .route("/tts/websocket", axum::routing::get(sockets::speak))
            .route(&format!("/tools/{TOOL}"), axum::routing::post(chat::tool))
            .route("/stand-in/stats", axum::routing::get(stats))
            .fallback(chat::chat)
            .with_state(stand_ins.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            // Nagle off, as on voxide's own server: a stand-in's small frames leave at once.
            let _ = axum::serve(
                listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                }),
                app,
            )
            .await;
        });
        Ok((stand_ins, addr, server))
    }

    /// What failed on purpose, and what the bot made of it.
    pub fn stats(&self) -> Stats {
        Stats {
            faults: self.faults.counts(),
            ledger: self.ledger().counts(),
        }
    }

    fn note(&self, at: Instant, key: String, which: fn(&mut Log) -> &mut HashMap<String, Instant>) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        which(&mut log).insert(key, at);
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session a socket's key (`bench-N`) names, or else the socket's own number (`sN`).
    fn session(&self, headers: &HeaderMap, name: &str) -> String {
        let key = headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let number = self.sockets.fetch_add(1, Ordering::Relaxed);
        match key.rsplit('-').next() {
            Some(tail) if tail.parse::<u64>().is_ok() => tail.to_owned(),
            _ => format!("s{number}"),
        }
    }

    /// A refusal in the provider's words when this chance of `fault` is taken.
    fn refused(&self, fault: Fault) -> Option<Response> {
        if !self.faults.strike(fault) {
            return None;
        }
        let status = self.faults.refusal();
        let (kind, retry_after) = match status {
            429 => ("rate_limit_exceeded", Some("1")),
            _ => ("server_error", None),
        };
        let body = json!({"error": {"message": "The stand-in refused this request on purpose.",
            "type": kind, "code": status}});
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let mut response = (status, Json(body)).into_response();
        if let Some(after) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static(after));
        }
        Some(response)
    }
}

async fn stats(State(stand_ins): State<StandIns>) -> Json<Stats> {
    Json(stand_ins.stats())
}

/// Waits until `at`, to within a few microseconds: tokio's timer wakes on whole milliseconds, up
/// to one late, which would add a millisecond to each delay the bot is measured against. It
/// sleeps to the millisecond before, then yields until the time.
async fn until(at: Instant) {
    if let Some(before) = at.checked_sub(Duration::from_millis(1)) {
        tokio::time::sleep_until(before).await;
    }
    while Instant::now() < at {
        tokio::task::yield_now().await;
    }
}

fn turn(session: &str, question: usize) -> String {
    format!("session {session} question {question}")
}
