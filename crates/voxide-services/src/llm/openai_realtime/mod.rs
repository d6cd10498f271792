//! OpenAI Realtime over its WebSocket (GA event names): PCM16 at 24 kHz both ways, server or
//! semantic VAD or voxide's own turns, tools through `function_call_output`.
//!
//! Use it as `RealtimeService::new(OpenAiRealtime::new(settings), context, options)`.

mod wire;

use serde_json::{Value, json};

use super::realtime::{
    ConnectRequest, Delivery, DeliveryKind, PlayedAudio, RealtimeError, RealtimeEvent,
    RealtimeProtocol, SessionSetup, connect_request, pcm_from_base64, pcm_to_base64, with_query,
};
use voxide_core::context::adapters::openai_realtime as adapter;
use voxide_core::context::{Message, ToolChoice};
use voxide_core::frames::{FunctionCallRequest, TokenUsage};
use wire::ServerEvent;

/// OpenAI's Realtime endpoint.
pub const DEFAULT_URL: &str = "wss://api.openai.com/v1/realtime";
/// The default model.
pub const DEFAULT_MODEL: &str = "gpt-realtime";
/// The default voice.
pub const DEFAULT_VOICE: &str = "marin";
/// The only PCM rate the API takes and gives.
pub const SAMPLE_RATE: u32 = 24_000;

/// Who decides when the user's turn ends.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnDetection {
    /// The provider's VAD on silence; it also interrupts the bot.
    ServerVad,
    /// The provider's semantic VAD (ends turns when the words sound finished).
    SemanticVad,
    /// voxide's own VAD and turn model upstream: the service commits the audio and asks for a
    /// response when the user's turn ends.
    Local,
}

/// Settings of an OpenAI Realtime session.
#[derive(Debug, Clone)]
pub struct OpenAiRealtimeSettings {
    /// The API key.
    pub api_key: voxide_core::secret::Secret,
    /// The WebSocket URL without the model (a compatible server or a test double may stand in).
    pub url: String,
    /// The model.
    pub model: String,
    /// The voice.
    pub voice: String,
    /// Who ends turns.
    pub turn_detection: TurnDetection,
    /// The model that transcribes the user's audio (`None`: no user transcripts).
    pub transcription_model: Option<String>,
}

impl OpenAiRealtimeSettings {
    /// Settings with `api_key` and the defaults.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            api_key: voxide_core::secret::Secret::new(api_key),
            url: DEFAULT_URL.to_owned(),
            model: DEFAULT_MODEL.to_owned(),
            voice: DEFAULT_VOICE.to_owned(),
            turn_detection: TurnDetection::ServerVad,
            transcription_model: Some("gpt-4o-mini-transcribe".to_owned()),
        }
    }

    /// Settings from `OPENAI_API_KEY` (required) and `OPENAI_REALTIME_URL` (optional).
    pub fn from_env() -> Result<Self, RealtimeError> {
        let key = std::env::var("OPENAI_API_KEY")
            .ok()
            .filter(|k| !k.trim().is_empty())
            .ok_or_else(|| {
                RealtimeError::Config(
                    "OPENAI_API_KEY is not set; OpenAI Realtime needs an API key".to_owned(),
                )
            })?;
        let mut settings = Self::new(key);
        if let Ok(url) = std::env::var("OPENAI_REALTIME_URL")
            && !url.trim().is_empty()
        {
            settings.url = url;
        }
        Ok(settings)
    }
}

/// The OpenAI Realtime protocol.
#[derive(Debug)]
pub struct OpenAiRealtime {
    settings: OpenAiRealtimeSettings,
    /// Calls of the current response, handed over when it is done.
    calls: Vec<FunctionCallRequest>,
}

impl OpenAiRealtime {
    /// The protocol with `settings`.
    pub fn new(settings: OpenAiRealtimeSettings) -> Self {
        Self {
            settings,
            calls: Vec::new(),
        }
    }

    fn turn_detection(&self) -> Value {
        match self.settings.turn_detection {
            TurnDetection::ServerVad => json!({"type": "server_vad"}),
            TurnDetection::SemanticVad => json!({"type": "semantic_vad"}),
            TurnDetection::Local => Value::Null,
        }
    }
}

impl RealtimeProtocol for OpenAiRealtime {
    fn provider(&self) -> &str {
        "openai"
    }

    fn model(&self) -> &str {
        &self.settings.model
    }

    fn request(&self) -> Result<ConnectRequest, RealtimeError> {
        let url = with_query(&self.settings.url, "model", &self.settings.model);
        let auth = format!("Bearer {}", self.settings.api_key.expose());
        connect_request(&url, &[("authorization", &auth)])
    }

