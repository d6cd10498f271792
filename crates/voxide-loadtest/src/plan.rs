//! What a session is to say, and what it heard: shared by the session that speaks, the link
//! it speaks over and the WebRTC call that link may be.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::impair::Impairment;
use crate::signal::{Change, Voice};
use crate::text::word_list;
use crate::{Protocol, Recorder};
use voxide_core::calculator::{format_number, is_number_word, read_number};

/// One recorded user turn, encoded once for every session.
pub struct TurnAudio {
    /// The WAV it came from.
    pub name: String,
    /// 20 ms frames as the wire carries them (PCM bytes, μ-law bytes for Twilio, Opus packets
    /// for WebRTC).
    pub(super) frames: Vec<Vec<u8>>,
    /// Where its speech starts and ends, in seconds from its start.
    pub speech_start: f64,
    pub speech_end: f64,
    /// What it says (the `.txt` beside the WAV), to score the bot's transcript against.
    pub reference: Option<String>,
}

impl TurnAudio {
    /// `samples` (mono 16 kHz) with `tone` (the room, empty for none) under them, encoded for
    /// `protocol`; `None` when they hold no speech. Where the speech starts and ends is read
    /// from the clean samples.
    pub fn new(name: String, samples: &[i16], tone: &[i16], protocol: Protocol) -> Option<Self> {
        let (start, end) = crate::signal::speech_bounds(samples, 16_000)?;
        let frames = crate::wire::encode(&crate::room::mix(samples, tone), protocol)?;
        Some(Self {
            name,
            frames,
            speech_start: start as f64 / 16_000.0,
            speech_end: end as f64 / 16_000.0,
            reference: None,
        })
    }
}

/// Packets one way, by what became of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NetworkCounts {
    pub received: u64,
    pub lost: u64,
    pub recovered: u64,
    /// Lost packets played from a copy in a later packet (RED); a bot that does not say has
    /// none.
    #[serde(default)]
    pub redundant: u64,
    pub concealed: u64,
    pub late: u64,
}

impl NetworkCounts {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Self) {
        self.received += other.received;
        self.lost += other.lost;
        self.recovered += other.recovered;
        self.redundant += other.redundant;
        self.concealed += other.concealed;
        self.late += other.late;
    }
}

impl From<crate::transports::jitter::NetworkStats> for NetworkCounts {
    fn from(stats: crate::transports::jitter::NetworkStats) -> Self {
        Self {
            received: stats.received,
            lost: stats.lost,
            recovered: stats.recovered,
            redundant: stats.redundant,
            concealed: stats.concealed,
            late: stats.late,
        }
    }
}

/// What the reader heard, shared with the speaker.
pub(super) struct Heard {
    /// Follows the bot's audio (the speaker's clock ends speech that no audio follows).
    pub(super) voice: Voice,
    pub(super) onsets: Vec<f64>,
    pub(super) offsets: Vec<f64>,
    /// Server events: (seconds, type, with `-` read as `_`).
    pub(super) events: Vec<(f64, String)>,
    /// The connection ended, for this reason.
    pub(super) closed: Option<String>,
    /// The node that answered the connection.
    pub(super) node: Option<String>,
    /// The W3C `traceparent` the connection carries: the server's trace of the session is
    /// then the one [`SessionResult::trace_id`] names.
    pub(super) traceparent: String,
    /// Trickle `PATCH`es sent, and the statuses of those refused.
    pub(super) trickle_sent: usize,
    pub(super) trickle_refused: Vec<u16>,
    /// The bot's final transcripts of the caller, in order.
    pub(super) transcripts: Vec<String>,
    /// The bot's last report of what the network did to the caller's audio.
    pub(super) bot_network: Option<NetworkCounts>,
    /// What the network did to the bot's voice, as the caller's jitter buffer saw it.
    pub(super) caller_network: Option<NetworkCounts>,
}

/// The words of `text` as a WER scores them: lowercase, without punctuation, and a number
/// said in words written in digits ("twenty six" and "26" are the same word), as the usual
/// English normaliser does, so a recogniser is not charged for how it writes a number.
pub(super) fn scored_words(text: &str) -> Vec<String> {
    /// The longest run of words read as one number.
    const LONGEST: usize = 6;
    let words = word_list(&text.replace('-', " "));
    let mut out = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        let number = (1..=LONGEST.min(words.len() - i)).rev().find_map(|n| {
            let run = &words[i..i + n];
            let spelled = run.iter().all(|w| is_number_word(w));
            spelled
                .then(|| read_number(&run.join(" ")))
                .flatten()
                .map(|value| (n, format_number(value)))
        });
        match number {
            Some((n, digits)) => {
                out.push(digits);
                i += n;
            }
            None => {
                out.push(words[i].clone());
                i += 1;
            }
        }
    }
    out
}

/// Transcripts a session keeps at most (a bot that sends more is not heard further).
const MAX_TRANSCRIPTS: usize = 10_000;

/// The bot's audio is over after this much quiet.
const HANGOVER_SECS: f64 = 0.8;

