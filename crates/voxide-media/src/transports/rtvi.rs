//! RTVI messages: the JSON dialect pipecat's clients speak, over the WebRTC data channel and
//! over the WebSocket (`/ws`, when the client's first message is RTVI).
//!
//! Every message is `{"label": "rtvi-ai", "type": ..., "id": ..., "data": ...}`. The server
//! answers `client-ready` with `bot-ready`; takes `send-text` (with its `run_immediately` and
//! `audio_response` options), `raw-audio` (base64 PCM), `dtmf`, `disconnect-bot` and the
//! `client-message`s of pipecat's eval harness (`eval-connect`, `eval-configure`,
//! `eval-context`, `eval-cancel`); renders the session's events (the LLM's response as it
//! streams, what the bot speaks, speaking and interruptions, what the user said, tool calls,
//! metrics, errors); and answers anything else with `error-response`.
//!
//! The protocol version is negotiated as pipecat does it: a 1.x client gets its own version back
//! and 1.x `bot-output` messages; any other client gets [`VERSION`] and the 2.x shape.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::context::Message;
use crate::events::{Event, ReportLevel};
use crate::frames::MetricsData;

/// The label every RTVI message carries.
pub const LABEL: &str = "rtvi-ai";
/// The protocol version voxide speaks to current clients.
pub const VERSION: &str = "2.2.0";
/// The major version of [`VERSION`].
const MAJOR: u64 = 2;
/// The oldest major version still served, in its own message shapes.
const LEGACY_MAJOR: u64 = 1;
/// The largest client message read; a larger one is answered with `error-response` unread.
pub const MAX_CLIENT_MESSAGE: usize = 64 * 1024;
/// Sentences the voice has made and the bot not yet started to say, held for the client.
const MAX_HELD_SENTENCES: usize = 64;
/// The most keys one `dtmf` message may press.
pub const MAX_DTMF_KEYS: usize = 32;
/// The most messages one `eval-context` may set.
pub const MAX_CONTEXT_MESSAGES: usize = 200;
/// The rates `raw-audio` may come at.
const RATES: std::ops::RangeInclusive<u32> = 8_000..=48_000;

/// What a client message asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// The client is ready: send these replies (`bot-ready`, after an `error-response` when its
    /// version is unknown or incompatible).
    Ready(Vec<String>),
    /// The user typed this.
    Text(SendText),
    /// The user's audio (`raw-audio`), mono.
    Audio {
        /// The samples.
        samples: Vec<i16>,
        /// Their rate.
        sample_rate: u32,
    },
    /// Keys the user pressed on a keypad, in order (`0`-`9`, `*`, `#`).
    Dtmf(String),
    /// A message of pipecat's eval harness.
    Eval(EvalMessage),
    /// The client is leaving.
    Disconnect,
    /// Not understood: send this reply (`error-response`).
    Invalid(String),
}

/// A `send-text`: what the user typed and what to do with it.
#[derive(Debug, Clone, PartialEq)]
pub struct SendText {
    /// The message's id, for an `error-response` about it.
    pub id: Option<String>,
    /// The words.
    pub content: String,
    /// Interrupt the bot and answer at once (pipecat's default); otherwise the words join the
    /// conversation and wait for the next turn.
    pub run_immediately: bool,
    /// Speak the answer (pipecat's default); false asks for a text answer.
    pub audio_response: bool,
}

/// The `client-message`s pipecat's eval harness sends (`data.t`, with its payload in `data.d`).
#[derive(Debug, Clone, PartialEq)]
pub enum EvalMessage {
    /// `eval-connect`, the harness's first message: what the connection asks of the bot.
    Connect(EvalFlags),
    /// `eval-configure`: how much of a function call to report, for this session.
    Configure {
        /// The level asked for every function (`"*"`); `None` leaves it.
        report_level: Option<ReportLevel>,
    },
    /// `eval-context`: replace the conversation with these messages, without answering.
    Context(Vec<Message>),
    /// `eval-cancel`: end the session at once.
    Cancel,
}

/// What an eval connection asks of the bot (`eval-connect`, or the `/ws` URL's flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct EvalFlags {
    /// The bot answers in text: nothing is spoken.
    pub skip_tts: bool,
    /// The bot's audio goes to the client as `eval-bot-audio` messages.
    pub capture_bot_audio: bool,
}

/// The flags of an `eval-connect` message, or `None` for any other message.
pub fn eval_connect(text: &str) -> Option<EvalFlags> {
    if text.len() > MAX_CLIENT_MESSAGE {
        return None;
    }
    let value: Value = serde_json::from_str(text).ok()?;
    let is_connect = value["label"] == LABEL
        && value["type"] == "client-message"
        && value["data"]["t"] == "eval-connect";
    is_connect.then(|| EvalFlags::deserialize(&value["data"]["d"]).unwrap_or_default())
}

/// Whether `text` is an RTVI message (a JSON object with the RTVI label), without parsing it
/// all: how `/ws` tells an RTVI client from one speaking voxide's own framing.
pub fn is_rtvi(text: &str) -> bool {
    text.len() <= MAX_CLIENT_MESSAGE
        && serde_json::from_str::<Value>(text)
            .is_ok_and(|v| v.get("label").and_then(Value::as_str) == Some(LABEL))
}

fn message(kind: &str, id: Option<&str>, data: Value) -> String {
    let mut out = json!({"label": LABEL, "type": kind, "data": data});
    if let Some(id) = id {
        out["id"] = json!(id);
    }
    out.to_string()
}

