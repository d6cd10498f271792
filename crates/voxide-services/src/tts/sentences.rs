//! A voice that speaks one piece of text at a time (Piper, espeak-ng) as a streaming engine:
//! each sentence the service sends is synthesised off the async workers, in order, and its word
//! timings are moved to where its audio falls in the context.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::stream::{
    EVENT_QUEUE, INPUT_QUEUE, TextUnit, TtsContext, TtsEngine, TtsEvent, TtsInput,
};
use super::{Synthesizer, WordTiming};

/// A [`Synthesizer`] as a [`TtsEngine`].
pub struct Sentences(Arc<dyn Synthesizer>);

impl Sentences {
    /// The streaming voice over `synthesizer`.
    pub fn shared(synthesizer: Arc<dyn Synthesizer>) -> Arc<dyn TtsEngine> {
        Arc::new(Self(synthesizer))
    }
}

impl TtsEngine for Sentences {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn sample_rate(&self) -> u32 {
        self.0.sample_rate()
    }

    fn text_unit(&self) -> TextUnit {
        TextUnit::Sentence
    }

    fn open(&self) -> TtsContext {
        let (input, inputs) = mpsc::channel(INPUT_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        tokio::spawn(speak(self.0.clone(), inputs, events_tx));
        TtsContext { input, events }
    }
}

/// Speaks each piece of text as it comes; ends when the context is dropped or flushed.
async fn speak(
    voice: Arc<dyn Synthesizer>,
    mut inputs: mpsc::Receiver<TtsInput>,
    events: mpsc::Sender<TtsEvent>,
) {
    // Seconds of audio the context has made so far.
    let mut offset = 0.0;
    while let Some(input) = inputs.recv().await {
        let text = match input {
            TtsInput::Text(text) => text.trim().to_owned(),
            TtsInput::Flush => {
                let _ = events.send(TtsEvent::Done).await;
                return;
            }
        };
        if text.is_empty() {
            continue;
        }
        let (to_speak, synthesizer) = (text.clone(), voice.clone());
        let speech =
            match tokio::task::spawn_blocking(move || synthesizer.synthesize(&to_speak)).await {
                Ok(Ok(speech)) => speech,
                Ok(Err(e)) => {
                    let _ = events.send(TtsEvent::Error(e.to_string())).await;
                    return;
                }
                Err(e) => {
                    let _ = events
                        .send(TtsEvent::Error(format!("speech synthesis stopped: {e}")))
                        .await;
                    return;
                }
            };
        let words = speech
            .words
            .iter()
            .map(|w| WordTiming {
                word: w.word.clone(),
                start_secs: w.start_secs + offset,
                end_secs: w.end_secs + offset,
            })
            .collect();
        offset += speech.samples.len() as f64 / f64::from(speech.sample_rate.max(1));
        let characters = text.chars().count() as u64;
        for event in [
            TtsEvent::Words { text, words },
            TtsEvent::Audio(speech.samples),
            TtsEvent::Characters(characters),
        ] {
            if events.send(event).await.is_err() {
                // The context was dropped: the turn was interrupted.
                return;
            }
        }
    }
}
