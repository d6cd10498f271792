//! Google Gemini Live over its WebSocket (`BidiGenerateContent`): PCM16 at 16 kHz in and 24 kHz
//! out, async tools declared `NON_BLOCKING`, results through `toolResponse`.
//!
//! Use it as `RealtimeService::new(GeminiLive::new(settings), context, options)`.

mod wire;

use serde_json::{Value, json};

use super::realtime::{
    ConnectRequest, Delivery, DeliveryKind, PlayedAudio, RealtimeError, RealtimeEvent,
    RealtimeProtocol, SessionSetup, connect_request, pcm_from_base64, pcm_to_base64, with_query,
};
use voxide_core::context::Message;
use voxide_core::context::adapters::gemini_live as adapter;
use voxide_core::frames::{FunctionCallRequest, TokenUsage};
use wire::{ServerContent, ServerMessage, ToolCall};

/// Gemini Live's endpoint.
pub const DEFAULT_URL: &str = "wss://generativelanguage.googleapis.com/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent";
/// The default model.
pub const DEFAULT_MODEL: &str = "gemini-2.5-flash-native-audio-preview-09-2025";
/// The default voice.
pub const DEFAULT_VOICE: &str = "Puck";
/// The rate Gemini takes audio at.
pub const INPUT_RATE: u32 = 16_000;
/// The rate of Gemini's audio.
pub const OUTPUT_RATE: u32 = 24_000;

/// Settings of a Gemini Live session.
#[derive(Debug, Clone)]
pub struct GeminiLiveSettings {
    /// The API key.
    pub api_key: voxide_core::secret::Secret,
    /// The WebSocket URL (a test double may stand in).
    pub url: String,
    /// The model.
    pub model: String,
    /// The voice.
    pub voice: String,
    /// True: Gemini's own activity detection ends turns; false: voxide's turns do
    /// (`activityStart` / `activityEnd`).
    pub server_turns: bool,
}

impl GeminiLiveSettings {
    /// Settings with `api_key` and the defaults.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            api_key: voxide_core::secret::Secret::new(api_key),
            url: DEFAULT_URL.to_owned(),
            model: DEFAULT_MODEL.to_owned(),
            voice: DEFAULT_VOICE.to_owned(),
            server_turns: true,
        }
    }

    /// Settings from `GEMINI_API_KEY` or `GOOGLE_API_KEY`, and `GEMINI_LIVE_URL` (optional).
    pub fn from_env() -> Result<Self, RealtimeError> {
        let key = ["GEMINI_API_KEY", "GOOGLE_API_KEY"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|k| !k.trim().is_empty()))
            .ok_or_else(|| {
                RealtimeError::Config(
                    "GEMINI_API_KEY (or GOOGLE_API_KEY) is not set; Gemini Live needs an API key"
                        .to_owned(),
                )
            })?;
        let mut settings = Self::new(key);
        if let Ok(url) = std::env::var("GEMINI_LIVE_URL")
            && !url.trim().is_empty()
        {
            settings.url = url;
        }
        Ok(settings)
    }
}

/// The Gemini Live protocol.
#[derive(Debug)]
pub struct GeminiLive {
    settings: GeminiLiveSettings,
    /// The model is producing a turn.
    responding: bool,
    /// The user's words of this turn so far (Gemini streams them without a final marker).
    user_text: String,
}

impl GeminiLive {
    /// The protocol with `settings`.
    pub fn new(settings: GeminiLiveSettings) -> Self {
        Self {
            settings,
            responding: false,
            user_text: String::new(),
        }
    }

    fn model_path(&self) -> String {
        if self.settings.model.starts_with("models/") {
            self.settings.model.clone()
        } else {
            format!("models/{}", self.settings.model)
        }
    }

    fn flush_user(&mut self, out: &mut Vec<RealtimeEvent>) {
        let text = std::mem::take(&mut self.user_text);
        if !text.trim().is_empty() {
            out.push(RealtimeEvent::UserTranscript {
                text: text.trim().to_owned(),
                is_final: true,
            });
        }
    }

    fn start_response(&mut self, out: &mut Vec<RealtimeEvent>) {
        if !self.responding {
            self.responding = true;
            self.flush_user(out);
            out.push(RealtimeEvent::ResponseStarted);
        }
    }

