//! Telephone carriers' media streams: a call's audio over a WebSocket the carrier opens to
//! `/ws/{carrier}`, in the carrier's own framing. Sans-IO: [`PhoneStream`] reads one message
//! and writes the bot's audio; the server's socket loop drives it.
//!
//! | carrier | the caller's audio | the bot's audio | the call | keys | interrupted |
//! |---|---|---|---|---|---|
//! | `twilio` | base64 μ-law 8 kHz, `media` | the same, with `streamSid` | `start`: `callSid`, `accountSid` | `dtmf.digit` | `clear` |
//! | `telnyx` | base64 PCMU, PCMA (8 kHz) or big-endian L16 (8 or 16 kHz), as `start.media_format` says | the same coding, `media` | `start.call_control_id` | `dtmf.digit` | `clear` |
//! | `plivo` | base64 μ-law 8 kHz or L16 (8 or 16 kHz) | `playAudio` with its content type and rate | `start.callId` | `dtmf.digit` | `clearAudio` |
//! | `exotel` | base64 16-bit PCM at 8, 16 or 24 kHz | `media` in chunks of 100 ms or more, each a multiple of 320 bytes | `start.call_sid` | `dtmf.digit` | `clear` |
//! | `vonage` | binary 16-bit PCM at 16 kHz (8 kHz if `websocket:connected` says so) | binary, 20 ms a message | — | `websocket:dtmf` | `{"action":"clear"}` |
//!
//! A track the carrier marks outbound (the bot's own audio, streamed back) is not the caller and
//! is skipped. Audio in a coding the stream cannot play is refused at `start`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::socket::{FramingError, WsMessage};
use crate::audio::resample::StreamResampler;
use crate::audio::{alaw, mulaw};

/// A carrier whose media streams voxide takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// Twilio Media Streams.
    Twilio,
    /// Telnyx media streaming (Call Control or TeXML), bidirectional in RTP mode.
    Telnyx,
    /// Plivo audio streams (`<Stream bidirectional="true">`).
    Plivo,
    /// Exotel's Voicebot applet.
    Exotel,
    /// Vonage's Voice API `connect` to a WebSocket.
    Vonage,
}

impl Carrier {
    /// Every carrier, in the order the docs list them.
    pub const ALL: [Carrier; 5] = [
        Carrier::Twilio,
        Carrier::Telnyx,
        Carrier::Plivo,
        Carrier::Exotel,
        Carrier::Vonage,
    ];

    /// The carrier `/ws/{name}` names.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Its name in the path.
    pub fn name(self) -> &'static str {
        match self {
            Carrier::Twilio => "twilio",
            Carrier::Telnyx => "telnyx",
            Carrier::Plivo => "plivo",
            Carrier::Exotel => "exotel",
            Carrier::Vonage => "vonage",
        }
    }

    /// Whether `path` is a carrier's stream (`/ws/twilio`, …).
    pub fn is_stream_path(path: &str) -> bool {
        path.strip_prefix("/ws/")
            .is_some_and(|name| Self::from_name(name).is_some())
    }
}

/// What a carrier's message means for the session.
#[derive(Debug, Clone, PartialEq)]
pub enum Heard {
    /// The caller's audio: mono samples at the call's rate.
    Audio {
        /// The samples.
        samples: Vec<i16>,
        /// Their rate.
        sample_rate: u32,
    },
    /// The stream began: the call it carries.
    Call(Call),
    /// A key pressed on the caller's keypad.
    Dtmf(char),
    /// The stream ended.
    Stop,
    /// Nothing to do (a keep-alive, a mark, the carrier's acknowledgement).
    Nothing,
}

/// The call a carrier's stream carries, as its first message names it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// Whose call it is.
    pub carrier: Carrier,
    /// The call's id (Twilio's `CA…`, Telnyx's call control id, …).
    pub call_sid: String,
    /// The account the call belongs to, where the carrier says (Twilio's `AC…`).
    pub account_sid: Option<String>,
}

/// How audio is coded on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    Mulaw,
    Alaw,
    /// 16-bit PCM, little-endian.
    L16,
    /// 16-bit PCM in network byte order (RFC 3551's L16).
    L16BigEndian,
}