    fn input_rate(&self) -> u32 {
        SAMPLE_RATE
    }

    fn output_rate(&self) -> u32 {
        SAMPLE_RATE
    }

    fn setup(&self, setup: &SessionSetup) -> Vec<Value> {
        let format = json!({"type": "audio/pcm", "rate": SAMPLE_RATE});
        let mut input = json!({"format": format, "turn_detection": self.turn_detection()});
        if let Some(model) = &self.settings.transcription_model {
            input["transcription"] = json!({"model": model});
        }
        let mut session = json!({
            "type": "realtime",
            "model": self.settings.model,
            "output_modalities": ["audio"],
            "audio": {
                "input": input,
                "output": {"format": format, "voice": self.settings.voice},
            },
            "tools": adapter::tools(&setup.tools),
            "tool_choice": adapter::tool_choice(setup.tool_choice.as_ref().unwrap_or(&ToolChoice::Auto)),
        });
        if let Some(instructions) = adapter::instructions(&setup.messages) {
            session["instructions"] = Value::String(instructions);
        }
        vec![json!({"type": "session.update", "session": session})]
    }

    fn update(&self, setup: &SessionSetup) -> Option<Vec<Value>> {
        let mut session = json!({
            "type": "realtime",
            "tools": adapter::tools(&setup.tools),
            "tool_choice": adapter::tool_choice(setup.tool_choice.as_ref().unwrap_or(&ToolChoice::Auto)),
        });
        if let Some(instructions) = adapter::instructions(&setup.messages) {
            session["instructions"] = Value::String(instructions);
        }
        Some(vec![json!({"type": "session.update", "session": session})])
    }

    fn audio(&self, samples: &[i16]) -> Value {
        json!({"type": "input_audio_buffer.append", "audio": pcm_to_base64(samples)})
    }

    fn deliveries(&self, messages: &[Message]) -> Vec<Delivery> {
        adapter::items(messages)
            .into_iter()
            .map(|item| {
                let kind = if item.key.starts_with("output:") {
                    DeliveryKind::ToolResult
                } else if item.key.starts_with("partial:") {
                    DeliveryKind::PartialResult
                } else {
                    DeliveryKind::History
                };
                Delivery {
                    key: item.key,
                    kind,
                    messages: vec![json!({"type": "conversation.item.create", "item": item.item})],
                }
            })
            .collect()
    }

    fn respond(&self) -> Option<Value> {
        Some(json!({"type": "response.create"}))
    }

    fn interrupt(&self, played: Option<&PlayedAudio>) -> Vec<Value> {
        let mut out = Vec::new();
        // The server's own VAD has cancelled the response already when it heard the user.
        if self.settings.turn_detection == TurnDetection::Local {
            out.push(json!({"type": "response.cancel"}));
        }
        if let Some(PlayedAudio {
            item_id: Some(item_id),
            played_ms,
        }) = played
        {
            out.push(json!({
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": played_ms,
            }));
        }
        out
    }

    fn user_started(&self) -> Vec<Value> {
        Vec::new()
    }

    fn user_stopped(&self) -> Vec<Value> {
        if self.settings.turn_detection != TurnDetection::Local {
            return Vec::new();
        }
        vec![
            json!({"type": "input_audio_buffer.commit"}),
            json!({"type": "response.create"}),
        ]
    }

    fn parse(&mut self, text: &str) -> Result<Vec<RealtimeEvent>, RealtimeError> {
        let unreadable = |reason: String| RealtimeError::Unreadable {
            provider: "openai",
            reason,
        };
        let event: ServerEvent =
            serde_json::from_str(text).map_err(|e| unreadable(e.to_string()))?;
        Ok(match event {
            ServerEvent::SessionUpdated => vec![RealtimeEvent::Ready],
            ServerEvent::SpeechStarted => vec![RealtimeEvent::UserStarted],
            ServerEvent::SpeechStopped => vec![RealtimeEvent::UserStopped],
            ServerEvent::TranscriptionDelta { delta } => vec![RealtimeEvent::UserTranscript {
                text: delta,
                is_final: false,
            }],
            ServerEvent::TranscriptionCompleted { transcript } => {
                vec![RealtimeEvent::UserTranscript {
                    text: transcript,
                    is_final: true,
                }]
            }
            ServerEvent::ResponseCreated => {
                self.calls.clear();
                vec![RealtimeEvent::ResponseStarted]
            }
            ServerEvent::AudioDelta { delta, item_id } => {
                let samples = pcm_from_base64(&delta).map_err(unreadable)?;
                vec![RealtimeEvent::Audio { samples, item_id }]
            }
            ServerEvent::TextDelta { delta } => vec![RealtimeEvent::BotText(delta)],
            ServerEvent::FunctionCallArgumentsDone {
                name,
                call_id,
                arguments,
            } => {
                self.calls.push(FunctionCallRequest {
                    function_name: name,
                    tool_call_id: call_id,
                    arguments: super::tools::parse_arguments(&arguments),
                });
                Vec::new()
            }
            ServerEvent::ResponseDone { response } => self.response_done(response),
            ServerEvent::Error { error } => vec![RealtimeEvent::Error(
                error.message.unwrap_or_else(|| "unknown error".to_owned()),
            )],
            ServerEvent::Other => Vec::new(),
        })
    }
}

