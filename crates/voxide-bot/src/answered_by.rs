//! Who answered a call voxide placed: a person, an answering machine or a phone menu, from the
//! first seconds of the callee's audio.
//!
//! The timing follows the classic answering-machine detector (Asterisk's `AMD()`): a person
//! says a short greeting ("Hello?") and waits; a machine talks on ("Hi, you've reached Sam, I
//! can't take your call…"). Words decide sooner where they can ("leave a message", "press
//! one"), and a beep is a machine beyond doubt. Once it is a machine, the detector waits for
//! the moment to speak: the beep's end, or the greeting's end followed by silence when no beep
//! comes.
//!
//! [`Detector`] is sans-IO: speech edges, words and beeps with their times in, [`Verdict`]s out.
//! [`AnswererDetection`] is its stage, after the STT: it keeps the callee's speech from the turn
//! stage until it knows who answered. A person (or a menu, or nobody told) then hears the
//! greeting, or, for a bot without one, is answered as if the stage were not there; a machine
//! gets the bot file's `[voicemail]` message once it records, and the call ends.
//!
//! Where only the timing spoke (a long greeting, many words, or nothing sure by the end of
//! listening) and the bot file asks for it (`ask_llm`), the bot's LLM reads what the callee
//! said ([`Judge`]), as LiveKit's detector does. Its answer overrules the timing: a person who
//! gave their name and company is greeted rather than left a message, and a greeting the
//! timing could not place is told apart. A beep still wins over it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;

use crate::audio::beep::BeepDetector;
use crate::context::{Message, ToolsSchema};
use crate::events::{AnsweredBecause, AnsweredBy, Event};
use crate::frames::{ControlFrame, DataFrame, EndFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};
use crate::services::llm::{LlmEngine, LlmEvent, LlmRequest};

/// Quiet this long after the answer tells nothing: who answered is unknown (Asterisk's
/// `initialSilence`, which calls it a machine).
pub const FIRST_SILENCE: Duration = Duration::from_millis(2_500);
/// Speech in the greeting past this is a machine's (Asterisk's default is 1.5 s; a person's
/// "Hello, this is Sam speaking" takes up to two).
pub const LONGEST_GREETING: Duration = Duration::from_millis(2_000);
/// Silence after a short greeting that says a person waits for an answer.
pub const AFTER_GREETING: Duration = Duration::from_millis(800);
/// Words in a person's greeting, at most.
pub const MOST_WORDS: usize = 5;
/// The longest the detector listens before it says what it thinks.
pub const LONGEST_LISTEN: Duration = Duration::from_secs(5);
/// Silence after a machine's greeting, with no beep, that says it records.
pub const NO_BEEP: Duration = Duration::from_millis(1_500);
/// The longest a machine's greeting may take: the message goes on then, beep or not.
pub const LONGEST_MACHINE: Duration = Duration::from_secs(30);

/// What the detector tells the stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Who answered, and why, as soon as it is known.
    Answered(AnsweredBy, AnsweredBecause),
    /// The machine records now: leave the message. `beep` if a beep said so.
    Record {
        /// A beep ended just now.
        beep: bool,
    },
}

/// What was heard so far.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Heard {
    /// Answered; nobody spoke yet.
    Waiting,
    /// The greeting: `speech` of it (the pauses left out) before the current run; the words of
    /// its final transcripts, and of the interim one since (which the next repeats).
    Greeting {
        speech: Duration,
        run: Run,
        settled: usize,
        pending: usize,
    },
    /// A machine: waiting for its beep or its silence.
    Machine { quiet_since: Option<Duration> },
    /// Nothing more to say.
    Done,
}

/// The greeting's state: speaking since, or quiet since.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Run {
    Speaking(Duration),
    Quiet(Duration),
}

/// The detector for one call, its times counted from the answer.
#[derive(Debug)]
pub struct Detector {
    phase: Heard,
}

impl Default for Detector {
    fn default() -> Self {
        Self::new()
    }
}

impl Detector {
    /// A detector for a call just answered.
    pub fn new() -> Self {
        Self {
            phase: Heard::Waiting,
        }
    }

    /// The callee started speaking at `at`.
    pub fn speech_started(&mut self, at: Duration) -> Option<Verdict> {
        match &mut self.phase {
            Heard::Waiting => {
                self.phase = Heard::Greeting {
                    speech: Duration::ZERO,
                    run: Run::Speaking(at),
                    settled: 0,
                    pending: 0,
                };
                None
            }
            Heard::Greeting { run, .. } => {
                if let Run::Quiet(_) = run {
                    *run = Run::Speaking(at);
                }
                None
            }
            Heard::Machine { quiet_since } => {
                *quiet_since = None;
                None
            }
            Heard::Done => None,
        }
    }

    /// The callee stopped speaking at `at`.
    pub fn speech_stopped(&mut self, at: Duration) -> Option<Verdict> {
        match &mut self.phase {
            Heard::Greeting { speech, run, .. } => {
                if let Run::Speaking(since) = *run {
                    *speech += at.saturating_sub(since);
                    *run = Run::Quiet(at);
                }
                None
            }
            Heard::Machine { quiet_since } => {
                *quiet_since = Some(at);
                None
            }
            Heard::Waiting | Heard::Done => None,
        }
    }