impl Coding {
    fn decode(self, bytes: &[u8]) -> Result<Vec<i16>, FramingError> {
        match self {
            Coding::Mulaw => Ok(bytes.iter().map(|b| mulaw::decode(*b)).collect()),
            Coding::Alaw => Ok(bytes.iter().map(|b| alaw::decode(*b)).collect()),
            Coding::L16 | Coding::L16BigEndian if !bytes.len().is_multiple_of(2) => {
                Err(FramingError::OddAudio(bytes.len()))
            }
            Coding::L16 => Ok(bytes
                .chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]]))
                .collect()),
            Coding::L16BigEndian => Ok(bytes
                .chunks_exact(2)
                .map(|b| i16::from_be_bytes([b[0], b[1]]))
                .collect()),
        }
    }

    fn encode(self, samples: &[i16]) -> Vec<u8> {
        match self {
            Coding::Mulaw => samples.iter().map(|s| mulaw::encode(*s)).collect(),
            Coding::Alaw => samples.iter().map(|s| alaw::encode(*s)).collect(),
            Coding::L16 => samples.iter().flat_map(|s| s.to_le_bytes()).collect(),
            Coding::L16BigEndian => samples.iter().flat_map(|s| s.to_be_bytes()).collect(),
        }
    }

    /// Bytes of silence.
    fn silence(self, bytes: usize) -> Vec<u8> {
        self.encode(&[0]).into_iter().cycle().take(bytes).collect()
    }
}

/// Exotel's chunks of bot audio: at least 100 ms (fewer break up on the network's jitter), in
/// multiples of [`EXOTEL_STEP`] bytes, at most [`EXOTEL_MOST`].
const EXOTEL_STEP: usize = 320;
const EXOTEL_MOST: usize = 100_000;

/// One call's stream: the carrier, the stream's id and coding once it began, and the bot's
/// audio on its way out.
pub struct PhoneStream {
    carrier: Carrier,
    stream_id: Option<String>,
    coding: Coding,
    rate: u32,
    down: Option<(u32, StreamResampler)>,
    /// Bot audio waiting for a whole chunk (Exotel, Vonage).
    pending: Vec<u8>,
}

impl PhoneStream {
    /// A stream from `carrier`, in its default coding until its first message says otherwise.
    pub fn new(carrier: Carrier) -> Self {
        let (coding, rate) = match carrier {
            Carrier::Twilio | Carrier::Telnyx | Carrier::Plivo => (Coding::Mulaw, 8_000),
            Carrier::Exotel => (Coding::L16, 8_000),
            Carrier::Vonage => (Coding::L16, 16_000),
        };
        Self {
            carrier,
            stream_id: None,
            coding,
            rate,
            down: None,
            pending: Vec::new(),
        }
    }

    /// Whose stream it is.
    pub fn carrier(&self) -> Carrier {
        self.carrier
    }

    /// Reads one message from the carrier.
    pub fn decode(&mut self, message: WsMessage) -> Result<Heard, FramingError> {
        match (self.carrier, message) {
            (Carrier::Vonage, WsMessage::Binary(bytes)) => self.audio(&bytes),
            (_, WsMessage::Binary(_)) => Err(FramingError::Format(format!(
                "{} sends JSON text messages only",
                self.carrier.name()
            ))),
            (Carrier::Twilio, WsMessage::Text(text)) => self.twilio(wire::read(&text, "event")?),
            (Carrier::Telnyx, WsMessage::Text(text)) => self.telnyx(wire::read(&text, "event")?),
            (Carrier::Plivo, WsMessage::Text(text)) => self.plivo(wire::read(&text, "event")?),
            (Carrier::Exotel, WsMessage::Text(text)) => self.exotel(wire::read(&text, "event")?),
            (Carrier::Vonage, WsMessage::Text(text)) => self.vonage(wire::read(&text, "event")?),
        }
    }

    fn audio(&self, bytes: &[u8]) -> Result<Heard, FramingError> {
        Ok(Heard::Audio {
            samples: self.coding.decode(bytes)?,
            sample_rate: self.rate,
        })
    }

    fn media(&self, media: wire::Media) -> Result<Heard, FramingError> {
        // The bot's own audio streamed back is not the caller.
        if media
            .track
            .as_deref()
            .is_some_and(|t| t.starts_with("outbound"))
        {
            return Ok(Heard::Nothing);
        }
        let bytes = STANDARD
            .decode(media.payload)
            .map_err(|e| FramingError::Malformed(format!("payload is not base64: {e}")))?;
        self.audio(&bytes)
    }

    fn begin(
        &mut self,
        call_sid: Option<String>,
        account_sid: Option<String>,
    ) -> Result<Heard, FramingError> {
        let call_sid = wire::id(call_sid, "the call's id")?;
        Ok(Heard::Call(Call {
            carrier: self.carrier,
            call_sid,
            account_sid,
        }))
    }

