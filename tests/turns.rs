//! Turn-taking on recorded audio: the real VAD, Smart Turn, Whisper and espeak-ng, fed at
//! real-time pace, with a scripted LLM so the bot's words are known. Needs the models
//! (scripts/setup.sh).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::stream::{self, BoxStream};
use tokio::time::Instant;

use voxide::aggregators::{AssistantAggregator, UserAggregator};
use voxide::audio::aec::EchoCanceller;
use voxide::audio::echo::{EchoGuard, EchoGuardParams, EchoReference};
use voxide::audio::resample::StreamResampler;
use voxide::audio::turn::SmartTurn;
use voxide::audio::vad::{VadBatcher, VadParams, VadStage};
use voxide::context::{ContextHandle, LlmContext, Message, StopReason};
use voxide::events::Event;
use voxide::frames::{AudioFrame, StartParams, SystemFrame};
use voxide::pipeline::{Pipeline, Session};
use voxide::services::llm::{
    FunctionCallParams, FunctionOptions, LlmEngine, LlmError, LlmEvent, LlmRequest, LlmService,
};
use voxide::services::stt::{Segmented, SttError, SttService, Transcriber, Whisper};
use voxide::services::tts::{
    EspeakVoice, PiperVoice, Sentences, Synthesizer, TtsEngine, TtsService,
};
use voxide::transports::{AudioOutput, AudioSink, OutputOptions};
use voxide::turns::{TurnStop, UserTurns};

const RATE: u32 = 16_000;
const CHUNK: usize = 320;
/// The bot's first answer: long enough to be talked over.
const LONG_REPLY: &str = "The weather in Paris is mild today. There is a light breeze from the \
west, and the afternoon should stay dry. In the evening the clouds come back, and it may rain \
a little after midnight.";

/// Answers from a script, then "Okay." for ever. A reply `call:NAME` is a call of tool NAME.
/// Remembers when each run started and whether its request carried a tool's result.
struct Scripted {
    replies: Mutex<VecDeque<String>>,
    runs: Arc<Mutex<Vec<LlmRun>>>,
}

/// One run of the scripted LLM.
struct LlmRun {
    at: Instant,
    /// The request's messages as JSON text.
    request: String,
}

impl LlmEngine for Scripted {
    fn model(&self) -> &str {
        "scripted"
    }

    fn provider(&self) -> &str {
        "test"
    }

    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        self.runs.lock().expect("lock").push(LlmRun {
            at: Instant::now(),
            request: serde_json::to_string(&request.messages).expect("json"),
        });
        let text = self
            .replies
            .lock()
            .expect("lock")
            .pop_front()
            .unwrap_or_else(|| "Okay.".into());
        if let Some(name) = text.strip_prefix("call:") {
            return Box::pin(stream::iter([Ok(LlmEvent::ToolCall {
                id: "call_1".into(),
                name: name.to_owned(),
                arguments: "{}".into(),
            })]));
        }
        // Word by word, as a model streams.
        let words: Vec<_> = text
            .split_inclusive(' ')
            .map(|w| Ok(LlmEvent::Text(w.to_owned())))
            .collect();
        Box::pin(stream::iter(words))
    }
}

/// An STT that takes `delay` longer than its engine.
struct Slow {
    engine: Arc<Whisper>,
    delay: Duration,
}

impl Transcriber for Slow {
    fn name(&self) -> &str {
        "slow"
    }

    fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
        std::thread::sleep(self.delay);
        self.engine.transcribe(audio)
    }
}

/// What the bot played, when, and a loopback of it for the echo scenario.
#[derive(Clone, Default)]
struct Speaker(Arc<Mutex<SpeakerState>>);

#[derive(Default)]
struct SpeakerState {
    played: Vec<Instant>,
    loopback: VecDeque<i16>,
}

impl AudioSink for Speaker {
    fn write(&mut self, samples: &[i16], _: u32) {
        let mut state = self.0.lock().expect("lock");
        state.played.push(Instant::now());
        state.loopback.extend(samples);
    }
}

/// One step of what the user does.
enum Step {
    Say(Vec<i16>),
    Silence(Duration),
    /// Silence until the bot has spoken for this long.
    WhileBotSpeaks(Duration),
    /// Silence until the bot has been quiet for this long after speaking.
    UntilBotDone(Duration),
    /// Lets the scenario's async tool finish.
    Release,
    /// Silence until this many final transcripts of the user have come.
    UntilFinals(usize),
}

