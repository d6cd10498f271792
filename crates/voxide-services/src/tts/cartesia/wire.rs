//! Cartesia's TTS WebSocket messages (`/tts/websocket`, API version 2026-03-01), as its API
//! documents them.

use serde::{Deserialize, Serialize};

/// A piece of a context's text.
#[derive(Debug, Serialize)]
pub struct Generate<'a> {
    pub model_id: &'a str,
    pub transcript: &'a str,
    pub voice: Voice<'a>,
    pub language: &'a str,
    pub context_id: &'a str,
    /// More text follows in this context (false ends it).
    #[serde(rename = "continue")]
    pub more: bool,
    pub output_format: OutputFormat,
    pub add_timestamps: bool,
    /// voxide sends whole sentences: no server-side buffering.
    pub max_buffer_delay_ms: u32,
}

#[derive(Debug, Serialize)]
pub struct Voice<'a> {
    pub mode: &'static str,
    pub id: &'a str,
}

#[derive(Debug, Serialize)]
pub struct OutputFormat {
    pub container: &'static str,
    pub encoding: &'static str,
    pub sample_rate: u32,
}

/// Stops a context's generation.
#[derive(Debug, Serialize)]
pub struct Cancel<'a> {
    pub context_id: &'a str,
    pub cancel: bool,
}

/// A message from the server; every one names its context.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// Base64 audio.
    Chunk { context_id: String, data: String },
    /// Words and their times, in seconds from the context's audio start.
    Timestamps {
        context_id: String,
        word_timestamps: WordTimestamps,
    },
    /// The context is spoken.
    Done { context_id: String },
    /// The context failed (`message` from 2026-03-01, `error` in older versions).
    Error {
        #[serde(default)]
        context_id: Option<String>,
        #[serde(default)]
        title: Option<String>,
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        error: Option<String>,
    },
    /// Messages voxide does not use (`flush_done`, `phoneme_timestamps`, later ones).
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
pub struct WordTimestamps {
    #[serde(default)]
    pub words: Vec<String>,
    #[serde(default)]
    pub start: Vec<f64>,
    #[serde(default)]
    pub end: Vec<f64>,
}
