//! A transcriber behind one provider WebSocket per user stream (Deepgram, AssemblyAI, OpenAI's
//! realtime transcription): the provider's sans-IO core, run by the shared driver
//! ([`crate::ws::drive`]). A provider is its settings and its core; the engine is the
//! same for all of them, as [`crate::tts::SocketVoice`] is for the voices.

use std::time::Instant;

use tokio::sync::mpsc;

use super::stream::{EVENT_QUEUE, INPUT_QUEUE, SttEngine, SttEvent, SttInput, SttStream};
use crate::ws::{self, ReconnectPolicy, WsCore};

/// What makes a socket transcriber one provider's: its name and rate, its model, and its core.
pub trait SocketProvider: Clone + Send + Sync + 'static {
    /// The engine's name, for metrics.
    const NAME: &'static str;
    /// The rate audio is sent at.
    const SAMPLE_RATE: u32;
    /// The provider's protocol, sans-IO.
    type Core: WsCore<Input = SttInput, Output = SttEvent>;

    /// The model.
    fn model(&self) -> &str;

    /// A core for one user's stream, started at `now`.
    fn core(&self, now: Instant) -> Self::Core;

    /// How a lost socket is retried.
    fn reconnect(&self) -> ReconnectPolicy;
}

/// A streaming transcriber: one socket per user stream, opened as the stream starts.
pub struct SocketStt<P> {
    settings: P,
}

impl<P: SocketProvider> SocketStt<P> {
    /// An engine for `settings`.
    pub fn new(settings: P) -> Self {
        Self { settings }
    }

    /// Its settings.
    pub fn settings(&self) -> &P {
        &self.settings
    }
}

impl<P: SocketProvider> SttEngine for SocketStt<P> {
    fn name(&self) -> &str {
        P::NAME
    }

    fn model(&self) -> &str {
        self.settings.model()
    }

    fn sample_rate(&self) -> u32 {
        P::SAMPLE_RATE
    }

    fn start(&self) -> SttStream {
        let (input, inputs) = mpsc::channel(INPUT_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let core = self.settings.core(Instant::now());
        tokio::spawn(ws::drive(
            core,
            inputs,
            events_tx,
            self.settings.reconnect(),
        ));
        SttStream { input, events }
    }
}