impl Heard {
    /// Nothing heard yet over a connection carrying `traceparent`, the bot's audio arriving at
    /// `rate`.
    pub(super) fn new(rate: u32, traceparent: String) -> Self {
        Self {
            voice: Voice::new(rate, HANGOVER_SECS),
            onsets: Vec::new(),
            offsets: Vec::new(),
            events: Vec::new(),
            closed: None,
            node: None,
            traceparent,
            trickle_sent: 0,
            trickle_refused: Vec::new(),
            transcripts: Vec::new(),
            bot_network: None,
            caller_network: None,
        }
    }

    /// A server event.
    pub(super) fn event(&mut self, at: f64, kind: &str) {
        self.events.push((at, kind.replace('-', "_")));
    }

    /// A server message's content, RTVI or `/ws`: a final transcript of the caller, or the
    /// bot's network metrics.
    pub(super) fn message(&mut self, kind: &str, message: &Value) {
        match kind {
            "user-transcription" if message["data"]["final"] == true => {
                self.transcript(message["data"]["text"].as_str());
            }
            "user_transcription" if message["final"] == true => {
                self.transcript(message["text"].as_str());
            }
            "metrics" => {
                if let Some(network) = message["data"]["network"]
                    .as_array()
                    .and_then(|list| list.last())
                    .and_then(|n| serde_json::from_value(n["value"].clone()).ok())
                {
                    self.bot_network = Some(network);
                }
            }
            _ => {}
        }
    }

    fn transcript(&mut self, text: Option<&str>) {
        if let Some(text) = text
            && self.transcripts.len() < MAX_TRANSCRIPTS
        {
            self.transcripts.push(text.trim().to_owned());
        }
    }

    pub(super) fn note(
        &mut self,
        changes: impl IntoIterator<Item = Change>,
        index: usize,
        recorder: &Recorder,
    ) {
        for change in changes {
            match change {
                Change::Onset(at) => {
                    self.onsets.push(at);
                    recorder.event(at, index, "bot_audio_onset", json!({}));
                }
                Change::Offset(at) => {
                    self.offsets.push(at);
                    recorder.event(at, index, "bot_audio_end", json!({}));
                }
            }
        }
    }
}

/// How a session speaks.
pub struct Plan {
    pub protocol: Protocol,
    /// The socket's URL.
    pub url: String,
    pub turns: usize,
    pub think: Duration,
    /// Talk over the bot this long after its reply starts (each turn after the first).
    pub barge_in_at: Option<Duration>,
    pub response_timeout: Duration,
    pub audio: Arc<Vec<TurnAudio>>,
    /// The frames the gaps between turns loop through (one of digital silence, or the room).
    pub gap: Arc<Vec<Vec<u8>>>,
    /// The run's clock.
    pub origin: Instant,
    /// The bearer token a guarded server wants.
    pub auth_token: Option<String>,
    /// What the network does to the caller's frames.
    pub network: Impairment,
    /// What the network does to the bot's voice on its way back (WebRTC).
    pub received: Impairment,
    /// Copies of earlier frames a WebRTC caller puts in each packet when the bot asks for RED.
    pub red: usize,
}

impl Plan {
    /// What session `index` says at its turn `turn`: the sessions take the WAVs in turn, each
    /// from where the one before stops, so a run covers as many of them as it has turns.
    pub(super) fn turn_audio(&self, index: usize, turn: usize) -> &TurnAudio {
        &self.audio[(index * self.turns + turn) % self.audio.len()]
    }

    pub(super) fn secs(&self, at: Instant) -> f64 {
        at.duration_since(self.origin).as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_score_the_same_in_words_and_in_digits() {
        assert_eq!(
            scored_words("What's fifteen plus twenty-six? Add one hundred and four."),
            ["whats", "15", "plus", "26", "add", "104"]
        );
        assert_eq!(
            scored_words("What's 15 plus 26?"),
            ["whats", "15", "plus", "26"]
        );
        assert_eq!(
            scored_words("and a time for you to go"),
            ["and", "a", "time", "for", "you", "to", "go"],
            "a lone 'and' and words like numbers stay words"
        );
    }

    #[test]
    fn final_transcripts_and_the_bots_network_report_are_heard_in_both_dialects() {
        let mut heard = Heard::new(16_000, String::new());
        let rtvi =
            |kind: &str, data: Value| json!({"label": "rtvi-ai", "type": kind, "data": data});
        heard.message(
            "user-transcription",
            &rtvi(
                "user-transcription",
                json!({"text": "what is", "final": false}),
            ),
        );
        heard.message(
            "user-transcription",
            &rtvi(
                "user-transcription",
                json!({"text": " What is the time? ", "final": true}),
            ),
        );
        heard.message(
            "user_transcription",
            &json!({"type": "user_transcription", "text": "Thanks.", "final": true}),
        );
        heard.message(
            "metrics",
            &rtvi(
                "metrics",
                json!({"network": [{"processor": "webrtc", "value": {"received": 90,
                    "lost": 10, "recovered": 6, "concealed": 4, "late": 1, "reordered": 2,
                    "duplicated": 0, "jitter_ms": 9.5, "depth_ms": 40.0, "sent_loss": null}}]}),
            ),
        );
        assert_eq!(heard.transcripts, ["What is the time?", "Thanks."]);
        assert_eq!(
            heard.bot_network,
            Some(NetworkCounts {
                received: 90,
                lost: 10,
                recovered: 6,
                redundant: 0,
                concealed: 4,
                late: 1,
            })
        );
    }
}
