//! A caller's connection to the bot: a WebSocket (voxide's `/ws`, Twilio Media Streams), a
//! WebRTC peer connection, or a SIP call. It sends the caller's 20 ms frames, and a reader feeds what comes
//! back (the bot's audio, the server's events) into the session's [`Heard`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::impair::Fate;
use super::plan::{Heard, Plan};
use super::sip::{Hooks, SipCall};
use super::webrtc::Call;
use super::{Protocol, Recorder};
use crate::audio::mulaw;
use crate::transports::sip::sdp::Codec;

type Sink = SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Message>;

/// One caller's connection.
pub(super) enum Link {
    /// voxide's `/ws` or Twilio Media Streams.
    Socket {
        sink: Sink,
        reader: tokio::task::JoinHandle<()>,
        /// Twilio's stream id; none for `/ws`.
        twilio: Option<String>,
        /// Frames the impaired network holds, each until it is due (in order: a socket is a
        /// stream, a late frame holds up those behind it).
        held: VecDeque<(Instant, Message)>,
    },
    /// SmallWebRTC.
    WebRtc(Box<Call>),
    /// A SIP call.
    Sip(Box<SipCall>),
}

impl Link {
    /// Connects the way a client of `plan`'s protocol does; the error is its kind.
    pub(super) async fn connect(
        plan: &Plan,
        index: usize,
        heard: Arc<Mutex<Heard>>,
        recorder: Recorder,
    ) -> Result<Self, String> {
        match plan.protocol {
            Protocol::Ws | Protocol::Twilio => socket(plan, index, heard, recorder).await,
            Protocol::WebRtc | Protocol::WebRtcStart => {
                let call = Call::connect(plan, index, heard, recorder).await?;
                Ok(Link::WebRtc(Box::new(call)))
            }
            Protocol::Sip | Protocol::SipWideband | Protocol::SipOpus => {
                let traceparent = heard
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .traceparent
                    .clone();
                let origin = plan.origin;
                let (listening, hanging) = (heard.clone(), recorder.clone());
                let hooks = Hooks {
                    audio: Box::new(move |samples| {
                        let now = Instant::now().duration_since(origin).as_secs_f64();
                        let mut heard = listening.lock().unwrap_or_else(|p| p.into_inner());
                        let changes = heard.voice.feed(samples, now);
                        heard.note(changes, index, &recorder);
                    }),
                    hung_up: Box::new(move || {
                        let now = Instant::now().duration_since(origin).as_secs_f64();
                        hanging.event(now, index, "server", json!({"type": "bye"}));
                        heard.lock().unwrap_or_else(|p| p.into_inner()).closed =
                            Some("hung_up".into());
                    }),
                };
                let codec = plan.protocol.sip_codec().unwrap_or(Codec::Pcmu);
                let call = SipCall::connect(&plan.url, index, (codec, traceparent), hooks).await?;
                Ok(Link::Sip(Box::new(call)))
            }
        }
    }

    /// Sends frame number `n` through the network, as `fate` has it; an error means the
    /// connection is gone. On a socket a frame's delay counts from this call and is kept in
    /// steps of the caller's 20 ms clock; copies are not made (a stream does not duplicate).
    pub(super) async fn send(&mut self, frame: &[u8], n: usize, fate: Fate) -> Result<(), ()> {
        match self {
            Link::Socket {
                sink, twilio, held, ..
            } => {
                let message = match twilio {
                    None => Message::binary(frame.to_vec()),
                    Some(sid) => {
                        let media = json!({"event": "media", "sequenceNumber": (n + 2).to_string(),
                            "streamSid": sid, "media": {"track": "inbound", "chunk": (n + 1).to_string(),
                            "timestamp": (n * 20).to_string(), "payload": STANDARD.encode(frame)}});
                        Message::text(media.to_string())
                    }
                };
                let now = Instant::now();
                if let Fate::Sent { delay, .. } = fate {
                    let due = held
                        .back()
                        .map_or(now + delay, |(last, _)| (now + delay).max(*last));
                    held.push_back((due, message));
                }
                while let Some((due, _)) = held.front()
                    && *due <= now
                {
                    let (_, message) = held.pop_front().expect("a held frame");
                    sink.send(message).await.map_err(|_| ())?;
                }
                Ok(())
            }
            Link::WebRtc(call) => call.send(frame, n, fate).await,
            Link::Sip(call) => call.send(frame, n, fate).await,
        }
    }

