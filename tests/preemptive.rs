//! Preemptive generation in the LLM service: an answer started on a guess at the turn's words
//! is taken over when the turn ends with them, and thrown away when it does not.

mod common;

use common::scripted::{Bot, ScriptedLlm, say};
use voxide::context::Message;
use voxide::frames::{DataFrame, SystemFrame};
use voxide::services::llm::LlmService;

/// What the user aggregator hands on at a pause: the context as the turn would make it.
async fn guess(bot: &Bot, words: &str) {
    let mut guess = bot.context.snapshot();
    guess.messages.push(Message::user(words));
    bot.handle
        .queue_frame(DataFrame::LlmGuess {
            id: 1,
            context: Box::new(guess),
        })
        .await
        .expect("queued");
}

fn last_answer(messages: &[Message]) -> Option<String> {
    match messages.last()? {
        Message::Assistant(m) => m.content.as_ref()?.as_ref().map(|c| c.joined_text()),
        _ => None,
    }
}

#[tokio::test]
async fn an_answer_started_on_the_right_guess_is_taken_over_not_asked_for_again() {
    let engine = ScriptedLlm::new(vec![vec![say("It is "), say("noon.")]]);
    let mut bot = Bot::start(LlmService::new(engine.clone()));
    guess(&bot, "What time is it?").await;
    bot.user_says("What time is it?", 1).await;
    assert_eq!(engine.runs(), 1, "the guess's run is the answer");
    let (messages, errors) = bot.stop().await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(last_answer(&messages).as_deref(), Some("It is noon."));
}

#[tokio::test]
async fn a_wrong_guess_is_thrown_away_and_the_turn_answered_afresh() {
    let engine = ScriptedLlm::new(vec![vec![say("Half an answer.")], vec![say("In Paris.")]]);
    let mut bot = Bot::start(LlmService::new(engine.clone()));
    guess(&bot, "What time is it").await;
    bot.user_says("What time is it in Paris?", 1).await;
    assert_eq!(engine.runs(), 2);
    let (messages, _, events) = bot.stop_with_events().await;
    // The guess is counted as one, with what it cost: its prompt and its answer's pieces.
    let wasted: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            voxide::events::Event::Metrics { data } => Some(data),
            _ => None,
        })
        .flatten()
        .filter_map(|m| match m {
            voxide::frames::MetricsData::Preemption {
                used: false,
                wasted,
                ..
            } => Some(*wasted),
            _ => None,
        })
        .collect();
    assert_eq!(wasted.len(), 1, "{events:?}");
    let usage = wasted[0].expect("what it cost").usage;
    assert!(
        usage.input > 10,
        "the prompt was sent, and billed: {usage:?}"
    );
    assert_eq!(last_answer(&messages).as_deref(), Some("In Paris."));
    assert!(
        messages
            .iter()
            .all(|m| last_answer(std::slice::from_ref(m)).as_deref() != Some("Half an answer.")),
        "the thrown-away answer never reached the context: {messages:?}"
    );
}

#[tokio::test]
async fn speech_after_a_guess_throws_it_away() {
    let engine = ScriptedLlm::new(vec![vec![say("Too early.")], vec![say("On time.")]]);
    let mut bot = Bot::start(LlmService::new(engine.clone()));
    guess(&bot, "Tell me more").await;
    // System frames overtake data frames: speak only once the guess has started.
    while engine.runs() < 1 {
        tokio::task::yield_now().await;
    }
    bot.handle
        .queue_frame(SystemFrame::VadUserStartedSpeaking)
        .await
        .expect("queued");
    bot.user_says("Tell me more", 1).await;
    assert_eq!(
        engine.runs(),
        2,
        "the user went on, so the guess was dropped"
    );
    let (messages, _) = bot.stop().await;
    assert_eq!(last_answer(&messages).as_deref(), Some("On time."));
}

mod voice {
    //! The TTS service behind the LLM service, speaking with a voice that records what it is
    //! asked to say.

    use std::sync::{Arc, Mutex};