struct Outcome {
    messages: Vec<Message>,
    events: Vec<(Instant, Event)>,
    played: Vec<Instant>,
    /// When each `Say` step started.
    said_at: Vec<Instant>,
    llm_runs: Vec<LlmRun>,
}

impl Outcome {
    fn count(&self, pick: fn(&Event) -> bool) -> usize {
        self.events.iter().filter(|(_, e)| pick(e)).count()
    }

    fn assistant(&self) -> Vec<&voxide::context::AssistantMessage> {
        self.messages
            .iter()
            .filter_map(|m| match m {
                Message::Assistant(a) if a.tool_calls.is_none() => Some(a),
                _ => None,
            })
            .collect()
    }

    /// The turn-taking events, with milliseconds since the first, for failure messages.
    fn timeline(&self) -> String {
        let Some((first, _)) = self.events.first() else {
            return String::new();
        };
        self.events
            .iter()
            .filter(|(_, e)| !matches!(e, Event::Metrics { .. }))
            .map(|(at, e)| format!("\n{:>6} {e:?}", at.duration_since(*first).as_millis()))
            .collect()
    }

    fn users(&self) -> Vec<&str> {
        self.messages
            .iter()
            .filter(|m| matches!(m, Message::User(_)))
            .filter_map(Message::text)
            .collect()
    }
}

#[derive(Default)]
struct Scenario {
    replies: Vec<&'static str>,
    echo_db: Option<f32>,
    guard: bool,
    /// Cancel the echo with the played audio as the reference.
    canceller: bool,
    /// Extra time each transcription takes, as a slow or loaded STT would.
    stt_delay: Duration,
}

/// The async tool of the scenarios that call one: `check_order` answers "shipped yesterday"
/// once a `Step::Release` lets it.
const ASYNC_TOOL: &str = "check_order";