fn error_response(id: Option<&str>, error: impl Into<String>) -> String {
    message("error-response", id, json!({"error": error.into()}))
}

/// An `error-response` to the message `id`: it was not used.
pub fn refused(id: Option<&str>, why: impl Into<String>) -> String {
    error_response(id, why)
}

fn send_text(id: Option<&str>, data: &Value) -> Result<SendText, String> {
    let content = data["content"]
        .as_str()
        .filter(|c| !c.trim().is_empty())
        .ok_or("send-text needs data.content")?;
    let option = |name: &str| match &data["options"][name] {
        Value::Null => Ok(true),
        Value::Bool(b) => Ok(*b),
        _ => Err(format!("send-text's options.{name} must be true or false")),
    };
    Ok(SendText {
        id: id.map(str::to_owned),
        content: content.to_owned(),
        run_immediately: option("run_immediately")?,
        audio_response: option("audio_response")?,
    })
}

/// `raw-audio` (`base64Audio`) or `raw-audio-batch` (`base64AudioBatch`): 16-bit PCM, mixed
/// down to mono.
fn raw_audio(data: &Value) -> Result<ClientMessage, String> {
    let sample_rate = data["sampleRate"]
        .as_u64()
        .and_then(|r| u32::try_from(r).ok())
        .filter(|r| RATES.contains(r))
        .ok_or("raw-audio needs data.sampleRate between 8000 and 48000")?;
    let channels = match data["numChannels"].as_u64() {
        None | Some(1) => 1,
        Some(2) => 2,
        Some(_) => return Err("raw-audio's numChannels must be 1 or 2".into()),
    };
    let pieces: Vec<&str> = match (&data["base64Audio"], &data["base64AudioBatch"]) {
        (Value::String(one), _) => vec![one],
        (_, Value::Array(batch)) => batch.iter().filter_map(Value::as_str).collect(),
        _ => return Err("raw-audio needs data.base64Audio".into()),
    };
    let mut samples = Vec::new();
    for piece in pieces {
        let pcm = crate::audio::pcm_from_base64(piece)
            .map_err(|e| format!("raw-audio is not base64 16-bit PCM: {e}"))?;
        if pcm.len() % channels != 0 {
            return Err("raw-audio holds part of a stereo frame".into());
        }
        samples.extend(
            pcm.chunks_exact(channels)
                .map(|f| (f.iter().map(|&s| i32::from(s)).sum::<i32>() / channels as i32) as i16),
        );
    }
    Ok(ClientMessage::Audio {
        samples,
        sample_rate,
    })
}

/// `dtmf`'s keys: `data.buttons` (protocol 2.1 and later) or `data.button` (before).
fn dtmf(data: &Value) -> Result<String, String> {
    let keys: Vec<&Value> = match (&data["buttons"], &data["button"]) {
        (Value::Array(keys), _) => keys.iter().collect(),
        (_, key @ Value::String(_)) => vec![key],
        _ => return Err("dtmf needs data.buttons".into()),
    };
    if keys.is_empty() || keys.len() > MAX_DTMF_KEYS {
        return Err(format!("dtmf presses 1 to {MAX_DTMF_KEYS} keys"));
    }
    keys.into_iter()
        .map(|key| match key.as_str() {
            Some(k)
                if k.len() == 1
                    && k.chars()
                        .all(|c| c.is_ascii_digit() || c == '*' || c == '#') =>
            {
                Ok(k.to_owned())
            }
            _ => Err(format!("{key} is not a keypad key (0-9, * or #)")),
        })
        .collect()
}

/// A `client-message`: voxide understands the eval harness's.
fn eval_message(data: &Value) -> Result<EvalMessage, String> {
    let payload = &data["d"];
    match data["t"].as_str().unwrap_or_default() {
        "eval-connect" => Ok(EvalMessage::Connect(
            EvalFlags::deserialize(if payload.is_object() {
                payload
            } else {
                &Value::Null
            })
            .unwrap_or_default(),
        )),
        "eval-configure" => {
            let report_level =
                match &payload["function_call_report_level"] {
                    Value::Null => None,
                    Value::Object(levels) => {
                        let level = levels.get("*").ok_or(
                            "eval-configure sets the report level for every function (\"*\") only",
                        )?;
                        Some(ReportLevel::deserialize(level).map_err(|_| {
                            format!("{level} is not a report level (none, name, full)")
                        })?)
                    }
                    _ => return Err("function_call_report_level must be an object".into()),
                };
            Ok(EvalMessage::Configure { report_level })
        }
        "eval-context" => {
            let messages = payload["messages"]
                .as_array()
                .ok_or("eval-context needs d.messages")?;
            if messages.len() > MAX_CONTEXT_MESSAGES {
                return Err(format!(
                    "eval-context sets at most {MAX_CONTEXT_MESSAGES} messages"
                ));
            }
            messages
                .iter()
                .map(|m| {
                    Message::deserialize(m).map_err(|e| format!("eval-context: a message: {e}"))
                })
                .collect::<Result<_, _>>()
                .map(EvalMessage::Context)
        }
        "eval-cancel" => Ok(EvalMessage::Cancel),
        "eval-image" => Err("eval-image: voxide's bots do not see images".into()),
        other => Err(format!("unsupported client-message {other:?}")),
    }
}

/// The answer to a client message of `len` bytes, over [`MAX_CLIENT_MESSAGE`].
pub fn too_large(len: usize) -> String {
    error_response(
        None,
        format!(
            "message_too_large: the message is {len} bytes; the most read is {MAX_CLIENT_MESSAGE}"
        ),
    )
}