    /// Words the callee said: a final transcript, or an interim one (which the next interim or
    /// the final repeats and replaces).
    pub fn words(&mut self, text: &str, is_final: bool) -> Option<Verdict> {
        if let Some(said) = said(text) {
            return self.decide(said, AnsweredBecause::Words);
        }
        if let Heard::Greeting {
            settled, pending, ..
        } = &mut self.phase
        {
            let count = text.split_whitespace().count();
            match is_final {
                true => (*settled, *pending) = (*settled + count, 0),
                false => *pending = count,
            }
            if *settled + *pending > MOST_WORDS {
                return self.decide(AnsweredBy::Machine, AnsweredBecause::ManyWords);
            }
        }
        None
    }

    /// A beep just ended: a machine, and it records now.
    pub fn beep(&mut self) -> Option<Verdict> {
        match self.phase {
            Heard::Done => None,
            Heard::Machine { .. } => {
                self.phase = Heard::Done;
                Some(Verdict::Record { beep: true })
            }
            // Said and done in one: the stage hears `Answered` with this `Record` behind it.
            Heard::Waiting | Heard::Greeting { .. } => {
                self.phase = Heard::Done;
                Some(Verdict::Answered(
                    AnsweredBy::Machine,
                    AnsweredBecause::Beep,
                ))
            }
        }
    }

    /// Time passed: what the silence or the length of the greeting says by `now`.
    pub fn tick(&mut self, now: Duration) -> Option<Verdict> {
        match self.phase {
            Heard::Waiting if now >= FIRST_SILENCE => {
                self.phase = Heard::Done;
                Some(Verdict::Answered(
                    AnsweredBy::Unknown,
                    AnsweredBecause::Silence,
                ))
            }
            Heard::Greeting { speech, run, .. } => {
                let spoken = match run {
                    Run::Speaking(since) => speech + now.saturating_sub(since),
                    Run::Quiet(_) => speech,
                };
                if spoken > LONGEST_GREETING {
                    return self.decide(AnsweredBy::Machine, AnsweredBecause::LongGreeting);
                }
                if let Run::Quiet(since) = run
                    && now.saturating_sub(since) >= AFTER_GREETING
                {
                    return self.decide(AnsweredBy::Human, AnsweredBecause::ShortGreeting);
                }
                if now >= LONGEST_LISTEN {
                    return self.decide(AnsweredBy::Unknown, AnsweredBecause::Undecided);
                }
                None
            }
            Heard::Machine { quiet_since } => {
                let quiet = quiet_since.is_some_and(|since| now.saturating_sub(since) >= NO_BEEP);
                if quiet || now >= LONGEST_MACHINE {
                    self.phase = Heard::Done;
                    return Some(Verdict::Record { beep: false });
                }
                None
            }
            Heard::Waiting | Heard::Done => None,
        }
    }

    /// The LLM said `who` answered, where the timing had decided otherwise or nothing: a
    /// machine waits for its beep or its silence (quiet since `quiet_since`, if it is quiet);
    /// anyone else ends the listening.
    pub fn overruled(&mut self, who: AnsweredBy, quiet_since: Option<Duration>) {
        self.phase = match who {
            AnsweredBy::Machine => Heard::Machine { quiet_since },
            _ => Heard::Done,
        };
    }

    fn decide(&mut self, who: AnsweredBy, because: AnsweredBecause) -> Option<Verdict> {
        let quiet_since = match self.phase {
            Heard::Done | Heard::Machine { .. } => return None,
            Heard::Greeting {
                run: Run::Quiet(since),
                ..
            } => Some(since),
            Heard::Greeting { .. } | Heard::Waiting => None,
        };
        self.phase = match who {
            AnsweredBy::Machine => Heard::Machine { quiet_since },
            _ => Heard::Done,
        };
        Some(Verdict::Answered(who, because))
    }
}

/// `[voicemail]` in a bot file: what the bot does when a machine answers a call it placed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Voicemail {
    /// What it leaves once the machine records (none: it hangs up).
    pub message: Option<String>,
    /// Where only the timing spoke, the bot's LLM reads the greeting and has the last word.
    pub ask_llm: bool,
}

/// What the LLM is told when it reads a greeting.
pub const JUDGE_INSTRUCTION: &str = "An assistant placed a phone call, and someone or something \
answered. You are given what the callee said in the first seconds, as a speech recogniser heard \
it. Tell who answered: a person, an answering machine or voicemail greeting, or an automated \
phone menu. Reply with one word: person, machine, menu, or unsure.";
/// The longest the LLM may take to read a greeting; past it, the timing's verdict stands.
pub const JUDGE_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest answer read (one word is asked for).
pub const JUDGE_MAX_TOKENS: usize = 8;
/// The most of the greeting the LLM is given, in characters.
const MOST_GREETING_CHARS: usize = 600;

/// The LLM's answer about a greeting: `Some(None)` once it came unsure, failed or late.
type Answer = Arc<Mutex<Option<Option<AnsweredBy>>>>;

/// The LLM's say on a greeting the timing was not sure of: asked once, in the background; the
/// stage reads its answer at the frame after it came.
pub struct Judge {
    engine: Arc<dyn LlmEngine>,
    answer: Option<Answer>,
}

impl std::fmt::Debug for Judge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Judge")
            .field("model", &self.engine.model())
            .field("asked", &self.answer.is_some())
            .finish()
    }
}

impl Judge {
    /// A judge asking `engine`.
    pub fn new(engine: Arc<dyn LlmEngine>) -> Self {
        Self {
            engine,
            answer: None,
        }
    }

