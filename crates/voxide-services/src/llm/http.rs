//! The driver every streamed HTTP LLM shares: OpenAI-compatible chat completions, Anthropic
//! Messages and Gemini's `streamGenerateContent` differ only in their request body and in how
//! their server-sent events read, which each provider's sans-IO [`Decode`] owns.
//!
//! One request per completion. What fails before the first event (429, 5xx, 529, a refused
//! connection, an `overloaded_error` as the stream's first event, no first chunk within the
//! deadline) is retried with backoff, `retry-after` honoured; once an event came nothing is
//! retried, since the words may already be spoken. The stream may go quiet between chunks for the
//! idle timeout, no longer. Dropping the returned stream (an interruption) drops the response and
//! frees the connection.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use reqwest::header::HeaderMap;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::sse::{SseDecoder, SseEvent};
use super::{LlmError, LlmEvent};

/// Events the stream may run ahead of its reader by.
const EVENT_QUEUE: usize = 64;
/// The longest `retry-after` honoured: a provider asking for more is treated as down.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// A provider's stream, read event by event (sans-IO).
pub trait Decode: Send + 'static {
    /// Reads one server-sent event.
    fn event(&mut self, event: &SseEvent) -> Result<Vec<LlmEvent>, LlmError>;
    /// The stream said it is over (`[DONE]`, `message_stop`); the body may still be open.
    fn done(&self) -> bool;
    /// The body ended: what is still held. A completion that produced nothing is an error.
    fn end(&mut self) -> Result<Vec<LlmEvent>, LlmError>;
}

/// How long to wait, and how often to try.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// How long the first chunk may take (the request included).
    pub first_chunk_timeout: Duration,
    /// How long the stream may go quiet between chunks.
    pub idle_timeout: Duration,
    /// Attempts after the first, before any event came (a hedge is one).
    pub retries: u32,
    /// After this long without a first chunk, a second request races the first (a hedge): the
    /// first to answer is read, the other dropped. `None`: the first waits out its deadline.
    pub hedge_after: Option<Duration>,
}

impl Default for Timing {
    /// pipecat's Gemini figures, which suit every provider: 5 s to the first chunk, 20 s idle;
    /// and a hedge halfway to the deadline, when a voice agent's first token is already very
    /// late (a provider's tail, a request stuck behind others), so that a late first token costs
    /// the caller 2.5 s and not the 5 s deadline and another request.
    fn default() -> Self {
        Self {
            first_chunk_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(20),
            retries: 2,
            hedge_after: Some(Duration::from_millis(2_500)),
        }
    }
}

/// One completion request, ready to send.
#[derive(Debug, Clone)]
struct Call {
    url: String,
    headers: HeaderMap,
    body: Value,
}

/// A provider's completion endpoint: the URL, the headers every request carries (the key), the
/// deadlines, and the process's pooled HTTP client.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    client: reqwest::Client,
    url: String,
    headers: HeaderMap,
    timing: Timing,
}

impl Endpoint {
    /// An endpoint at `url`.
    pub(crate) fn new(url: String, headers: HeaderMap, timing: Timing) -> Result<Self, LlmError> {
        let client = crate::http_client().map_err(LlmError::Setup)?;
        Ok(Self {
            client,
            url,
            headers,
            timing,
        })
    }

