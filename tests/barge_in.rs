//! Barge-in policies of the user-turn machine, frame by frame on a clock of the test's own: interrupt at the
//! VAD's start, wait for enough words, pause the bot and resume it when no words come; and the
//! output holding its audio while paused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use voxide::events::Event;
use voxide::frames::{
    AudioFrame, ControlFrame, DataFrame, Frame, FrameBody, SystemFrame, Transcription,
};
use voxide::pipeline::{
    Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session,
};
use voxide::transports::{AudioOutput, AudioSink, OutputOptions};
use voxide::turns::machine::{Action, Input, ONSET_FADE_GRACE, StopRule};
use voxide::turns::{BargeIn, TurnMachine, TurnStop, UserTurns};

/// Records the turn-taking frames that leave the stage, and the transcripts' words.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl Recorder {
    fn seen(&self) -> Vec<String> {
        self.0.lock().expect("lock").clone()
    }
}

impl FrameProcessor for Recorder {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        let label = match &frame.body {
            FrameBody::Data(DataFrame::Transcription(t)) => Some(format!("final: {}", t.text)),
            FrameBody::Data(DataFrame::InterimTranscription(t)) => {
                Some(format!("interim: {}", t.text))
            }
            FrameBody::Data(DataFrame::UserTurn(text)) => Some(format!("answer: {text}")),
            FrameBody::System(
                SystemFrame::Interruption
                | SystemFrame::PausePlayback
                | SystemFrame::ResumePlayback
                | SystemFrame::UserStartedSpeaking
                | SystemFrame::UserStoppedSpeaking,
            ) => Some(frame.name().to_owned()),
            _ => None,
        };
        if let Some(label) = label {
            self.0.lock().expect("lock").push(label);
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Counts the interruptions that leave the stage upstream.
#[derive(Clone, Default)]
struct UpstreamInterruptions(Arc<Mutex<usize>>);

impl FrameProcessor for UpstreamInterruptions {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if direction == Direction::Upstream && frame.is_interruption() {
            *self.0.lock().expect("lock") += 1;
        }
        cx.push(frame, direction);
        Ok(())
    }
}

enum Step {
    Frame(Frame),
    Wait(u64),
}

fn vad_start() -> Step {
    Step::Frame(SystemFrame::VadUserStartedSpeaking.into())
}

fn onset() -> Step {
    Step::Frame(SystemFrame::VadSpeechOnset { near_speaker: true }.into())
}

/// An onset under the speaker's level, in a café: most likely the room's talk.
fn room_onset() -> Step {
    Step::Frame(
        SystemFrame::VadSpeechOnset {
            near_speaker: false,
        }
        .into(),
    )
}

fn onset_faded() -> Step {
    Step::Frame(SystemFrame::VadOnsetFaded.into())
}

fn vad_stop() -> Step {
    Step::Frame(SystemFrame::VadUserStoppedSpeaking.into())
}

fn interim(text: &str) -> Step {
    Step::Frame(DataFrame::InterimTranscription(Box::new(Transcription::new(text, "user"))).into())
}

fn final_(text: &str) -> Step {
    Step::Frame(DataFrame::Transcription(Box::new(Transcription::new(text, "user"))).into())
}

/// A turn ends after 300 ms of silence.
const SILENCE: Duration = Duration::from_millis(300);

/// Plays `steps` to a turn machine while the bot is speaking, on a clock of its own, and
/// returns the frames it pushed and the transcripts it passed on, in order.
fn play(barge_in: BargeIn, steps: Vec<Step>) -> Vec<String> {
    let mut machine = TurnMachine::new(StopRule::Silence(SILENCE), barge_in);
    let mut now = Instant::now();
    let mut seen = Vec::new();
    let speaking = Step::Frame(SystemFrame::BotStartedSpeaking.into());
    for step in std::iter::once(speaking).chain(steps) {
        match step {
            Step::Frame(frame) => {
                let input = Input::of(&frame.body).expect("a frame the machine takes");
                let actions = machine.handle(input, now);
                record(&mut seen, Some(&frame), actions);
            }
            Step::Wait(ms) => {
                let until = now + Duration::from_millis(ms);
                while let Some(due) = machine.next_deadline().filter(|due| *due <= until) {
                    now = due;
                    let actions = machine.handle(Input::Tick, now);
                    record(&mut seen, None, actions);
                }
                now = until;
            }
        }
    }
    seen
}

/// Names what the machine did: the frames it pushed, and the transcripts it let through.
fn record(seen: &mut Vec<String>, frame: Option<&Frame>, actions: Vec<Action>) {
    for action in actions {
        match action {
            Action::Forward => seen.extend(frame.and_then(transcript_label)),
            Action::Push(pushed) => seen.push(Frame::from(pushed).name().to_owned()),
            Action::Interrupt => seen.push("interruption".to_owned()),
            Action::Answer(text) => seen.push(format!("answer: {text}")),
            // The machines here guess nothing (preemption is off by default).
            Action::Guess { .. } | Action::Judge { .. } => {}
        }
    }
}

fn transcript_label(frame: &Frame) -> Option<String> {
    match &frame.body {
        FrameBody::Data(DataFrame::Transcription(t)) => Some(format!("final: {}", t.text)),
        FrameBody::Data(DataFrame::InterimTranscription(t)) => Some(format!("interim: {}", t.text)),
        _ => None,
    }
}

/// Plays `steps` (ending with a wait; system frames overtake data frames, so a transcript a
/// system frame must not overtake is followed by a wait) through the stage in a session
/// whose clock is paused; returns what left the stage and the session's pause, resume and
/// interruption events. What left it is what the machine alone does with the same steps.
async fn play_with_events(barge_in: BargeIn, steps: Vec<Step>) -> (Vec<String>, Vec<String>) {
    assert!(
        matches!(steps.last(), Some(Step::Wait(_))),
        "let the last frame land"
    );
    let recorder = Recorder::default();
    let stage = UserTurns::with_barge_in(TurnStop::SpeechTimeout(SILENCE), barge_in);
    let upstream = UpstreamInterruptions::default();
    let pipeline = Pipeline::new()
        .then(upstream.clone())
        .then(stage)
        .then(recorder.clone());
    let session = Session::builder(pipeline).idle_timeout(None).spawn();
    let mut events = session.handle().subscribe();
    let handle = session.handle();
    handle
        .queue_frame(SystemFrame::BotStartedSpeaking)
        .await
        .expect("queued");
    let mut alone = Vec::new();
    for step in steps {
        match step {
            Step::Frame(frame) => {
                alone.push(Step::Frame(Frame::new(frame.body.clone())));
                handle.queue_frame(frame).await.expect("queued");
            }
            Step::Wait(ms) => {
                alone.push(Step::Wait(ms));
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
        }
    }
    handle.cancel();
    let _ = session.join().await;
    let mut names = Vec::new();
    while let Ok(event) = events.try_recv() {
        match event.event {
            Event::BotPaused => names.push("bot_paused".to_owned()),
            Event::BotResumed => names.push("bot_resumed".to_owned()),
            Event::Interruption => names.push("interruption".to_owned()),
            _ => {}
        }
    }
    let seen = recorder.seen();
    assert_eq!(
        seen,
        play(barge_in, alone),
        "the stage does what its machine says"
    );
    // Every interruption goes both ways, and the session reports it once.
    let interruptions = seen.iter().filter(|s| *s == "interruption").count();
    assert_eq!(*upstream.0.lock().expect("lock"), interruptions);
    assert_eq!(
        names.iter().filter(|n| *n == "interruption").count(),
        interruptions
    );
    (seen, names)
}

#[test]
fn by_default_speech_over_the_bot_interrupts_at_once() {
    let seen = play(BargeIn::default(), vec![vad_start(), Step::Wait(100)]);
    assert_eq!(seen, ["user_started_speaking", "interruption"]);
}

#[tokio::test(start_paused = true)]
async fn the_bot_holds_at_an_onset_and_plays_on_a_moment_after_it_fades() {
    let grace = ONSET_FADE_GRACE.as_millis() as u64;
    for (after_fade, expected) in [
        (grace - 1, &["bot_paused"][..]),
        (grace + 1, &["bot_paused", "bot_resumed"]),
    ] {
        let steps = vec![
            onset(),
            Step::Wait(60),
            onset_faded(),
            Step::Wait(after_fade),
        ];
        let (_, events) = play_with_events(BargeIn::default(), steps).await;
        assert_eq!(events, expected, "{after_fade} ms after the fade");
    }
}

#[tokio::test(start_paused = true)]
async fn an_onset_that_starts_speech_turns_the_hold_into_one_interruption() {
    let at_once = vec![onset(), Step::Wait(150), vad_start(), Step::Wait(100)];
    // "Let me | stop you there" in a café: the first word's onset fades, and the next word's
    // comes 150 ms later, within the grace. The bot stops once, not twice.
    let first_word_faded = vec![
        onset(),
        Step::Wait(300),
        onset_faded(),
        Step::Wait(150),
        onset(),
        Step::Wait(200),
        vad_start(),
        Step::Wait(100),
    ];
    for steps in [at_once, first_word_faded] {
        let (seen, events) = play_with_events(BargeIn::default(), steps).await;
        assert_eq!(
            seen,
            ["pause_playback", "user_started_speaking", "interruption"]
        );
        assert_eq!(events, ["bot_paused", "interruption"]);
    }
}

#[tokio::test(start_paused = true)]
async fn the_rooms_talk_under_the_speakers_level_does_not_hold_the_bot() {
    // A café makes onsets all the time: holding at each would stutter the bot's voice. One
    // that goes on still starts a turn, and that interrupts.
    let (seen, events) = play_with_events(
        BargeIn::default(),
        vec![
            room_onset(),
            Step::Wait(60),
            onset_faded(),
            room_onset(),
            Step::Wait(150),
            vad_start(),
            Step::Wait(100),
        ],
    )
    .await;
    assert_eq!(seen, ["user_started_speaking", "interruption"]);
    assert_eq!(events, ["interruption"]);
    // A user who starts softer holds the bot once their onset comes to their level.
    let (seen, _) = play_with_events(
        BargeIn::default(),
        vec![
            room_onset(),
            Step::Wait(30),
            Step::Frame(SystemFrame::VadOnsetNearSpeaker.into()),
            Step::Wait(120),
            vad_start(),
            Step::Wait(100),
        ],
    )
    .await;
    assert_eq!(
        seen,
        ["pause_playback", "user_started_speaking", "interruption"]
    );
}

#[test]
fn with_the_onset_hold_off_the_bot_talks_until_the_start() {
    let barge_in = BargeIn {
        pause_at_onset: false,
        ..BargeIn::default()
    };
    let seen = play(
        barge_in,
        vec![
            onset(),
            onset_faded(),
            onset(),
            Step::Wait(150),
            vad_start(),
        ],
    );
    assert_eq!(seen, ["user_started_speaking", "interruption"]);
}

#[tokio::test(start_paused = true)]
async fn a_hold_at_the_onset_carries_into_a_barge_in_waiting_for_words() {
    // Resuming if no words come: the onset's hold is the barge-in's pause, not a second one.
    let barge_in = BargeIn {
        resume_after: Some(Duration::from_millis(300)),
        ..BargeIn::default()
    };
    let (seen, events) = play_with_events(
        barge_in,
        vec![
            onset(),
            Step::Wait(150),
            vad_start(),
            Step::Wait(200),
            vad_stop(),
            Step::Wait(1_000),
        ],
    )
    .await;
    assert_eq!(
        seen,
        [
            "pause_playback",
            "user_started_speaking",
            "user_stopped_speaking",
            "resume_playback"
        ]
    );
    assert_eq!(events, ["bot_paused", "bot_resumed"]);
    // Talking on until words confirm it: the hold ends at the start.
    let barge_in = BargeIn {
        min_words: 3,
        ..BargeIn::default()
    };
    let seen = play(barge_in, vec![onset(), Step::Wait(150), vad_start()]);
    assert_eq!(
        seen,
        ["pause_playback", "user_started_speaking", "resume_playback"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_paused_bot_resumes_when_no_words_come() {
    let barge_in = BargeIn {
        min_words: 0,
        resume_after: Some(Duration::from_millis(500)),
        ..BargeIn::default()
    };
    let (seen, events) = play_with_events(
        barge_in,
        vec![vad_start(), Step::Wait(200), vad_stop(), Step::Wait(1_000)],
    )
    .await;
    assert_eq!(events, ["bot_paused", "bot_resumed"]);
    assert_eq!(
        seen,
        [
            "user_started_speaking",
            "pause_playback",
            "user_stopped_speaking",
            "resume_playback"
        ]
    );
}

#[test]
fn words_confirm_the_interruption_before_their_transcript_goes_on() {
    let barge_in = BargeIn {
        min_words: 2,
        resume_after: Some(Duration::from_millis(500)),
        ..BargeIn::default()
    };
    let seen = play(
        barge_in,
        vec![
            vad_start(),
            interim("wait"),
            Step::Wait(200),
            interim("wait stop"),
            vad_stop(),
            final_("Wait, stop."),
            Step::Wait(1_000),
        ],
    );
    assert_eq!(
        seen,
        [
            "user_started_speaking",
            "pause_playback",
            "interim: wait",
            "interruption",
            "interim: wait stop",
            "final: Wait, stop.",
            "user_stopped_speaking",
            "answer: Wait, stop."
        ]
    );
}

#[test]
fn a_short_remark_over_the_bot_is_dropped_and_the_bot_talks_on() {
    let barge_in = BargeIn {
        min_words: 3,
        resume_after: None,
        ..BargeIn::default()
    };
    let seen = play(
        barge_in,
        vec![
            vad_start(),
            interim("yeah"),
            vad_stop(),
            Step::Wait(400),
            final_("Yeah."),
            Step::Wait(200),
        ],
    );
    // The turn starts and ends (the aggregator gets no words); no pause, no interruption.
    assert_eq!(
        seen,
        [
            "user_started_speaking",
            "interim: yeah",
            "user_stopped_speaking"
        ]
    );
}

#[test]
fn a_listeners_reactions_over_the_bot_let_it_talk_on_and_a_real_word_stops_it() {
    let barge_in = BargeIn {
        backchannels: true,
        pause_at_onset: false,
        ..BargeIn::default()
    };
    let seen = play(
        barge_in,
        vec![
            vad_start(),
            interim("Mm-hmm"),
            vad_stop(),
            Step::Wait(400),
            final_("Mm-hmm, I see."),
            Step::Wait(200),
            vad_start(),
            interim("Oh wait"),
            Step::Wait(100),
        ],
    );
    // The reactions are no turn and stop nothing; "wait" does, at its first interim.
    assert_eq!(
        seen,
        [
            "user_started_speaking",
            "interim: Mm-hmm",
            "user_stopped_speaking",
            "user_started_speaking",
            "interruption",
            "interim: Oh wait",
        ]
    );
}

#[test]
fn a_late_transcript_with_enough_words_still_interrupts_a_resumed_bot() {
    let barge_in = BargeIn {
        min_words: 2,
        resume_after: Some(Duration::from_millis(300)),
        ..BargeIn::default()
    };
    let seen = play(
        barge_in,
        vec![
            vad_start(),
            vad_stop(),
            Step::Wait(800),
            final_("Hold on please."),
            Step::Wait(100),
        ],
    );
    assert_eq!(
        seen,
        [
            "user_started_speaking",
            "pause_playback",
            "user_stopped_speaking",
            "resume_playback",
            "interruption",
            "final: Hold on please.",
            "answer: Hold on please."
        ]
    );
}

/// Counts the samples the output hands its sink, and when.
#[derive(Clone, Default)]
struct CountingSink(Arc<Mutex<Vec<(tokio::time::Instant, usize)>>>);

impl AudioSink for CountingSink {
    fn write(&mut self, samples: &[i16], _sample_rate: u32) {
        self.0
            .lock()
            .expect("lock")
            .push((tokio::time::Instant::now(), samples.len()));
    }
}

impl CountingSink {
    fn samples(&self) -> usize {
        self.0.lock().expect("lock").iter().map(|(_, n)| n).sum()
    }
}

#[tokio::test(start_paused = true)]
async fn a_paused_output_holds_its_audio_and_the_floor_until_it_resumes() {
    let sink = CountingSink::default();
    let recorder = Recorder::default();
    let output = AudioOutput::new(sink.clone(), OutputOptions::default());
    let session = Session::builder(Pipeline::new().then(output).then(recorder.clone()))
        .idle_timeout(None)
        .spawn();
    let mut events = session.handle().subscribe();
    let handle = session.handle();
    // One second of audio at 16 kHz.
    let audio = AudioFrame::new(vec![1_000i16; 16_000], 16_000, 1);
    handle
        .queue_frame(DataFrame::OutputAudio(audio))
        .await
        .expect("queued");
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle
        .queue_frame(SystemFrame::PausePlayback)
        .await
        .expect("queued");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let at_pause = sink.samples();
    assert!((4_000..=6_000).contains(&at_pause), "{at_pause}");
    // Held for two seconds: nothing more is played, and the bot has not stopped speaking.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sink.samples(), at_pause);
    handle
        .queue_frame(SystemFrame::ResumePlayback)
        .await
        .expect("queued");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sink.samples(), 16_000, "the rest played after the resume");
    handle.cancel();
    let _ = session.join().await;
    let mut speaking = Vec::new();
    while let Ok(event) = events.try_recv() {
        match event.event {
            Event::BotStartedSpeaking => speaking.push("started"),
            Event::BotStoppedSpeaking => speaking.push("stopped"),
            _ => {}
        }
    }
    assert_eq!(
        speaking,
        ["started", "stopped"],
        "one utterance, paused in the middle"
    );
}

#[test]
fn once_the_bot_has_finished_a_short_answer_is_a_turn_again() {
    let barge_in = BargeIn {
        min_words: 3,
        resume_after: None,
        ..BargeIn::default()
    };
    let seen = play(
        barge_in,
        vec![
            vad_start(),
            vad_stop(),
            Step::Wait(400),
            final_("Yeah."),
            Step::Frame(SystemFrame::BotStoppedSpeaking.into()),
            vad_start(),
            vad_stop(),
            final_("Okay."),
            Step::Wait(400),
        ],
    );
    assert_eq!(
        seen,
        [
            "user_started_speaking",
            "user_stopped_speaking",
            "user_started_speaking",
            "final: Okay.",
            "user_stopped_speaking",
            "answer: Okay."
        ]
    );
}

#[test]
fn a_transcript_of_speech_the_vad_missed_interrupts_and_is_a_turn() {
    let seen = play(
        BargeIn::default(),
        vec![
            interim("what time"),
            Step::Wait(500),
            final_("What time is it?"),
            Step::Wait(900),
            // Still open: a second after the last words, not the first.
            Step::Frame(SystemFrame::BotStoppedSpeaking.into()),
            Step::Wait(300),
        ],
    );
    assert_eq!(
        seen,
        [
            "user_started_speaking",
            "interruption",
            "interim: what time",
            "final: What time is it?",
            "user_stopped_speaking",
            "answer: What time is it?"
        ]
    );
}

#[test]
fn a_final_announced_in_a_vad_turn_that_lands_after_it_opens_no_turn() {
    let seen = play(
        BargeIn::default(),
        vec![
            vad_start(),
            Step::Frame(SystemFrame::TranscriptionPending.into()),
            vad_stop(),
            Step::Wait(400),
            final_("Hello there."),
            Step::Frame(ControlFrame::TranscriptionDone.into()),
            Step::Wait(1_500),
        ],
    );
    assert_eq!(
        seen,
        [
            "user_started_speaking",
            "interruption",
            "user_stopped_speaking",
            "final: Hello there.",
            "answer: Hello there."
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn speech_while_the_bot_works_out_its_answer_interrupts_it_at_once() {
    // Even a policy that waits for words over the bot's voice: a half-question's answer that
    // has not been spoken yet is not worth keeping.
    let barge_in = BargeIn {
        min_words: 3,
        ..BargeIn::default()
    };
    let turn = |words| {
        [
            vad_start(),
            final_(words),
            Step::Wait(10),
            vad_stop(),
            Step::Wait(400),
        ]
    };
    let mut steps = vec![Step::Frame(SystemFrame::BotStoppedSpeaking.into())];
    // The question, then more of it before the bot answers.
    steps.extend(turn("What time"));
    steps.extend(turn("is it?"));
    // The bot answers and finishes; the next turn owes it nothing.
    steps.push(Step::Frame(SystemFrame::BotStartedSpeaking.into()));
    steps.push(Step::Frame(SystemFrame::BotStoppedSpeaking.into()));
    steps.extend(turn("Thanks."));
    let (seen, events) = play_with_events(barge_in, steps).await;
    assert_eq!(
        seen,
        [
            "user_started_speaking",
            "final: What time",
            "user_stopped_speaking",
            "answer: What time",
            "user_started_speaking",
            "interruption",
            "final: is it?",
            "user_stopped_speaking",
            "answer: is it?",
            "user_started_speaking",
            "final: Thanks.",
            "user_stopped_speaking",
            "answer: Thanks."
        ]
    );
    assert_eq!(events, ["interruption"]);
}
