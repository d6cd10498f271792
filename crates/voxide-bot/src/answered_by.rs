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

use std::time::Duration;

use crate::audio::beep::BeepDetector;
use crate::events::{AnsweredBecause, AnsweredBy, Event};
use crate::frames::{ControlFrame, DataFrame, EndFrame, Frame, FrameBody, SystemFrame};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

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
}

/// Where the stage stands.
#[derive(Debug)]
enum Phase {
    /// Telling who answered: the callee's speech is held.
    Listening { held: Vec<(Frame, Direction)> },
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
        }
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
            ) => verdicts.extend(self.detector.speech_started(at)),
            FrameBody::System(SystemFrame::VadSilenceStarted) => {
                verdicts.extend(self.detector.speech_stopped(at));
            }
            FrameBody::Data(DataFrame::Transcription(words)) => {
                verdicts.extend(self.detector.words(&words.text, true));
            }
            FrameBody::Data(DataFrame::InterimTranscription(words)) => {
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
                } else if let Some(greeting) = self.greeting.take() {
                    // The greeting answers their "Hello?".
                    self.phase = Phase::Greeted;
                    for frame in Frame::response(greeting) {
                        cx.push(frame, Direction::Downstream);
                    }
                } else {
                    for (frame, direction) in held {
                        cx.push(frame, direction);
                    }
                }
            }
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
            SystemFrame::VadSpeechOnset
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
            if let Phase::Listening { held } = &mut self.phase {
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
}
