//! Text to speech: the streaming voice interface, the embedded voices behind it as sentence
//! synthesizers (Piper: VITS through ONNX Runtime with espeak-ng phonemes; espeak-ng itself), and
//! the service that turns streamed LLM text into audio.

pub mod cartesia;
pub mod deepgram;
pub mod elevenlabs;
mod fallback;
pub mod openai;
mod sentences;
mod service;
mod socket;
mod stream;

pub use fallback::TtsFallback;
pub use sentences::Sentences;
pub use service::TtsService;
pub use socket::{Command, SocketProvider, SocketVoice};
pub use stream::{EVENT_QUEUE, INPUT_QUEUE, TextUnit, TtsContext, TtsEngine, TtsEvent, TtsInput};
pub use voxide_core::text::first_words_end;
pub use voxide_engines::tts::{
    EspeakVoice, PiperVoice, Speech, Synthesizer, TtsError, WordTiming, espeak, piper,
};

/// Characters a second of speech holds, for timing the words of a voice that times none.
const CHARS_PER_SEC: f64 = 15.0;

/// `text`'s words timed from `start` seconds at [`CHARS_PER_SEC`], each in proportion to its
/// length: what a voice without word timings (OpenAI speech, Deepgram Aura) reports, so that an
/// interruption keeps the words whose estimated end was played.
pub(crate) fn estimated_words(text: &str, start: f64) -> Vec<WordTiming> {
    let mut at = start;
    text.split_whitespace()
        .map(|word| {
            // The space after the word takes its share too.
            let secs = (word.chars().count() + 1) as f64 / CHARS_PER_SEC;
            let timing = WordTiming {
                word: word.to_owned(),
                start_secs: at,
                end_secs: at + secs,
            };
            at += secs;
            timing
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_timed_in_order_from_the_start_at_the_speaking_rate() {
        let words = estimated_words("It is noon.", 2.0);
        let said: Vec<&str> = words.iter().map(|w| w.word.as_str()).collect();
        assert_eq!(said, ["It", "is", "noon."]);
        assert_eq!(words[0].start_secs, 2.0);
        assert!(words.windows(2).all(|w| w[0].end_secs == w[1].start_secs));
        let total = words.last().map_or(0.0, |w| w.end_secs) - 2.0;
        assert!((total - 12.0 / CHARS_PER_SEC).abs() < 1e-9);
    }
}