async fn play(scenario: Scenario, steps: Vec<Step>) -> Outcome {
    let context = ContextHandle::new(LlmContext::new(vec![Message::system("Be brief.")]));
    let runs = Arc::new(Mutex::new(Vec::new()));
    let engine = Scripted {
        replies: Mutex::new(scenario.replies.iter().map(|r| r.to_string()).collect()),
        runs: runs.clone(),
    };
    let release = Arc::new(tokio::sync::Notify::new());
    let mut llm = LlmService::new(engine);
    {
        let release = release.clone();
        llm.register_function(
            Some(ASYNC_TOOL),
            move |call: FunctionCallParams| {
                let release = release.clone();
                async move {
                    release.notified().await;
                    call.result_callback
                        .done(serde_json::json!("shipped yesterday"));
                }
            },
            FunctionOptions::asynchronous(),
        );
    }
    let speaker = Speaker::default();
    let reference = EchoReference::new();
    let mut pipeline = Pipeline::new();
    if scenario.canceller {
        pipeline = pipeline.then(EchoCanceller::new(reference.clone()));
    }
    if scenario.guard {
        pipeline = pipeline.then(EchoGuard::new(
            reference.clone(),
            EchoGuardParams::default(),
        ));
    }
    let stop = TurnStop::SmartTurn {
        model: SmartTurn::shared().expect("the Smart Turn model; run scripts/setup.sh"),
        incomplete_timeout: Duration::from_secs(3),
        words: true,
    };
    let voice: Arc<dyn TtsEngine> =
        Sentences::shared(Arc::new(EspeakVoice::new("en-us").expect("espeak-ng")));
    let pipeline = pipeline
        .then(VadStage::new(
            VadBatcher::shared().expect("the VAD model"),
            VadParams::default(),
        ))
        .then(SttService::new(
            Segmented::shared(Arc::new(Slow {
                engine: Whisper::shared().expect("the Whisper model"),
                delay: scenario.stt_delay,
            })),
            "user",
        ))
        .then(UserTurns::new(stop))
        .then(UserAggregator::new(context.clone()))
        .then(llm)
        .then(TtsService::new(voice))
        .then(AudioOutput::new(
            reference.tap(speaker.clone()),
            OutputOptions::default(),
        ))
        .then(AssistantAggregator::new(context.clone()));
    let builder = Session::builder(pipeline)
        .params(StartParams {
            audio_out_sample_rate: RATE,
            ..StartParams::default()
        })
        .idle_timeout(None);
    let mut subscription = builder.subscribe();
    let session = builder.spawn();
    let handle = session.handle();
    let events = Arc::new(Mutex::new(Vec::new()));
    let collector = {
        let events = events.clone();
        tokio::spawn(async move {
            while let Ok(e) = subscription.recv().await {
                let ended = matches!(e.event, Event::SessionEnded { .. });
                events.lock().expect("lock").push((Instant::now(), e.event));
                if ended {
                    break;
                }
            }
        })
    };
    // The bot's speaking state, from the events.
    let bot_state = |events: &Mutex<Vec<(Instant, Event)>>| -> (Option<Instant>, Option<Instant>) {
        let events = events.lock().expect("lock");
        let mut started = None;
        let mut stopped = None;
        for (at, e) in events.iter() {
            match e {
                Event::BotStartedSpeaking => (started, stopped) = (Some(*at), None),
                Event::BotStoppedSpeaking => stopped = Some(*at),
                _ => {}
            }
        }
        (started, stopped)
    };
    let echo_gain = scenario.echo_db.map(|db| 10f32.powf(db / 20.0));
    // Sound takes a while from the speaker to the mic (device buffers, the room): 30 ms here.
    let mut echo_path: VecDeque<i16> = std::iter::repeat_n(0, RATE as usize * 30 / 1000).collect();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut said_at = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for step in steps {
        let mut audio: VecDeque<i16> = match &step {
            Step::Say(samples) => {
                said_at.push(Instant::now());
                samples.iter().copied().collect()
            }
            Step::Silence(d) => {
                std::iter::repeat_n(0, (d.as_secs_f64() * f64::from(RATE)) as usize).collect()
            }
            Step::Release => {
                release.notify_one();
                VecDeque::new()
            }
            _ => VecDeque::new(),
        };
        loop {
            let done = match &step {
                Step::Say(_) | Step::Silence(_) => audio.is_empty(),
                Step::WhileBotSpeaks(d) => {
                    matches!(bot_state(&events), (Some(at), None) if at.elapsed() >= *d)
                }
                Step::UntilBotDone(d) => {
                    matches!(bot_state(&events), (Some(_), Some(at)) if at.elapsed() >= *d)
                }
                Step::Release => true,
                Step::UntilFinals(n) => {
                    let events = events.lock().expect("lock");
                    let finals = events
                        .iter()
                        .filter(|(_, e)| {
                            matches!(e, Event::UserTranscription { is_final: true, .. })
                        })
                        .count();
                    finals >= *n
                }
            };
            if done || Instant::now() > deadline {
                break;
            }
            tick.tick().await;
            let mut chunk: Vec<i16> = (0..CHUNK).map(|_| audio.pop_front().unwrap_or(0)).collect();
            if let Some(gain) = echo_gain {
                let mut state = speaker.0.lock().expect("lock");
                for sample in &mut chunk {
                    echo_path.push_back(state.loopback.pop_front().unwrap_or(0));
                    let echo = echo_path.pop_front().unwrap_or(0);
                    let mixed = f32::from(*sample) + gain * f32::from(echo);
                    *sample = mixed.clamp(-32_768.0, 32_767.0) as i16;
                }
            }
            let frame = SystemFrame::InputAudio(AudioFrame::new(chunk, RATE, 1));
            handle.queue_frame(frame).await.expect("the session runs");
        }
    }
    handle.stop_when_done().await.expect("the session runs");
    session.join().await;
    let _ = collector.await;
    let messages = context.lock().messages.clone();
    let events = std::mem::take(&mut *events.lock().expect("lock"));
    let played = speaker.0.lock().expect("lock").played.clone();
    let llm_runs = std::mem::take(&mut *runs.lock().expect("lock"));
    Outcome {
        messages,
        events,
        played,
        said_at,
        llm_runs,
    }
}

/// A question with a pause in the middle, then silence until the bot has answered.
fn paused_question() -> Vec<Step> {
    vec![
        Step::Say(say("I would like to know the weather in, uh,")),
        Step::Silence(Duration::from_millis(700)),
        Step::Say(say("Paris?")),
        Step::UntilBotDone(Duration::from_millis(500)),
    ]
}

/// The user's question.
fn question() -> Vec<i16> {
    say("What is the weather like in Paris today?")
}

/// `text` in Piper's voice at 16 kHz.
fn say(text: &str) -> Vec<i16> {
    // Without the voice's sampling noise: its pauses vary from run to run otherwise, and a
    // pause is what these scenarios are about.
    static VOICE: OnceLock<PiperVoice> = OnceLock::new();
    let voice = VOICE.get_or_init(|| {
        PiperVoice::load_default()
            .expect("the Piper voice; run scripts/setup.sh")
            .deterministic()
    });
    let speech = voice.synthesize(text).expect("speech");
    let mut down = StreamResampler::new(speech.sample_rate, RATE).expect("resampler");
    down.process(&speech.samples)
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .collect()
}