    fn twilio(&mut self, message: wire::Twilio) -> Result<Heard, FramingError> {
        match message {
            wire::Twilio::Connected | wire::Twilio::Mark => Ok(Heard::Nothing),
            wire::Twilio::Start { stream_sid, start } => {
                let encoding = start
                    .media_format
                    .encoding
                    .as_deref()
                    .unwrap_or("audio/x-mulaw");
                let rate = start.media_format.sample_rate.unwrap_or(8_000);
                if encoding != "audio/x-mulaw" || rate != 8_000 {
                    return Err(FramingError::Format(format!(
                        "{encoding} at {rate} Hz (expected audio/x-mulaw at 8000 Hz)"
                    )));
                }
                let account = wire::id(start.account_sid, "accountSid")?;
                self.stream_id = stream_sid.or(start.stream_sid);
                self.begin(start.call_sid, Some(account))
            }
            wire::Twilio::Media { media } => self.media(media),
            wire::Twilio::Dtmf { dtmf } => dtmf.key(),
            wire::Twilio::Stop => Ok(Heard::Stop),
        }
    }

    fn telnyx(&mut self, message: wire::Telnyx) -> Result<Heard, FramingError> {
        match message {
            wire::Telnyx::Connected | wire::Telnyx::Mark => Ok(Heard::Nothing),
            wire::Telnyx::Error { payload } => {
                let payload = payload.unwrap_or_default();
                tracing::warn!(%payload, "Telnyx reported an error on the media stream");
                Ok(Heard::Nothing)
            }
            wire::Telnyx::Start { stream_id, start } => {
                let format = start.media_format;
                let encoding = format.encoding.as_deref().unwrap_or("PCMU");
                let rate = format.sample_rate.unwrap_or(8_000);
                (self.coding, self.rate) = match (encoding, rate) {
                    ("PCMU", 8_000) => (Coding::Mulaw, 8_000),
                    ("PCMA", 8_000) => (Coding::Alaw, 8_000),
                    ("L16", 8_000 | 16_000) => (Coding::L16BigEndian, rate as u32),
                    _ => {
                        return Err(FramingError::Format(format!(
                            "{encoding} at {rate} Hz (expected PCMU or PCMA at 8000 Hz, or L16 at 8000 or 16000 Hz)"
                        )));
                    }
                };
                self.stream_id = stream_id;
                self.begin(start.call_control_id, None)
            }
            wire::Telnyx::Media { media } => self.media(media),
            wire::Telnyx::Dtmf { dtmf } => dtmf.key(),
            wire::Telnyx::Stop => Ok(Heard::Stop),
        }
    }

    fn plivo(&mut self, message: wire::Plivo) -> Result<Heard, FramingError> {
        match message {
            wire::Plivo::PlayedStream | wire::Plivo::ClearedAudio => Ok(Heard::Nothing),
            wire::Plivo::Start { start } => {
                let format = start.media_format;
                let encoding = format.encoding.as_deref().unwrap_or("audio/x-mulaw");
                let rate = format.sample_rate.unwrap_or(8_000);
                (self.coding, self.rate) = match (encoding, rate) {
                    ("audio/x-mulaw", 8_000) => (Coding::Mulaw, 8_000),
                    ("audio/x-l16", 8_000 | 16_000) => (Coding::L16, rate as u32),
                    _ => {
                        return Err(FramingError::Format(format!(
                            "{encoding} at {rate} Hz (expected audio/x-mulaw at 8000 Hz, or audio/x-l16 at 8000 or 16000 Hz)"
                        )));
                    }
                };
                self.stream_id = start.stream_id;
                self.begin(start.call_id, start.account_id)
            }
            wire::Plivo::Media { media } => self.media(media),
            wire::Plivo::Dtmf { dtmf } => dtmf.key(),
            wire::Plivo::Stop => Ok(Heard::Stop),
        }
    }

    fn exotel(&mut self, message: wire::Exotel) -> Result<Heard, FramingError> {
        match message {
            wire::Exotel::Connected | wire::Exotel::Mark => Ok(Heard::Nothing),
            wire::Exotel::Start { stream_sid, start } => {
                let format = start.media_format;
                let encoding = format.encoding.as_deref().unwrap_or("audio/x-raw");
                let rate = format.sample_rate.map(|r| r.0).unwrap_or(8_000);
                if encoding != "audio/x-raw" || ![8_000, 16_000, 24_000].contains(&rate) {
                    return Err(FramingError::Format(format!(
                        "{encoding} at {rate} Hz (expected audio/x-raw at 8000, 16000 or 24000 Hz)"
                    )));
                }
                self.rate = rate;
                self.stream_id = stream_sid.or(start.stream_sid);
                self.begin(start.call_sid, start.account_sid)
            }
            wire::Exotel::Media { media } => self.media(media),
            wire::Exotel::Dtmf { dtmf } => dtmf.key(),
            wire::Exotel::Stop => Ok(Heard::Stop),
        }
    }

