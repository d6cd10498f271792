//! A voice behind one WebSocket per session that speaks many turns (Cartesia, Deepgram Aura):
//! each turn's context forwards its text to the socket's core as [`Command`]s naming the
//! context, and a router hands each event the core sends back to its context. A context dropped
//! before its flush (an interruption) is cancelled, and what still comes for it has no route and
//! is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::stream::{
    EVENT_QUEUE, INPUT_QUEUE, TextUnit, TtsContext, TtsEngine, TtsEvent, TtsInput,
};

/// What a turn's context tells the socket's core, naming the context.
#[derive(Debug)]
pub enum Command {
    /// A sentence of a context.
    Text {
        /// The context.
        context: String,
        /// The sentence.
        text: String,
    },
    /// The context's text is all in.
    Flush {
        /// The context.
        context: String,
    },
    /// The context was dropped (an interruption).
    Cancel {
        /// The context.
        context: String,
    },
}

/// Where each open context's events go, by context id.
type Routes = Arc<Mutex<HashMap<String, mpsc::Sender<TtsEvent>>>>;

/// What makes a socket voice one provider's: its name, model and rate, and the driver it starts.
pub trait SocketProvider: Send + Sync + 'static {
    /// The voice's name, for metrics.
    const NAME: &'static str;

    /// The model.
    fn model(&self) -> &str;

    /// The rate of the audio it asks for.
    fn sample_rate(&self) -> u32;

    /// Spawns the socket's driver: commands in, `(context, event)` out.
    fn start(&self, commands: mpsc::Receiver<Command>, events: mpsc::Sender<(String, TtsEvent)>);
}

/// A voice over one socket per session: started on the first context (or a warm-up), again after
/// its driver gave up and ended.
pub struct SocketVoice<P> {
    provider: P,
    commands: Mutex<Option<mpsc::Sender<Command>>>,
    routes: Routes,
    next: AtomicU64,
}

impl<P: SocketProvider> SocketVoice<P> {
    /// The voice `provider`'s settings describe.
    pub fn new(provider: P) -> Self {
        Self {
            provider,
            commands: Mutex::new(None),
            routes: Arc::default(),
            next: AtomicU64::new(1),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &P {
        &self.provider
    }

    /// The socket's command sender, starting the driver and its router the first time.
    fn commands(&self) -> mpsc::Sender<Command> {
        let mut commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = commands.as_ref().filter(|s| !s.is_closed()) {
            return sender.clone();
        }
        let (sender, inputs) = mpsc::channel(INPUT_QUEUE);
        let (outputs, mut routed) = mpsc::channel::<(String, TtsEvent)>(EVENT_QUEUE);
        self.provider.start(inputs, outputs);
        let routes = self.routes.clone();
        tokio::spawn(async move {
            while let Some((context, event)) = routed.recv().await {
                let last = matches!(
                    event,
                    TtsEvent::Done | TtsEvent::Error(_) | TtsEvent::Failed(_)
                );
                let route = routes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&context)
                    .cloned();
                // No route: the context was dropped, and what still comes for it is stale.
                if let Some(route) = route {
                    let _ = route.send(event).await;
                }
                if last {
                    routes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&context);
                }
            }
        });
        *commands = Some(sender.clone());
        sender
    }
}

impl<P: SocketProvider> TtsEngine for SocketVoice<P> {
    fn name(&self) -> &str {
        P::NAME
    }

    fn model(&self) -> &str {
        self.provider.model()
    }

    fn sample_rate(&self) -> u32 {
        self.provider.sample_rate()
    }

    fn text_unit(&self) -> TextUnit {
        TextUnit::Sentence
    }

    /// Opens the socket before the first turn needs it.
    fn warm(&self) {
        self.commands();
    }

    fn open(&self) -> TtsContext {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let context = format!("voxide-{:08x}-{n}", voxide_core::ids::random_u32());
        let (input, mut inputs) = mpsc::channel(INPUT_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(context.clone(), events_tx);
        let commands = self.commands();
        let routes = self.routes.clone();
        tokio::spawn(async move {
            let mut flushed = false;
            while let Some(input) = inputs.recv().await {
                let command = match input {
                    TtsInput::Text(text) => Command::Text {
                        context: context.clone(),
                        text,
                    },
                    TtsInput::Flush => {
                        flushed = true;
                        Command::Flush {
                            context: context.clone(),
                        }
                    }
                };
                if commands.send(command).await.is_err() {
                    return;
                }
            }
            // Dropped before its flush: the turn was interrupted.
            if !flushed {
                routes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&context);
                let _ = commands.send(Command::Cancel { context }).await;
            }
        });
        TtsContext { input, events }
    }
}
