//! Several STT engines as one (`--stt deepgram,whisper`): when the active engine gives up for
//! good, the next one takes over, is sent the audio of the turn in progress again, and the
//! stream says so ([`SttEvent::Switched`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

use super::stream::{EVENT_QUEUE, INPUT_QUEUE, SttEngine, SttEvent, SttInput, SttStream};

/// Audio kept for the next engine: the turn in progress, at most this many seconds.
const KEPT_SECS: usize = 30;

/// The engines, each the fallback of the one before.
pub struct SttFallback {
    engines: Vec<Arc<dyn SttEngine>>,
    name: String,
    /// The engine listening now (the last stream's).
    active: Arc<AtomicUsize>,
}

impl SttFallback {
    /// `engines` in order of preference; they must all take the same rate.
    pub fn shared(engines: Vec<Arc<dyn SttEngine>>) -> Result<Arc<dyn SttEngine>, String> {
        let Some(first) = engines.first() else {
            return Err("no STT engine to fall back on".into());
        };
        if engines.len() == 1 {
            return Ok(first.clone());
        }
        let rate = first.sample_rate();
        if let Some(other) = engines.iter().find(|e| e.sample_rate() != rate) {
            return Err(format!(
                "{} takes {} Hz and {} {} Hz: a fallback list needs one rate",
                first.name(),
                rate,
                other.name(),
                other.sample_rate()
            ));
        }
        let name = engines
            .iter()
            .map(|e| e.name())
            .collect::<Vec<_>>()
            .join(",");
        Ok(Arc::new(Self {
            engines,
            name,
            active: Arc::default(),
        }))
    }
}

impl SttEngine for SttFallback {
    fn name(&self) -> &str {
        &self.name
    }

    fn model(&self) -> &str {
        self.engines[self.active.load(Ordering::Relaxed)].model()
    }

    fn sample_rate(&self) -> u32 {
        self.engines[0].sample_rate()
    }

    fn start(&self) -> SttStream {
        let (input, inputs) = mpsc::channel(INPUT_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        self.active.store(0, Ordering::Relaxed);
        let relay = Relay {
            engines: self.engines.clone(),
            active: self.active.clone(),
            index: 0,
            kept: VecDeque::new(),
            limit: KEPT_SECS * self.sample_rate() as usize,
            speaking: false,
            owed: 0,
        };
        tokio::spawn(relay.run(inputs, events_tx));
        SttStream { input, events }
    }
}

struct Relay {
    engines: Vec<Arc<dyn SttEngine>>,
    active: Arc<AtomicUsize>,
    index: usize,
    /// Audio since the last finalize was answered (the turn in progress).
    kept: VecDeque<i16>,
    limit: usize,
    speaking: bool,
    /// Finalizes the active engine has not answered.
    owed: usize,
}

impl Relay {
    async fn run(mut self, mut inputs: mpsc::Receiver<SttInput>, out: mpsc::Sender<SttEvent>) {
        let mut stream = self.engines[0].start();
        loop {
            tokio::select! {
                input = inputs.recv() => {
                    let Some(input) = input else { return };
                    self.note(&input);
                    let _ = stream.input.send(input).await;
                }
                event = stream.events.recv() => match event {
                    Some(SttEvent::Failed(reason)) if self.index + 1 < self.engines.len() => {
                        stream = self.switch(reason, &out).await;
                    }
                    Some(event) => {
                        if matches!(event, SttEvent::Finalized(_)) {
                            self.owed = self.owed.saturating_sub(1);
                            if self.owed == 0 {
                                self.kept.clear();
                            }
                        }
                        if out.send(event).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                },
            }
        }
    }

    fn note(&mut self, input: &SttInput) {
        match input {
            SttInput::Audio(samples) => {
                self.kept.extend(samples);
                let excess = self.kept.len().saturating_sub(self.limit);
                self.kept.drain(..excess);
            }
            SttInput::SpeechStarted => self.speaking = true,
            SttInput::SpeechOnset { .. }
            | SttInput::OnsetNearSpeaker
            | SttInput::OnsetFaded
            | SttInput::SilenceStarted => {}
            SttInput::Finalize => {
                self.speaking = false;
                self.owed += 1;
            }
        }
    }

    /// Starts the next engine and gives it the turn in progress.
    async fn switch(&mut self, reason: String, out: &mpsc::Sender<SttEvent>) -> SttStream {
        let from = self.engines[self.index].name().to_owned();
        self.index += 1;
        self.active.store(self.index, Ordering::Relaxed);
        let next = &self.engines[self.index];
        tracing::warn!(%from, to = next.name(), %reason, "the STT failed; falling back");
        let _ = out
            .send(SttEvent::Switched {
                from,
                to: next.name().to_owned(),
                reason,
            })
            .await;
        let stream = next.start();
        // The turn in progress (its audio, the finalizes it still owes), then where the VAD is.
        let mut replay = Vec::new();
        if self.owed > 0 || self.speaking {
            replay.push(SttInput::SpeechStarted);
            replay.push(SttInput::Audio(self.kept.iter().copied().collect()));
        }
        replay.extend((0..self.owed).map(|_| SttInput::Finalize));
        if self.speaking && self.owed > 0 {
            replay.push(SttInput::SpeechStarted);
        }
        for input in replay {
            let _ = stream.input.send(input).await;
        }
        stream
    }
}