    use tokio::sync::mpsc;
    use voxide::context::{ContextHandle, LlmContext, Message};
    use voxide::events::EndReason;
    use voxide::frames::{DataFrame, Frame, FrameBody, SystemFrame};
    use voxide::pipeline::{
        Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session, SessionHandle,
    };
    use voxide::services::llm::LlmService;
    use voxide::services::tts::{Sentences, Speech, Synthesizer, TtsError, TtsService, WordTiming};

    use super::common::scripted::ScriptedLlm;

    /// The output rate: no resampling between the voice and the frames.
    pub const RATE: u32 = 24_000;
    /// Samples a character of speech takes.
    pub const PER_CHAR: usize = 240;

    /// Speaks `PER_CHAR` samples a character, its words one after another; records each text.
    #[derive(Clone, Default)]
    pub struct RecordingVoice(pub Arc<Mutex<Vec<String>>>);

    impl RecordingVoice {
        pub fn said(&self) -> Vec<String> {
            self.0.lock().expect("lock").clone()
        }
    }

    impl Synthesizer for RecordingVoice {
        fn name(&self) -> &str {
            "recording"
        }

        fn sample_rate(&self) -> u32 {
            RATE
        }

        fn synthesize(&self, text: &str) -> Result<Speech, TtsError> {
            self.0.lock().expect("lock").push(text.to_owned());
            let secs_per_char = PER_CHAR as f64 / f64::from(RATE);
            let mut at = 0.0;
            let words = text
                .split(' ')
                .map(|word| {
                    let start = at;
                    at += (word.len() + 1) as f64 * secs_per_char;
                    WordTiming {
                        word: word.to_owned(),
                        start_secs: start,
                        end_secs: at,
                    }
                })
                .collect();
            Ok(Speech {
                samples: vec![1; text.len() * PER_CHAR],
                sample_rate: RATE,
                words,
            })
        }
    }

    /// What reached the end of the pipeline.
    #[derive(Debug, Default)]
    pub struct Heard {
        /// Each spoken text with its first word's start, in seconds from its own audio.
        pub texts: Vec<(String, f64)>,
        pub audio_samples: usize,
        pub responses: usize,
    }

    /// Takes note of the frames passing it in one direction.
    struct Ears(mpsc::UnboundedSender<Frame>, Direction);

    impl FrameProcessor for Ears {
        fn process(
            &mut self,
            frame: Frame,
            direction: Direction,
            cx: &mut FrameContext<'_>,
        ) -> Result<(), ProcessorError> {
            if direction == self.1 {
                let _ = self.0.send(frame.clone());
            }
            cx.push(frame, direction);
            Ok(())
        }
    }

    pub struct SpeakingBot {
        pub handle: SessionHandle,
        session: Session,
        pub context: ContextHandle,
        frames: mpsc::UnboundedReceiver<Frame>,
        upstream: mpsc::UnboundedReceiver<Frame>,
        pub heard: Heard,
    }

    impl SpeakingBot {
        pub fn start(engine: ScriptedLlm, voice: RecordingVoice) -> Self {
            let context = ContextHandle::new(LlmContext::new(vec![Message::system(
                "You are a test bot.",
            )]));
            let (tx, frames) = mpsc::unbounded_channel();
            let (up, upstream) = mpsc::unbounded_channel();
            let pipeline = Pipeline::new()
                .then(Ears(up, Direction::Upstream))
                .then(LlmService::new(engine))
                .then(TtsService::new(Sentences::shared(Arc::new(voice))))
                .then(Ears(tx, Direction::Downstream));
            let session = Session::builder(pipeline).idle_timeout(None).spawn();
            Self {
                handle: session.handle(),
                session,
                context,
                frames,
                upstream,
                heard: Heard::default(),
            }
        }

        /// What the user aggregator hands on at a pause: the context as the turn would make it.
        pub async fn guess(&self, words: &str) {
            let mut guess = self.context.snapshot();
            guess.messages.push(Message::user(words));
            self.handle
                .queue_frame(DataFrame::LlmGuess {
                    id: 1,
                    context: Box::new(guess),
                })
                .await
                .expect("queued");
        }

