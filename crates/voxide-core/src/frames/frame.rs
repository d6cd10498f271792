use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::AppResources;
use super::{AudioFrame, MetricsData, TokenUsage};
use crate::context::{ContextHandle, LlmContext, Message, StopReason, ToolsSchema};

/// A frame's identity. Copies of a frame (a parallel pipeline's branches) share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(u64);

impl FrameId {
    fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The numeric value, unique within this process.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FrameId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// How a frame travels: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameCategory {
    /// Jumps every queue, never dropped.
    System,
    /// Ordered with data.
    Control,
    /// Payload.
    Data,
}

/// One unit flowing through a session.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Identity, fresh for every new frame.
    pub id: FrameId,
    /// Presentation timestamp, where the frame has a place on a media clock.
    pub pts: Option<Duration>,
    /// What the frame carries.
    pub body: FrameBody,
}

/// The three kinds of frame.
#[derive(Debug, Clone)]
pub enum FrameBody {
    /// See [`SystemFrame`].
    System(SystemFrame),
    /// See [`ControlFrame`].
    Control(ControlFrame),
    /// See [`DataFrame`].
    Data(DataFrame),
}

impl Frame {
    /// A response of the bot's own that is no LLM's (a greeting, a check-in, a flow's line):
    /// `text` as the frames an LLM response would be, for the voice to speak and the assistant
    /// aggregator to write into the conversation.
    pub fn response(text: String) -> [Frame; 3] {
        [
            ControlFrame::LlmFullResponseStart.into(),
            DataFrame::LlmText(text).into(),
            ControlFrame::LlmFullResponseEnd.into(),
        ]
    }

    /// A new frame with a fresh id and no timestamp.
    pub fn new(body: impl Into<FrameBody>) -> Self {
        Self {
            id: FrameId::next(),
            pts: None,
            body: body.into(),
        }
    }

    /// Sets the presentation timestamp.
    pub fn with_pts(mut self, pts: Duration) -> Self {
        self.pts = Some(pts);
        self
    }

    /// The frame's kind.
    pub fn category(&self) -> FrameCategory {
        match self.body {
            FrameBody::System(_) => FrameCategory::System,
            FrameBody::Control(_) => FrameCategory::Control,
            FrameBody::Data(_) => FrameCategory::Data,
        }
    }

    /// True for system frames, which bypass queues.
    pub fn is_system(&self) -> bool {
        matches!(self.body, FrameBody::System(_))
    }

    /// True when an interruption must not discard this frame or abort its processing.
    pub fn is_uninterruptible(&self) -> bool {
        match &self.body {
            // System frames are never queued behind data, so an interruption never meets them.
            FrameBody::System(_) => true,
            FrameBody::Control(c) => match c {
                ControlFrame::End(_)
                | ControlFrame::Stop
                | ControlFrame::TranscriptionDone
                | ControlFrame::FunctionCallInProgress(_) => true,
                ControlFrame::LlmFullResponseStart
                | ControlFrame::LlmFullResponseEnd
                | ControlFrame::TtsStarted
                | ControlFrame::TtsStopped
                | ControlFrame::LlmResponseSummary(_) => false,
            },
            FrameBody::Data(d) => match d {
                // The user's words are input, like the user's audio: an interruption is about
                // the bot's output and never loses them.
                // So are the messages a client adds or sets (typed text, a keypad entry): one
                // that interrupts the bot queues them right behind the interruption.
                DataFrame::FunctionCallResult(_)
                | DataFrame::Transcription(_)
                | DataFrame::InterimTranscription(_)
                | DataFrame::UserTurn(_)
                | DataFrame::LlmMessagesAppend { .. }
                | DataFrame::LlmMessagesUpdate { .. } => true,
                DataFrame::OutputAudio(_)
                | DataFrame::Text(_)
                | DataFrame::LlmText(_)
                | DataFrame::TtsText(_)
                | DataFrame::LlmContext(_)
                | DataFrame::UserTurnGuess { .. }
                | DataFrame::LlmGuess { .. }
                | DataFrame::TtsGuess { .. }
                | DataFrame::LlmSetTools(_)
                | DataFrame::LlmRun
                | DataFrame::TransportMessage(_)
                | DataFrame::Phone(_) => false,
            },
        }
    }

