//! Several voices as one (`--tts cartesia,piper`): when the active voice gives up for good
//! before a turn's first audio, the next one takes over, is sent the turn's text again, and
//! speaks from then on ([`TtsEvent::Switched`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

use voxide_engines::audio::resample::StreamResampler;

use super::stream::{
    EVENT_QUEUE, INPUT_QUEUE, TextUnit, TtsContext, TtsEngine, TtsEvent, TtsInput,
};

/// The voices, each the fallback of the one before.
pub struct TtsFallback {
    voices: Arc<[Arc<dyn TtsEngine>]>,
    active: Arc<AtomicUsize>,
    name: String,
}

impl TtsFallback {
    /// `voices` in order of preference; they must take text alike. Audio of a voice at another
    /// rate than the first's is resampled to it.
    pub fn shared(voices: Vec<Arc<dyn TtsEngine>>) -> Result<Arc<dyn TtsEngine>, String> {
        let Some(first) = voices.first() else {
            return Err("no voice to fall back on".into());
        };
        if voices.len() == 1 {
            return Ok(first.clone());
        }
        let unit = first.text_unit();
        if let Some(other) = voices.iter().find(|v| v.text_unit() != unit) {
            return Err(format!(
                "{} and {} take text differently: a fallback list needs voices that take it alike",
                first.name(),
                other.name()
            ));
        }
        let name = voices
            .iter()
            .map(|v| v.name())
            .collect::<Vec<_>>()
            .join(",");
        Ok(Arc::new(Self {
            voices: voices.into(),
            active: Arc::default(),
            name,
        }))
    }
}

impl TtsEngine for TtsFallback {
    fn name(&self) -> &str {
        &self.name
    }

    fn model(&self) -> &str {
        self.voices[self.active.load(Ordering::Relaxed)].model()
    }

    fn sample_rate(&self) -> u32 {
        self.voices[0].sample_rate()
    }

    fn text_unit(&self) -> TextUnit {
        self.voices[0].text_unit()
    }

    fn warm(&self) {
        self.voices[self.active.load(Ordering::Relaxed)].warm();
    }

    fn open(&self) -> TtsContext {
        let (input, inputs) = mpsc::channel(INPUT_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let relay = Relay {
            voices: self.voices.clone(),
            active: self.active.clone(),
            said: Vec::new(),
            flushed: false,
            spoke: false,
            resampler: None,
        };
        tokio::spawn(relay.run(inputs, events_tx));
        TtsContext { input, events }
    }
}

struct Relay {
    voices: Arc<[Arc<dyn TtsEngine>]>,
    active: Arc<AtomicUsize>,
    /// The turn's text so far, for a voice that takes over.
    said: Vec<String>,
    flushed: bool,
    /// Audio came: the turn can no longer move to another voice.
    spoke: bool,
    /// From the active voice's rate to the first's, when they differ.
    resampler: Option<StreamResampler>,
}

impl Relay {
    fn resample_for(&mut self, index: usize) {
        let (from, to) = (
            self.voices[index].sample_rate(),
            self.voices[0].sample_rate(),
        );
        self.resampler = (from != to)
            .then(|| StreamResampler::new(from, to).ok())
            .flatten();
    }