    /// Streams one completion of `body`, read by a fresh decoder from `decoder` on each attempt.
    pub(crate) fn stream<D: Decode>(
        &self,
        body: Value,
        decoder: impl Fn() -> D + Send + Sync + 'static,
    ) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        let call = Call {
            url: self.url.clone(),
            headers: self.headers.clone(),
            body,
        };
        let (client, timing) = (self.client.clone(), self.timing);
        let (tx, mut rx) = mpsc::channel(EVENT_QUEUE);
        // The task ends with the completion, or as soon as the reader drops the stream,
        // dropping the response and with it the connection; a request waiting to be retried
        // is not sent again (a guess thrown away while its provider asked it to wait would
        // otherwise be asked, and billed, after the turn's own answer).
        tokio::spawn(async move {
            tokio::select! {
                ran = run(&client, &call, timing, &decoder, &tx) => {
                    if let Err(error) = ran {
                        let _ = tx.send(Err(error)).await;
                    }
                }
                () = tx.closed() => {}
            }
        });
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
    }

    /// Opens a connection to the endpoint's host and leaves it in the pool, so that the first
    /// turn pays no TCP or TLS handshake. Any answer will do (a `HEAD` on a completion endpoint
    /// is usually 404 or 405); a failure is only logged, since the turn will report it if it
    /// lasts.
    pub(crate) fn warm(&self) -> BoxFuture<'static, ()> {
        let (client, url) = (self.client.clone(), self.url.clone());
        Box::pin(async move {
            match tokio::time::timeout(Duration::from_secs(10), client.head(&url).send()).await {
                Ok(Ok(response)) => {
                    tracing::debug!(%url, status = response.status().as_u16(), "LLM connection warm")
                }
                Ok(Err(e)) => {
                    tracing::debug!(%url, error = %e, "could not warm the LLM connection")
                }
                Err(_) => tracing::debug!(%url, "warming the LLM connection timed out"),
            }
        })
    }
}

/// Why an attempt failed, and whether another may succeed.
enum Attempt {
    Retry {
        error: LlmError,
        after: Option<Duration>,
    },
    Fail(LlmError),
}

impl Attempt {
    /// A decoder's error: an overloaded or rate-limited provider may answer the next attempt.
    fn from_decode(error: LlmError) -> Self {
        match error {
            LlmError::Busy(_) => Attempt::Retry { error, after: None },
            error => Attempt::Fail(error),
        }
    }
}

type Events = mpsc::Sender<Result<LlmEvent, LlmError>>;

async fn run<D: Decode>(
    client: &reqwest::Client,
    call: &Call,
    timing: Timing,
    decoder: &(impl Fn() -> D + Sync),
    out: &Events,
) -> Result<(), LlmError> {
    // One request to its first events, within the first-chunk deadline.
    let attempt = || async {
        tokio::time::timeout(timing.first_chunk_timeout, async {
            let response = send(client, call).await?;
            first_events(response, decoder()).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(Attempt::Retry {
                error: LlmError::Connection(format!(
                    "no answer within {:?}",
                    timing.first_chunk_timeout
                )),
                after: None,
            })
        })
    };
    let hedge_at = || timing.hedge_after.map(|after| Instant::now() + after);
    let mut racing = futures_util::stream::FuturesUnordered::new();
    racing.push(attempt());
    let mut sent = 1;
    let mut hedge = hedge_at();
    loop {
        let hedge_due = async {
            match hedge {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(first) = racing.next() => match first {
                // The first to answer is read; the other request is dropped with `racing`.
                Ok(started) => return started.finish(timing.idle_timeout, out).await,
                Err(Attempt::Fail(error)) => return Err(error),
                // The hedge, or the request it hedged, may still answer.
                Err(Attempt::Retry { .. }) if !racing.is_empty() => {}
                Err(Attempt::Retry { error, after }) => {
                    if sent > timing.retries {
                        return Err(error);
                    }
                    let wait = after.unwrap_or(Duration::from_millis(250 << sent));
                    tracing::warn!(attempt = sent, wait_ms = wait.as_millis() as u64, %error, "LLM request failed before its first token; retrying");
                    tokio::time::sleep(wait).await;
                    racing.push(attempt());
                    sent += 1;
                    hedge = hedge_at();
                }
            },
            () = hedge_due, if sent <= timing.retries => {
                tracing::warn!(after_ms = timing.hedge_after.unwrap_or_default().as_millis() as u64, "no first token yet: a second LLM request races the first");
                racing.push(attempt());
                sent += 1;
                hedge = None;
            }
        }
    }
}

/// A `retry-after` in seconds, clamped before it becomes a duration (`1e20` would overflow one).
fn retry_after(value: &str) -> Option<Duration> {
    let secs = value.trim().parse::<f64>().ok()?;
    (secs.is_finite() && secs >= 0.0)
        .then(|| Duration::from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64())))
}

