//! WebSocket framing: how audio and messages travel over one socket, in two dialects.
//!
//! **voxide PCM** (`/ws`): binary messages are 16-bit little-endian mono PCM, at the rate the
//! client named (`?sample_rate=`, default 16000) going in and at the pipeline's output rate
//! (`?out_sample_rate=`, default 24000) coming out. Text messages are JSON: the client may send
//! `{"type":"text","text":"..."}` (the user typed something) and `{"type":"stop"}`; the server
//! sends every session event as one object (the same objects `voxide run --events` writes, with
//! `type` and `t_ms`) and `{"type":"error","message":"..."}` for a message it could not use.
//!
//! **RTVI** (`/ws`, when the client's first message is an RTVI message, as pipecat's clients and
//! its eval harness send): JSON text messages only, read and written by [`super::rtvi`]. The
//! user's audio comes as `raw-audio`; the bot's goes out as `eval-bot-audio` when the client
//! asks for it (`?capture_bot_audio=true`, or `eval-connect`), else not at all.
//!
//! **Telephone carriers' media streams** (`/ws/twilio`, `/ws/telnyx`, `/ws/plivo`,
//! `/ws/exotel`, `/ws/vonage`): each in the carrier's framing, read and written by
//! [`super::carriers`]. Keys pressed reach the session one at a time, gathered into an entry by
//! [`super::dtmf`]; an interruption tells the carrier to drop the bot's audio it holds.

use serde_json::{Value, json};

pub use super::carriers::Call;
use super::carriers::{Carrier, Heard, PhoneStream};
use super::rtvi::{self, ClientMessage, EvalFlags, EvalMessage, Rtvi};
pub use super::socket::{FramingError, WsMessage};
use crate::audio::pcm_to_base64;
use crate::events::{Event, SessionEvent};

/// What a client message means for the session.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// User audio: mono samples at a rate.
    Audio {
        /// The samples.
        samples: Vec<i16>,
        /// Their rate.
        sample_rate: u32,
    },
    /// The user typed this.
    Text(String),
    /// A telephone call's stream began (a carrier's `start`).
    Call(Call),
    /// An RTVI message.
    Rtvi(ClientMessage),
    /// A key pressed on the caller's keypad (a carrier's `dtmf`).
    Dtmf(char),
    /// The client is done.
    Stop,
    /// Nothing to do (a keep-alive, a mark, the stream's metadata).
    Nothing,
}

/// What the server sends.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// Bot audio, mono, at a rate.
    Audio(Vec<i16>, u32),
    /// A session event.
    Event(SessionEvent),
    /// Drop audio already sent but not yet played (an interruption).
    Clear,
    /// A client message could not be used.
    Error(String),
    /// A message already in the client's dialect (an RTVI reply).
    Text(String),
}

/// One dialect's encoder and decoder, with its per-connection state.
pub enum Framing {
    /// voxide's PCM + JSON framing.
    Pcm {
        /// The client's input rate.
        input_rate: u32,
        /// Until the client's first message: what an RTVI client asked for in the URL, should
        /// that message be RTVI.
        rtvi: Option<EvalFlags>,
        /// The session's id and whether it is recorded, for an RTVI client's `bot-ready`.
        session: Option<(String, bool)>,
    },
    /// RTVI JSON messages.
    Rtvi(Box<RtviState>),
    /// A telephone carrier's media stream.
    Phone(Box<PhoneStream>),
}

/// What an RTVI connection remembers.
pub struct RtviState {
    rtvi: Rtvi,
    /// The bot's audio goes to the client (`eval-bot-audio`).
    capture_audio: bool,
    /// Messages read so far: only the first may make the session a text one.
    read: u64,
}

impl Framing {
    /// voxide's framing with input audio at `input_rate`; RTVI, with `flags`, if the client's
    /// first message is RTVI.
    pub fn pcm(input_rate: u32, flags: EvalFlags) -> Self {
        Self::Pcm {
            input_rate,
            rtvi: Some(flags),
            session: None,
        }
    }

