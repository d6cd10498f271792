//! A local stand-in for a streamed HTTP LLM API (OpenAI-compatible, Anthropic, Gemini): it
//! answers every POST with the next scripted reply, byte for byte as the provider sends it, and
//! records what it was asked and over which connection. It is as strict as the real APIs: a
//! request that breaks their rules (`voxide::bench::providers::stand_ins::strict`) is answered
//! 400 in the provider's own error shape, and recorded in `refused`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::Value;
use voxide::bench::providers::stand_ins::strict;

/// What the stand-in answers.
#[derive(Clone)]
pub enum Reply {
    /// An event stream, cut into pieces of this many bytes.
    Stream(String, usize),
    /// A status and body, with `retry-after: 0`.
    Status(u16, &'static str),
    /// `429 Too Many Requests`, asking the client to wait this many seconds.
    Busy(u32),
    /// This much of a stream, then nothing, forever.
    Stall(String),
    /// A reply chosen from the request.
    With(Arc<dyn Fn(&Value) -> Reply + Send + Sync>),
}

/// One request as it came.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    /// The JSON body (null for a `HEAD`).
    pub body: Value,
    /// The client's end of the connection: the same for requests on one connection.
    pub peer: SocketAddr,
}

#[derive(Clone, Default)]
pub struct StandIn {
    replies: Arc<Mutex<Vec<Reply>>>,
    posts: Arc<Mutex<usize>>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Why each refused request was refused.
    pub refused: Arc<Mutex<Vec<String>>>,
    /// The thinking blocks sent so far, by the call they led to.
    thinking: Arc<Mutex<strict::Thinking>>,
}

impl StandIn {
    /// The POST requests, in order.
    pub fn posts(&self) -> Vec<Seen> {
        let seen = self.seen.lock().expect("lock");
        seen.iter()
            .filter(|s| s.method == Method::POST)
            .cloned()
            .collect()
    }

    /// Why requests were refused, in order.
    pub fn refusals(&self) -> Vec<String> {
        self.refused.lock().expect("lock").clone()
    }

    /// Every request, in order.
    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

/// Listens on a free loopback port; the replies answer the POSTs in order (the last repeats).
pub async fn start(replies: Vec<Reply>) -> (SocketAddr, StandIn) {
    let stand_in = StandIn {
        replies: Arc::new(Mutex::new(replies)),
        ..StandIn::default()
    };
    let app = axum::Router::new()
        .fallback(answer)
        .with_state(stand_in.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    (addr, stand_in)
}

async fn answer(
    State(stand_in): State<StandIn>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let uri_path = uri.path().to_owned();
    stand_in.seen.lock().expect("lock").push(Seen {
        method: method.clone(),
        uri,
        headers,
        body: json.clone(),
        peer,
    });
    if method != Method::POST {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    if let Some(api) = strict::Api::of_path(uri_path.as_str()) {
        let thinking = stand_in.thinking.lock().expect("lock").clone();
        if let Err(why) = strict::check(api, &json, &thinking) {
            stand_in.refused.lock().expect("lock").push(why.clone());
            return api.refusal(&why);
        }
    }
    let reply = {
        let mut posts = stand_in.posts.lock().expect("lock");
        *posts += 1;
        let replies = stand_in.replies.lock().expect("lock");
        replies[(*posts - 1).min(replies.len() - 1)].clone()
    };
    respond(reply, &json, &stand_in)
}

fn respond(reply: Reply, request: &Value, stand_in: &StandIn) -> Response {
    let sse = [("content-type", "text/event-stream")];
    match reply {
        Reply::Stream(text, piece) => {
            stand_in
                .thinking
                .lock()
                .expect("lock")
                .extend(strict::thinking_in(&text));
            let pieces: Vec<Result<Bytes, Infallible>> = text
                .into_bytes()
                .chunks(piece)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            (sse, Body::from_stream(futures_util::stream::iter(pieces))).into_response()
        }
        Reply::Status(status, body) => (
            StatusCode::from_u16(status).expect("status"),
            [("retry-after", "0")],
            body,
        )
            .into_response(),
        Reply::Busy(seconds) => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", seconds.to_string())],
            r#"{"error":{"message":"rate limited"}}"#,
        )
            .into_response(),
        Reply::Stall(text) => {
            let first = futures_util::stream::iter([Ok::<_, Infallible>(Bytes::from(text))]);
            (
                sse,
                Body::from_stream(first.chain(futures_util::stream::pending())),
            )
                .into_response()
        }
        Reply::With(choose) => respond(choose(request), request, stand_in),
    }
}

/// Server-sent events with CRLF line ends and a keepalive comment first: `(event name, data)`.
pub fn events(events: &[(Option<&str>, Value)]) -> String {
    let mut out = String::from(": ping\r\n\r\n");
    for (name, data) in events {
        if let Some(name) = name {
            out.push_str(&format!("event: {name}\r\n"));
        }
        out.push_str(&format!("data: {data}\r\n\r\n"));
    }
    out
}