    fn server_content(
        &mut self,
        content: ServerContent,
        out: &mut Vec<RealtimeEvent>,
    ) -> Result<(), RealtimeError> {
        if let Some(text) = content.input_transcription.and_then(|t| t.text) {
            self.user_text.push_str(&text);
            out.push(RealtimeEvent::UserTranscript {
                text: self.user_text.trim().to_owned(),
                is_final: false,
            });
        }
        if content.interrupted {
            self.responding = false;
            out.push(RealtimeEvent::Interrupted);
        }
        let parts = content
            .model_turn
            .map(|turn| turn.parts)
            .unwrap_or_default();
        for data in parts.into_iter().filter_map(|part| part.inline_data) {
            let samples = pcm_from_base64(&data.data).map_err(unreadable)?;
            self.start_response(out);
            out.push(RealtimeEvent::Audio {
                samples,
                item_id: None,
            });
        }
        if let Some(text) = content.output_transcription.and_then(|t| t.text) {
            self.start_response(out);
            out.push(RealtimeEvent::BotText(text));
        }
        if content.turn_complete {
            self.flush_user(out);
            if std::mem::take(&mut self.responding) {
                out.push(RealtimeEvent::ResponseDone { cancelled: false });
            }
        }
        Ok(())
    }

    fn tool_call(&mut self, call: ToolCall, out: &mut Vec<RealtimeEvent>) {
        let calls = call
            .function_calls
            .into_iter()
            .map(|c| FunctionCallRequest {
                function_name: c.name,
                tool_call_id: c.id,
                arguments: match c.args {
                    args @ Value::Object(_) => args,
                    _ => json!({}),
                },
            })
            .collect();
        self.start_response(out);
        out.push(RealtimeEvent::ToolCalls(calls));
        // Gemini's turn pauses on a call: the response is over until it speaks again.
        self.responding = false;
        out.push(RealtimeEvent::ResponseDone { cancelled: false });
    }
}

/// A server message that does not read as Gemini Live's.
fn unreadable(reason: String) -> RealtimeError {
    RealtimeError::Unreadable {
        provider: "google",
        reason,
    }
}

impl RealtimeProtocol for GeminiLive {
    fn provider(&self) -> &str {
        "google"
    }

    fn model(&self) -> &str {
        &self.settings.model
    }

    fn request(&self) -> Result<ConnectRequest, RealtimeError> {
        connect_request(
            &with_query(&self.settings.url, "key", self.settings.api_key.expose()),
            &[],
        )
    }

    fn input_rate(&self) -> u32 {
        INPUT_RATE
    }

    fn output_rate(&self) -> u32 {
        OUTPUT_RATE
    }