    /// The session this connection is: an RTVI client's `bot-ready` names it and says whether
    /// it is recorded.
    pub fn set_session(&mut self, id: &str, recorded: bool) {
        match self {
            Self::Pcm { session, .. } => *session = Some((id.to_owned(), recorded)),
            Self::Rtvi(state) => state.rtvi.set_session(id, recorded),
            Self::Phone(_) => {}
        }
    }

    /// RTVI framing: the bot's audio goes out when `flags` capture it.
    pub fn rtvi(flags: EvalFlags) -> Self {
        let mut rtvi = Rtvi::new();
        rtvi.set_text_only(flags.skip_tts);
        Self::Rtvi(Box::new(RtviState {
            rtvi,
            capture_audio: flags.capture_bot_audio,
            read: 0,
        }))
    }

    /// A telephone carrier's framing.
    pub fn phone(carrier: Carrier) -> Self {
        Self::Phone(Box::new(PhoneStream::new(carrier)))
    }

    /// Reads one client message.
    pub fn decode(&mut self, message: WsMessage) -> Result<Inbound, FramingError> {
        if let (Self::Pcm { rtvi, session, .. }, message) = (&mut *self, &message)
            && let Some(flags) = rtvi.take()
            && let WsMessage::Text(text) = message
            && rtvi::is_rtvi(text)
        {
            let session = session.take();
            *self = Self::rtvi(flags);
            if let Some((id, recorded)) = session {
                self.set_session(&id, recorded);
            }
        }
        match (self, message) {
            (Self::Pcm { input_rate, .. }, WsMessage::Binary(bytes)) => {
                if bytes.len() % 2 != 0 {
                    return Err(FramingError::OddAudio(bytes.len()));
                }
                Ok(Inbound::Audio {
                    samples: bytes
                        .chunks_exact(2)
                        .map(|b| i16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                    sample_rate: *input_rate,
                })
            }
            (Self::Pcm { .. }, WsMessage::Text(text)) => {
                let value = parse(&text)?;
                match value.get("type").and_then(Value::as_str) {
                    Some("text") => value
                        .get("text")
                        .and_then(Value::as_str)
                        .filter(|t| !t.trim().is_empty())
                        .map(|t| Inbound::Text(t.to_owned()))
                        .ok_or_else(|| {
                            FramingError::Malformed("text needs a \"text\" string".into())
                        }),
                    Some("stop") => Ok(Inbound::Stop),
                    Some("ping") => Ok(Inbound::Nothing),
                    Some(other) => Err(FramingError::Unknown(other.to_owned())),
                    None => Err(FramingError::Malformed("no \"type\"".into())),
                }
            }
            (Self::Rtvi(state), WsMessage::Text(text)) => {
                let message = state.rtvi.parse(&text);
                if let ClientMessage::Eval(EvalMessage::Connect(flags)) = &message {
                    state.capture_audio = flags.capture_bot_audio;
                    // As the session: a text one only when its first message says so.
                    if flags.skip_tts && state.read == 0 {
                        state.rtvi.set_text_only(true);
                    }
                }
                state.read += 1;
                Ok(Inbound::Rtvi(message))
            }
            (Self::Rtvi(_), WsMessage::Binary(_)) => Err(FramingError::Format(
                "RTVI clients send JSON text messages only (audio as raw-audio)".into(),
            )),
            (Self::Phone(stream), message) => Ok(match stream.decode(message)? {
                Heard::Audio {
                    samples,
                    sample_rate,
                } => Inbound::Audio {
                    samples,
                    sample_rate,
                },
                Heard::Call(call) => Inbound::Call(call),
                Heard::Dtmf(key) => Inbound::Dtmf(key),
                Heard::Stop => Inbound::Stop,
                Heard::Nothing => Inbound::Nothing,
            }),
        }
    }

    /// Writes one server message: none, one or several in this dialect.
    pub fn encode(&mut self, message: Outbound) -> Vec<WsMessage> {
        let one = match (self, message) {
            (_, Outbound::Text(text)) => Some(WsMessage::Text(text)),
            (Self::Pcm { .. }, Outbound::Audio(samples, _)) => Some(WsMessage::Binary(
                samples.iter().flat_map(|s| s.to_le_bytes()).collect(),
            )),
            (Self::Pcm { session, .. }, Outbound::Event(event)) => {
                let mut value = serde_json::to_value(&event).ok();
                // `session_started` names the session and says whether it is recorded.
                if let (Some(value), Event::SessionStarted, Some((id, recorded))) =
                    (&mut value, &event.event, session.as_ref())
                {
                    value["session_id"] = json!(id);
                    value["recorded"] = json!(recorded);
                }
                value.map(|value| WsMessage::Text(value.to_string()))
            }
            (Self::Pcm { .. } | Self::Rtvi(_), Outbound::Clear) => None,
            (Self::Pcm { .. } | Self::Phone(_), Outbound::Error(message)) => Some(WsMessage::Text(
                json!({"type": "error", "message": message}).to_string(),
            )),
            (Self::Rtvi(state), Outbound::Event(event)) => {
                return state
                    .rtvi
                    .render(&event.event)
                    .into_iter()
                    .map(WsMessage::Text)
                    .collect();
            }
            (Self::Rtvi(state), Outbound::Audio(samples, rate)) => state.capture_audio.then(|| {
                WsMessage::Text(
                    json!({"label": rtvi::LABEL, "type": "eval-bot-audio",
                        "data": {"audio": pcm_to_base64(&samples), "sampleRate": rate}})
                    .to_string(),
                )
            }),
            (Self::Rtvi(_), Outbound::Error(message)) => {
                Some(WsMessage::Text(rtvi::error(&message)))
            }
            (Self::Phone(stream), Outbound::Audio(samples, rate)) => {
                return stream.play(&samples, rate);
            }
            (Self::Phone(stream), Outbound::Clear) => stream.clear(),
            // Audio held for a whole chunk goes out once the bot stops speaking.
            (Self::Phone(stream), Outbound::Event(event)) => {
                return match event.event {
                    Event::BotStoppedSpeaking => stream.flush(),
                    _ => Vec::new(),
                };
            }
        };
        one.into_iter().collect()
    }
}

fn parse(text: &str) -> Result<Value, FramingError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| FramingError::Malformed(e.to_string()))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(FramingError::Malformed("expected a JSON object".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;

    #[test]
    fn pcm_audio_round_trips_as_little_endian_bytes() {
        let mut framing = Framing::pcm(16_000, EvalFlags::default());
        let samples = vec![0i16, 1, -1, i16::MAX, i16::MIN, 1234];
        let [WsMessage::Binary(bytes)] =
            &framing.encode(Outbound::Audio(samples.clone(), 16_000))[..]
        else {
            panic!("binary audio");
        };
        assert_eq!(&bytes[..4], &[0, 0, 1, 0]);
        assert_eq!(
            framing.decode(WsMessage::Binary(bytes.clone())),
            Ok(Inbound::Audio {
                samples,
                sample_rate: 16_000
            })
        );
        assert_eq!(
            framing.decode(WsMessage::Binary(vec![1, 2, 3])),
            Err(FramingError::OddAudio(3))
        );
    }

    #[test]
    fn session_started_names_the_session_for_a_pcm_client_and_bot_ready_for_an_rtvi_one() {
        let started = || {
            Outbound::Event(SessionEvent {
                elapsed: std::time::Duration::ZERO,
                event: Event::SessionStarted,
            })
        };
        let mut framing = Framing::pcm(16_000, EvalFlags::default());
        framing.set_session("ws-1", true);
        let [WsMessage::Text(out)] = &framing.encode(started())[..] else {
            panic!("one event");
        };
        let out: Value = serde_json::from_str(out).expect("json");
        assert_eq!(out["type"], "session_started");
        assert_eq!(out["session_id"], "ws-1");
        assert_eq!(out["recorded"], true);

        // The same connection turned RTVI by its first message keeps what it was told.
        let mut framing = Framing::pcm(16_000, EvalFlags::default());
        framing.set_session("ws-2", false);
        let ready =
            r#"{"label":"rtvi-ai","type":"client-ready","id":"r","data":{"version":"1.0.0"}}"#;
        let Ok(Inbound::Rtvi(ClientMessage::Ready(replies))) =
            framing.decode(WsMessage::Text(ready.into()))
        else {
            panic!("an RTVI client-ready");
        };
        let reply: Value = serde_json::from_str(&replies[0]).expect("json");
        assert_eq!(reply["data"]["about"]["session_id"], "ws-2");
        assert_eq!(reply["data"]["about"]["recorded"], false);
    }

    #[test]
    fn pcm_text_messages_are_checked() {
        let mut framing = Framing::pcm(16_000, EvalFlags::default());
        let text = |s: &str| WsMessage::Text(s.to_owned());
        assert_eq!(
            framing.decode(text(r#"{"type":"text","text":"hi"}"#)),
            Ok(Inbound::Text("hi".into()))
        );
        assert_eq!(
            framing.decode(text(r#"{"type":"stop"}"#)),
            Ok(Inbound::Stop)
        );
        assert!(matches!(
            framing.decode(text("{nope")),
            Err(FramingError::Malformed(_))
        ));
        assert!(matches!(
            framing.decode(text("[1]")),
            Err(FramingError::Malformed(_))
        ));
        assert_eq!(
            framing.decode(text(r#"{"type":"dance"}"#)),
            Err(FramingError::Unknown("dance".into()))
        );
        assert!(matches!(
            framing.decode(text(r#"{"type":"text","text":"  "}"#)),
            Err(FramingError::Malformed(_))
        ));
    }

    #[test]
    fn twilio_media_streams_round_trip() {
        let mut framing = Framing::phone(Carrier::Twilio);
        let text = |v: Value| WsMessage::Text(v.to_string());
        assert_eq!(
            framing.decode(text(
                json!({"event": "connected", "protocol": "Call", "version": "1.0.0"})
            )),
            Ok(Inbound::Nothing)
        );
        // No stream yet: nothing can be addressed.
        assert!(framing.encode(Outbound::Clear).is_empty());
        let start = json!({
            "event": "start", "sequenceNumber": "1", "streamSid": "MZ123",
            "start": {"streamSid": "MZ123", "accountSid": "AC1", "callSid": "CA1",
                      "tracks": ["inbound"], "customParameters": {},
                      "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}
        });
        assert_eq!(
            framing.decode(text(start)),
            Ok(Inbound::Call(Call {
                carrier: Carrier::Twilio,
                call_sid: "CA1".into(),
                account_sid: Some("AC1".into())
            }))
        );
        let payload = STANDARD.encode([0xffu8, 0x7f, 0x80, 0x00]);
        let media = json!({"event": "media", "sequenceNumber": "2", "streamSid": "MZ123",
            "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": payload}});
        assert_eq!(
            framing.decode(text(media)),
            Ok(Inbound::Audio {
                samples: vec![0, 0, 32_124, -32_124],
                sample_rate: 8_000
            })
        );
        let [WsMessage::Text(out)] = &framing.encode(Outbound::Audio(vec![0; 160], 8_000))[..]
        else {
            panic!("media out");
        };
        let out: Value = serde_json::from_str(out).expect("json");
        assert_eq!(out["event"], "media");
        assert_eq!(out["streamSid"], "MZ123");
        let bytes = STANDARD
            .decode(out["media"]["payload"].as_str().expect("payload"))
            .expect("base64");
        assert_eq!(bytes, vec![0xff; 160]);
        assert_eq!(
            framing.encode(Outbound::Clear),
            [WsMessage::Text(
                r#"{"event":"clear","streamSid":"MZ123"}"#.into()
            )]
        );
        assert_eq!(
            framing.decode(text(json!({"event": "dtmf", "streamSid": "MZ123",
                "dtmf": {"track": "inbound_track", "digit": "#"}}))),
            Ok(Inbound::Dtmf('#'))
        );
        assert!(matches!(
            framing.decode(text(json!({"event": "dtmf", "dtmf": {"digit": "12"}}))),
            Err(FramingError::Malformed(_))
        ));
        assert_eq!(
            framing.decode(text(
                json!({"event": "stop", "streamSid": "MZ123", "stop": {}})
            )),
            Ok(Inbound::Stop)
        );
    }

    #[test]
    fn twilio_rejects_what_it_cannot_play() {
        let mut framing = Framing::phone(Carrier::Twilio);
        let start = json!({"event": "start", "start": {"mediaFormat":
            {"encoding": "audio/l16", "sampleRate": 16000, "channels": 1}}});
        assert!(matches!(
            framing.decode(WsMessage::Text(start.to_string())),
            Err(FramingError::Format(_))
        ));
        let unnamed =
            json!({"event": "start", "start": {"accountSid": "AC1", "callSid": "CA/../x"}});
        assert!(matches!(
            framing.decode(WsMessage::Text(unnamed.to_string())),
            Err(FramingError::Malformed(_))
        ));
        let bad = json!({"event": "media", "media": {"payload": "***"}});
        assert!(matches!(
            framing.decode(WsMessage::Text(bad.to_string())),
            Err(FramingError::Malformed(_))
        ));
        assert!(matches!(
            framing.decode(WsMessage::Binary(vec![0, 0])),
            Err(FramingError::Format(_))
        ));
    }

    #[test]
    fn a_client_whose_first_message_is_rtvi_speaks_rtvi_from_then_on() {
        let flags = EvalFlags {
            skip_tts: true,
            capture_bot_audio: false,
        };
        let mut framing = Framing::pcm(16_000, flags);
        let ready = json!({"label": "rtvi-ai", "type": "client-ready", "id": "r",
            "data": {"version": "2.2.0"}});
        let Ok(Inbound::Rtvi(ClientMessage::Ready(replies))) =
            framing.decode(WsMessage::Text(ready.to_string()))
        else {
            panic!("an RTVI handshake");
        };
        assert!(replies[0].contains("bot-ready"));
        assert!(matches!(
            framing.decode(WsMessage::Binary(vec![0, 0])),
            Err(FramingError::Format(_))
        ));
        // Its events are RTVI; the bot's audio is not sent unless asked for.
        let event = SessionEvent {
            elapsed: std::time::Duration::ZERO,
            event: crate::events::Event::LlmText { text: "Hi".into() },
        };
        let [WsMessage::Text(out)] = &framing.encode(Outbound::Event(event))[..] else {
            panic!("one message");
        };
        assert!(out.contains("bot-llm-text"), "{out}");
        assert!(
            framing
                .encode(Outbound::Audio(vec![1; 160], 24_000))
                .is_empty()
        );
        // eval-connect asks for it.
        let connect = json!({"label": "rtvi-ai", "type": "client-message", "id": "c",
            "data": {"t": "eval-connect", "d": {"capture_bot_audio": true}}});
        assert!(matches!(
            framing.decode(WsMessage::Text(connect.to_string())),
            Ok(Inbound::Rtvi(ClientMessage::Eval(EvalMessage::Connect(_))))
        ));
        let [WsMessage::Text(audio)] = &framing.encode(Outbound::Audio(vec![1; 160], 24_000))[..]
        else {
            panic!("the bot's audio");
        };
        let audio: Value = serde_json::from_str(audio).expect("json");
        assert_eq!(audio["type"], "eval-bot-audio");
        assert_eq!(audio["data"]["sampleRate"], 24_000);
    }

    #[test]
    fn a_client_whose_first_message_is_audio_keeps_voxides_framing() {
        let mut framing = Framing::pcm(16_000, EvalFlags::default());
        assert!(matches!(
            framing.decode(WsMessage::Binary(vec![0, 0])),
            Ok(Inbound::Audio { .. })
        ));
        let ready = json!({"label": "rtvi-ai", "type": "client-ready", "data": {}});
        assert_eq!(
            framing.decode(WsMessage::Text(ready.to_string())),
            Err(FramingError::Unknown("client-ready".into()))
        );
    }
}