    /// The system frame inside, if this is one.
    pub fn as_system(&self) -> Option<&SystemFrame> {
        match &self.body {
            FrameBody::System(s) => Some(s),
            _ => None,
        }
    }

    /// The control frame inside, if this is one.
    pub fn as_control(&self) -> Option<&ControlFrame> {
        match &self.body {
            FrameBody::Control(c) => Some(c),
            _ => None,
        }
    }

    /// The data frame inside, if this is one.
    pub fn as_data(&self) -> Option<&DataFrame> {
        match &self.body {
            FrameBody::Data(d) => Some(d),
            _ => None,
        }
    }

    /// A short name of the variant, for logs and events.
    pub fn name(&self) -> &'static str {
        match &self.body {
            FrameBody::System(s) => s.name(),
            FrameBody::Control(c) => c.name(),
            FrameBody::Data(d) => d.name(),
        }
    }

    /// True for the end frame.
    pub fn is_end(&self) -> bool {
        matches!(self.body, FrameBody::Control(ControlFrame::End(_)))
    }

    /// True for the cancel frame.
    pub fn is_cancel(&self) -> bool {
        matches!(self.body, FrameBody::System(SystemFrame::Cancel { .. }))
    }

    /// True for the interruption frame.
    pub fn is_interruption(&self) -> bool {
        matches!(self.body, FrameBody::System(SystemFrame::Interruption))
    }
}

impl<T: Into<FrameBody>> From<T> for Frame {
    fn from(body: T) -> Self {
        Frame::new(body)
    }
}

impl From<SystemFrame> for FrameBody {
    fn from(f: SystemFrame) -> Self {
        FrameBody::System(f)
    }
}

impl From<ControlFrame> for FrameBody {
    fn from(f: ControlFrame) -> Self {
        FrameBody::Control(f)
    }
}

impl From<DataFrame> for FrameBody {
    fn from(f: DataFrame) -> Self {
        FrameBody::Data(f)
    }
}

/// Frames that jump every queue and are never dropped.
#[derive(Debug, Clone)]
pub enum SystemFrame {
    /// The first frame of a session: its parameters and shared resources.
    Start(Arc<StartFrame>),
    /// Stop at once, discarding everything queued.
    Cancel {
        /// Why, for logs.
        reason: Option<String>,
    },
    /// The user barged in: discard queued interruptible frames and abort interruptible work.
    Interruption,
    /// Something went wrong in a stage; travels upstream to the session.
    Error(Box<ErrorFrame>),
    /// Measurements.
    Metrics(Vec<MetricsData>),
    /// Audio from the input transport. System, so an interruption never discards the user's voice.
    InputAudio(AudioFrame),
    /// The VAD heard speech in silence, not yet confirmed as a start: a
    /// [`SystemFrame::VadUserStartedSpeaking`] or a [`SystemFrame::VadOnsetFaded`] follows.
    VadSpeechOnset {
        /// It came near the speaker's level at once (always where the room does not talk); in
        /// a café, an onset under it is most likely the room's talk.
        near_speaker: bool,
    },
    /// An onset that was not `near_speaker` came near the speaker's level before the start.
    VadOnsetNearSpeaker,
    /// The onset fell quiet before the start delay: it was not speech (a click, a cough).
    VadOnsetFaded,
    /// The VAD heard speech start (confirmed after its start delay).
    VadUserStartedSpeaking,
    /// The VAD heard the first silence after speech; a [`SystemFrame::VadUserStoppedSpeaking`]
    /// follows if it lasts the stop delay. Each stop has one of these before it, marking where
    /// the speech ended.
    VadSilenceStarted,
    /// The VAD heard speech again after a [`SystemFrame::VadSilenceStarted`], before its stop
    /// delay ran out: the silence was a pause inside the speech.
    VadSpeechResumed,
    /// The VAD heard speech stop (confirmed after its stop delay).
    VadUserStoppedSpeaking,
    /// The STT has every word of the speech before the latest first silence, ahead of the
    /// VAD's stop (a provider finalized early): these words since the last final, which that
    /// stop's final will repeat. The turn stage may guess the turn with them at once.
    TranscriptionSettled(String),
    /// The speech of guess `id`'s first words (preemptive generation) is made and held: pushed
    /// upstream by the TTS, so the turn stage's hold on a finished turn need not outlast it.
    GuessSpoken(u64),
    /// The STT owes a final transcript for speech that is ending (sent just before the VAD's
    /// stop); a [`ControlFrame::TranscriptionDone`] follows once it is delivered.
    TranscriptionPending,
    /// The user's turn started.
    UserStartedSpeaking,
    /// The user's turn ended.
    UserStoppedSpeaking,
    /// A tick while the user speaks (the VAD's, every 0.2 s of speech).
    UserSpeaking,
    /// The output transport started playing bot audio.
    BotStartedSpeaking,
    /// The output transport finished playing bot audio.
    BotStoppedSpeaking,
    /// A tick while the bot speaks.
    BotSpeaking,
    /// Hold the bot's audio where it is (the user may be interrupting); nothing is dropped.
    PausePlayback,
    /// Play on from where [`SystemFrame::PausePlayback`] held it (it was a false interruption).
    ResumePlayback,
    /// Nobody spoke for the configured user-idle time.
    UserIdle,
    /// The LLM asked for these function calls (one batch).
    FunctionCallsStarted(Arc<[FunctionCallRequest]>),
    /// A running function call is cancelled.
    FunctionCallCancel(Box<FunctionCallCancel>),
    /// A transport message that must not wait behind data (e.g. an RTVI reply).
    TransportMessageUrgent(Box<Value>),
}