    /// Says goodbye and hangs up.
    pub(super) async fn close(self) {
        match self {
            Link::Socket {
                mut sink,
                reader,
                twilio,
                held,
            } => {
                for (_, message) in held {
                    let _ = sink.send(message).await;
                }
                let bye = match &twilio {
                    None => json!({"type": "stop"}),
                    Some(sid) => json!({"event": "stop", "streamSid": sid, "stop": {}}),
                };
                let _ = sink.send(Message::text(bye.to_string())).await;
                let _ = sink.close().await;
                reader.abort();
            }
            Link::WebRtc(call) => call.close().await,
            Link::Sip(call) => call.close().await,
        }
    }
}

async fn socket(
    plan: &Plan,
    index: usize,
    heard: Arc<Mutex<Heard>>,
    recorder: Recorder,
) -> Result<Link, String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = plan
        .url
        .as_str()
        .into_client_request()
        .map_err(|_| "bad_target".to_owned())?;
    if let Some(token) = &plan.auth_token {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| "bad_auth_token".to_owned())?;
        request.headers_mut().insert("authorization", value);
    }
    let traceparent = heard
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .traceparent
        .parse();
    if let Ok(value) = traceparent {
        request.headers_mut().insert("traceparent", value);
    }
    // Without Nagle, as a caller's audio goes: each 20 ms frame leaves when it is sent.
    let (socket, response) = tokio_tungstenite::connect_async_with_config(request, None, true)
        .await
        .map_err(|e| match &e {
            tokio_tungstenite::tungstenite::Error::Http(r) => {
                format!("connect_http_{}", r.status().as_u16())
            }
            _ => "connect_refused".to_owned(),
        })?;
    heard.lock().unwrap_or_else(|p| p.into_inner()).node = response
        .headers()
        .get("x-voxide-node")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (mut sink, stream) = socket.split();
    // A server takes each call once: every run's calls are new ones, as a carrier's are.
    let call_sid = || {
        use crate::ids::random_u32;
        format!(
            "CA{:08x}{:08x}{:08x}{:08x}",
            random_u32(),
            random_u32(),
            random_u32(),
            random_u32()
        )
    };
    let twilio = (plan.protocol == Protocol::Twilio).then(|| format!("MZloadtest{index}"));
    if let Some(sid) = &twilio {
        let hello = [
            json!({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
            json!({"event": "start", "sequenceNumber": "1", "streamSid": sid,
                "start": {"streamSid": sid, "accountSid": "ACloadtest", "callSid": call_sid(),
                          "tracks": ["inbound"], "customParameters": {},
                          "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}),
        ];
        for message in hello {
            sink.send(Message::text(message.to_string()))
                .await
                .map_err(|_| "dropped".to_owned())?;
        }
    }
    let listener = SocketListener {
        origin: plan.origin,
        twilio: twilio.is_some(),
        index,
        recorder,
        heard,
    };
    let reader = tokio::spawn(listener.read(stream));
    Ok(Link::Socket {
        sink,
        reader,
        twilio,
        held: VecDeque::new(),
    })
}

/// Where a socket caller's server messages go.
struct SocketListener {
    origin: Instant,
    twilio: bool,
    index: usize,
    recorder: Recorder,
    heard: Arc<Mutex<Heard>>,
}

impl SocketListener {
    /// Reads the server until it goes: its audio into the voice detector, its events recorded.
    async fn read<S>(self, mut stream: S)
    where
        S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
            + Unpin,
    {
        loop {
            let message = stream.next().await;
            let now = Instant::now().duration_since(self.origin).as_secs_f64();
            let samples = match message {
                Some(Ok(Message::Binary(bytes))) => Some(
                    bytes
                        .chunks_exact(2)
                        .map(|b| i16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                ),
                Some(Ok(Message::Text(text))) => self.text(&text, now),
                Some(Ok(_)) => None,
                Some(Err(_)) | None => {
                    self.heard().closed = Some("dropped".into());
                    return;
                }
            };
            let Some(samples) = samples else { continue };
            let mut heard = self.heard();
            let changes = heard.voice.feed(&samples, now);
            heard.note(changes, self.index, &self.recorder);
        }
    }

    /// A text message: Twilio's audio, or an event to record.
    fn text(&self, text: &str, now: f64) -> Option<Vec<i16>> {
        let value: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        if self.twilio && value["event"] == "media" {
            return value["media"]["payload"]
                .as_str()
                .and_then(|p| STANDARD.decode(p).ok())
                .map(|b| b.into_iter().map(mulaw::decode).collect());
        }
        let kind = value["type"]
            .as_str()
            .or(value["event"].as_str())
            .unwrap_or("unknown");
        self.recorder
            .event(now, self.index, "server", json!({"type": kind}));
        let mut heard = self.heard();
        heard.event(now, kind);
        heard.message(kind, &value);
        None
    }

    fn heard(&self) -> std::sync::MutexGuard<'_, Heard> {
        self.heard.lock().unwrap_or_else(|p| p.into_inner())
    }
}