/// A function call's data as the client may see it ([`Event::for_client`]): its id, its name
/// where one is told, and each of `fields` that is not null.
fn tool_call<const N: usize>(name: &str, tool_call_id: &str, fields: [(&str, Value); N]) -> Value {
    let mut data = serde_json::Map::new();
    if !name.is_empty() {
        data.insert("function_name".into(), json!(name));
    }
    data.insert("tool_call_id".into(), json!(tool_call_id));
    for (key, value) in fields {
        if !value.is_null() {
            data.insert(key.into(), value);
        }
    }
    Value::Object(data)
}

/// A non-fatal `error`: something the client sent was not used; the session goes on.
pub fn error(text: &str) -> String {
    message("error", None, json!({"error": text, "fatal": false}))
}

/// A fatal `error`: the server ends the session for this reason.
pub fn fatal_error(text: &str) -> String {
    message("error", None, json!({"error": text, "fatal": true}))
}

/// One client's side of the protocol: the version it negotiated decides the message shapes.
#[derive(Debug, Default)]
pub struct Rtvi {
    legacy: bool,
    segments: u64,
    /// The bot is playing audio.
    speaking: bool,
    /// What the voice will say once the bot starts speaking: the client gets each sentence as
    /// it is heard, as pipecat sends it (at most [`MAX_HELD_SENTENCES`]).
    held: Vec<String>,
    /// A text session: nothing is spoken, so the LLM's words go out as `bot-output` sentences
    /// that will not be spoken, as pipecat sends them.
    text_only: bool,
    /// The text session's response so far, short of a whole sentence.
    unspoken: String,
    /// Dollars the session's LLM calls cost so far (those with a known price).
    session_cost_usd: f64,
    /// The session's id and whether it is recorded, for `bot-ready`'s `about`.
    session: Option<(String, bool)>,
}

impl Rtvi {
    /// A conversation before `client-ready`: current shapes until the client says otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    /// The session this conversation is: `bot-ready`'s `about` names it (`session_id`) and
    /// says whether it is recorded (`recorded`), so a client can fetch its recording and
    /// transcript afterwards (`/admin/sessions/{id}/…`).
    pub fn set_session(&mut self, id: &str, recorded: bool) {
        self.session = Some((id.to_owned(), recorded));
    }

    /// A text session (`skip_tts`): the LLM's words are the bot's output.
    pub fn set_text_only(&mut self, text_only: bool) {
        self.text_only = text_only;
    }

    /// Reads one client message.
    pub fn parse(&mut self, text: &str) -> ClientMessage {
        if text.len() > MAX_CLIENT_MESSAGE {
            return ClientMessage::Invalid(too_large(text.len()));
        }
        let Ok(value) = serde_json::from_str::<Value>(text) else {
            return ClientMessage::Invalid(error_response(None, "the message is not JSON"));
        };
        let id = value.get("id").and_then(Value::as_str);
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if value.get("label").and_then(Value::as_str) != Some(LABEL) {
            return ClientMessage::Invalid(error_response(id, format!("expected label {LABEL:?}")));
        }
        let data = &value["data"];
        let parsed = match kind {
            "client-ready" => Ok(ClientMessage::Ready(self.ready(id, &data["version"]))),
            "send-text" => send_text(id, data).map(ClientMessage::Text),
            "raw-audio" | "raw-audio-batch" => raw_audio(data),
            "dtmf" => dtmf(data).map(ClientMessage::Dtmf),
            "client-message" => eval_message(data).map(ClientMessage::Eval),
            "disconnect-bot" => Ok(ClientMessage::Disconnect),
            other => Err(format!("unsupported message type {other:?}")),
        };
        parsed.unwrap_or_else(|why| ClientMessage::Invalid(error_response(id, why)))
    }

    /// Negotiates the version; returns the replies to `client-ready`.
    fn ready(&mut self, id: Option<&str>, version: &Value) -> Vec<String> {
        let mut replies = Vec::new();
        let major = version.as_str().map(|v| {
            v.split('.')
                .map(str::parse::<u64>)
                .collect::<Result<Vec<_>, _>>()
        });
        let mut answer = VERSION.to_owned();
        match (version.as_str(), major) {
            (Some(v), Some(Ok(parts))) if parts.len() == 3 => {
                if parts[0] == LEGACY_MAJOR {
                    self.legacy = true;
                    answer = v.to_owned();
                } else if parts[0] != MAJOR {
                    replies.push(error_response(
                        id,
                        format!("RTVI version {v} is not compatible with {VERSION}; compatibility issues may occur"),
                    ));
                }
            }
            (Some(v), _) => replies.push(error_response(
                id,
                format!("invalid client version format ({v}); compatibility issues may occur"),
            )),
            (None, _) => replies.push(error_response(
                id,
                "client version unknown; compatibility issues may occur",
            )),
        }
        let mut about = json!({"library": "voxide", "library_version": env!("CARGO_PKG_VERSION")});
        if let Some((session_id, recorded)) = &self.session {
            about["session_id"] = json!(session_id);
            about["recorded"] = json!(recorded);
        }
        replies.push(message(
            "bot-ready",
            id,
            json!({"version": answer, "about": about}),
        ));
        replies
    }