impl SystemFrame {
    fn name(&self) -> &'static str {
        match self {
            SystemFrame::Start(_) => "start",
            SystemFrame::Cancel { .. } => "cancel",
            SystemFrame::Interruption => "interruption",
            SystemFrame::Error(_) => "error",
            SystemFrame::Metrics(_) => "metrics",
            SystemFrame::InputAudio(_) => "input_audio",
            SystemFrame::VadUserStartedSpeaking => "vad_user_started_speaking",
            SystemFrame::VadSpeechOnset { .. } => "vad_speech_onset",
            SystemFrame::VadOnsetNearSpeaker => "vad_onset_near_speaker",
            SystemFrame::VadOnsetFaded => "vad_onset_faded",
            SystemFrame::VadSilenceStarted => "vad_silence_started",
            SystemFrame::VadSpeechResumed => "vad_speech_resumed",
            SystemFrame::VadUserStoppedSpeaking => "vad_user_stopped_speaking",
            SystemFrame::TranscriptionSettled(_) => "transcription_settled",
            SystemFrame::GuessSpoken(_) => "guess_spoken",
            SystemFrame::TranscriptionPending => "transcription_pending",
            SystemFrame::UserStartedSpeaking => "user_started_speaking",
            SystemFrame::UserStoppedSpeaking => "user_stopped_speaking",
            SystemFrame::UserSpeaking => "user_speaking",
            SystemFrame::BotStartedSpeaking => "bot_started_speaking",
            SystemFrame::BotStoppedSpeaking => "bot_stopped_speaking",
            SystemFrame::BotSpeaking => "bot_speaking",
            SystemFrame::PausePlayback => "pause_playback",
            SystemFrame::ResumePlayback => "resume_playback",
            SystemFrame::UserIdle => "user_idle",
            SystemFrame::FunctionCallsStarted(_) => "function_calls_started",
            SystemFrame::FunctionCallCancel(_) => "function_call_cancel",
            SystemFrame::TransportMessageUrgent(_) => "transport_message_urgent",
        }
    }
}

/// Frames that keep their order with data.
#[derive(Debug, Clone)]
pub enum ControlFrame {
    /// Finish what is queued, then stop.
    End(EndFrame),
    /// Stop processing but keep the session's resources (e.g. to hand a call over).
    Stop,
    /// The LLM starts a response.
    LlmFullResponseStart,
    /// The LLM finished a response.
    LlmFullResponseEnd,
    /// The TTS starts producing audio for a response.
    TtsStarted,
    /// The TTS finished producing audio for a response.
    TtsStopped,
    /// The STT delivered the final transcript it owed (or heard no words in the speech), after
    /// the transcript itself.
    TranscriptionDone,
    /// A function call began running.
    FunctionCallInProgress(Box<FunctionCallInProgress>),
    /// Who answered, what it cost and why it stopped; sent just before the response's end.
    LlmResponseSummary(Box<LlmResponseSummary>),
}