    fn vonage(&mut self, message: wire::Vonage) -> Result<Heard, FramingError> {
        match message {
            wire::Vonage::Connected { content_type } => {
                self.rate = match content_type.as_deref() {
                    None | Some("audio/l16;rate=16000") => 16_000,
                    Some("audio/l16;rate=8000") => 8_000,
                    Some(other) => {
                        return Err(FramingError::Format(format!(
                            "{other} (expected audio/l16;rate=16000 or audio/l16;rate=8000)"
                        )));
                    }
                };
                Ok(Heard::Nothing)
            }
            wire::Vonage::Dtmf { digit } => wire::Dtmf { digit }.key(),
            wire::Vonage::Cleared | wire::Vonage::Notify => Ok(Heard::Nothing),
        }
    }

    /// The bot's audio, `samples` at `rate`, as the carrier takes it: none, one or several
    /// messages (none before a stream that needs its id has begun).
    pub fn play(&mut self, samples: &[i16], rate: u32) -> Vec<WsMessage> {
        let narrow = if rate == self.rate {
            samples.to_vec()
        } else {
            if self.down.as_ref().is_none_or(|(r, _)| *r != rate) {
                match StreamResampler::new(rate, self.rate) {
                    Ok(down) => self.down = Some((rate, down)),
                    Err(_) => return Vec::new(),
                }
            }
            match self.down.as_mut() {
                Some((_, down)) => down.process(samples),
                None => return Vec::new(),
            }
        };
        let bytes = self.coding.encode(&narrow);
        match self.carrier {
            Carrier::Exotel | Carrier::Vonage => {
                self.pending.extend_from_slice(&bytes);
                self.chunks(false)
            }
            _ => self.one(&bytes).into_iter().collect(),
        }
    }

    /// The bot stopped speaking: what waits for a whole chunk goes out, padded with silence.
    pub fn flush(&mut self) -> Vec<WsMessage> {
        self.chunks(true)
    }

    /// Whole chunks of the pending audio; with `all`, the rest too, padded to a whole one.
    fn chunks(&mut self, all: bool) -> Vec<WsMessage> {
        let (least, step) = match self.carrier {
            Carrier::Exotel => {
                let tenth = self.rate as usize / 10 * 2;
                (tenth.div_ceil(EXOTEL_STEP) * EXOTEL_STEP, EXOTEL_STEP)
            }
            // 20 ms a message.
            _ => {
                let frame = self.rate as usize / 50 * 2;
                (frame, frame)
            }
        };
        if all && !self.pending.is_empty() {
            let whole = self.pending.len().max(least).div_ceil(step) * step;
            let pad = self.coding.silence(whole - self.pending.len());
            self.pending.extend(pad);
        }
        let mut out = Vec::new();
        while self.pending.len() >= least {
            let take = match self.carrier {
                Carrier::Exotel => (self.pending.len().min(EXOTEL_MOST) / step) * step,
                _ => step,
            };
            let chunk: Vec<u8> = self.pending.drain(..take).collect();
            out.extend(self.one(&chunk));
        }
        out
    }

    /// One message of audio bytes, already coded.
    fn one(&self, bytes: &[u8]) -> Option<WsMessage> {
        let payload = || STANDARD.encode(bytes);
        let text = |value: Value| Some(WsMessage::Text(value.to_string()));
        match self.carrier {
            Carrier::Twilio => text(
                json!({"event": "media", "streamSid": self.stream_id.as_ref()?,
                "media": {"payload": payload()}}),
            ),
            Carrier::Telnyx => text(json!({"event": "media", "media": {"payload": payload()}})),
            Carrier::Plivo => {
                let content = match self.coding {
                    Coding::L16 => "audio/x-l16",
                    _ => "audio/x-mulaw",
                };
                text(
                    json!({"event": "playAudio", "streamId": self.stream_id.as_ref()?,
                    "media": {"contentType": content, "sampleRate": self.rate, "payload": payload()}}),
                )
            }
            Carrier::Exotel => text(
                json!({"event": "media", "stream_sid": self.stream_id.as_ref()?,
                "media": {"payload": payload()}}),
            ),
            Carrier::Vonage => Some(WsMessage::Binary(bytes.to_vec())),
        }
    }