    async fn run(mut self, mut inputs: mpsc::Receiver<TtsInput>, out: mpsc::Sender<TtsEvent>) {
        let mut index = self.active.load(Ordering::Relaxed);
        self.resample_for(index);
        let mut context = self.voices[index].open();
        // The service drops its sender once the turn is flushed, and the speech goes on; a
        // sender dropped before the flush is an interruption.
        let mut inputs_open = true;
        loop {
            tokio::select! {
                input = inputs.recv(), if inputs_open => {
                    let Some(input) = input else {
                        if self.flushed {
                            inputs_open = false;
                            continue;
                        }
                        // Dropping the voice's context cancels it.
                        return;
                    };
                    match &input {
                        TtsInput::Text(text) => self.said.push(text.clone()),
                        TtsInput::Flush => self.flushed = true,
                    }
                    let _ = context.input.send(input).await;
                }
                event = context.events.recv() => match event {
                    Some(TtsEvent::Failed(reason)) if !self.spoke && index + 1 < self.voices.len() => {
                        let from = self.voices[index].name().to_owned();
                        index += 1;
                        self.active.store(index, Ordering::Relaxed);
                        let to = self.voices[index].name().to_owned();
                        tracing::warn!(%from, %to, %reason, "the voice failed; falling back");
                        let _ = out.send(TtsEvent::Switched { from, to, reason }).await;
                        self.resample_for(index);
                        context = self.voices[index].open();
                        for text in &self.said {
                            let _ = context.input.send(TtsInput::Text(text.clone())).await;
                        }
                        if self.flushed {
                            let _ = context.input.send(TtsInput::Flush).await;
                        }
                    }
                    Some(TtsEvent::Audio(samples)) => {
                        self.spoke = true;
                        let samples = match &mut self.resampler {
                            Some(resampler) => resampler.process(&samples),
                            None => samples,
                        };
                        if out.send(TtsEvent::Audio(samples)).await.is_err() {
                            return;
                        }
                    }
                    Some(event) => {
                        let last = matches!(event, TtsEvent::Done | TtsEvent::Error(_) | TtsEvent::Failed(_));
                        if out.send(event).await.is_err() || last {
                            return;
                        }
                    }
                    None => return,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test voice: each input gets the event `answer` gives it, if any; a context ends after
    /// `Done` or `Failed`.
    struct Voice {
        name: &'static str,
        answer: fn(TtsInput) -> Option<TtsEvent>,
    }

    /// A voice whose key is refused: it fails each context once it has seen its flush.
    const REFUSED: Voice = Voice {
        name: "refused",
        answer: |input| (input == TtsInput::Flush).then(|| TtsEvent::Failed("401".into())),
    };

    /// A voice that says each text as a hundred samples of its length.
    const SPEAKS: Voice = Voice {
        name: "speaks",
        answer: |input| {
            Some(match input {
                TtsInput::Text(text) => TtsEvent::Audio(vec![text.len() as i16; 100]),
                TtsInput::Flush => TtsEvent::Done,
            })
        },
    };

    impl TtsEngine for Voice {
        fn name(&self) -> &str {
            self.name
        }

        fn sample_rate(&self) -> u32 {
            16_000
        }

        fn text_unit(&self) -> TextUnit {
            TextUnit::Sentence
        }

        fn open(&self) -> TtsContext {
            let (input, mut inputs) = mpsc::channel(INPUT_QUEUE);
            let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
            let answer = self.answer;
            tokio::spawn(async move {
                while let Some(input) = inputs.recv().await {
                    let Some(event) = answer(input) else { continue };
                    let last = matches!(event, TtsEvent::Done | TtsEvent::Failed(_));
                    if events_tx.send(event).await.is_err() || last {
                        return;
                    }
                }
            });
            TtsContext { input, events }
        }
    }

    /// What `voices`, as a fallback list, say of `texts` (then a flush if `flushed`) in a turn
    /// the service let go of after its last input.
    async fn said(voices: [Voice; 2], texts: &[&str], flushed: bool) -> Vec<TtsEvent> {
        let voices = TtsFallback::shared(voices.map(|v| Arc::new(v) as Arc<dyn TtsEngine>).into())
            .expect("a list");
        let TtsContext { input, mut events } = voices.open();
        for text in texts {
            input
                .send(TtsInput::Text((*text).into()))
                .await
                .expect("text");
        }
        if flushed {
            input.send(TtsInput::Flush).await.expect("flush");
        }
        drop(input);
        let mut heard = Vec::new();
        while let Some(event) = events.recv().await {
            heard.push(event);
        }
        heard
    }

    #[tokio::test]
    async fn a_voice_that_fails_after_the_turn_was_flushed_and_let_go_hands_it_on_whole() {
        let heard = said([REFUSED, SPEAKS], &["Hello there."], true).await;
        assert!(
            matches!(&heard[0], TtsEvent::Switched { from, to, .. } if from == "refused" && to == "speaks"),
            "{heard:?}"
        );
        assert_eq!(heard[1..], [TtsEvent::Audio(vec![12; 100]), TtsEvent::Done]);
    }

    #[tokio::test]
    async fn a_flushed_turn_let_go_is_spoken_to_its_end() {
        let heard = said([SPEAKS, REFUSED], &["Hello there.", "It is noon."], true).await;
        let audio = |n| TtsEvent::Audio(vec![n; 100]);
        assert_eq!(heard, [audio(12), audio(11), TtsEvent::Done]);
    }

    #[tokio::test]
    async fn a_turn_let_go_before_its_flush_is_cancelled() {
        let heard = said([REFUSED, SPEAKS], &["Hello there."], false).await;
        assert_eq!(heard, [], "nothing is said of an interrupted turn");
    }
}