impl ControlFrame {
    fn name(&self) -> &'static str {
        match self {
            ControlFrame::End(_) => "end",
            ControlFrame::Stop => "stop",
            ControlFrame::LlmFullResponseStart => "llm_full_response_start",
            ControlFrame::LlmFullResponseEnd => "llm_full_response_end",
            ControlFrame::TtsStarted => "tts_started",
            ControlFrame::TtsStopped => "tts_stopped",
            ControlFrame::TranscriptionDone => "transcription_done",
            ControlFrame::FunctionCallInProgress(_) => "function_call_in_progress",
            ControlFrame::LlmResponseSummary(_) => "llm_response_summary",
        }
    }
}

/// Payload frames.
#[derive(Debug, Clone)]
pub enum DataFrame {
    /// Audio for the output transport to play.
    OutputAudio(AudioFrame),
    /// Plain text, e.g. typed by the user or injected by the app.
    Text(String),
    /// Text streamed by an LLM.
    LlmText(String),
    /// Text a TTS is speaking.
    TtsText(TtsText),
    /// A final transcript of user speech.
    Transcription(Box<Transcription>),
    /// A partial transcript that may still change.
    InterimTranscription(Box<Transcription>),
    /// A user turn to answer, handed on by the turn stage once the turn is over and all its
    /// finals are in: its words, for the user aggregator to commit before it runs the LLM.
    /// Empty when the turn brought no words but cut off an answer the bot had not started.
    UserTurn(String),
    /// The words of a turn that may be over, handed on by the turn stage at a pause whose
    /// words are all in, before the turn has ended: the LLM may start on them (preemptive
    /// generation). Should the turn end with these words, they come again as a `UserTurn`.
    UserTurnGuess {
        /// The guess's number, which its `LlmGuess` and `TtsGuess` carry on.
        id: u64,
        /// The words.
        text: String,
    },
    /// Run the LLM on this context.
    LlmContext(ContextHandle),
    /// Start the LLM on what the context will be if the turn ends as guessed, holding its
    /// output: an `LlmContext` with the same messages takes it over, any other throws it away.
    LlmGuess {
        /// The `UserTurnGuess`'s number.
        id: u64,
        /// The context.
        context: Box<LlmContext>,
    },
    /// The first words of the answer to an `LlmGuess`, for the TTS to speak ahead with its
    /// audio held: a response whose first words are these plays it, any other throws it away.
    TtsGuess {
        /// The `UserTurnGuess`'s number.
        id: u64,
        /// The words.
        text: String,
    },
    /// Append messages to the context.
    LlmMessagesAppend {
        /// Messages to append.
        messages: Vec<Message>,
        /// Whether to run the LLM afterwards.
        run_llm: bool,
    },
    /// Replace the context's messages.
    LlmMessagesUpdate {
        /// The new messages.
        messages: Vec<Message>,
        /// Whether to run the LLM afterwards.
        run_llm: bool,
    },
    /// Replace the context's tools.
    LlmSetTools(Box<ToolsSchema>),
    /// Run the LLM on the context as it is.
    LlmRun,
    /// A function call settled (or reported progress, for async calls).
    FunctionCallResult(Box<FunctionCallResult>),
    /// A message for the transport's peer (e.g. RTVI over a data channel).
    TransportMessage(Box<Value>),
    /// What the bot asks of the phone line it talks on, carried out by the output once the
    /// speech before it has played.
    Phone(PhoneAction),
}

/// What the bot asks of a phone line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PhoneAction {
    /// Hand the call to this number or SIP URI (a blind transfer: SIP's REFER).
    Transfer(String),
    /// Press these keypad keys (to steer a phone menu): RFC 4733 events, or the tones.
    SendKeys(String),
}

impl DataFrame {
    fn name(&self) -> &'static str {
        match self {
            DataFrame::OutputAudio(_) => "output_audio",
            DataFrame::Text(_) => "text",
            DataFrame::LlmText(_) => "llm_text",
            DataFrame::TtsText(_) => "tts_text",
            DataFrame::Transcription(_) => "transcription",
            DataFrame::InterimTranscription(_) => "interim_transcription",
            DataFrame::UserTurn(_) => "user_turn",
            DataFrame::LlmContext(_) => "llm_context",
            DataFrame::UserTurnGuess { .. } => "user_turn_guess",
            DataFrame::LlmGuess { .. } => "llm_guess",
            DataFrame::TtsGuess { .. } => "tts_guess",
            DataFrame::LlmMessagesAppend { .. } => "llm_messages_append",
            DataFrame::LlmMessagesUpdate { .. } => "llm_messages_update",
            DataFrame::LlmSetTools(_) => "llm_set_tools",
            DataFrame::LlmRun => "llm_run",
            DataFrame::FunctionCallResult(_) => "function_call_result",
            DataFrame::TransportMessage(_) => "transport_message",
            DataFrame::Phone(_) => "phone",
        }
    }
}