    /// Asks about `greeting`, in the background; false if it was asked already.
    fn ask(&mut self, greeting: &str, cx: &mut FrameContext<'_>) -> bool {
        if self.answer.is_some() {
            return false;
        }
        let slot = Answer::default();
        self.answer = Some(slot.clone());
        let engine = self.engine.clone();
        let greeting: String = greeting.chars().take(MOST_GREETING_CHARS).collect();
        cx.spawn(async move {
            let read = read_greeting(engine.as_ref(), &greeting);
            let by = match tokio::time::timeout(JUDGE_TIMEOUT, read).await {
                Ok(Ok(by)) => by,
                Ok(Err(why)) => {
                    tracing::warn!(%why, "the LLM could not read the greeting");
                    None
                }
                Err(_) => {
                    tracing::warn!("the LLM did not read the greeting in time");
                    None
                }
            };
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(by);
            Ok(())
        });
        true
    }

    /// The LLM's answer, once, when it has come.
    fn answered(&mut self) -> Option<Option<AnsweredBy>> {
        let slot = self.answer.as_ref()?;
        let mut answer = slot.lock().unwrap_or_else(|p| p.into_inner());
        answer.take()
    }
}

/// Who `engine` thinks said `greeting`: `None` when it is unsure.
async fn read_greeting(
    engine: &dyn LlmEngine,
    greeting: &str,
) -> Result<Option<AnsweredBy>, String> {
    let request = LlmRequest {
        messages: vec![
            Message::system(JUDGE_INSTRUCTION),
            Message::user(format!("The callee said: \"{greeting}\"")),
        ],
        tools: ToolsSchema::default(),
        tool_choice: None,
    };
    let mut stream = engine.generate(request);
    let mut reply = String::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(LlmEvent::Text(piece)) => reply.push_str(&piece),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        if reply.len() > 200 {
            break;
        }
    }
    let by = verdict_of(&reply);
    tracing::info!(reply = %reply.trim(), ?by, "the LLM read the greeting");
    Ok(by)
}

/// Who the LLM's reply names: its first word that names one; `None` if it is unsure.
fn verdict_of(reply: &str) -> Option<AnsweredBy> {
    reply
        .split(|c: char| !c.is_alphabetic())
        .find_map(|word| match word.to_lowercase().as_str() {
            "person" | "human" => Some(Some(AnsweredBy::Human)),
            "machine" | "voicemail" | "answering" => Some(Some(AnsweredBy::Machine)),
            "menu" | "ivr" => Some(Some(AnsweredBy::Menu)),
            "unsure" | "unknown" => Some(None),
            _ => None,
        })
        .flatten()
}

/// Where the stage stands.
#[derive(Debug)]
enum Phase {
    /// Telling who answered: the callee's speech is held.
    Listening { held: Vec<(Frame, Direction)> },
    /// The timing told nothing; the LLM reads the greeting. The speech is still held.
    Asking { held: Vec<(Frame, Direction)> },
    /// A person greeted back: what is left of their "Hello?" (its stop, its last words) is
    /// not a turn; their next speech is.
    Greeted,
    /// A machine: its greeting is not the bot's to answer; waiting for it to record.
    Machine,
    /// A person, a menu or nobody told: the conversation is the bot's.
    Talking,
    /// The message is left (or none was to be): the call ends.
    Over,
}

/// The stage that tells who answered a call the bot placed, before the turn stage.
#[derive(Debug)]
pub struct AnswererDetection {
    detector: Detector,
    beeps: Option<BeepDetector>,
    /// The callee's audio heard so far, the stage's clock.
    heard: Duration,
    phase: Phase,
    greeting: Option<String>,
    voicemail: Voicemail,
    /// The LLM, where the bot file asks for its say.
    judge: Option<Judge>,
    /// The callee's words: its final transcripts, and the interim one since.
    said: (String, String),
    /// Since when the callee is quiet (`None` while it speaks).
    quiet_since: Option<Duration>,
}

impl AnswererDetection {
    /// A stage for a call just answered: a person hears `greeting`, a machine `voicemail`.
    pub fn new(greeting: Option<String>, voicemail: Voicemail) -> Self {
        Self {
            detector: Detector::new(),
            beeps: None,
            heard: Duration::ZERO,
            phase: Phase::Listening { held: Vec::new() },
            greeting,
            voicemail,
            judge: None,
            said: (String::new(), String::new()),
            quiet_since: Some(Duration::ZERO),
        }
    }

    /// The stage with `engine` reading greetings where only the timing spoke.
    pub fn with_judge(mut self, engine: Arc<dyn LlmEngine>) -> Self {
        self.judge = Some(Judge::new(engine));
        self
    }

    /// What the callee said so far.
    fn greeting_heard(&self) -> String {
        let (finals, interim) = &self.said;
        format!("{finals} {interim}").trim().to_owned()
    }

    /// Asks the LLM about a verdict only the timing gave; true if the verdict waits for it
    /// (nothing was told yet), false if it stands meanwhile (a machine, waiting to record).
    fn ask_llm(
        &mut self,
        by: AnsweredBy,
        because: AnsweredBecause,
        cx: &mut FrameContext<'_>,
    ) -> bool {
        let timing = matches!(
            because,
            AnsweredBecause::LongGreeting | AnsweredBecause::ManyWords | AnsweredBecause::Undecided
        );
        let greeting = self.greeting_heard();
        let Some(judge) = self.judge.as_mut() else {
            return false;
        };
        if !timing || greeting.is_empty() || !judge.ask(&greeting, cx) {
            return false;
        }
        tracing::info!(?by, ?because, "the LLM reads the greeting");
        match (&mut self.phase, by) {
            (Phase::Listening { held }, AnsweredBy::Unknown) => {
                self.phase = Phase::Asking {
                    held: std::mem::take(held),
                };
                true
            }
            _ => false,
        }
    }

