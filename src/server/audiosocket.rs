//! Asterisk's AudioSocket (`--audiosocket-listen`): Asterisk opens one TCP connection a call
//! (`AudioSocket(uuid,host:port)` in a dialplan) and streams its audio; each is a session with
//! the server's default bot. The protocol is `transports::audiosocket`'s; this is its driver.
//! Who may connect: the networks of `--sip-allow` (loopback when none is given); a connection
//! also counts against the per-address limit and `--max-sessions`, and is hung up past either.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::App;
use super::phone::CallSession;
use super::sip::Network;
use crate::audio::resample::StreamResampler;
use crate::bot::SessionInfo;
use crate::events::Event;
use crate::frames::AudioFrame;
use crate::transports::audiosocket::{self, HANGUP, Message, Reader};
use crate::transports::output::AudioSink;

/// How long a connection may take to name its call (its first message, the UUID).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one write to Asterisk may wait before the call is given up.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The rate the bot speaks at; the call's own rate is what Asterisk sends.
const BOT_RATE: u32 = 16_000;

/// Takes AudioSocket connections on `listener` until the server stops.
pub(crate) async fn serve(app: Arc<App>, listener: TcpListener, allow: Vec<Network>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "an AudioSocket connection could not be taken");
                continue;
            }
        };
        if !allow.iter().any(|n| n.contains(peer.ip())) {
            tracing::info!(%peer, "an AudioSocket connection from an address not allowed (--sip-allow): closed");
            continue;
        }
        if !app.access.allow_session(peer.ip()) {
            app.metrics.session_rejected();
            tracing::info!(%peer, "an AudioSocket connection past the per-address limit: closed");
            continue;
        }
        let _ = stream.set_nodelay(true);
        tokio::spawn(run(app.clone(), stream, peer));
    }
}

/// The bot's audio, to the connection's writer; past a bounded queue it is dropped.
struct Sink(mpsc::Sender<Vec<i16>>);

impl AudioSink for Sink {
    fn write(&mut self, samples: &[i16], _sample_rate: u32) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.0.try_send(samples.to_vec()) {
            crate::warnings::audio_dropped("audiosocket_out");
        }
    }

    // AudioSocket has no way to take back audio sent: the writer sends it at real-time pace,
    // so an interruption stops the voice within a chunk.
    fn clear(&mut self) {}
}

/// One call: its UUID first, then its audio and keys both ways until either side hangs up.
async fn run(app: Arc<App>, mut stream: TcpStream, peer: SocketAddr) {
    let mut reader = Reader::default();
    let mut buffer = vec![0u8; 8_192];
    let mut queued: Vec<Message> = Vec::new();
    let hello = tokio::time::timeout(HELLO_TIMEOUT, async {
        loop {
            let n = stream.read(&mut buffer).await.ok().filter(|n| *n > 0)?;
            let mut messages = reader.push(&buffer[..n]).ok()?.into_iter();
            if let Some(first) = messages.next() {
                queued.extend(messages);
                return match first {
                    Message::Uuid(uuid) => Some(uuid),
                    _ => None,
                };
            }
        }
    })
    .await;
    let Ok(Some(uuid)) = hello else {
        tracing::info!(%peer, "an AudioSocket connection named no call: closed");
        let _ = stream.write_all(&HANGUP).await;
        return;
    };
    let admission = match app.admit() {
        Ok(admission) => admission,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "an AudioSocket call refused");
            let _ = stream.write_all(&HANGUP).await;
            return;
        }
    };
    let info = SessionInfo {
        id: format!("audiosocket-{}", audiosocket::uuid_text(&uuid)),
        request_data: serde_json::Value::Null,
        placed: false,
    };
    let (out_tx, mut out_rx) = mpsc::channel(crate::audio::AUDIO_QUEUE);
    let sink: Box<dyn AudioSink> = Box::new(Sink(out_tx));
    let mut phone =
        match CallSession::start(&app, &info, "audiosocket", (BOT_RATE, sink), admission) {
            Ok(phone) => phone,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the bot; hanging up");
                let _ = stream.write_all(&HANGUP).await;
                return;
            }
        };
    tracing::info!(session = %info.id, %peer, "an AudioSocket call answered");
    // The call's rate is the rate its audio comes at (8 kHz until it says otherwise).
    let mut rate = 8_000;
    let mut narrow: Option<StreamResampler> = None;
    let (mut read_half, mut write_half) = stream.into_split();
    let mut why = "the caller hung up";
    'call: loop {
        for message in queued.drain(..) {
            match message {
                Message::Audio {
                    samples,
                    sample_rate,
                } => {
                    rate = sample_rate;
                    if phone
                        .handle
                        .queue_live_audio(AudioFrame::new(samples, sample_rate, 1))
                        .await
                        .is_err()
                    {
                        why = "the session ended";
                        break 'call;
                    }
                }
                Message::Dtmf(key) => {
                    let _ = phone.input.press(&key.to_string(), &phone.handle).await;
                }
                Message::Hangup => break 'call,
                Message::Error(code) => {
                    tracing::info!(session = %info.id, ?code, "Asterisk reported an error: the call ends");
                    why = "Asterisk reported an error";
                    break 'call;
                }
                Message::Uuid(_) => {}
            }
        }
        let keypad = phone.input.keypad_deadline().map(Instant::from_std);
        tokio::select! {
            read = read_half.read(&mut buffer) => match read {
                Ok(n) if n > 0 => match reader.push(&buffer[..n]) {
                    Ok(messages) => queued.extend(messages),
                    Err(e) => {
                        tracing::info!(session = %info.id, error = %e, "an unreadable AudioSocket stream: hanging up");
                        why = "an unreadable stream";
                        break;
                    }
                },
                _ => break,
            },
            out = out_rx.recv() => {
                let Some(samples) = out else { break };
                let samples = if rate == BOT_RATE {
                    samples
                } else {
                    let down = match &mut narrow {
                        Some(down) => down,
                        None => match StreamResampler::new(BOT_RATE, rate) {
                            Ok(down) => narrow.insert(down),
                            Err(_) => continue,
                        },
                    };
                    down.process(&samples)
                };
                let bytes = audiosocket::audio(&samples, rate);
                if !matches!(tokio::time::timeout(WRITE_TIMEOUT, write_half.write_all(&bytes)).await, Ok(Ok(()))) {
                    why = "Asterisk stopped reading";
                    break;
                }
            }
            event = phone.events.recv() => match event {
                Ok(event) => {
                    app.metrics.observe(&event.event);
                    if matches!(event.event, Event::SessionEnded { .. }) {
                        why = "the session ended";
                        break;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => break,
            },
            () = tokio::time::sleep_until(keypad.unwrap_or_else(Instant::now)), if keypad.is_some() => {
                let _ = phone.input.keypad_due(&phone.handle).await;
            }
        }
    }
    tracing::info!(session = %info.id, why, "an AudioSocket call ended");
    let _ = tokio::time::timeout(WRITE_TIMEOUT, write_half.write_all(&HANGUP)).await;
    phone.end().await;
}