    /// The RTVI messages for a session event, if the protocol has any.
    pub fn render(&mut self, event: &Event) -> Vec<String> {
        let (kind, data) = match event {
            Event::UserMuteStarted => ("user-mute-started", Value::Null),
            Event::UserMuteStopped => ("user-mute-stopped", Value::Null),
            Event::UserStartedSpeaking => ("user-started-speaking", Value::Null),
            Event::UserStoppedSpeaking => ("user-stopped-speaking", Value::Null),
            Event::BotStartedSpeaking => {
                self.speaking = true;
                let held = std::mem::take(&mut self.held);
                let mut out = vec![message("bot-started-speaking", None, Value::Null)];
                out.extend(held.iter().flat_map(|text| self.bot_output(text)));
                return out;
            }
            Event::BotStoppedSpeaking => {
                self.speaking = false;
                ("bot-stopped-speaking", Value::Null)
            }
            Event::Interruption => {
                // Sentences not yet heard never will be.
                self.held.clear();
                ("bot-interrupted", Value::Null)
            }
            Event::UserTranscription { text, is_final } => {
                // `user-input` is the current message; `user-transcription` stays for older
                // clients.
                let data =
                    json!({"text": text, "final": is_final, "user_id": "user", "timestamp": ""});
                let mut input = data.clone();
                input["input_type"] = json!("transcription");
                return vec![
                    message("user-transcription", None, data),
                    message("user-input", None, input),
                ];
            }
            Event::LlmStarted => {
                self.unspoken.clear();
                ("bot-llm-started", Value::Null)
            }
            Event::LlmText { text } => {
                let mut out = vec![message("bot-llm-text", None, json!({"text": text}))];
                if self.text_only {
                    self.unspoken.push_str(text);
                    while let Some(end) = crate::text::sentence_end(&self.unspoken) {
                        let sentence: String = self.unspoken.drain(..end).collect();
                        out.push(self.unspoken_output(sentence.trim()));
                    }
                }
                return out;
            }
            Event::LlmStopped => {
                let mut out = Vec::new();
                let rest = std::mem::take(&mut self.unspoken);
                if self.text_only && !rest.trim().is_empty() {
                    out.push(self.unspoken_output(rest.trim()));
                }
                out.push(message("bot-llm-stopped", None, Value::Null));
                return out;
            }
            Event::BotText { text } if !self.speaking => {
                if self.held.len() < MAX_HELD_SENTENCES {
                    self.held.push(text.clone());
                }
                return Vec::new();
            }
            Event::BotText { text } => return self.bot_output(text),
            Event::ToolCallStarted {
                name,
                tool_call_id,
                arguments,
            } => {
                let started = if name.is_empty() {
                    json!({})
                } else {
                    json!({"function_name": name})
                };
                return vec![
                    message("llm-function-call-started", None, started),
                    message(
                        "llm-function-call-in-progress",
                        None,
                        tool_call(name, tool_call_id, [("arguments", arguments.clone())]),
                    ),
                ];
            }
            Event::ToolCallResult {
                name,
                tool_call_id,
                result,
            } => (
                "llm-function-call-stopped",
                tool_call(
                    name,
                    tool_call_id,
                    [
                        ("cancelled", json!(false)),
                        ("result", result.clone().unwrap_or(Value::Null)),
                    ],
                ),
            ),
            // RTVI has no message for an async tool's progress: voxide's own, as a
            // `server-message` (which clients hand to the app).
            Event::ToolCallIntermediate {
                name,
                tool_call_id,
                result,
            } => {
                let mut data = tool_call(
                    name,
                    tool_call_id,
                    [("result", result.clone().unwrap_or(Value::Null))],
                );
                data["type"] = json!("llm-function-call-intermediate");
                ("server-message", data)
            }
            Event::ToolCallCancelled {
                name, tool_call_id, ..
            } => (
                "llm-function-call-stopped",
                tool_call(name, tool_call_id, [("cancelled", json!(true))]),
            ),
            Event::Metrics { data } => match self.metrics(data) {
                Some(data) => ("metrics", data),
                None => return Vec::new(),
            },
            Event::Error {
                message: text,
                fatal,
                ..
            } => ("error", json!({"error": text, "fatal": fatal})),
            _ => return Vec::new(),
        };
        vec![message(kind, None, data)]
    }

    /// A sentence the bot speaks: `bot-output` in the negotiated shape, then `bot-tts-text`.
    fn bot_output(&mut self, text: &str) -> Vec<String> {
        vec![
            self.output(text, true),
            message("bot-tts-text", None, json!({"text": text})),
        ]
    }
}

impl Rtvi {
    /// A sentence of a text session's answer: `bot-output` that will not be spoken.
    fn unspoken_output(&mut self, text: &str) -> String {
        self.output(text, false)
    }

    /// `bot-output` for a sentence, spoken (to its end) or not to be, in the negotiated shape.
    fn output(&mut self, text: &str, spoken: bool) -> String {
        self.segments += 1;
        let mut output = json!({
            "text": text,
            "output_type": "sentence",
            "text_type": "sentence",
            "aggregated_by": "sentence",
            "segment_id": self.segments,
        });
        if self.legacy {
            output["spoken"] = json!(spoken);
        } else if spoken {
            output["will_be_spoken"] = json!(true);
            output["spoken_status"] = json!("completed");
            output["spoken_progress"] = json!({"accumulated_text": text, "remaining_text": ""});
        } else {
            output["will_be_spoken"] = json!(false);
            output["spoken_status"] = json!("new");
        }
        message("bot-output", None, output)
    }