    /// The LLM's answer: what the timing left open, or a person or a menu where the timing
    /// heard a machine.
    fn take_llms_word(&mut self, answer: Option<AnsweredBy>, cx: &mut FrameContext<'_>) {
        match (&mut self.phase, answer) {
            (Phase::Asking { held }, _) => {
                self.phase = Phase::Listening {
                    held: std::mem::take(held),
                };
                let (by, because) = match answer {
                    Some(by) => (by, AnsweredBecause::Llm),
                    None => (AnsweredBy::Unknown, AnsweredBecause::Undecided),
                };
                self.detector.overruled(by, self.quiet_since);
                self.act(Verdict::Answered(by, because), cx);
            }
            (Phase::Machine, Some(by @ (AnsweredBy::Human | AnsweredBy::Menu))) => {
                tracing::info!(?by, "the LLM overrules the timing: no machine");
                cx.emit(Event::CallAnswered {
                    by,
                    because: AnsweredBecause::Llm,
                });
                self.detector.overruled(by, None);
                self.phase = Phase::Talking;
                if by == AnsweredBy::Human {
                    self.greet(cx);
                }
            }
            (_, answer) => tracing::info!(?answer, "the LLM's reading changes nothing"),
        }
    }

    /// Says the greeting, if the bot has one: true if it did.
    fn greet(&mut self, cx: &mut FrameContext<'_>) -> bool {
        let Some(greeting) = self.greeting.take() else {
            return false;
        };
        // The greeting answers their "Hello?".
        self.phase = Phase::Greeted;
        for frame in Frame::response(greeting) {
            cx.push(frame, Direction::Downstream);
        }
        true
    }

    /// What the detector makes of `frame`, with the audio's clock advanced past it.
    fn hear(&mut self, frame: &Frame) -> Vec<Verdict> {
        let mut verdicts = Vec::new();
        let at = self.heard;
        match &frame.body {
            FrameBody::System(SystemFrame::InputAudio(audio)) => {
                let rate = audio.sample_rate.max(1);
                let beeps = self.beeps.get_or_insert_with(|| BeepDetector::new(rate));
                if beeps.push(&audio.samples).is_some() {
                    verdicts.extend(self.detector.beep());
                }
                let samples = audio.samples.len() / usize::from(audio.channels.max(1));
                self.heard += Duration::from_secs_f64(samples as f64 / f64::from(rate));
                verdicts.extend(self.detector.tick(self.heard));
            }
            FrameBody::System(
                SystemFrame::VadUserStartedSpeaking | SystemFrame::VadSpeechResumed,
            ) => {
                self.quiet_since = None;
                verdicts.extend(self.detector.speech_started(at));
            }
            FrameBody::System(SystemFrame::VadSilenceStarted) => {
                self.quiet_since = Some(at);
                verdicts.extend(self.detector.speech_stopped(at));
            }
            FrameBody::Data(DataFrame::Transcription(words)) => {
                let (finals, interim) = &mut self.said;
                finals.push(' ');
                finals.push_str(&words.text);
                interim.clear();
                verdicts.extend(self.detector.words(&words.text, true));
            }
            FrameBody::Data(DataFrame::InterimTranscription(words)) => {
                self.said.1.clone_from(&words.text);
                verdicts.extend(self.detector.words(&words.text, false));
            }
            _ => {}
        }
        // A beep before anything else said it: a machine that records already.
        if verdicts
            == [Verdict::Answered(
                AnsweredBy::Machine,
                AnsweredBecause::Beep,
            )]
        {
            verdicts.push(Verdict::Record { beep: true });
        }
        verdicts
    }

    fn act(&mut self, verdict: Verdict, cx: &mut FrameContext<'_>) {
        match verdict {
            Verdict::Answered(by, because) => {
                if self.ask_llm(by, because, cx) {
                    return;
                }
                tracing::info!(?by, ?because, "who answered the call");
                cx.emit(Event::CallAnswered { by, because });
                let held = match std::mem::replace(&mut self.phase, Phase::Talking) {
                    Phase::Listening { held } => held,
                    other => {
                        self.phase = other;
                        return;
                    }
                };
                if by == AnsweredBy::Machine {
                    self.phase = Phase::Machine;
                } else if !self.greet(cx) {
                    for (frame, direction) in held {
                        cx.push(frame, direction);
                    }
                }
            }
            // Only a machine records: the LLM may have told a person since.
            Verdict::Record { .. } if !matches!(self.phase, Phase::Machine) => {}
            Verdict::Record { beep } => {
                cx.emit(Event::VoicemailRecording { beep });
                self.phase = Phase::Over;
                if let Some(message) = self.voicemail.message.take() {
                    for frame in Frame::response(message) {
                        cx.push(frame, Direction::Downstream);
                    }
                }
                let end = EndFrame {
                    reason: Some("an answering machine took the call".into()),
                };
                cx.push(ControlFrame::End(end).into(), Direction::Downstream);
            }
        }
    }
}

