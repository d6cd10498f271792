//! Several engines as one: each the fallback of the one before (`--llm openai,local`).
//!
//! A request goes to the active engine. When it fails before any of its answer came (its own
//! retries spent), the request goes to the next engine, and the stream says so with
//! [`LlmEvent::Fallback`], which the LLM service turns into an `llm_fallback` event. Later
//! requests stay on the engine that answered; after [`RETRY_PRIMARY_AFTER`] the first one is
//! tried again. An engine that fails after it began to answer is not replaced mid-answer: its
//! words may already be spoken.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{LlmEngine, LlmError, LlmEvent, LlmRequest};

/// How long later requests stay on a fallback before the first engine is tried again.
pub const RETRY_PRIMARY_AFTER: Duration = Duration::from_secs(60);

/// The engines, and which one answers now.
pub struct FallbackLlm {
    engines: Arc<[Box<dyn LlmEngine>]>,
    state: Arc<State>,
}

struct State {
    active: AtomicUsize,
    /// When the active engine took over from the first.
    since: Mutex<Option<Instant>>,
}

impl State {
    fn switch(&self, to: usize) {
        self.active.store(to, Ordering::Relaxed);
        *self.since.lock().unwrap_or_else(|e| e.into_inner()) = (to > 0).then(Instant::now);
    }

    /// The engine to start with: the active one, or the first again once it has rested.
    fn start(&self) -> usize {
        let since = *self.since.lock().unwrap_or_else(|e| e.into_inner());
        if since.is_some_and(|t| t.elapsed() >= RETRY_PRIMARY_AFTER) {
            self.switch(0);
        }
        self.active.load(Ordering::Relaxed)
    }
}

impl FallbackLlm {
    /// `engines` in order of preference; at least one.
    pub fn new(engines: Vec<Box<dyn LlmEngine>>) -> Result<Self, LlmError> {
        if engines.is_empty() {
            return Err(LlmError::Setup("no LLM to fall back on".into()));
        }
        Ok(Self {
            engines: engines.into(),
            state: Arc::new(State {
                active: AtomicUsize::new(0),
                since: Mutex::new(None),
            }),
        })
    }

    fn active(&self) -> &dyn LlmEngine {
        self.engines[self.state.active.load(Ordering::Relaxed)].as_ref()
    }
}

impl LlmEngine for FallbackLlm {
    fn model(&self) -> &str {
        self.active().model()
    }

    fn provider(&self) -> &str {
        self.active().provider()
    }

    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        let engines = self.engines.clone();
        let state = self.state.clone();
        let (tx, mut rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut index = state.start();
            loop {
                let engine = &engines[index];
                let mut stream = engine.generate(request.clone());
                // Bookkeeping (usage) is held until the answer begins: a failed attempt's is
                // dropped with it.
                let mut held = Vec::new();
                let mut answering = false;
                let failure = loop {
                    match stream.next().await {
                        None => break None,
                        Some(Ok(event)) if answering || event.is_content() => {
                            answering = true;
                            for event in held.drain(..).chain([event]) {
                                if tx.send(Ok(event)).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Some(Ok(event)) => held.push(event),
                        Some(Err(error)) => break Some(error),
                    }
                };
                let next = index + 1;
                match failure {
                    Some(error) if !answering && next < engines.len() => {
                        tracing::warn!(from = engine.provider(), to = engines[next].provider(), %error, "the LLM failed; falling back");
                        let fallback = LlmEvent::Fallback {
                            from: engine.provider().to_owned(),
                            to: engines[next].provider().to_owned(),
                            reason: error.to_string(),
                        };
                        state.switch(next);
                        if tx.send(Ok(fallback)).await.is_err() {
                            return;
                        }
                        index = next;
                    }
                    Some(error) => {
                        let _ = tx.send(Err(error)).await;
                        return;
                    }
                    None => {
                        for event in held {
                            if tx.send(Ok(event)).await.is_err() {
                                return;
                            }
                        }
                        return;
                    }
                }
            }
        });
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
    }

    fn warm(&self) -> BoxFuture<'static, ()> {
        let warms: Vec<_> = self.engines.iter().map(|e| e.warm()).collect();
        futures_util::future::join_all(warms).map(|_| ()).boxed()
    }
}