    /// RTVI `metrics` data, as pipecat's server sends it: `ttfb` and `processing` per processor,
    /// `tokens` per LLM call, `characters` per TTS call; and voxide's `voice_to_voice` and
    /// `turn_wait` per turn. Each `tokens` entry also carries its
    /// dollars (`cost_usd`, when the model's price is known) and the session's so far
    /// (`session_cost_usd`).
    fn metrics(&mut self, data: &[MetricsData]) -> Option<Value> {
        let mut out = serde_json::Map::new();
        let mut add = |key: &str, item: Value| {
            if let Value::Array(list) = out.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
                list.push(item);
            }
        };
        for item in data {
            match item {
                MetricsData::Ttfb {
                    processor, seconds, ..
                } => add("ttfb", json!({"processor": processor, "value": seconds})),
                MetricsData::ProcessingTime { processor, seconds } => add(
                    "processing",
                    json!({"processor": processor, "value": seconds}),
                ),
                // voxide's own, beside pipecat's keys (clients pass unknown keys through):
                // the turn's voice-to-voice latency and how long its end waited.
                MetricsData::VoiceToVoice { seconds } => add(
                    "voice_to_voice",
                    json!({"processor": "voxide", "value": seconds}),
                ),
                MetricsData::TurnWait { seconds } => add(
                    "turn_wait",
                    json!({"processor": "voxide", "value": seconds}),
                ),
                MetricsData::LlmUsage {
                    processor,
                    model,
                    usage,
                    cost_usd,
                } => {
                    self.session_cost_usd += cost_usd.unwrap_or(0.0);
                    add(
                        "tokens",
                        json!({
                            "processor": processor,
                            "model": model,
                            "value": {
                                "prompt_tokens": usage.input + usage.cache_read + usage.cache_write,
                                "completion_tokens": usage.output,
                                "total_tokens": usage.total(),
                                "cache_read_input_tokens": usage.cache_read,
                                "cache_creation_input_tokens": usage.cache_write,
                            },
                            "cost_usd": cost_usd,
                            "session_cost_usd": self.session_cost_usd,
                        }),
                    );
                }
                MetricsData::TtsUsage {
                    processor,
                    model,
                    characters,
                    cost_usd,
                } => {
                    self.session_cost_usd += cost_usd.unwrap_or(0.0);
                    add(
                        "characters",
                        json!({"processor": processor, "model": model, "value": characters,
                            "cost_usd": cost_usd, "session_cost_usd": self.session_cost_usd}),
                    );
                }
                MetricsData::SttUsage {
                    processor,
                    model,
                    seconds,
                    cost_usd,
                } => {
                    self.session_cost_usd += cost_usd.unwrap_or(0.0);
                    add(
                        "stt_seconds",
                        json!({"processor": processor, "model": model, "value": seconds,
                            "cost_usd": cost_usd, "session_cost_usd": self.session_cost_usd}),
                    );
                }
                MetricsData::Network {
                    transport,
                    received,
                    lost,
                    recovered,
                    redundant,
                    red,
                    concealed,
                    late,
                    reordered,
                    duplicated,
                    jitter_ms,
                    depth_ms,
                    sent_loss,
                } => add(
                    "network",
                    json!({"processor": transport, "value": {
                        "received": received, "lost": lost, "recovered": recovered,
                        "redundant": redundant, "red": red, "concealed": concealed, "late": late, "reordered": reordered,
                        "duplicated": duplicated, "jitter_ms": jitter_ms, "depth_ms": depth_ms,
                        "sent_loss": sent_loss,
                    }}),
                ),
                _ => {}
            }
        }
        (!out.is_empty()).then_some(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(rtvi: &mut Rtvi, data: &str) -> Vec<Value> {
        let text =
            format!(r#"{{"label":"rtvi-ai","type":"client-ready","id":"abc","data":{data}}}"#);
        let ClientMessage::Ready(replies) = rtvi.parse(&text) else {
            panic!("ready");
        };
        replies
            .iter()
            .map(|r| serde_json::from_str(r).expect("json"))
            .collect()
    }

    fn bot_output(rtvi: &mut Rtvi) -> Value {
        rtvi.render(&Event::BotStartedSpeaking);
        let rendered = rtvi.render(&Event::BotText {
            text: "It is sunny.".into(),
        });
        assert_eq!(rendered.len(), 2);
        let tts: Value = serde_json::from_str(&rendered[1]).expect("json");
        assert_eq!(tts["type"], "bot-tts-text");
        assert_eq!(tts["data"]["text"], "It is sunny.");
        serde_json::from_str(&rendered[0]).expect("json")
    }

    #[test]
    fn bot_ready_names_the_session_and_whether_it_is_recorded_once_told() {
        let mut rtvi = Rtvi::new();
        let about = &ready(&mut rtvi, r#"{"version":"1.0.0"}"#)[0]["data"]["about"];
        assert_eq!(about["library"], "voxide");
        assert!(about.get("session_id").is_none(), "{about}");
        let mut rtvi = Rtvi::new();
        rtvi.set_session("node.abc", true);
        let about = &ready(&mut rtvi, r#"{"version":"1.0.0"}"#)[0]["data"]["about"];
        assert_eq!(about["session_id"], "node.abc");
        assert_eq!(about["recorded"], true);
    }

    #[test]
    fn a_current_client_gets_the_current_version_and_v2_bot_output() {
        let mut rtvi = Rtvi::new();
        let replies = ready(&mut rtvi, r#"{"version":"2.1.0"}"#);
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0]["type"], "bot-ready");
        assert_eq!(replies[0]["id"], "abc");
        assert_eq!(replies[0]["label"], LABEL);
        assert_eq!(replies[0]["data"]["version"], VERSION);
        let output = bot_output(&mut rtvi);
        assert_eq!(output["type"], "bot-output");
        assert_eq!(output["data"]["text"], "It is sunny.");
        assert_eq!(output["data"]["will_be_spoken"], true);
        assert_eq!(output["data"]["spoken_status"], "completed");
        assert_eq!(
            output["data"]["spoken_progress"]["accumulated_text"],
            "It is sunny."
        );
        assert!(output["data"].get("spoken").is_none());
        assert_eq!(bot_output(&mut rtvi)["data"]["segment_id"], 2);
    }

    #[test]
    fn a_1x_client_gets_its_version_back_and_v1_bot_output() {
        let mut rtvi = Rtvi::new();
        let replies = ready(&mut rtvi, r#"{"version":"1.4.1"}"#);
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0]["data"]["version"], "1.4.1");
        let output = bot_output(&mut rtvi);
        assert_eq!(output["data"]["spoken"], true);
        assert!(output["data"].get("spoken_status").is_none());
    }

    #[test]
    fn an_unknown_or_odd_version_is_warned_about_and_still_served() {
        for data in [r#"{}"#, r#"{"version":"banana"}"#, r#"{"version":"3.0.0"}"#] {
            let replies = ready(&mut Rtvi::new(), data);
            assert_eq!(replies.len(), 2, "{data}");
            assert_eq!(replies[0]["type"], "error-response", "{data}");
            assert_eq!(replies[0]["id"], "abc");
            assert_eq!(replies[1]["type"], "bot-ready", "{data}");
        }
    }

    #[test]
    fn a_message_over_the_limit_is_answered_unread() {
        let mut rtvi = Rtvi::new();
        let huge = format!(
            r#"{{"label":"rtvi-ai","type":"send-text","data":{{"content":"{}"}}}}"#,
            "a".repeat(1 << 20)
        );
        let ClientMessage::Invalid(reply) = rtvi.parse(&huge) else {
            panic!("a megabyte is not read");
        };
        let reply: Value = serde_json::from_str(&reply).expect("JSON");
        assert_eq!(reply["type"], "error-response");
        let error = reply["data"]["error"].as_str().expect("a reason");
        assert!(error.starts_with("message_too_large"), "{error}");
    }

    #[test]
    fn text_unknown_and_malformed_messages() {
        let mut rtvi = Rtvi::new();
        assert_eq!(
            rtvi.parse(
                r#"{"label":"rtvi-ai","type":"send-text","id":"1","data":{"content":"hi"}}"#
            ),
            ClientMessage::Text(SendText {
                id: Some("1".into()),
                content: "hi".into(),
                run_immediately: true,
                audio_response: true,
            })
        );
        assert_eq!(
            rtvi.parse(r#"{"label":"rtvi-ai","type":"disconnect-bot","id":"2"}"#),
            ClientMessage::Disconnect
        );
        for bad in [
            r#"{"label":"rtvi-ai","type":"dance","id":"3"}"#,
            r#"{"label":"other","type":"client-ready"}"#,
            "not json",
            r#"{"label":"rtvi-ai","type":"send-text","data":{}}"#,
        ] {
            let ClientMessage::Invalid(reply) = rtvi.parse(bad) else {
                panic!("{bad} is invalid");
            };
            assert!(reply.contains("error-response"), "{reply}");
        }
    }

    #[test]
    fn events_render_as_rtvi_messages() {
        let mut rtvi = Rtvi::new();
        let rendered = rtvi.render(&Event::UserTranscription {
            text: "hello".into(),
            is_final: true,
        });
        let value: Value = serde_json::from_str(&rendered[0]).expect("json");
        assert_eq!(value["type"], "user-transcription");
        assert_eq!(value["data"]["text"], "hello");
        assert_eq!(value["data"]["final"], true);
        let call = rtvi.render(&Event::ToolCallStarted {
            name: "get_weather".into(),
            tool_call_id: "c1".into(),
            arguments: json!({"city": "Paris"}),
        });
        let kinds: Vec<Value> = call
            .iter()
            .map(|m| serde_json::from_str::<Value>(m).expect("json")["type"].clone())
            .collect();
        assert_eq!(
            kinds,
            [
                json!("llm-function-call-started"),
                json!("llm-function-call-in-progress")
            ]
        );
        let progress = rtvi.render(&Event::ToolCallIntermediate {
            name: "set_timer".into(),
            tool_call_id: "c2".into(),
            result: Some(json!({"seconds_left": 2})),
        });
        let progress: Value = serde_json::from_str(&progress[0]).expect("json");
        assert_eq!(progress["type"], "server-message");
        assert_eq!(
            progress["data"],
            json!({"type": "llm-function-call-intermediate", "function_name": "set_timer",
                "tool_call_id": "c2", "result": {"seconds_left": 2}})
        );
        assert!(rtvi.render(&Event::SessionStarted).is_empty());
    }

    #[test]
    fn token_metrics_carry_each_calls_dollars_and_the_sessions() {
        let mut rtvi = Rtvi::new();
        let usage = |cost| Event::Metrics {
            data: vec![MetricsData::LlmUsage {
                processor: "LlmService".into(),
                model: Some("gpt-4.1-mini".into()),
                usage: crate::frames::TokenUsage {
                    input: 900,
                    output: 20,
                    cache_read: 100,
                    cache_write: 0,
                },
                cost_usd: cost,
            }],
        };
        let first: Value = serde_json::from_str(&rtvi.render(&usage(Some(0.25)))[0]).expect("json");
        assert_eq!(first["type"], "metrics");
        let tokens = &first["data"]["tokens"][0];
        assert_eq!(tokens["value"]["prompt_tokens"], 1000);
        assert_eq!(tokens["value"]["completion_tokens"], 20);
        assert_eq!(tokens["value"]["cache_read_input_tokens"], 100);
        assert_eq!(tokens["cost_usd"], 0.25);
        let unpriced: Value = serde_json::from_str(&rtvi.render(&usage(None))[0]).expect("json");
        assert_eq!(unpriced["data"]["tokens"][0]["cost_usd"], Value::Null);
        let second: Value = serde_json::from_str(&rtvi.render(&usage(Some(0.5)))[0]).expect("json");
        assert_eq!(second["data"]["tokens"][0]["session_cost_usd"], 0.75);
    }

    fn client(kind: &str, data: Value) -> String {
        json!({"label": LABEL, "type": kind, "id": "m1", "data": data}).to_string()
    }

    fn refusal(message: ClientMessage) -> String {
        let ClientMessage::Invalid(reply) = message else {
            panic!("refused: {message:?}");
        };
        let reply: Value = serde_json::from_str(&reply).expect("json");
        assert_eq!(reply["type"], "error-response");
        assert_eq!(reply["id"], "m1");
        reply["data"]["error"].as_str().expect("why").to_owned()
    }

    #[test]
    fn send_text_options_default_to_pipecats_and_are_checked() {
        let mut rtvi = Rtvi::new();
        let ClientMessage::Text(text) = rtvi.parse(&client(
            "send-text",
            json!({"content": "Hi", "options": {"run_immediately": false, "audio_response": false}}),
        )) else {
            panic!("text");
        };
        assert!(!text.run_immediately && !text.audio_response);
        assert_eq!(text.id.as_deref(), Some("m1"));
        let why = refusal(rtvi.parse(&client(
            "send-text",
            json!({"content": "Hi", "options": {"run_immediately": "yes"}}),
        )));
        assert!(why.contains("run_immediately"), "{why}");
    }

    #[test]
    fn raw_audio_is_decoded_mixed_to_mono_and_bounded() {
        let mut rtvi = Rtvi::new();
        let pcm = |samples: &[i16]| crate::audio::pcm_to_base64(samples);
        assert_eq!(
            rtvi.parse(&client(
                "raw-audio",
                json!({"base64Audio": pcm(&[1, -1, 300]), "sampleRate": 16000, "numChannels": 1})
            )),
            ClientMessage::Audio {
                samples: vec![1, -1, 300],
                sample_rate: 16_000
            }
        );
        assert_eq!(
            rtvi.parse(&client(
                "raw-audio-batch",
                json!({"base64AudioBatch": [pcm(&[100, 300]), pcm(&[-2, 0])], "sampleRate": 48000, "numChannels": 2})
            )),
            ClientMessage::Audio {
                samples: vec![200, -1],
                sample_rate: 48_000
            }
        );
        for (data, expected) in [
            (
                json!({"base64Audio": pcm(&[1]), "sampleRate": 4000}),
                "sampleRate",
            ),
            (
                json!({"base64Audio": pcm(&[1]), "sampleRate": 16000, "numChannels": 6}),
                "numChannels",
            ),
            (json!({"base64Audio": "AAE", "sampleRate": 16000}), "base64"),
            (
                json!({"base64Audio": pcm(&[1, 2, 3]), "sampleRate": 16000, "numChannels": 2}),
                "stereo",
            ),
            (json!({"sampleRate": 16000}), "base64Audio"),
        ] {
            let why = refusal(rtvi.parse(&client("raw-audio", data)));
            assert!(why.contains(expected), "{why}");
        }
    }

    #[test]
    fn dtmf_takes_keypad_keys_in_order() {
        let mut rtvi = Rtvi::new();
        assert_eq!(
            rtvi.parse(&client("dtmf", json!({"buttons": ["1", "2", "#"]}))),
            ClientMessage::Dtmf("12#".into())
        );
        assert_eq!(
            rtvi.parse(&client("dtmf", json!({"button": "*"}))),
            ClientMessage::Dtmf("*".into())
        );
        for data in [
            json!({"buttons": []}),
            json!({"buttons": ["12"]}),
            json!({"buttons": ["A"]}),
            json!({"buttons": vec!["1"; MAX_DTMF_KEYS + 1]}),
        ] {
            refusal(rtvi.parse(&client("dtmf", data)));
        }
    }

    #[test]
    fn the_eval_harness_messages_are_read() {
        let mut rtvi = Rtvi::new();
        let eval = |t: &str, d: Value| client("client-message", json!({"t": t, "d": d}));
        let connect = eval(
            "eval-connect",
            json!({"skip_tts": true, "capture_bot_audio": false, "capture_bot_images": false}),
        );
        let flags = EvalFlags {
            skip_tts: true,
            capture_bot_audio: false,
        };
        assert_eq!(
            rtvi.parse(&connect),
            ClientMessage::Eval(EvalMessage::Connect(flags))
        );
        assert_eq!(eval_connect(&connect), Some(flags));
        assert_eq!(eval_connect(&client("client-ready", json!({}))), None);
        assert_eq!(
            rtvi.parse(&eval(
                "eval-configure",
                json!({"function_call_report_level": {"*": "full"}, "vad_user_speaking": true})
            )),
            ClientMessage::Eval(EvalMessage::Configure {
                report_level: Some(ReportLevel::Full)
            })
        );
        assert_eq!(
            rtvi.parse(&eval("eval-configure", json!({"llm_markers": true}))),
            ClientMessage::Eval(EvalMessage::Configure { report_level: None })
        );
        let ClientMessage::Eval(EvalMessage::Context(messages)) = rtvi.parse(&eval(
            "eval-context",
            json!({"messages": [{"role": "user", "content": "I am Alex."}, {"role": "assistant", "content": "Hi Alex."}]}),
        )) else {
            panic!("context");
        };
        assert_eq!(
            messages,
            [Message::user("I am Alex."), Message::assistant("Hi Alex.")]
        );
        assert_eq!(
            rtvi.parse(&eval("eval-cancel", json!({}))),
            ClientMessage::Eval(EvalMessage::Cancel)
        );
        for (message, expected) in [
            (
                eval(
                    "eval-configure",
                    json!({"function_call_report_level": {"get_weather": "full"}}),
                ),
                "\"*\"",
            ),
            (
                eval(
                    "eval-configure",
                    json!({"function_call_report_level": {"*": "everything"}}),
                ),
                "report level",
            ),
            (
                eval("eval-context", json!({"messages": [{"role": "robot"}]})),
                "a message",
            ),
            (
                eval("eval-image", json!({"image": "", "format": "image/png"})),
                "images",
            ),
            (eval("my-app", json!({})), "my-app"),
        ] {
            let why = refusal(rtvi.parse(&message));
            assert!(why.contains(expected), "{why}");
        }
    }

    #[test]
    fn the_llms_response_interruptions_and_what_the_user_said_render_as_pipecat_sends_them() {
        let mut rtvi = Rtvi::new();
        let kinds = |rtvi: &mut Rtvi, event: Event| -> Vec<Value> {
            rtvi.render(&event)
                .iter()
                .map(|m| serde_json::from_str(m).expect("json"))
                .collect()
        };
        assert_eq!(
            kinds(&mut rtvi, Event::LlmStarted)[0]["type"],
            "bot-llm-started"
        );
        let text = kinds(&mut rtvi, Event::LlmText { text: "Hel".into() });
        assert_eq!(text[0]["type"], "bot-llm-text");
        assert_eq!(text[0]["data"]["text"], "Hel");
        assert_eq!(
            kinds(&mut rtvi, Event::LlmStopped)[0]["type"],
            "bot-llm-stopped"
        );
        assert_eq!(
            kinds(&mut rtvi, Event::Interruption)[0]["type"],
            "bot-interrupted"
        );
        let said = kinds(
            &mut rtvi,
            Event::UserTranscription {
                text: "Hello.".into(),
                is_final: true,
            },
        );
        assert_eq!(said[1]["type"], "user-input");
        assert_eq!(said[1]["data"]["input_type"], "transcription");
        assert_eq!(said[1]["data"]["final"], true);
        assert_eq!(said[1]["data"]["text"], "Hello.");
    }

    #[test]
    fn what_the_voice_will_say_reaches_the_client_as_the_bot_says_it() {
        let mut rtvi = Rtvi::new();
        let kinds = |messages: Vec<String>| -> Vec<String> {
            messages
                .iter()
                .map(|m| {
                    serde_json::from_str::<Value>(m).expect("json")["type"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect()
        };
        let said = |text: &str| Event::BotText { text: text.into() };
        assert!(
            rtvi.render(&said("It is noon.")).is_empty(),
            "held until heard"
        );
        assert_eq!(
            kinds(rtvi.render(&Event::BotStartedSpeaking)),
            ["bot-started-speaking", "bot-output", "bot-tts-text"]
        );
        assert_eq!(
            kinds(rtvi.render(&said("And sunny."))),
            ["bot-output", "bot-tts-text"]
        );
        rtvi.render(&Event::BotStoppedSpeaking);
        // An interruption drops what was never heard.
        assert!(rtvi.render(&said("Unheard.")).is_empty());
        rtvi.render(&Event::Interruption);
        assert_eq!(
            kinds(rtvi.render(&Event::BotStartedSpeaking)),
            ["bot-started-speaking"]
        );
    }

    #[test]
    fn a_text_sessions_answer_goes_out_as_sentences_that_will_not_be_spoken() {
        let mut rtvi = Rtvi::new();
        rtvi.set_text_only(true);
        let outputs = |messages: Vec<String>| -> Vec<Value> {
            messages
                .iter()
                .map(|m| serde_json::from_str::<Value>(m).expect("json"))
                .filter(|m| m["type"] == "bot-output")
                .collect()
        };
        rtvi.render(&Event::LlmStarted);
        assert!(
            outputs(rtvi.render(&Event::LlmText {
                text: "12 plus 30".into()
            }))
            .is_empty()
        );
        let first = outputs(rtvi.render(&Event::LlmText {
            text: " is 42. Any".into(),
        }));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0]["data"]["text"], "12 plus 30 is 42.");
        assert_eq!(first[0]["data"]["will_be_spoken"], false);
        assert_eq!(first[0]["data"]["spoken_status"], "new");
        let rest = rtvi.render(&Event::LlmStopped);
        let kinds: Vec<Value> = rest
            .iter()
            .map(|m| serde_json::from_str::<Value>(m).expect("json")["type"].clone())
            .collect();
        assert_eq!(kinds, [json!("bot-output"), json!("bot-llm-stopped")]);
        assert_eq!(outputs(rest)[0]["data"]["text"], "Any");
        // A spoken session leaves its output to the voice.
        let mut spoken = Rtvi::new();
        spoken.render(&Event::LlmStarted);
        assert!(
            outputs(spoken.render(&Event::LlmText {
                text: "Hi there. ".into()
            }))
            .is_empty()
        );
    }
}