/// The callee's speech, as the VAD and the STT tell of it.
fn callee_speech(frame: &Frame) -> bool {
    matches!(
        frame.body,
        FrameBody::System(
            SystemFrame::VadSpeechOnset { .. }
                | SystemFrame::VadOnsetNearSpeaker
                | SystemFrame::VadOnsetFaded
                | SystemFrame::VadUserStartedSpeaking
                | SystemFrame::VadSilenceStarted
                | SystemFrame::VadSpeechResumed
                | SystemFrame::VadUserStoppedSpeaking
                | SystemFrame::TranscriptionSettled(_)
                | SystemFrame::TranscriptionPending
        ) | FrameBody::Control(ControlFrame::TranscriptionDone)
            | FrameBody::Data(DataFrame::Transcription(_) | DataFrame::InterimTranscription(_))
    )
}

impl FrameProcessor for AnswererDetection {
    fn name(&self) -> &str {
        "AnswererDetection"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if let Some(answer) = self.judge.as_mut().and_then(Judge::answered) {
            self.take_llms_word(answer, cx);
        }
        if let Phase::Greeted = self.phase
            && let FrameBody::System(SystemFrame::VadUserStartedSpeaking) = frame.body
        {
            self.phase = Phase::Talking;
        }
        if matches!(self.phase, Phase::Talking) {
            cx.push(frame, direction);
            return Ok(());
        }
        let verdicts = match direction {
            Direction::Downstream => self.hear(&frame),
            Direction::Upstream => Vec::new(),
        };
        if callee_speech(&frame) {
            if let Phase::Listening { held } | Phase::Asking { held } = &mut self.phase {
                held.push((frame, direction));
            }
        } else {
            cx.push(frame, direction);
        }
        for verdict in verdicts {
            self.act(verdict, cx);
        }
        Ok(())
    }
}

/// Phrases a voicemail greeting says.
const MACHINE_PHRASES: &[&str] = &[
    "leave a message",
    "leave your message",
    "leave me a message",
    "after the tone",
    "after the beep",
    "at the tone",
    "voicemail",
    "voice mail",
    "mailbox",
    "not available",
    "unavailable",
    "can't take your call",
    "cannot take your call",
    "can't come to the phone",
    "cannot come to the phone",
    "record your message",
    "you have reached",
    "you've reached",
];

/// Phrases a phone menu says.
const MENU_PHRASES: &[&str] = &[
    "press one",
    "press two",
    "press 1",
    "press 2",
    "press zero",
    "press 0",
    "press the pound",
    "press star",
    "menu options",
    "options have changed",
    "para español",
    "your call is important",
    "please hold",
    "stay on the line",
    "listen carefully",
];

