//! OpenAI-compatible speech (`POST {base}/audio/speech`, `response_format: pcm`): OpenAI's own
//! and the self-hosted servers that speak its API. One request per sentence, its raw 24 kHz
//! PCM streamed back as it comes; an interruption drops the request.
//!
//! The API gives no word timings, so each sentence's words are timed from where its audio starts
//! in the turn at a nominal speaking rate: when the bot is cut off, the words whose estimated
//! end had been played reach the context, not the whole sentence.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::mpsc;

use super::estimated_words;
use super::stream::{
    EVENT_QUEUE, INPUT_QUEUE, TextUnit, TtsContext, TtsEngine, TtsEvent, TtsInput,
};

/// OpenAI's API, when `OPENAI_BASE_URL` names no other.
pub const DEFAULT_BASE_URL: &str = crate::OPENAI_BASE_URL;
/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "gpt-4o-mini-tts";
/// The voice used when none is named.
pub const DEFAULT_VOICE: &str = "alloy";
/// The rate of `pcm` responses.
pub const SAMPLE_RATE: u32 = 24_000;

/// Where and how to speak.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiSpeechSettings {
    /// Up to and including `/v1`: `{base_url}/audio/speech` is called.
    pub base_url: String,
    /// Sent as a bearer token; none for servers that need no key.
    pub api_key: Option<voxide_core::secret::Secret>,
    /// The model.
    pub model: String,
    /// The voice.
    pub voice: String,
    /// How long a sentence's first audio may take.
    pub first_chunk_timeout: Duration,
}

impl OpenAiSpeechSettings {
    /// From `OPENAI_API_KEY` and `OPENAI_BASE_URL`: a key is required for OpenAI's own API.
    pub fn from_env() -> Result<Self, String> {
        let (base_url, api_key) = crate::openai_from_env("--tts openai")?;
        Ok(Self {
            base_url,
            api_key,
            model: DEFAULT_MODEL.to_owned(),
            voice: DEFAULT_VOICE.to_owned(),
            first_chunk_timeout: Duration::from_secs(10),
        })
    }
}

/// The engine.
pub struct OpenAiSpeech {
    settings: OpenAiSpeechSettings,
    client: reqwest::Client,
}

impl OpenAiSpeech {
    /// An engine for `settings`.
    pub fn new(settings: OpenAiSpeechSettings) -> Result<Self, String> {
        Ok(Self {
            settings,
            client: crate::http_client()?,
        })
    }

    /// Its settings.
    pub fn settings(&self) -> &OpenAiSpeechSettings {
        &self.settings
    }
}

impl TtsEngine for OpenAiSpeech {
    fn name(&self) -> &str {
        "openai"
    }

    fn model(&self) -> &str {
        &self.settings.model
    }

    fn sample_rate(&self) -> u32 {
        SAMPLE_RATE
    }

    fn text_unit(&self) -> TextUnit {
        TextUnit::Sentence
    }

    fn open(&self) -> TtsContext {
        let (input, inputs) = mpsc::channel(INPUT_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let speaker = Speaker {
            client: self.client.clone(),
            settings: self.settings.clone(),
            events: events_tx,
            offset: 0.0,
        };
        tokio::spawn(speaker.run(inputs));
        TtsContext { input, events }
    }
}

/// One turn's requests, in order.
struct Speaker {
    client: reqwest::Client,
    settings: OpenAiSpeechSettings,
    events: mpsc::Sender<TtsEvent>,
    /// Seconds of the turn's audio so far.
    offset: f64,
}

/// Why a sentence was not spoken.
enum Failure {
    /// This sentence; the next may work.
    Passing(String),
    /// The key or the request: every sentence will fail.
    Permanent(String),
    /// The context was dropped.
    Gone,
}

impl Speaker {
    async fn run(mut self, mut inputs: mpsc::Receiver<TtsInput>) {
        while let Some(input) = inputs.recv().await {
            let text = match input {
                TtsInput::Text(text) => text.trim().to_owned(),
                TtsInput::Flush => {
                    let _ = self.events.send(TtsEvent::Done).await;
                    return;
                }
            };
            if text.is_empty() {
                continue;
            }
            let event = match self.speak(&text).await {
                Ok(()) => continue,
                Err(Failure::Gone) => return,
                Err(Failure::Passing(e)) => TtsEvent::Error(format!("OpenAI speech: {e}")),
                Err(Failure::Permanent(e)) => TtsEvent::Failed(format!("OpenAI speech: {e}")),
            };
            let _ = self.events.send(event).await;
            return;
        }
    }

    async fn send(&self, event: TtsEvent) -> Result<(), Failure> {
        self.events.send(event).await.map_err(|_| Failure::Gone)
    }

    async fn speak(&mut self, text: &str) -> Result<(), Failure> {
        let url = format!(
            "{}/audio/speech",
            self.settings.base_url.trim_end_matches('/')
        );
        let body = json!({
            "model": self.settings.model,
            "input": text,
            "voice": self.settings.voice,
            "response_format": "pcm",
        });
        let mut request = self.client.post(&url).json(&body);
        if let Some(key) = &self.settings.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = tokio::time::timeout(self.settings.first_chunk_timeout, request.send())
            .await
            .map_err(|_| Failure::Passing("no answer in time".into()))?
            .map_err(|e| Failure::Passing(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let detail: String = response
                .text()
                .await
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect();
            let message = format!("HTTP {status}: {detail}");
            return Err(if matches!(status.as_u16(), 401 | 403 | 404) {
                Failure::Permanent(message)
            } else {
                Failure::Passing(message)
            });
        }
        self.send(TtsEvent::Characters(text.chars().count() as u64))
            .await?;
        self.send(TtsEvent::Words {
            text: text.to_owned(),
            words: estimated_words(text, self.offset),
        })
        .await?;
        let mut bytes = response.bytes_stream();
        // A sample may be split between two chunks.
        let mut odd: Option<u8> = None;
        while let Some(chunk) = bytes.next().await {
            let chunk = chunk.map_err(|e| Failure::Passing(e.to_string()))?;
            let mut data: Vec<u8> = odd
                .take()
                .into_iter()
                .chain(chunk.iter().copied())
                .collect();
            if data.len() % 2 == 1 {
                odd = data.pop();
            }
            let samples: Vec<i16> = data
                .chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]]))
                .collect();
            if samples.is_empty() {
                continue;
            }
            self.offset += samples.len() as f64 / f64::from(SAMPLE_RATE);
            self.send(TtsEvent::Audio(samples)).await?;
        }
        Ok(())
    }
}
