use serde::{Deserialize, Serialize};

use crate::context::TokenUsage;

/// What a guessed answer that was thrown away cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WastedGuess {
    /// Its tokens, prompt and answer.
    pub usage: TokenUsage,
    /// Its dollars, where the model's price is known.
    pub cost_usd: Option<f64>,
}

/// One measurement carried by a metrics frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MetricsData {
    /// Time from a service's request to its first output.
    Ttfb {
        /// The processor that measured it.
        processor: String,
        /// The model, where the service knows it.
        model: Option<String>,
        /// Seconds.
        seconds: f64,
    },
    /// Time a processor spent on one unit of work.
    ProcessingTime {
        /// The processor that measured it.
        processor: String,
        /// Seconds.
        seconds: f64,
    },
    /// Tokens one LLM call used.
    LlmUsage {
        /// The processor that measured it.
        processor: String,
        /// The model.
        model: Option<String>,
        /// Token counts.
        usage: TokenUsage,
        /// Dollars, when the model's price is known.
        cost_usd: Option<f64>,
    },
    /// Characters one TTS call spoke.
    TtsUsage {
        /// The processor that measured it.
        processor: String,
        /// The voice's model.
        model: Option<String>,
        /// Characters synthesised.
        characters: u64,
        /// Dollars, when the model's price is known.
        cost_usd: Option<f64>,
    },
    /// Audio one user turn sent to the STT.
    SttUsage {
        /// The processor that measured it.
        processor: String,
        /// The engine's model.
        model: Option<String>,
        /// Seconds of audio.
        seconds: f64,
        /// Dollars, when the model's price is known.
        cost_usd: Option<f64>,
    },
    /// End of user speech (the last voiced audio of the turn: the VAD's last stop in it, less
    /// its stop window) to first bot audio.
    VoiceToVoice {
        /// Seconds.
        seconds: f64,
    },
    /// A preemptive generation: the LLM started on the turn's words at a pause, before the
    /// turn ended. Used when the turn ended with those words; otherwise thrown away with the
    /// tokens it had made.
    Preemption {
        /// The processor that ran it.
        processor: String,
        /// The answer was taken over.
        used: bool,
        /// Tokens (text pieces) it had generated when it was taken over or thrown away.
        tokens: u64,
        /// A guess thrown away: what it cost all the same (the provider's count where its
        /// answer had come to its end; else the prompt estimated at four characters a token
        /// and the pieces generated), and its dollars where the model's price is known.
        wasted: Option<WastedGuess>,
    },
    /// End of user speech to the end of their turn: how long the turn detection waited, a part
    /// of `VoiceToVoice` a slow turn detector cannot hide in.
    TurnWait {
        /// Seconds.
        seconds: f64,
    },
    /// What the echo canceller did while the bot played: the input's level before and after
    /// it (dBFS, over the frames with the bot's voice in the reference), so `input_db -
    /// output_db` is the echo's suppression where nobody talked over the bot.
    EchoCancellation {
        /// The processor that measured it.
        processor: String,
        /// Seconds of input measured.
        seconds: f64,
        /// The microphone's level.
        input_db: f64,
        /// The level after cancellation.
        output_db: f64,
        /// The speaker-to-microphone delay the canceller found, in ms.
        delay_ms: i32,
    },
    /// What the network did to a session's incoming audio so far (totals since it started),
    /// and the loss its client reports of the bot's voice.
    Network {
        /// The transport that measured it (`webrtc`).
        transport: String,
        /// Packets received.
        received: u64,
        /// Packets not received in time to play.
        lost: u64,
        /// Lost packets rebuilt from the next packet's forward error correction.
        recovered: u64,
        /// Lost packets played from a copy a later packet carried (RED, RFC 2198).
        redundant: u64,
        /// Packets that came in RED.
        red: u64,
        /// 20 ms frames concealed.
        concealed: u64,
        /// Packets that came after their time was played.
        late: u64,
        /// Packets that came before one sent earlier.
        reordered: u64,
        /// Packets received twice.
        duplicated: u64,
        /// Interarrival jitter, in ms.
        jitter_ms: f64,
        /// The jitter buffer's depth, in ms.
        depth_ms: f64,
        /// The share of the bot's voice the client reports lost (RTCP), 0 to 1.
        sent_loss: Option<f64>,
    },
}