    /// The caller interrupted: the carrier drops the bot's audio it holds (nothing before a
    /// stream that needs its id has begun).
    pub fn clear(&mut self) -> Option<WsMessage> {
        self.pending.clear();
        let value = match self.carrier {
            Carrier::Twilio => json!({"event": "clear", "streamSid": self.stream_id.as_ref()?}),
            Carrier::Telnyx => json!({"event": "clear"}),
            Carrier::Plivo => json!({"event": "clearAudio", "streamId": self.stream_id.as_ref()?}),
            Carrier::Exotel => json!({"event": "clear", "stream_sid": self.stream_id.as_ref()?}),
            Carrier::Vonage => json!({"action": "clear"}),
        };
        Some(WsMessage::Text(value.to_string()))
    }
}

/// The carriers' messages, as they write them.
mod wire {
    use super::*;

    /// A text message tagged by `tag`: an unknown tag is named in the error.
    pub fn read<T: DeserializeOwned>(text: &str, tag: &str) -> Result<T, FramingError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| FramingError::Malformed(e.to_string()))?;
        let Some(name) = value.get(tag).and_then(Value::as_str).map(str::to_owned) else {
            return Err(FramingError::Malformed(format!("no \"{tag}\"")));
        };
        serde_json::from_value(value).map_err(|e| {
            if e.to_string().starts_with("unknown variant") {
                FramingError::Unknown(name)
            } else {
                FramingError::Malformed(format!("{name}: {e}"))
            }
        })
    }

    /// An id the carrier gave: 1 to 128 letters, digits and `-_:.`.
    pub fn id(value: Option<String>, what: &str) -> Result<String, FramingError> {
        value
            .filter(|id| {
                (1..=128).contains(&id.len())
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_:.".contains(&b))
            })
            .ok_or_else(|| {
                FramingError::Malformed(format!(
                    "{what} is missing or not 1 to 128 letters, digits and -_:."
                ))
            })
    }

    #[derive(Deserialize)]
    pub struct Media {
        pub track: Option<String>,
        pub payload: String,
    }

    #[derive(Deserialize)]
    pub struct Dtmf {
        pub digit: String,
    }

    impl Dtmf {
        pub fn key(self) -> Result<Heard, FramingError> {
            let mut chars = self.digit.chars();
            match (chars.next(), chars.next()) {
                (Some(key), None) if crate::transports::dtmf::is_key(key) => Ok(Heard::Dtmf(key)),
                _ => Err(FramingError::Malformed(
                    "dtmf needs one keypad key as its digit".into(),
                )),
            }
        }
    }

    #[derive(Deserialize)]
    #[serde(tag = "event", rename_all = "lowercase")]
    pub enum Twilio {
        Connected,
        Mark,
        Start {
            #[serde(rename = "streamSid")]
            stream_sid: Option<String>,
            start: TwilioStart,
        },
        Media {
            media: Media,
        },
        Dtmf {
            dtmf: Dtmf,
        },
        Stop,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct TwilioStart {
        pub stream_sid: Option<String>,
        pub call_sid: Option<String>,
        pub account_sid: Option<String>,
        #[serde(default)]
        pub media_format: Format,
    }

    /// A stream's coding: its encoding's name and its rate.
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    pub struct Format {
        pub encoding: Option<String>,
        pub sample_rate: Option<u64>,
    }

    #[derive(Deserialize)]
    #[serde(tag = "event", rename_all = "lowercase")]
    pub enum Telnyx {
        Connected,
        Mark,
        Error {
            payload: Option<Value>,
        },
        Start {
            stream_id: Option<String>,
            start: TelnyxStart,
        },
        Media {
            media: Media,
        },
        Dtmf {
            dtmf: Dtmf,
        },
        Stop,
    }

    #[derive(Deserialize)]
    pub struct TelnyxStart {
        pub call_control_id: Option<String>,
        #[serde(default)]
        pub media_format: SnakeFormat,
    }

    /// [`Format`] with snake-case names.
    #[derive(Deserialize, Default)]
    pub struct SnakeFormat {
        pub encoding: Option<String>,
        pub sample_rate: Option<u64>,
    }

    #[derive(Deserialize)]
    #[serde(tag = "event", rename_all = "camelCase")]
    pub enum Plivo {
        Start { start: PlivoStart },
        Media { media: Media },
        Dtmf { dtmf: Dtmf },
        PlayedStream,
        ClearedAudio,
        Stop,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PlivoStart {
        pub stream_id: Option<String>,
        pub call_id: Option<String>,
        pub account_id: Option<String>,
        #[serde(default)]
        pub media_format: Format,
    }

    #[derive(Deserialize)]
    #[serde(tag = "event", rename_all = "lowercase")]
    pub enum Exotel {
        Connected,
        Mark,
        Start {
            stream_sid: Option<String>,
            start: ExotelStart,
        },
        Media {
            media: Media,
        },
        Dtmf {
            dtmf: Dtmf,
        },
        Stop,
    }

    #[derive(Deserialize)]
    pub struct ExotelStart {
        pub stream_sid: Option<String>,
        pub call_sid: Option<String>,
        pub account_sid: Option<String>,
        #[serde(default)]
        pub media_format: ExotelFormat,
    }

    /// Exotel writes its rate as a string (`"8000"`).
    #[derive(Deserialize, Default)]
    pub struct ExotelFormat {
        pub encoding: Option<String>,
        pub sample_rate: Option<Rate>,
    }

    /// A rate written as a number or as a string of digits.
    pub struct Rate(pub u32);

    impl<'de> Deserialize<'de> for Rate {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            match Value::deserialize(deserializer)? {
                Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
                Value::String(s) => s.trim().parse().ok(),
                _ => None,
            }
            .map(Rate)
            .ok_or_else(|| serde::de::Error::custom("a rate must be a whole number of Hz"))
        }
    }

    #[derive(Deserialize)]
    #[serde(tag = "event")]
    pub enum Vonage {
        #[serde(rename = "websocket:connected")]
        Connected {
            #[serde(rename = "content-type")]
            content_type: Option<String>,
        },
        #[serde(rename = "websocket:dtmf")]
        Dtmf { digit: String },
        #[serde(rename = "websocket:cleared")]
        Cleared,
        #[serde(rename = "websocket:notify")]
        Notify,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: Value) -> WsMessage {
        WsMessage::Text(value.to_string())
    }

    fn json_of(message: &WsMessage) -> Value {
        match message {
            WsMessage::Text(text) => serde_json::from_str(text).expect("JSON"),
            WsMessage::Binary(_) => panic!("a text message"),
        }
    }

    fn payload(message: &Value) -> Vec<u8> {
        STANDARD
            .decode(message["media"]["payload"].as_str().expect("payload"))
            .expect("base64")
    }

    #[test]
    fn every_carrier_is_found_by_its_path_and_nothing_else_is() {
        for carrier in Carrier::ALL {
            assert_eq!(Carrier::from_name(carrier.name()), Some(carrier));
            assert!(Carrier::is_stream_path(&format!("/ws/{}", carrier.name())));
        }
        assert!(!Carrier::is_stream_path("/ws/"));
        assert!(!Carrier::is_stream_path("/ws/twilio/x"));
        assert!(!Carrier::is_stream_path("/ws/sip"));
    }

    #[test]
    fn telnyx_takes_alaw_as_its_start_says_and_answers_in_it() {
        let mut stream = PhoneStream::new(Carrier::Telnyx);
        assert_eq!(
            stream.decode(text(json!({"event": "connected", "version": "1.0.0"}))),
            Ok(Heard::Nothing)
        );
        let start = json!({"event": "start", "sequence_number": "1", "stream_id": "32DE",
            "start": {"user_id": "u", "call_control_id": "v3:MdI9_x-1", "from": "+13122010094",
                      "media_format": {"encoding": "PCMA", "sample_rate": 8000, "channels": 1}}});
        assert_eq!(
            stream.decode(text(start)),
            Ok(Heard::Call(Call {
                carrier: Carrier::Telnyx,
                call_sid: "v3:MdI9_x-1".into(),
                account_sid: None
            }))
        );
        let media = json!({"event": "media", "sequence_number": "4", "stream_id": "32DE",
            "media": {"track": "inbound", "chunk": "2", "timestamp": "5",
                      "payload": STANDARD.encode([0xd5u8, 0x55, 0xaa])}});
        assert_eq!(
            stream.decode(text(media)),
            Ok(Heard::Audio {
                samples: vec![8, -8, 32_256],
                sample_rate: 8_000
            })
        );
        let echo = json!({"event": "media", "media": {"track": "outbound", "payload": "1Q=="}});
        assert_eq!(stream.decode(text(echo)), Ok(Heard::Nothing));
        let out = stream.play(&[0; 160], 8_000);
        let out = json_of(&out[0]);
        assert_eq!(out["event"], "media");
        assert_eq!(payload(&out), vec![0xd5; 160]);
        assert_eq!(
            json_of(&stream.clear().expect("clear")),
            json!({"event": "clear"})
        );
        assert_eq!(
            stream.decode(text(
                json!({"event": "dtmf", "stream_id": "32DE", "dtmf": {"digit": "*"}})
            )),
            Ok(Heard::Dtmf('*'))
        );
        assert_eq!(
            stream.decode(text(json!({"event": "stop", "stop": {}}))),
            Ok(Heard::Stop)
        );
    }

    #[test]
    fn telnyx_l16_is_big_endian_both_ways_at_its_rate() {
        let mut stream = PhoneStream::new(Carrier::Telnyx);
        let start = json!({"event": "start", "stream_id": "s", "start": {"call_control_id": "c",
            "media_format": {"encoding": "L16", "sample_rate": 16000, "channels": 1}}});
        assert!(matches!(stream.decode(text(start)), Ok(Heard::Call(_))));
        let media =
            json!({"event": "media", "media": {"payload": STANDARD.encode([0x01u8, 0x02])}});
        assert_eq!(
            stream.decode(text(media)),
            Ok(Heard::Audio {
                samples: vec![0x0102],
                sample_rate: 16_000
            })
        );
        let out = stream.play(&[0x0102], 16_000);
        assert_eq!(payload(&json_of(&out[0])), vec![0x01, 0x02]);
        let g722 = json!({"event": "start", "start": {"call_control_id": "c",
            "media_format": {"encoding": "G722", "sample_rate": 16000}}});
        assert!(matches!(
            PhoneStream::new(Carrier::Telnyx).decode(text(g722)),
            Err(FramingError::Format(_))
        ));
    }

    #[test]
    fn plivo_plays_audio_to_its_stream_and_clears_it() {
        let mut stream = PhoneStream::new(Carrier::Plivo);
        // Nothing can be addressed before the stream began.
        assert!(stream.play(&[0; 160], 8_000).is_empty());
        assert_eq!(stream.clear(), None);
        let start = json!({"event": "start", "sequenceNumber": 0,
            "start": {"callId": "4b0c-1", "streamId": "2017-f6", "accountId": "MA1",
                      "tracks": ["inbound"], "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}},
            "extra_headers": "{}"});
        assert_eq!(
            stream.decode(text(start)),
            Ok(Heard::Call(Call {
                carrier: Carrier::Plivo,
                call_sid: "4b0c-1".into(),
                account_sid: Some("MA1".into())
            }))
        );
        // The pipeline's 16 kHz narrowed to the call's 8 kHz.
        let out = json_of(&stream.play(&[0; 320], 16_000)[0]);
        assert_eq!(out["event"], "playAudio");
        assert_eq!(out["streamId"], "2017-f6");
        assert_eq!(out["media"]["contentType"], "audio/x-mulaw");
        assert_eq!(out["media"]["sampleRate"], 8_000);
        assert!((150..=170).contains(&payload(&out).len()), "{out}");
        assert_eq!(
            json_of(&stream.clear().expect("clear")),
            json!({"event": "clearAudio", "streamId": "2017-f6"})
        );
        assert_eq!(
            stream.decode(text(json!({"event": "dtmf", "dtmf": {"digit": "9"}}))),
            Ok(Heard::Dtmf('9'))
        );
        assert_eq!(
            stream.decode(text(json!({"event": "playedStream", "name": "m"}))),
            Ok(Heard::Nothing)
        );
    }

    #[test]
    fn exotel_gets_chunks_of_at_least_100_ms_in_steps_of_320_bytes_and_the_tail_padded() {
        // 100 ms at 8 kHz: 1,600 bytes.
        let mut stream = PhoneStream::new(Carrier::Exotel);
        let start = json!({"event": "start", "sequence_number": "1", "stream_sid": "MZ1",
            "start": {"stream_sid": "MZ1", "call_sid": "CA1", "account_sid": "AC1",
                      "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"}}});
        assert!(matches!(stream.decode(text(start)), Ok(Heard::Call(_))));
        let media = json!({"event": "media", "stream_sid": "MZ1",
            "media": {"chunk": "2", "timestamp": "200", "payload": STANDARD.encode([0x02u8, 0x01])}});
        assert_eq!(
            stream.decode(text(media)),
            Ok(Heard::Audio {
                samples: vec![0x0102],
                sample_rate: 8_000
            })
        );
        // 20 ms at a time: nothing until 100 ms are there.
        for _ in 0..4 {
            assert!(stream.play(&[7; 160], 8_000).is_empty());
        }
        let out = stream.play(&[7; 170], 8_000);
        let [first] = &out[..] else {
            panic!("one chunk: {out:?}");
        };
        let first = json_of(first);
        assert_eq!(first["stream_sid"], "MZ1");
        assert_eq!(payload(&first).len(), 1_600);
        // The 10 samples left over go out padded once the bot stops.
        let tail = stream.flush();
        let bytes = payload(&json_of(&tail[0]));
        assert_eq!(bytes.len(), 1_600);
        assert_eq!(&bytes[..20], &[7, 0].repeat(10)[..]);
        assert!(bytes[20..].iter().all(|b| *b == 0));
        assert!(stream.flush().is_empty());
        // An interruption drops what waits.
        stream.play(&[7; 160], 8_000);
        assert_eq!(
            json_of(&stream.clear().expect("clear")),
            json!({"event": "clear", "stream_sid": "MZ1"})
        );
        assert!(stream.flush().is_empty());
        assert_eq!(
            stream.decode(text(
                json!({"event": "dtmf", "dtmf": {"digit": "5", "duration": "100"}})
            )),
            Ok(Heard::Dtmf('5'))
        );
    }

    #[test]
    fn vonage_speaks_binary_pcm_in_20_ms_messages() {
        let mut stream = PhoneStream::new(Carrier::Vonage);
        let connected = json!({"event": "websocket:connected",
            "content-type": "audio/l16;rate=16000", "caller": "447700900000"});
        assert_eq!(stream.decode(text(connected)), Ok(Heard::Nothing));
        assert_eq!(
            stream.decode(WsMessage::Binary(vec![0x02, 0x01, 0xff, 0xff])),
            Ok(Heard::Audio {
                samples: vec![0x0102, -1],
                sample_rate: 16_000
            })
        );
        assert_eq!(
            stream.decode(WsMessage::Binary(vec![1, 2, 3])),
            Err(FramingError::OddAudio(3))
        );
        let out = stream.play(&[5; 500], 16_000);
        assert_eq!(out.len(), 1);
        assert!(matches!(&out[0], WsMessage::Binary(b) if b.len() == 640));
        let tail = stream.flush();
        assert!(
            matches!(&tail[..], [WsMessage::Binary(b)] if b.len() == 640 && b[360..].iter().all(|x| *x == 0))
        );
        assert_eq!(
            json_of(&stream.clear().expect("clear")),
            json!({"action": "clear"})
        );
        assert_eq!(
            stream.decode(text(
                json!({"event": "websocket:dtmf", "digit": "3", "duration": 260})
            )),
            Ok(Heard::Dtmf('3'))
        );
        let narrow = json!({"event": "websocket:connected", "content-type": "audio/l16;rate=8000"});
        let mut stream = PhoneStream::new(Carrier::Vonage);
        stream.decode(text(narrow)).expect("8 kHz");
        assert!(
            matches!(&stream.play(&[5; 160], 8_000)[..], [WsMessage::Binary(b)] if b.len() == 320)
        );
    }

    #[test]
    fn what_a_carrier_did_not_send_is_a_clear_error() {
        let mut exotel = PhoneStream::new(Carrier::Exotel);
        assert_eq!(
            exotel.decode(text(json!({"event": "hangup"}))),
            Err(FramingError::Unknown("hangup".into()))
        );
        assert!(matches!(
            exotel.decode(text(json!({"no": "event"}))),
            Err(FramingError::Malformed(_))
        ));
        assert!(matches!(
            exotel.decode(WsMessage::Binary(vec![0, 0])),
            Err(FramingError::Format(_))
        ));
        let unnamed = json!({"event": "start", "start": {"call_sid": "CA/../x"}});
        assert!(matches!(
            exotel.decode(text(unnamed)),
            Err(FramingError::Malformed(_))
        ));
        let mp3 = json!({"event": "start", "start": {"call_sid": "CA1",
            "media_format": {"encoding": "audio/mpeg", "sample_rate": 8000}}});
        assert!(matches!(
            exotel.decode(text(mp3)),
            Err(FramingError::Format(_))
        ));
        let mut plivo = PhoneStream::new(Carrier::Plivo);
        assert!(matches!(
            plivo.decode(text(json!({"event": "dtmf", "dtmf": {"digit": "12"}}))),
            Err(FramingError::Malformed(_))
        ));
        assert!(matches!(
            plivo.decode(text(json!({"event": "media", "media": {"payload": "***"}}))),
            Err(FramingError::Malformed(_))
        ));
        let mut vonage = PhoneStream::new(Carrier::Vonage);
        assert!(matches!(
            vonage.decode(text(
                json!({"event": "websocket:connected", "content-type": "audio/opus"})
            )),
            Err(FramingError::Format(_))
        ));
    }
}