fn is_interruption(e: &Event) -> bool {
    matches!(e, Event::Interruption)
}

fn is_pause(e: &Event) -> bool {
    matches!(e, Event::BotPaused)
}

fn is_resume(e: &Event) -> bool {
    matches!(e, Event::BotResumed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_question_is_one_turn_and_gets_the_whole_answer() {
    let out = play(
        Scenario {
            replies: vec!["It is sunny in Paris."],
            ..Scenario::default()
        },
        vec![
            Step::Silence(Duration::from_millis(500)),
            Step::Say(question()),
            Step::UntilBotDone(Duration::from_millis(500)),
        ],
    )
    .await;
    let users = out.users();
    assert_eq!(users.len(), 1, "one turn: {users:?}");
    assert!(users[0].to_lowercase().contains("weather"), "{users:?}");
    let replies = out.assistant();
    assert_eq!(replies.len(), 1);
    assert_eq!(
        Message::Assistant(replies[0].clone()).text(),
        Some("It is sunny in Paris.")
    );
    assert_eq!(out.count(is_interruption), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talking_over_the_bot_stops_it_and_keeps_only_the_words_played() {
    let barge = say("Hold on a moment please.");
    let barge_secs = barge.len() as f64 / f64::from(RATE);
    let out = play(
        Scenario {
            replies: vec![LONG_REPLY, "Sure."],
            ..Scenario::default()
        },
        vec![
            Step::Say(question()),
            Step::WhileBotSpeaks(Duration::from_millis(2_500)),
            Step::Say(barge),
            Step::UntilBotDone(Duration::from_millis(500)),
        ],
    )
    .await;
    assert!(out.count(is_interruption) >= 1, "the bot was interrupted");
    // The bot went quiet while the user talked over it (VAD start_secs plus slack for a
    // loaded machine), and spoke again only to answer.
    let barge_at = out.said_at[1];
    let quiet_from = barge_at + Duration::from_millis(800);
    let quiet_until = barge_at + Duration::from_secs_f64(barge_secs);
    let during: Vec<_> = out
        .played
        .iter()
        .filter(|t| **t > quiet_from && **t < quiet_until)
        .collect();
    assert!(
        during.is_empty(),
        "{} chunks played over the user",
        during.len()
    );
    let replies = out.assistant();
    let first = Message::Assistant(replies[0].clone());
    let heard = words(first.text().unwrap_or_default());
    let whole = words(LONG_REPLY);
    eprintln!("kept after the interruption: {heard:?}");
    assert!(!heard.is_empty(), "some of the answer was heard");
    assert!(
        heard.len() < whole.len() / 2,
        "only what was played: {heard:?}"
    );
    assert_eq!(heard[..], whole[..heard.len()], "a prefix of the answer");
    assert_eq!(
        replies[0].meta.as_ref().map(|m| m.stop_reason),
        Some(StopReason::Aborted)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cough_while_the_bot_speaks_does_not_interrupt() {
    // 150 ms of loud noise with a fast attack and decay, like a cough.
    let mut seed = 12_345u32;
    let cough: Vec<i16> = (0..RATE as usize * 15 / 100)
        .map(|i| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let noise = (seed >> 16) as i16 as f32 / 32_768.0;
            let envelope = (-(i as f32) / 800.0).exp();
            (noise * envelope * 20_000.0) as i16
        })
        .collect();
    let out = play(
        Scenario {
            replies: vec![LONG_REPLY],
            ..Scenario::default()
        },
        vec![
            Step::Say(question()),
            Step::WhileBotSpeaks(Duration::from_millis(1_500)),
            Step::Say(cough),
            Step::UntilBotDone(Duration::from_millis(500)),
        ],
    )
    .await;
    assert_eq!(out.count(is_interruption), 0);
    // If the cough held the bot at all, the bot played on after it.
    assert_eq!(out.count(is_pause), out.count(is_resume));
    let replies = out.assistant();
    assert_eq!(replies.len(), 1, "{:#?}", out.messages);
    assert_eq!(
        words(
            Message::Assistant(replies[0].clone())
                .text()
                .unwrap_or_default()
        ),
        words(LONG_REPLY)
    );
}

/// The bot's own voice fed back into the input at -10 dB, as from a speaker next to the mic.
async fn echo_scenario(guard: bool) -> Outcome {
    play(
        Scenario {
            replies: vec![LONG_REPLY],
            echo_db: Some(-10.0),
            guard,
            ..Scenario::default()
        },
        vec![
            Step::Say(question()),
            Step::UntilBotDone(Duration::from_millis(500)),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bots_own_echo_does_not_interrupt_it_with_the_guard_on() {
    let out = echo_scenario(true).await;
    assert_eq!(out.count(is_interruption), 0);
    // Not even a hold: the guard keeps the echo from the VAD.
    assert_eq!(out.count(is_pause), 0);
    let replies = out.assistant();
    assert_eq!(replies.len(), 1, "{:?}", out.users());
    assert_eq!(
        words(
            Message::Assistant(replies[0].clone())
                .text()
                .unwrap_or_default()
        ),
        words(LONG_REPLY)
    );
    // Without the guard, the same echo is taken for the user: the bot holds for it (and the
    // echo dies with the bot's voice, so it fades rather than interrupts).
    let unguarded = echo_scenario(false).await;
    assert!(
        unguarded.count(is_pause) + unguarded.count(is_interruption) >= 1,
        "the echo alone holds or interrupts the bot without the guard"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canceller_removes_the_bots_echo_but_not_the_user() {
    // The bot's voice comes back 10 dB down the whole time; the user talks over it once.
    let out = play(
        Scenario {
            replies: vec![LONG_REPLY, "Sure."],
            echo_db: Some(-10.0),
            canceller: true,
            ..Scenario::default()
        },
        vec![
            Step::Say(question()),
            Step::WhileBotSpeaks(Duration::from_millis(3_000)),
            Step::Say(say("Stop, wait a moment please.")),
            Step::UntilBotDone(Duration::from_millis(500)),
        ],
    )
    .await;
    let timeline = out.timeline();
    let barge_at = out.said_at[1];
    let interruptions: Vec<Instant> = out
        .events
        .iter()
        .filter(|(_, e)| is_interruption(e))
        .map(|(at, _)| *at)
        .collect();
    assert!(
        interruptions.iter().all(|at| *at >= barge_at),
        "only the user interrupts, never the echo{timeline}"
    );
    assert!(
        !interruptions.is_empty(),
        "the user's voice came through the canceller{timeline}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_mid_sentence_stays_in_the_same_turn() {
    // A filler before the pause. The voice also pauses at the comma after "in", so the VAD
    // stops twice before "Paris"; Smart Turn rates both stops at 0.01 or less (finished ≥ 0.5),
    // far from its threshold, so the verdicts hold under any load.
    let out = play(
        Scenario {
            replies: vec!["It is sunny."],
            ..Scenario::default()
        },
        paused_question(),
    )
    .await;
    let (users, timeline) = (out.users(), out.timeline());
    assert_eq!(users.len(), 1, "one turn: {users:?}{timeline}");
    assert!(
        words(users[0]).iter().any(|w| w == "paris"),
        "both halves in the turn: {users:?}{timeline}"
    );
    let ended = out.count(|e| matches!(e, Event::UserStoppedSpeaking));
    assert_eq!(ended, 1, "{timeline}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_ends_before_its_transcript_is_one_message() {
    // Each decode takes a second longer: Smart Turn ends the turn long before Whisper has the
    // second half's words, as on a loaded machine or with a slow network STT.
    let out = play(
        Scenario {
            replies: vec!["It is sunny."],
            stt_delay: Duration::from_secs(1),
            ..Scenario::default()
        },
        paused_question(),
    )
    .await;
    let (users, timeline) = (out.users(), out.timeline());
    assert_eq!(
        users.len(),
        1,
        "one message for the turn: {users:?}{timeline}"
    );
    assert!(
        words(users[0]).iter().any(|w| w == "paris"),
        "both halves in the message: {users:?}{timeline}"
    );
    assert_eq!(out.llm_runs.len(), 1, "one answer for the turn{timeline}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_result_that_lands_while_the_user_speaks_waits_for_the_turn() {
    let follow_up = say("And could you also send me the receipt by email please");
    let half = follow_up.len() / 2;
    let out = play(
        Scenario {
            replies: vec!["call:check_order", "Let me check.", "It shipped yesterday."],
            ..Scenario::default()
        },
        vec![
            Step::Say(say("Where is my order?")),
            Step::UntilBotDone(Duration::from_millis(800)),
            // The tool's result arrives in the middle of the user's next sentence.
            Step::Say(follow_up[..half].to_vec()),
            Step::Release,
            Step::Say(follow_up[half..].to_vec()),
            // Until the follow-up's words are in (they may come after the turn's end and the
            // result's answer) and the answer after them has been spoken.
            Step::UntilFinals(2),
            Step::WhileBotSpeaks(Duration::from_millis(100)),
            Step::UntilBotDone(Duration::from_millis(500)),
        ],
    )
    .await;
    let turns: Vec<Instant> = out
        .events
        .iter()
        .filter(|(_, e)| matches!(e, Event::UserStartedSpeaking))
        .map(|(at, _)| *at)
        .collect();
    let ends: Vec<Instant> = out
        .events
        .iter()
        .filter(|(_, e)| matches!(e, Event::UserStoppedSpeaking))
        .map(|(at, _)| *at)
        .collect();
    assert_eq!((turns.len(), ends.len()), (2, 2), "two user turns");
    let (start, end) = (turns[1], ends[1]);
    let released = out.said_at[2];
    assert!(
        start < released && released < end,
        "the result came mid-turn"
    );
    assert!(
        out.llm_runs.iter().all(|r| r.at < start || r.at > end),
        "the LLM ran while the user was speaking"
    );
    let after: Vec<&LlmRun> = out.llm_runs.iter().filter(|r| r.at > end).collect();
    assert!(
        after
            .iter()
            .any(|r| r.request.contains("shipped yesterday")),
        "a run after the turn has the result"
    );
    // The user's second message (whatever Whisper made of it) reaches the model after the turn.
    let users = |r: &&LlmRun| r.request.matches(r#""role":"user""#).count();
    assert!(
        after.iter().any(|r| users(r) == 2),
        "a run after the turn has the user's words: {:?}{}",
        after.iter().map(|r| &r.request).collect::<Vec<_>>(),
        out.timeline()
    );
    assert!(
        out.messages
            .iter()
            .any(|m| m.text().is_some_and(|t| t.contains("shipped yesterday"))),
        "the result is in the context"
    );
}

/// A model of its own with one worker, so that one held request holds all of it.
fn one_worker() -> SmartTurn {
    SmartTurn::load_with(voxide::audio::turn::SmartTurnEngine::best(), 1)
        .expect("the Smart Turn model; run scripts/setup.sh")
}

#[tokio::test(start_paused = true)]
async fn a_pause_the_busy_turn_model_cannot_judge_in_time_ends_the_turn_a_second_on() {
    let model = Arc::new(one_worker());
    // Another session's request holds the model's thread until the end of the test.
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (entered, holding) = std::sync::mpsc::channel::<()>();
    let held = Mutex::new(held);
    let busy = model.judge(vec![0; RATE as usize], move || {
        let _ = entered.send(());
        let _ = held.lock().map(|h| h.recv());
        false
    });
    holding
        .recv()
        .expect("the model's thread took the other request");

    let stop = TurnStop::SmartTurn {
        model: model.clone(),
        incomplete_timeout: Duration::from_secs(3),
        words: true,
    };
    let session = Session::builder(Pipeline::new().then(UserTurns::new(stop)))
        .idle_timeout(None)
        .spawn();
    let mut events = session.handle().subscribe();
    let handle = session.handle();
    handle
        .queue_frame(SystemFrame::VadUserStartedSpeaking)
        .await
        .expect("queued");
    let speech = AudioFrame::new(vec![0; RATE as usize], RATE, 1);
    handle
        .queue_frame(SystemFrame::InputAudio(speech))
        .await
        .expect("queued");
    tokio::time::sleep(Duration::from_millis(500)).await;
    handle
        .queue_frame(SystemFrame::VadUserStoppedSpeaking)
        .await
        .expect("queued");
    let paused = Instant::now();
    let ended = loop {
        match events.recv().await.expect("the session's events").event {
            Event::UserStoppedSpeaking => break Instant::now(),
            _ => continue,
        }
    };
    // Not the 3 s an unfinished-sounding turn may wait: no verdict came.
    let waited = ended - paused;
    assert!(
        waited >= voxide::turns::VERDICT_WAIT
            && waited < voxide::turns::VERDICT_WAIT + Duration::from_millis(100),
        "{waited:?}"
    );
    release.send(()).expect("release");
    drop(release);
    assert!(busy.await.expect("judged").is_some());
    handle.cancel();
    let _ = session.join().await;
}