/// Sends the request once; returns the streaming response.
async fn send(client: &reqwest::Client, call: &Call) -> Result<reqwest::Response, Attempt> {
    let response = client
        .post(&call.url)
        .headers(call.headers.clone())
        .json(&call.body)
        .send()
        .await
        .map_err(|e| Attempt::Retry {
            error: LlmError::Connection(e.to_string()),
            after: None,
        })?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(retry_after);
    let text = response.text().await.unwrap_or_default();
    let message = format!("HTTP {status}: {}", clip(&text));
    // 429 (rate limits), 5xx and Anthropic's 529 (overloaded) pass; the rest is the request's
    // fault or the key's, and says so at once.
    if status.as_u16() == 429 || status.is_server_error() || status.as_u16() == 529 {
        Err(Attempt::Retry {
            error: LlmError::Busy(message),
            after,
        })
    } else {
        Err(Attempt::Fail(LlmError::Provider(message)))
    }
}

/// A response whose first events came.
struct Started<D> {
    bytes: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    sse: SseDecoder,
    decoder: D,
    pending: Vec<LlmEvent>,
}

impl<D: Decode> Started<D> {
    /// Decodes a piece of the body.
    fn decode(&mut self, bytes: &[u8]) -> Result<Vec<LlmEvent>, LlmError> {
        let mut events = Vec::new();
        let sse = self
            .sse
            .push(bytes)
            .map_err(|e| LlmError::Protocol(e.to_string()))?;
        for event in &sse {
            events.extend(self.decoder.event(event)?);
        }
        Ok(events)
    }

    /// Reads the rest of the stream into `out`; returns when it ends or the reader left.
    async fn finish(mut self, idle_timeout: Duration, out: &Events) -> Result<(), LlmError> {
        for event in std::mem::take(&mut self.pending) {
            if out.send(Ok(event)).await.is_err() {
                return Ok(());
            }
        }
        while !self.decoder.done() {
            let bytes = match tokio::time::timeout(idle_timeout, self.bytes.next()).await {
                Err(_) => {
                    return Err(LlmError::Connection(format!(
                        "the stream stalled for {idle_timeout:?}"
                    )));
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(LlmError::Connection(e.to_string())),
                Ok(Some(Ok(bytes))) => bytes,
            };
            for event in self.decode(&bytes)? {
                if out.send(Ok(event)).await.is_err() {
                    return Ok(());
                }
            }
        }
        for event in self.decoder.end()? {
            if out.send(Ok(event)).await.is_err() {
                break;
            }
        }
        Ok(())
    }
}

/// Reads until the first events (or the end): what the first-chunk deadline covers.
async fn first_events<D: Decode>(
    response: reqwest::Response,
    decoder: D,
) -> Result<Started<D>, Attempt> {
    let mut started = Started {
        bytes: response.bytes_stream().boxed(),
        sse: SseDecoder::new(),
        decoder,
        pending: Vec::new(),
    };
    loop {
        match started.bytes.next().await {
            None => return Ok(started),
            Some(Err(e)) => {
                return Err(Attempt::Retry {
                    error: LlmError::Connection(e.to_string()),
                    after: None,
                });
            }
            Some(Ok(bytes)) => {
                let events = started.decode(&bytes).map_err(Attempt::from_decode)?;
                started.pending.extend(events);
                // Usage alone (Anthropic's `message_start`) is not an answer yet: an overloaded
                // error may still follow it, and be retried.
                if started.pending.iter().any(LlmEvent::is_content) || started.decoder.done() {
                    return Ok(started);
                }
            }
        }
    }
}

/// The start of a provider's error text, enough to say what went wrong.
pub(crate) fn clip(text: &str) -> String {
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_or_odd_retry_after_is_clamped_or_ignored_never_a_panic() {
        assert_eq!(retry_after("1e20"), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(retry_after(" 0 "), Some(Duration::ZERO));
        for odd in ["-1", "NaN", "inf", "Wed, 21 Oct 2015 07:28:00 GMT", ""] {
            assert_eq!(retry_after(odd), None, "{odd}");
        }
    }
}