        /// The number of the next guess whose first words the voice says it has spoken.
        pub async fn guess_spoken(&mut self) -> u64 {
            loop {
                let frame = self.upstream.recv().await.expect("the session runs");
                if let FrameBody::System(SystemFrame::GuessSpoken(id)) = frame.body {
                    return id;
                }
            }
        }

        /// The turn ends with `words`: the LLM runs on the context; waits for its response.
        pub async fn user_says(&mut self, words: &str) {
            self.context.lock().messages.push(Message::user(words));
            self.handle
                .queue_frame(DataFrame::LlmContext(self.context.clone()))
                .await
                .expect("queued");
            self.response().await;
        }

        /// Waits for the end of one more response, taking note of what was heard.
        pub async fn response(&mut self) {
            let seen = self.heard.responses;
            while self.heard.responses == seen {
                let frame = self.frames.recv().await.expect("the session runs");
                match frame.body {
                    FrameBody::Data(DataFrame::TtsText(text)) => {
                        let first = text.words.as_ref().map_or(-1.0, |w| w[0].start_secs);
                        self.heard.texts.push((text.text, first));
                    }
                    FrameBody::Data(DataFrame::OutputAudio(audio)) => {
                        self.heard.audio_samples += audio.samples.len();
                    }
                    _ if frame.name() == "llm_full_response_end" => self.heard.responses += 1,
                    _ => {}
                }
            }
        }

        pub async fn stop(self) {
            self.handle.stop_when_done().await.expect("queued");
            assert_eq!(self.session.join().await, EndReason::Completed);
        }
    }
}

/// Waits until `voice` has been asked to say `n` texts.
async fn said(voice: &voice::RecordingVoice, n: usize) {
    while voice.said().len() < n {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn the_first_sentence_of_a_guessed_answer_is_spoken_ahead_and_played_once_taken_over() {
    let engine = ScriptedLlm::new(vec![vec![say("It is noon. "), say("Anything else?")]]);
    let voice = voice::RecordingVoice::default();
    let mut bot = voice::SpeakingBot::start(engine.clone(), voice.clone());
    bot.guess("What time is it?").await;
    said(&voice, 1).await;
    assert_eq!(
        voice.said(),
        ["It is noon."],
        "spoken before the turn ended"
    );
    assert_eq!(
        bot.guess_spoken().await,
        1,
        "the turn stage hears that the speech is ready"
    );

    bot.user_says("What time is it?").await;
    assert_eq!(engine.runs(), 1);
    assert_eq!(
        voice.said(),
        ["It is noon.", "Anything else?"],
        "the first sentence is not synthesised again"
    );
    let heard = &bot.heard;
    let texts: Vec<&str> = heard.texts.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(texts, ["It is noon.", "Anything else?"]);
    assert!(
        heard.texts.iter().all(|(_, first)| first.abs() < 1e-9),
        "each text's words are timed from its own audio: {:?}",
        heard.texts
    );
    let chars = "It is noon.".len() + "Anything else?".len();
    assert_eq!(heard.audio_samples, chars * voice::PER_CHAR);
    bot.stop().await;
}

#[tokio::test]
async fn speech_made_ahead_for_a_wrong_guess_is_never_played() {
    let engine = ScriptedLlm::new(vec![vec![say("Half an answer.")], vec![say("In Paris.")]]);
    let voice = voice::RecordingVoice::default();
    let mut bot = voice::SpeakingBot::start(engine.clone(), voice.clone());
    bot.guess("What time is it").await;
    said(&voice, 1).await;

    bot.user_says("What time is it in Paris?").await;
    assert_eq!(engine.runs(), 2);
    assert_eq!(voice.said(), ["Half an answer.", "In Paris."]);
    let texts: Vec<&str> = bot.heard.texts.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(texts, ["In Paris."]);
    assert_eq!(bot.heard.audio_samples, "In Paris.".len() * voice::PER_CHAR);
    bot.stop().await;
}