    fn setup(&self, setup: &SessionSetup) -> Vec<Value> {
        let mut config = json!({
            "model": self.model_path(),
            "generationConfig": {
                "responseModalities": ["AUDIO"],
                "speechConfig": {"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": self.settings.voice}}},
            },
            "tools": adapter::tools(&setup.tools, &setup.async_functions),
            "inputAudioTranscription": {},
            "outputAudioTranscription": {},
        });
        if let Some(instruction) = adapter::system_instruction(&setup.messages) {
            config["systemInstruction"] = instruction;
        }
        if !self.settings.server_turns {
            config["realtimeInputConfig"] =
                json!({"automaticActivityDetection": {"disabled": true}});
        }
        vec![json!({"setup": config})]
    }

    /// A `contextUpdate`: the Live API's in-session change of instructions and tools, applied in
    /// order with the inputs around it (so before the function response that follows it). The
    /// tools come wrapped, as the API has them, so that an empty list clears them.
    fn update(&self, setup: &SessionSetup) -> Option<Vec<Value>> {
        let mut update = json!({
            "tools": {"tools": adapter::tools(&setup.tools, &setup.async_functions)},
        });
        if let Some(instruction) = adapter::system_instruction(&setup.messages) {
            update["systemInstruction"] = instruction;
        }
        Some(vec![json!({"contextUpdate": update})])
    }

    fn audio(&self, samples: &[i16]) -> Value {
        json!({"realtimeInput": {"audio": {
            "data": pcm_to_base64(samples),
            "mimeType": format!("audio/pcm;rate={INPUT_RATE}"),
        }}})
    }

    fn deliveries(&self, messages: &[Message]) -> Vec<Delivery> {
        adapter::items(messages)
            .into_iter()
            .map(|item| Delivery {
                kind: if item.key.starts_with("output:") {
                    DeliveryKind::ToolResult
                } else if item.key.starts_with("partial:") {
                    DeliveryKind::PartialResult
                } else {
                    DeliveryKind::History
                },
                key: item.key,
                messages: vec![item.message],
            })
            .collect()
    }

    fn respond(&self) -> Option<Value> {
        // Gemini answers a tool response by itself (per its scheduling).
        None
    }

    fn interrupt(&self, _played: Option<&PlayedAudio>) -> Vec<Value> {
        // Gemini stops on its own when it hears the user (or on activityStart); there is no
        // truncation message.
        Vec::new()
    }

    fn user_started(&self) -> Vec<Value> {
        if self.settings.server_turns {
            return Vec::new();
        }
        vec![json!({"realtimeInput": {"activityStart": {}}})]
    }

    fn user_stopped(&self) -> Vec<Value> {
        if self.settings.server_turns {
            return Vec::new();
        }
        vec![json!({"realtimeInput": {"activityEnd": {}}})]
    }

    fn parse(&mut self, text: &str) -> Result<Vec<RealtimeEvent>, RealtimeError> {
        // serde would read a struct from an array too; the wire has only objects.
        if !text.trim_start().starts_with('{') {
            return Err(unreadable(
                "a server message that is not an object".to_owned(),
            ));
        }
        let message: ServerMessage =
            serde_json::from_str(text).map_err(|e| unreadable(e.to_string()))?;
        let mut out = Vec::new();
        if message.setup_complete.is_some() {
            out.push(RealtimeEvent::Ready);
        }
        if let Some(content) = message.server_content {
            self.server_content(content, &mut out)?;
        }
        if let Some(call) = message.tool_call {
            self.tool_call(call, &mut out);
        }
        if let Some(cancellation) = message.tool_call_cancellation {
            out.push(RealtimeEvent::ToolCallsCancelled(cancellation.ids));
        }
        if let Some(usage) = message.usage_metadata {
            let cached = usage.cached_content_token_count;
            out.push(RealtimeEvent::Usage(TokenUsage {
                input: usage.prompt_token_count.saturating_sub(cached),
                output: usage.response_token_count,
                cache_read: cached,
                cache_write: 0,
            }));
        }
        if let Some(away) = message.go_away {
            let time_left = away.time_left.unwrap_or_default();
            tracing::info!(%time_left, "Gemini Live will close this connection soon");
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_opens_streams_and_closes() {
        let mut p = GeminiLive::new(GeminiLiveSettings::new("k"));
        let events = p
            .parse(r#"{"serverContent":{"inputTranscription":{"text":"hi there"}}}"#)
            .expect("parses");
        assert!(matches!(
            &events[0],
            RealtimeEvent::UserTranscript {
                is_final: false,
                ..
            }
        ));
        let events = p
            .parse(r#"{"serverContent":{"modelTurn":{"parts":[{"inlineData":{"mimeType":"audio/pcm;rate=24000","data":"AQACAA=="}}]}}}"#)
            .expect("parses");
        assert_eq!(
            events,
            vec![
                RealtimeEvent::UserTranscript {
                    text: "hi there".into(),
                    is_final: true
                },
                RealtimeEvent::ResponseStarted,
                RealtimeEvent::Audio {
                    samples: vec![1, 2],
                    item_id: None
                },
            ]
        );
        let events = p
            .parse(r#"{"serverContent":{"turnComplete":true},"usageMetadata":{"promptTokenCount":9,"responseTokenCount":4}}"#)
            .expect("parses");
        assert_eq!(events[0], RealtimeEvent::ResponseDone { cancelled: false });
        assert!(matches!(
            events[1],
            RealtimeEvent::Usage(TokenUsage {
                input: 9,
                output: 4,
                ..
            })
        ));
    }

    #[test]
    fn malformed_messages_are_errors() {
        let mut p = GeminiLive::new(GeminiLiveSettings::new("k"));
        assert!(matches!(
            p.parse("[1]"),
            Err(RealtimeError::Unreadable {
                provider: "google",
                ..
            })
        ));
        assert!(
            p.parse(r#"{"toolCall":{"functionCalls":[{"args":{}}]}}"#)
                .is_err()
        );
        assert_eq!(p.parse(r#"{"somethingNew":{}}"#), Ok(vec![]));
    }
}