impl OpenAiRealtime {
    fn response_done(&mut self, response: wire::Response) -> Vec<RealtimeEvent> {
        let status = response.status.as_deref().unwrap_or("completed");
        let mut out = Vec::new();
        if status == "failed" {
            let message = response
                .status_details
                .and_then(|details| details.error)
                .and_then(|error| error.message)
                .unwrap_or_else(|| "the response failed".to_owned());
            out.push(RealtimeEvent::Error(message));
        }
        let calls = std::mem::take(&mut self.calls);
        if !calls.is_empty() && status == "completed" {
            out.push(RealtimeEvent::ToolCalls(calls));
        }
        if let Some(usage) = response.usage {
            let cached = usage.input_token_details.map_or(0, |d| d.cached_tokens);
            out.push(RealtimeEvent::Usage(TokenUsage {
                input: usage.input_tokens.saturating_sub(cached),
                output: usage.output_tokens,
                cache_read: cached,
                cache_write: 0,
            }));
        }
        out.push(RealtimeEvent::ResponseDone {
            cancelled: status != "completed",
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protocol(turns: TurnDetection) -> OpenAiRealtime {
        let mut settings = OpenAiRealtimeSettings::new("k");
        settings.turn_detection = turns;
        OpenAiRealtime::new(settings)
    }

    #[test]
    fn calls_are_handed_over_when_the_response_is_done() {
        let mut p = protocol(TurnDetection::ServerVad);
        assert_eq!(
            p.parse(r#"{"type":"response.created","response":{"id":"r1"}}"#),
            Ok(vec![RealtimeEvent::ResponseStarted])
        );
        let done = r#"{"type":"response.function_call_arguments.done","response_id":"r1","item_id":"i1","output_index":0,"call_id":"c1","name":"calc","arguments":"{\"x\":1}"}"#;
        assert_eq!(p.parse(done), Ok(vec![]));
        let events = p
            .parse(r#"{"type":"response.done","response":{"id":"r1","status":"completed","usage":{"total_tokens":30,"input_tokens":20,"output_tokens":10,"input_token_details":{"cached_tokens":5}}}}"#)
            .expect("parses");
        assert_eq!(
            events,
            vec![
                RealtimeEvent::ToolCalls(vec![FunctionCallRequest {
                    function_name: "calc".into(),
                    tool_call_id: "c1".into(),
                    arguments: json!({"x": 1}),
                }]),
                RealtimeEvent::Usage(TokenUsage {
                    input: 15,
                    output: 10,
                    cache_read: 5,
                    cache_write: 0
                }),
                RealtimeEvent::ResponseDone { cancelled: false },
            ]
        );
    }

    #[test]
    fn malformed_events_are_errors_not_panics() {
        let mut p = protocol(TurnDetection::ServerVad);
        assert!(matches!(
            p.parse("{"),
            Err(RealtimeError::Unreadable {
                provider: "openai",
                ..
            })
        ));
        assert!(p.parse(r#"{"no":"type"}"#).is_err());
        assert!(
            p.parse(r#"{"type":"response.output_audio.delta","delta":"!!"}"#)
                .is_err()
        );
        assert!(
            p.parse(r#"{"type":"response.function_call_arguments.done"}"#)
                .is_err()
        );
        assert_eq!(p.parse(r#"{"type":"rate_limits.updated"}"#), Ok(vec![]));
    }

    #[test]
    fn local_turns_commit_and_cancel_themselves() {
        let local = protocol(TurnDetection::Local);
        assert_eq!(local.user_stopped().len(), 2);
        let played = PlayedAudio {
            item_id: Some("i1".into()),
            played_ms: 640,
        };
        let cut = local.interrupt(Some(&played));
        assert_eq!(cut[0]["type"], "response.cancel");
        assert_eq!(cut[1]["audio_end_ms"], 640);
        let server = protocol(TurnDetection::ServerVad);
        assert!(server.user_stopped().is_empty());
        assert_eq!(server.interrupt(Some(&played)).len(), 1);
    }
}
