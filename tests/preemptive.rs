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
        .queue_frame(DataFrame::LlmGuess(Box::new(guess)))
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
    let (messages, _) = bot.stop().await;
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