/// Parameters every processor learns from the start frame.
#[derive(Debug, Clone)]
pub struct StartParams {
    /// Sample rate of audio entering the pipeline.
    pub audio_in_sample_rate: u32,
    /// Sample rate of audio leaving the pipeline.
    pub audio_out_sample_rate: u32,
    /// Whether the user may interrupt the bot.
    pub allow_interruptions: bool,
    /// Whether services report TTFB and processing metrics.
    pub enable_metrics: bool,
    /// Whether services report token and character usage.
    pub enable_usage_metrics: bool,
    /// The bot answers in text: the voice passes the LLM's words on unspoken (a text client,
    /// or pipecat's eval harness in text mode).
    pub skip_tts: bool,
}

impl Default for StartParams {
    fn default() -> Self {
        Self {
            audio_in_sample_rate: 16_000,
            audio_out_sample_rate: 24_000,
            allow_interruptions: true,
            enable_metrics: false,
            enable_usage_metrics: false,
            skip_tts: false,
        }
    }
}

/// The start frame's payload.
#[derive(Debug, Clone, Default)]
pub struct StartFrame {
    /// Session parameters.
    pub params: StartParams,
    /// The app's resources, handed to every tool handler.
    pub resources: AppResources,
}

/// The end frame's payload.
#[derive(Debug, Clone, Default)]
pub struct EndFrame {
    /// Why the session ends, for logs.
    pub reason: Option<String>,
}

/// An error raised by a stage.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorFrame {
    /// What went wrong, for people.
    pub message: String,
    /// A fatal error ends the session.
    pub fatal: bool,
    /// The processor that raised it.
    pub processor: Option<String>,
}

impl ErrorFrame {
    /// A non-fatal error.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            fatal: false,
            processor: None,
        }
    }

    /// A fatal error.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            fatal: true,
            ..Self::new(message)
        }
    }
}

/// Text a TTS speaks, or passes along unspoken.
#[derive(Debug, Clone, PartialEq)]
pub struct TtsText {
    /// The words.
    pub text: String,
    /// False when the text is shown but not spoken.
    pub spoken: bool,
    /// When each word is heard in the audio that follows this frame, where the TTS knows it: the
    /// assistant aggregator uses it to keep only the words played before an interruption.
    pub words: Option<Arc<[WordTiming]>>,
}

impl TtsText {
    /// Spoken text without word timings (a provider speaking by itself).
    pub fn spoken(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            spoken: true,
            words: None,
        }
    }
}

/// When one word is spoken.
#[derive(Debug, Clone, PartialEq)]
pub struct WordTiming {
    /// The word as written.
    pub word: String,
    /// Start, in seconds from the start of the speech.
    pub start_secs: f64,
    /// End, in seconds.
    pub end_secs: f64,
}

/// A transcript of the user's speech.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcription {
    /// The words.
    pub text: String,
    /// Which user spoke.
    pub user_id: String,
    /// When it was transcribed.
    pub timestamp: SystemTime,
    /// BCP-47 language, where the STT knows it.
    pub language: Option<String>,
}

impl Transcription {
    /// A transcript of `text` by `user_id`, stamped now.
    pub fn new(text: impl Into<String>, user_id: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            user_id: user_id.into(),
            timestamp: SystemTime::now(),
            language: None,
        }
    }
}

/// One function call the LLM asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCallRequest {
    /// The tool's name.
    pub function_name: String,
    /// The provider's id for this call.
    pub tool_call_id: String,
    /// Parsed arguments.
    pub arguments: Value,
}

/// A function call began running.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCallInProgress {
    /// The tool's name.
    pub function_name: String,
    /// The provider's id for this call.
    pub tool_call_id: String,
    /// Parsed arguments.
    pub arguments: Value,
    /// False for asynchronous calls, which survive interruptions.
    pub cancel_on_interruption: bool,
    /// The batch this call came in.
    pub group_id: u64,
}

