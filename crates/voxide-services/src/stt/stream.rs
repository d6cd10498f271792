//! The streaming speech-to-text interface every engine implements: a network provider that
//! listens continuously (Deepgram, AssemblyAI) as much as Whisper, which decodes segments.
//!
//! The STT service starts one [`SttStream`] per user per session and sends it all of the user's
//! audio from the session's start, with the VAD's verdicts; transcripts come back as they come.
//! At each VAD stop the service asks the engine to finalize, and the engine answers that request
//! with exactly one [`SttEvent::Finalized`] holding the words spoken since the previous one
//! (possibly none). The turn logic sees only this; it never knows which engine it has.

use tokio::sync::mpsc;

/// Inputs an engine's stream may fall behind by before audio is dropped (10 s of 20 ms frames).
pub const INPUT_QUEUE: usize = 512;
/// Events the service may fall behind by.
pub const EVENT_QUEUE: usize = 64;

/// What the STT service tells a stream, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum SttInput {
    /// The user's audio, mono at the engine's [`SttEngine::sample_rate`]: all of it, whatever
    /// the VAD says.
    Audio(Vec<i16>),
    /// The VAD heard speech in silence, not yet confirmed: a [`SttInput::SpeechStarted`] or an
    /// [`SttInput::OnsetFaded`] follows. Where speech began, for an engine that keeps the
    /// audio before the start.
    SpeechOnset {
        /// It came near the speaker's level (always where the room does not talk): in a café,
        /// an onset under it is most likely the room's talk.
        near_speaker: bool,
    },
    /// An onset under the speaker's level came near it before the start.
    OnsetNearSpeaker,
    /// The onset fell quiet before it was confirmed. Over a room's noise a voice's first words
    /// can be a few onsets that fade before one is confirmed.
    OnsetFaded,
    /// The VAD confirmed speech.
    SpeechStarted,
    /// The first silence after speech, which may become the VAD's stop.
    SilenceStarted,
    /// The VAD's stop: answer with one [`SttEvent::Finalized`].
    Finalize,
}

/// What a stream says.
#[derive(Debug, Clone, PartialEq)]
pub enum SttEvent {
    /// Words heard so far; later ones may differ.
    Interim(String),
    /// The words since the previous answer are all in, ahead of the stop (the engine finalized
    /// at the first silence): the next [`SttEvent::Finalized`] repeats them, unless more speech
    /// comes first.
    Settled(String),
    /// The answer to one [`SttInput::Finalize`]: the words since the previous answer.
    Finalized(String),
    /// A failure the stream lives through (a decode that failed, a provider error).
    Error(String),
    /// The engine gave up for good (a rejected key, reconnects spent): from now on it answers
    /// each finalize with no words.
    Failed(String),
    /// A fallback list's engine gave up and the next took over (the turn in progress was sent
    /// to it again).
    Switched {
        /// The engine that failed.
        from: String,
        /// The engine that listens now.
        to: String,
        /// Why.
        reason: String,
    },
}

/// One user's running transcription: inputs in, events out. Dropping `input` ends it.
pub struct SttStream {
    /// Where the service sends audio and the VAD's verdicts.
    pub input: mpsc::Sender<SttInput>,
    /// Where the transcripts come from; it closes when the stream ends.
    pub events: mpsc::Receiver<SttEvent>,
}

/// Something that transcribes a user's speech as it comes.
pub trait SttEngine: Send + Sync + 'static {
    /// The engine's name, for metrics.
    fn name(&self) -> &str;

    /// The model listening now, for metrics and prices (the name where there is no other).
    fn model(&self) -> &str {
        self.name()
    }

    /// The rate audio must be sent at.
    fn sample_rate(&self) -> u32;

    /// Starts one user's transcription. Called inside the runtime; the stream's tasks end when
    /// its input is dropped.
    fn start(&self) -> SttStream;
}
