//! The streaming text-to-speech interface every voice implements: a network provider that takes
//! text as it comes and streams audio back (Cartesia, ElevenLabs) as much as Piper, which speaks
//! a sentence at a time.
//!
//! The TTS service opens one [`TtsContext`] per assistant turn: text goes in (a sentence at a
//! time, or token by token to a voice that buffers itself, as [`TtsEngine::text_unit`] asks),
//! then [`TtsInput::Flush`] when the turn's text is all in. Audio and word timings come back, and
//! [`TtsEvent::Done`] once everything flushed was spoken. An interruption drops the context:
//! the voice cancels it, and whatever it still sends is never read.

use tokio::sync::mpsc;

use super::WordTiming;

/// Inputs a context may fall behind by.
pub const INPUT_QUEUE: usize = 256;
/// Events the service may fall behind by.
pub const EVENT_QUEUE: usize = 64;

/// How a voice wants its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextUnit {
    /// Whole sentences (a first clause may come alone, to start sooner).
    Sentence,
    /// The LLM's tokens as they come: the voice buffers and cuts them itself.
    Token,
}

/// What the TTS service tells a context, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum TtsInput {
    /// More of the turn's text.
    Text(String),
    /// The turn's text is all in: speak the rest, then answer [`TtsEvent::Done`].
    Flush,
}

/// What a context says.
#[derive(Debug, Clone, PartialEq)]
pub enum TtsEvent {
    /// The words of `text` and when each is heard, in seconds from the start of the context's
    /// audio. Sent no later than the audio of its first word.
    Words {
        /// What the words spell.
        text: String,
        /// Their timings; empty when the voice cannot tell.
        words: Vec<WordTiming>,
    },
    /// The next piece of the context's audio, mono at [`TtsEngine::sample_rate`].
    Audio(Vec<i16>),
    /// Characters spoken, for usage metrics.
    Characters(u64),
    /// Everything flushed has been spoken.
    Done,
    /// A failure: the context ends.
    Error(String),
    /// The voice gave up for good (a rejected key, reconnects spent): the context ends, and so
    /// will every later one.
    Failed(String),
    /// A fallback list's voice gave up and the next took over this context (its text was sent
    /// to it again).
    Switched {
        /// The voice that failed.
        from: String,
        /// The voice that speaks now.
        to: String,
        /// Why.
        reason: String,
    },
}

/// One assistant turn's speech: text in, audio out. Dropping it cancels the turn.
pub struct TtsContext {
    /// Where the service sends the text.
    pub input: mpsc::Sender<TtsInput>,
    /// Where the speech comes from; it closes when the context ends.
    pub events: mpsc::Receiver<TtsEvent>,
}

/// Something that speaks text.
pub trait TtsEngine: Send + Sync + 'static {
    /// The voice's name, for metrics.
    fn name(&self) -> &str;

    /// The model speaking now, for metrics and prices (the name where there is no other).
    fn model(&self) -> &str {
        self.name()
    }

    /// The rate of the audio it makes.
    fn sample_rate(&self) -> u32;

    /// How it wants its text.
    fn text_unit(&self) -> TextUnit;

    /// Opens one turn's context. Called inside the runtime.
    fn open(&self) -> TtsContext;

    /// Gets ready before the first turn (a network voice opens its socket). Called inside the
    /// runtime when the session starts; nothing to do by default.
    fn warm(&self) {}
}