/// What happens after a function-call result reaches the context.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FunctionCallResultProperties {
    /// Run the LLM now (`Some(true)`), never (`Some(false)`), or when the batch settled (`None`).
    pub run_llm: Option<bool>,
    /// Called once the result is in the context.
    pub on_context_updated: Option<OnContextUpdated>,
}

/// A callback run once, when a function result has been written to the context.
#[derive(Clone)]
pub struct OnContextUpdated(Arc<std::sync::Mutex<Option<ContextCallback>>>);

type ContextCallback = Box<dyn FnOnce() + Send>;

impl OnContextUpdated {
    /// Wraps `callback`.
    pub fn new(callback: impl FnOnce() + Send + 'static) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(Box::new(callback)))))
    }

    /// Runs the callback; later calls (e.g. on a clone) do nothing.
    pub fn call(&self) {
        let callback = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(callback) = callback {
            callback();
        }
    }
}

impl fmt::Debug for OnContextUpdated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnContextUpdated")
    }
}

impl PartialEq for OnContextUpdated {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A function call's result: final, or an intermediate update of an async call.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCallResult {
    /// The tool's name.
    pub function_name: String,
    /// The provider's id for this call.
    pub tool_call_id: String,
    /// Parsed arguments.
    pub arguments: Value,
    /// What the tool returned; `None` when it returned nothing.
    pub result: Option<Value>,
    /// Final, an intermediate update of an async call, or the call's cancellation.
    pub kind: ResultKind,
    /// False for asynchronous calls.
    pub cancel_on_interruption: bool,
    /// The batch this call came in.
    pub group_id: u64,
    /// What to do after the result lands.
    pub properties: FunctionCallResultProperties,
}

impl FunctionCallResult {
    /// The call is over: its final result, or its cancellation.
    pub fn settles(&self) -> bool {
        self.kind != ResultKind::Intermediate
    }
}

/// What a [`FunctionCallResult`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultKind {
    /// An update of an async call; more follow.
    Intermediate,
    /// The call's result.
    Final,
    /// The call was cancelled rather than completed (the result is empty).
    Cancelled,
}

/// A running function call is cancelled.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCallCancel {
    /// The tool's name.
    pub function_name: String,
    /// The provider's id for this call.
    pub tool_call_id: String,
    /// Why.
    pub reason: CancelReason,
}

/// Why a function call was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    /// The user interrupted the bot.
    Interruption,
    /// It ran past its timeout.
    Timeout,
    /// The model called `cancel_<name>`.
    Llm,
}

/// What one LLM response was: who answered, the tokens and dollars it took, why it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmResponseSummary {
    /// The provider (e.g. `openai`, `local`).
    pub provider: String,
    /// The model.
    pub model: String,
    /// Tokens used.
    pub usage: TokenUsage,
    /// Dollars, when the model's price is known.
    pub cost_usd: Option<f64>,
    /// Why it ended.
    pub stop_reason: StopReason,
    /// Reasoning the model showed, if any.
    pub thinking: String,
    /// Messages for the context that only this provider reads (Gemini's thought signatures).
    pub provider_messages: Vec<crate::context::ProviderMessage>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_get_fresh_ids_and_clones_keep_them() {
        let a = Frame::new(DataFrame::Text("a".into()));
        let b = Frame::new(DataFrame::Text("b".into()));
        assert_ne!(a.id, b.id);
        assert_eq!(a.clone().id, a.id);
    }

    #[test]
    fn end_and_function_frames_survive_interruptions() {
        assert!(Frame::new(ControlFrame::End(EndFrame::default())).is_uninterruptible());
        let result = FunctionCallResult {
            function_name: "f".into(),
            tool_call_id: "1".into(),
            arguments: Value::Null,
            result: None,
            kind: ResultKind::Final,
            cancel_on_interruption: true,
            group_id: 1,
            properties: FunctionCallResultProperties::default(),
        };
        assert!(Frame::new(DataFrame::FunctionCallResult(Box::new(result))).is_uninterruptible());
        assert!(!Frame::new(DataFrame::LlmText("hi".into())).is_uninterruptible());
        assert!(!Frame::new(ControlFrame::TtsStarted).is_uninterruptible());
    }

    #[test]
    fn frames_stay_small() {
        // Every hop moves a frame by value: rare, large payloads are boxed to keep it small.
        assert!(
            std::mem::size_of::<Frame>() <= 72,
            "{}",
            std::mem::size_of::<Frame>()
        );
    }
}