/// Whom `text` sounds like, if its words tell.
fn said(text: &str) -> Option<AnsweredBy> {
    let text: String = text
        .to_lowercase()
        .chars()
        .map(|c| match c {
            '’' => '\'',
            c if c.is_alphanumeric() || c == '\'' => c,
            _ => ' ',
        })
        .collect();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if MENU_PHRASES.iter().any(|p| text.contains(p)) {
        Some(AnsweredBy::Menu)
    } else if MACHINE_PHRASES.iter().any(|p| text.contains(p)) {
        Some(AnsweredBy::Machine)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use crate::frames::{AudioFrame, Transcription};
    use crate::pipeline::{Pipeline, Session};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Ticks every 20 ms from `from` to `to`; the verdicts that came.
    fn ticks(detector: &mut Detector, from: u64, to: u64) -> Vec<(u64, Verdict)> {
        (from / 20..=to / 20)
            .filter_map(|n| detector.tick(ms(n * 20)).map(|v| (n * 20, v)))
            .collect()
    }

    #[test]
    fn a_short_hello_then_a_pause_is_a_person() {
        let mut d = Detector::new();
        assert_eq!(ticks(&mut d, 0, 600), []);
        d.speech_started(ms(600));
        assert_eq!(d.words("Hello?", false), None);
        d.speech_stopped(ms(1_300));
        assert_eq!(
            ticks(&mut d, 620, 3_000),
            [(
                2_100,
                Verdict::Answered(AnsweredBy::Human, AnsweredBecause::ShortGreeting)
            )]
        );
        assert_eq!(d.tick(ms(60_000)), None, "nothing more to say");
    }

    #[test]
    fn a_greeting_that_talks_on_is_a_machine_which_records_after_its_beep() {
        let mut d = Detector::new();
        d.speech_started(ms(400));
        // Short pauses between its sentences do not make it a person.
        d.speech_stopped(ms(1_500));
        assert_eq!(ticks(&mut d, 1_500, 2_000), []);
        d.speech_started(ms(2_000));
        assert_eq!(
            ticks(&mut d, 2_000, 3_000),
            [(
                2_920,
                Verdict::Answered(AnsweredBy::Machine, AnsweredBecause::LongGreeting)
            )]
        );
        d.speech_stopped(ms(5_200));
        assert_eq!(ticks(&mut d, 5_200, 5_600), []);
        assert_eq!(d.beep(), Some(Verdict::Record { beep: true }));
        assert_eq!(ticks(&mut d, 5_600, 9_000), []);
    }

    #[test]
    fn a_machine_that_never_beeps_records_after_its_silence() {
        let mut d = Detector::new();
        d.speech_started(ms(300));
        assert_eq!(
            d.words("Hi, you've reached Sam", false),
            Some(Verdict::Answered(
                AnsweredBy::Machine,
                AnsweredBecause::Words
            ))
        );
        d.speech_stopped(ms(4_000));
        assert_eq!(
            ticks(&mut d, 4_000, 7_000),
            [(5_500, Verdict::Record { beep: false })]
        );
    }

    #[test]
    fn words_tell_a_machine_or_a_menu_before_the_timing_does() {
        for (text, who) in [
            (
                "Please leave a message after the tone.",
                AnsweredBy::Machine,
            ),
            (
                "The person you are calling is not available",
                AnsweredBy::Machine,
            ),
            (
                "Thank you for calling. For sales, press one.",
                AnsweredBy::Menu,
            ),
            ("Para español, oprima dos", AnsweredBy::Menu),
        ] {
            let mut d = Detector::new();
            d.speech_started(ms(200));
            assert_eq!(
                d.words(text, true),
                Some(Verdict::Answered(who, AnsweredBecause::Words)),
                "{text}"
            );
        }
        let mut d = Detector::new();
        d.speech_started(ms(200));
        // Interim transcripts repeat the words before them: they are not added up.
        for interim in ["Hi", "Hi, who's", "Hi, who's this?"] {
            assert_eq!(d.words(interim, false), None, "{interim}");
        }
        assert_eq!(d.words("Hi, who's this?", true), None);
        assert_eq!(d.words("Sam speaking.", true), None);
        assert_eq!(
            d.words("Who is this", true),
            Some(Verdict::Answered(
                AnsweredBy::Machine,
                AnsweredBecause::ManyWords
            ))
        );
    }

    #[test]
    fn a_beep_is_a_machine_at_once_and_silence_is_unknown() {
        let mut d = Detector::new();
        d.speech_started(ms(300));
        assert_eq!(
            d.beep(),
            Some(Verdict::Answered(
                AnsweredBy::Machine,
                AnsweredBecause::Beep
            ))
        );
        assert_eq!(d.tick(ms(60_000)), None, "nothing more to say");
        let mut d = Detector::new();
        assert_eq!(
            ticks(&mut d, 0, 4_000),
            [(
                2_500,
                Verdict::Answered(AnsweredBy::Unknown, AnsweredBecause::Silence)
            )]
        );
    }

    #[test]
    fn speech_that_fits_neither_is_unknown_once_listening_runs_out() {
        let mut d = Detector::new();
        // Short bursts, never a pause long enough, never long enough in all.
        let mut verdicts = Vec::new();
        for n in 0..8u64 {
            d.speech_started(ms(200 + n * 700));
            d.speech_stopped(ms(400 + n * 700));
            verdicts.extend(ticks(&mut d, 200 + n * 700, 880 + n * 700));
        }
        assert_eq!(
            verdicts,
            [(
                5_000,
                Verdict::Answered(AnsweredBy::Unknown, AnsweredBecause::Undecided)
            )]
        );
    }

    /// `ms` of the callee's audio at 8 kHz: `tone` Hz, or silence.
    fn audio(ms: u64, tone: Option<f32>) -> Vec<Frame> {
        (0..ms / 20)
            .map(|packet| {
                let samples: Vec<i16> = (0..160u64)
                    .map(|n| match tone {
                        Some(hz) => {
                            let t = (packet * 160 + n) as f32 / 8_000.0;
                            (8_000.0 * (std::f32::consts::TAU * hz * t).sin()) as i16
                        }
                        None => 0,
                    })
                    .collect();
                Frame::new(SystemFrame::InputAudio(AudioFrame::new(samples, 8_000, 1)))
            })
            .collect()
    }

    fn system(frame: SystemFrame) -> Vec<Frame> {
        vec![Frame::new(frame)]
    }

    fn words(text: &str, done: bool) -> Vec<Frame> {
        let words = Box::new(Transcription::new(text, "callee"));
        vec![Frame::new(match done {
            true => DataFrame::Transcription(words),
            false => DataFrame::InterimTranscription(words),
        })]
    }

    /// "Hello?" after a moment, then a pause.
    fn hello() -> Vec<Frame> {
        [
            audio(600, None),
            system(SystemFrame::VadUserStartedSpeaking),
            audio(200, None),
            words("Hello?", false),
            audio(300, None),
            system(SystemFrame::VadSilenceStarted),
            words("Hello?", true),
            audio(1_200, None),
            system(SystemFrame::VadUserStoppedSpeaking),
            audio(400, None),
        ]
        .concat()
    }

    /// Passes every frame on, and keeps a copy.
    struct Seen(Arc<Mutex<Vec<Frame>>>);

    impl FrameProcessor for Seen {
        fn process(
            &mut self,
            frame: Frame,
            direction: Direction,
            cx: &mut FrameContext<'_>,
        ) -> Result<(), ProcessorError> {
            self.0.lock().expect("unpoisoned").push(frame.clone());
            cx.push(frame, direction);
            Ok(())
        }
    }

    /// Runs `stage` on `groups` of the callee's frames, each queued once the one before has
    /// gone through (as the next words come seconds later); what came out of it.
    async fn run(stage: AnswererDetection, groups: Vec<Vec<Frame>>) -> Vec<Frame> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let pipeline = Pipeline::new().then(stage).then(Seen(seen.clone()));
        let session = Session::builder(pipeline).idle_timeout(None).spawn();
        let handle = session.handle();
        for group in groups {
            for frame in group {
                let _ = handle.queue_frame(frame).await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let _ = handle.stop_when_done().await;
        session.join().await;
        let seen = seen.lock().expect("unpoisoned");
        seen.clone()
    }

    /// What came out, by name, the audio left out; and the bot's words.
    fn said(frames: &[Frame]) -> (Vec<&'static str>, Vec<String>) {
        let names = frames
            .iter()
            .filter(|f| !matches!(f.body, FrameBody::System(SystemFrame::InputAudio(_))))
            .map(Frame::name)
            .collect();
        let text = frames
            .iter()
            .filter_map(|f| match &f.body {
                FrameBody::Data(DataFrame::LlmText(text)) => Some(text.clone()),
                _ => None,
            })
            .collect();
        (names, text)
    }

    fn voicemail(message: &str) -> Voicemail {
        Voicemail {
            message: Some(message.into()),
            ask_llm: false,
        }
    }

    fn bakery() -> AnswererDetection {
        AnswererDetection::new(Some("Hi, it's the bakery.".into()), voicemail("Bye."))
    }

    #[tokio::test(start_paused = true)]
    async fn a_person_who_says_hello_hears_the_greeting_not_an_answer_to_hello() {
        let out = run(bakery(), vec![hello()]).await;
        let (names, text) = said(&out);
        assert_eq!(text, ["Hi, it's the bakery."]);
        for callee in ["vad_user_started_speaking", "vad_user_stopped_speaking"] {
            assert!(!names.contains(&callee), "{names:?}");
        }
        assert!(
            !names.iter().any(|n| n.contains("transcription")),
            "{names:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_the_greeting_the_persons_next_words_are_a_turn() {
        let next = [
            system(SystemFrame::VadUserStartedSpeaking),
            words("Is my cake ready?", true),
            system(SystemFrame::VadUserStoppedSpeaking),
        ]
        .concat();
        let out = run(bakery(), vec![hello(), next]).await;
        let words: Vec<_> = out
            .iter()
            .filter_map(|f| match &f.body {
                FrameBody::Data(DataFrame::Transcription(t)) => Some(t.text.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(words, ["Is my cake ready?"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bot_without_a_greeting_hears_the_persons_hello_as_a_turn() {
        let stage = AnswererDetection::new(None, voicemail("Bye."));
        let out = run(stage, vec![hello()]).await;
        let (names, text) = said(&out);
        assert!(text.is_empty(), "{text:?}");
        // Each queue in its order: the VAD's edges overtake the words, as they do anywhere.
        let kind = |part: &str| -> Vec<&str> {
            names.iter().filter(|n| n.contains(part)).copied().collect()
        };
        assert_eq!(
            kind("vad_"),
            [
                "vad_user_started_speaking",
                "vad_silence_started",
                "vad_user_stopped_speaking"
            ]
        );
        assert_eq!(
            kind("transcription"),
            ["interim_transcription", "transcription"]
        );
    }

    /// A voicemail greeting, then a second's pause with a beep in it or not.
    async fn machine(beep: bool) -> Vec<Frame> {
        let greeting = [
            audio(400, None),
            system(SystemFrame::VadUserStartedSpeaking),
            words("Hi, you've", false),
            audio(3_000, None),
            words("Hi, you've reached Sam, please leave a message", true),
            system(SystemFrame::VadSilenceStarted),
        ]
        .concat();
        let pause = [
            audio(300, None),
            audio(500, beep.then_some(1_000.0)),
            audio(200, None),
        ]
        .concat();
        let stage = AnswererDetection::new(
            Some("Hi, it's the bakery.".into()),
            voicemail("Your cake is ready."),
        );
        run(stage, vec![greeting, pause]).await
    }

    /// Why each end frame that came out ended.
    fn ends(out: &[Frame]) -> Vec<Option<String>> {
        out.iter()
            .filter_map(|f| match &f.body {
                FrameBody::Control(ControlFrame::End(end)) => Some(end.reason.clone()),
                _ => None,
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_machine_hears_the_message_after_its_beep_then_the_call_ends() {
        let out = machine(true).await;
        let (names, text) = said(&out);
        assert_eq!(text, ["Your cake is ready."]);
        assert!(
            !names.iter().any(|n| n.contains("transcription")),
            "{names:?}"
        );
        let why = ends(&out);
        assert_eq!(
            why[0].as_deref(),
            Some("an answering machine took the call")
        );
        // The message follows the beep: every packet of it came out before the words.
        let before = out
            .iter()
            .take_while(|f| !matches!(f.body, FrameBody::Data(DataFrame::LlmText(_))))
            .filter(|f| matches!(f.body, FrameBody::System(SystemFrame::InputAudio(_))))
            .count();
        assert!(before >= (400 + 3_000 + 300 + 500) / 20, "{before}");
        // Without the beep, a second of quiet is not yet the machine recording.
        let out = machine(false).await;
        assert_eq!(said(&out).1, Vec::<String>::new());
        assert_eq!(ends(&out), [None]);
    }

    /// An LLM that reads every greeting as `reply`, after `delay`; the greetings it was given.
    struct Reads {
        reply: &'static str,
        delay: Duration,
        asked: Arc<Mutex<Vec<String>>>,
    }

    impl Reads {
        fn judge(
            reply: &'static str,
            delay_ms: u64,
        ) -> (Arc<dyn LlmEngine>, Arc<Mutex<Vec<String>>>) {
            let asked = Arc::new(Mutex::new(Vec::new()));
            let engine = Reads {
                reply,
                delay: ms(delay_ms),
                asked: asked.clone(),
            };
            (Arc::new(engine), asked)
        }
    }

    impl LlmEngine for Reads {
        fn model(&self) -> &str {
            "reads"
        }

        fn provider(&self) -> &str {
            "test"
        }

        fn generate(
            &self,
            request: LlmRequest,
        ) -> futures_util::stream::BoxStream<
            'static,
            Result<LlmEvent, crate::services::llm::LlmError>,
        > {
            let said = request
                .messages
                .last()
                .and_then(Message::text)
                .unwrap_or_default();
            self.asked.lock().expect("unpoisoned").push(said.to_owned());
            let (reply, delay) = (self.reply.to_owned(), self.delay);
            Box::pin(futures_util::stream::once(async move {
                tokio::time::sleep(delay).await;
                Ok(LlmEvent::Text(reply))
            }))
        }
    }

    /// A person who answers with their name and their shop: three seconds of speech, longer
    /// than a person's greeting by the clock, then a wait for the caller. (The callee's audio
    /// and the VAD's edges are system frames, which overtake words queued beside them: each
    /// group's words arrive by its end.)
    fn long_hello() -> Vec<Vec<Frame>> {
        let first_words = [
            audio(400, None),
            system(SystemFrame::VadUserStartedSpeaking),
            audio(1_000, None),
            words("Hello, this is Sam Patel", false),
        ]
        .concat();
        let longer_than_a_persons = [
            audio(1_400, None),
            words(
                "Hello, this is Sam Patel at Northwind Bakery, how can I help?",
                false,
            ),
        ]
        .concat();
        let then_quiet = [
            audio(600, None),
            system(SystemFrame::VadSilenceStarted),
            audio(1_000, None),
        ]
        .concat();
        vec![
            first_words,
            longer_than_a_persons,
            then_quiet,
            audio(2_000, None),
        ]
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_greeting_the_llm_reads_as_a_person_is_greeted_not_left_a_message() {
        let (engine, asked) = Reads::judge("Person.", 300);
        let out = run(bakery().with_judge(engine), long_hello()).await;
        assert_eq!(said(&out).1, ["Hi, it's the bakery."]);
        assert_eq!(ends(&out), [None], "the call goes on");
        let asked = asked.lock().expect("unpoisoned");
        assert_eq!(asked.len(), 1, "asked once: {asked:?}");
        assert!(asked[0].contains("Sam Patel"), "{asked:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn without_the_llms_say_a_long_greeting_is_a_machine() {
        // The same person, by the clock alone: a machine, left the message.
        let out = run(bakery(), long_hello()).await;
        assert_eq!(said(&out).1, ["Bye."]);
        // An LLM that agrees, or answers too late, leaves the timing's verdict standing.
        for (reply, delay) in [("machine", 300), ("person", 10_000)] {
            let (engine, _) = Reads::judge(reply, delay);
            let out = run(bakery().with_judge(engine), long_hello()).await;
            assert_eq!(said(&out).1, ["Bye."], "{reply} after {delay} ms");
        }
    }

    /// Speech in short bursts with short pauses: never long enough for a machine by the clock,
    /// never quiet long enough for a person; then a second and a half of quiet.
    fn halting() -> Vec<Vec<Frame>> {
        let bursts = |n: usize| -> Vec<Frame> {
            (0..n)
                .flat_map(|_| {
                    [
                        system(SystemFrame::VadUserStartedSpeaking),
                        audio(300, None),
                        system(SystemFrame::VadSilenceStarted),
                        audio(500, None),
                    ]
                    .concat()
                })
                .collect()
        };
        let first = [audio(200, None), bursts(3), words("Uh yes", true)].concat();
        vec![first, bursts(3), audio(1_800, None), audio(1_800, None)]
    }

    #[tokio::test(start_paused = true)]
    async fn a_greeting_the_timing_cannot_place_is_what_the_llm_reads_it_as() {
        // The LLM hears a machine: it records once it has been quiet a while.
        let (engine, _) = Reads::judge("machine", 200);
        let out = run(bakery().with_judge(engine), halting()).await;
        assert_eq!(said(&out).1, ["Bye."]);
        // The LLM hears a person: greeted.
        let (engine, _) = Reads::judge("It is a person.", 200);
        let out = run(bakery().with_judge(engine), halting()).await;
        assert_eq!(said(&out).1, ["Hi, it's the bakery."]);
        // Unsure: unknown, and the conversation is the bot's, as without the LLM.
        let (engine, _) = Reads::judge("unsure", 200);
        let out = run(bakery().with_judge(engine), halting()).await;
        assert_eq!(said(&out).1, ["Hi, it's the bakery."]);
        assert_eq!(ends(&out), [None]);
    }

    #[test]
    fn the_llms_reply_names_who_answered_by_its_first_telling_word() {
        assert_eq!(verdict_of("Person."), Some(AnsweredBy::Human));
        assert_eq!(verdict_of("machine"), Some(AnsweredBy::Machine));
        assert_eq!(
            verdict_of("It's a voicemail greeting."),
            Some(AnsweredBy::Machine)
        );
        assert_eq!(verdict_of("MENU"), Some(AnsweredBy::Menu));
        assert_eq!(verdict_of("unsure, maybe a person"), None);
        assert_eq!(verdict_of("I cannot tell."), None);
    }
}
