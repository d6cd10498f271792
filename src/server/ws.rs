//! The WebSocket endpoints: one session per connection, in voxide's PCM framing (`/ws`) or a
//! telephone carrier's media stream (`/ws/{carrier}`). See [`crate::transports::websocket`] for
//! the framing.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, Path, Query, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use serde_json::Value;

use super::access::ClientAddr;
use super::calls::{Awaiting, CallState};
use super::rtvi::{Leave, RtviInput};
use super::{Admission, ApiError, App};
use crate::bot::SessionInfo;
use crate::context::Message as ChatMessage;
use crate::events::{Event, ReportLevel, SessionEvent};
use crate::frames::{AudioFrame, DataFrame, PhoneAction};
use crate::observe::Watched;
use crate::pipeline::Session;
use crate::transports::carriers::Carrier;
use crate::transports::heartbeat::Heartbeat;
use crate::transports::output::AudioSink;
use crate::transports::pace::{Pace, TextPace};
use crate::transports::rtvi::{self, EvalFlags};
use crate::transports::websocket::{Framing, Inbound, Outbound, WsMessage};

/// Query parameters of `/ws`.
#[derive(Debug, Deserialize)]
pub(crate) struct PcmParams {
    /// Rate of the audio the client sends.
    sample_rate: Option<u32>,
    /// Rate of the audio the client wants back.
    out_sample_rate: Option<u32>,
    /// The bot it talks to (default: the server's first).
    bot: Option<String>,
    /// The bot answers in text: nothing is spoken (pipecat's eval harness in text mode).
    skip_tts: Option<bool>,
    /// An RTVI client gets the bot's audio as `eval-bot-audio` messages.
    capture_bot_audio: Option<bool>,
    /// `false`: the caller refuses to be recorded (`--record-dir`).
    record: Option<bool>,
}

/// Query parameters of `/ws/{carrier}`.
#[derive(Debug, Deserialize)]
pub(crate) struct PhoneParams {
    /// The bot the call goes to (default: the server's first).
    bot: Option<String>,
    /// `false`: the caller refuses to be recorded (`--record-dir`).
    record: Option<bool>,
}

/// A WebSocket session's info: a fresh id, and the bot its URL asked for and whether it may
/// be recorded.
fn session_info(
    app: &App,
    bot: Option<String>,
    record: Option<bool>,
) -> Result<SessionInfo, ApiError> {
    if let Some(name) = &bot {
        app.bots.find(name)?;
    }
    let mut request_data = serde_json::Map::new();
    if let Some(name) = bot {
        request_data.insert("bot".into(), Value::String(name));
    }
    if let Some(record) = record {
        request_data.insert("record".into(), Value::Bool(record));
    }
    Ok(SessionInfo {
        id: format!(
            "ws-{:08x}{:08x}",
            crate::ids::random_u32(),
            crate::ids::random_u32()
        ),
        request_data: if request_data.is_empty() {
            Value::Null
        } else {
            Value::Object(request_data)
        },
        placed: false,
    })
}

const RATES: std::ops::RangeInclusive<u32> = 8_000..=48_000;

pub(crate) async fn pcm(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    client: Option<Extension<ClientAddr>>,
    params: Result<Query<PcmParams>, QueryRejection>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = params?;
    let info = session_info(&app, params.bot, params.record)?;
    let upgrade = upgrade?;
    let input_rate = params.sample_rate.unwrap_or(16_000);
    let out_rate = params.out_sample_rate.unwrap_or(24_000);
    if !RATES.contains(&input_rate) || !RATES.contains(&out_rate) {
        return Err(ApiError::BadRequest(
            "sample_rate and out_sample_rate must be between 8000 and 48000".into(),
        ));
    }
    let admission = app.admit()?;
    let flags = EvalFlags {
        skip_tts: params.skip_tts.unwrap_or(false),
        capture_bot_audio: params.capture_bot_audio.unwrap_or(false),
    };
    let framing = Framing::pcm(input_rate, flags);
    Ok(limited(upgrade).on_upgrade(move |socket| async move {
        run_session(
            app,
            socket,
            (framing, flags.skip_tts),
            out_rate,
            Opening {
                info,
                admission,
                traceparent: super::webrtc::traceparent(&headers),
                client: client.map(|Extension(ClientAddr(ip))| ip),
                call_sid: None,
            },
        )
        .await;
    }))
}

pub(crate) async fn phone(
    State(app): State<Arc<App>>,
    Path(carrier): Path<String>,
    headers: axum::http::HeaderMap,
    client: Option<Extension<ClientAddr>>,
    params: Result<Query<PhoneParams>, QueryRejection>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let carrier = Carrier::from_name(&carrier).ok_or_else(|| {
        let known: Vec<&str> = Carrier::ALL.iter().map(|c| c.name()).collect();
        ApiError::NotFound(format!(
            "no carrier {carrier:?}: the media streams voxide takes are {}",
            known.join(", ")
        ))
    })?;
    let Query(params) = params?;
    let info = session_info(&app, params.bot, params.record)?;
    let upgrade = upgrade?;
    let admission = app.admit()?;
    // The pipeline speaks at 16 kHz for telephone calls; the framing narrows it to the call's.
    Ok(limited(upgrade).on_upgrade(move |socket| async move {
        run_session(
            app,
            socket,
            (Framing::phone(carrier), false),
            16_000,
            Opening {
                info,
                admission,
                traceparent: super::webrtc::traceparent(&headers),
                client: client.map(|Extension(ClientAddr(ip))| ip),
                call_sid: None,
            },
        )
        .await;
    }))
}

/// `/calls/{id}/stream`: the media stream of a call Twilio dialed for `POST /calls`, in
/// Twilio's framing. The call's session and place were taken when it was placed; the stream
/// is taken once, and its `start` must name the call Twilio was asked for.
pub(crate) async fn placed_call(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = upgrade?;
    let Awaiting {
        info,
        admission,
        call_sid,
    } = app
        .outbound
        .take_stream(&id)
        .ok_or_else(|| ApiError::NotFound(format!("no call {id:.80} waits for its stream here")))?;
    app.outbound.note(&id, CallState::Answered);
    Ok(limited(upgrade).on_upgrade(move |socket| async move {
        let opening = Opening {
            info,
            admission,
            traceparent: super::webrtc::traceparent(&headers),
            client: None,
            call_sid: Some(call_sid),
        };
        let framing = (Framing::phone(Carrier::Twilio), false);
        let ended = run_session(app.clone(), socket, framing, 16_000, opening).await;
        app.outbound.note(
            &id,
            CallState::Ended {
                reason: ended.placed_call_ended().into(),
            },
        );
    }))
}

/// How long a quiet client waits for its bot: one that speaks first gets it at its first
/// message; one that waits (for a greeting) gets it after this.
const BUILD_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// Largest WebSocket message a client may send (a second of 48 kHz audio is under 100 KB).
pub const MAX_WS_MESSAGE: usize = 1 << 20;

/// How long one write to a client may wait: a client that reads nothing for this long is
/// closed (the bot's audio meanwhile is dropped past a bounded queue, never piled up).
pub const CLIENT_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// An upgrade whose messages are at most [`MAX_WS_MESSAGE`]: a larger one closes the socket.
fn limited(upgrade: WebSocketUpgrade) -> WebSocketUpgrade {
    upgrade
        .max_message_size(MAX_WS_MESSAGE)
        .max_frame_size(MAX_WS_MESSAGE)
}

/// Sends the bot's audio to the socket's writer; a client that stops reading loses audio, not
/// the server's memory. On a carrier's stream it carries out the bot's phone actions too: keys
/// as the keypad's tones in its audio, transfers through [`hand_over`].
struct SocketSink {
    out: mpsc::Sender<Outbound>,
    /// The rate of the audio it is given.
    rate: u32,
    /// A carrier's call: where transfers go.
    transfers: Option<mpsc::Sender<String>>,
}

impl SocketSink {
    fn send(&self, message: Outbound) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.out.try_send(message) {
            crate::warnings::audio_dropped("ws_out");
        }
    }
}

impl AudioSink for SocketSink {
    fn write(&mut self, samples: &[i16], sample_rate: u32) {
        self.send(Outbound::Audio(samples.to_vec(), sample_rate));
    }

    fn clear(&mut self) {
        self.send(Outbound::Clear);
    }

    fn phone(&mut self, action: &PhoneAction) -> bool {
        let Some(transfers) = &self.transfers else {
            return false;
        };
        match action {
            // Queued behind the words before them; the carrier plays them in turn.
            PhoneAction::SendKeys(keys) => {
                let tones = crate::transports::dtmf::tones(keys, self.rate);
                self.send(Outbound::Audio(tones, self.rate));
            }
            PhoneAction::Transfer(to) => {
                let _ = transfers.try_send(to.clone());
            }
        }
        true
    }
}

/// The carrier's id of the call a stream carries.
#[derive(Debug, Default)]
struct CallId {
    /// The call it must carry: one voxide placed.
    expected: Option<String>,
    /// The call its `start` named.
    named: std::sync::OnceLock<String>,
}

/// Hands the stream's call over to each number or URI the bot asks for: through Twilio's REST
/// API on a Twilio stream, whose call then leaves the stream. A transfer that cannot happen
/// leaves the caller with the bot, which is told.
async fn hand_over(
    app: Arc<App>,
    (carrier, call): (Carrier, Arc<CallId>),
    mut asked: mpsc::Receiver<String>,
    handle: crate::pipeline::SessionHandle,
) {
    while let Some(to) = asked.recv().await {
        tracing::info!(%to, carrier = carrier.name(), "transferring the call");
        let named = call.named.get();
        let done = match (carrier, named) {
            (Carrier::Twilio | Carrier::Telnyx, None) => {
                Err("the stream never named its call".to_owned())
            }
            (Carrier::Twilio, Some(sid)) => match app.twilio.as_ref() {
                Some(twilio) => twilio.transfer(sid, &to).await.map_err(|e| e.to_string()),
                None => Err(
                    "handing a Twilio call over needs --twilio-account-sid and TWILIO_AUTH_TOKEN"
                        .to_owned(),
                ),
            },
            (Carrier::Telnyx, Some(id)) => match app.telnyx.as_ref() {
                Some(telnyx) => telnyx.transfer(id, &to).await.map_err(|e| e.to_string()),
                None => Err("handing a Telnyx call over needs TELNYX_API_KEY".to_owned()),
            },
            _ => Err(format!(
                "a {} stream cannot hand its call over",
                carrier.name()
            )),
        };
        match done {
            // Twilio ends the stream with the call's new TwiML; a Telnyx call bridged to its
            // new party keeps streaming, which the bot must not hear or speak into.
            Ok(()) if carrier == Carrier::Telnyx => {
                tracing::info!("the call was handed over: the bot leaves it");
                let _ = handle.stop_when_done().await;
            }
            Ok(()) => tracing::info!("the call was handed over"),
            Err(why) => super::phone::transfer_failed(&handle, &why).await,
        }
    }
}

/// What the upgrade learned of a session before it began.
struct Opening {
    info: SessionInfo,
    admission: Admission,
    /// The caller's W3C `traceparent`.
    traceparent: Option<String>,
    /// The address the per-address limit counted it under.
    client: Option<std::net::IpAddr>,
    /// The carrier's id of the call this stream must carry (a call voxide placed).
    call_sid: Option<String>,
}

async fn run_session(
    app: Arc<App>,
    socket: WebSocket,
    (mut framing, mut skip_tts): (Framing, bool),
    out_rate: u32,
    Opening {
        info,
        admission,
        traceparent,
        client,
        call_sid,
    }: Opening,
) -> Ended {
    let call = Arc::new(CallId {
        expected: call_sid,
        ..CallId::default()
    });
    let (mut sender, mut receiver) = socket.split();
    // The bot is built once the client has said something, or has stayed a moment: a client
    // that leaves at once, or whose first message breaks the limits, costs no bot.
    let first = match tokio::time::timeout(BUILD_AFTER, receiver.next()).await {
        Ok(Some(Ok(Message::Close(_))) | Some(Err(_)) | None) => {
            tracing::debug!("the client left before its bot was built");
            return Ended::Left;
        }
        Ok(Some(Ok(message))) => Some(message),
        Err(_) => None,
    };
    // An RTVI client may ask for a text session in its first message (`eval-connect`).
    if let Some(Message::Text(text)) = &first
        && let Some(flags) = rtvi::eval_connect(text)
    {
        skip_tts |= flags.skip_tts;
    }
    let receiver = futures_util::stream::iter(first.map(Ok)).chain(receiver);
    let (out_tx, out_rx) = mpsc::channel::<Outbound>(crate::audio::AUDIO_QUEUE);
    let carrier = match &framing {
        Framing::Phone(stream) => Some(stream.carrier()),
        _ => None,
    };
    let transport = carrier.map_or("websocket", Carrier::name);
    let (transfers, asked) = mpsc::channel::<String>(4);
    let sink = SocketSink {
        out: out_tx.clone(),
        rate: out_rate,
        transfers: carrier.is_some().then_some(transfers),
    };
    let mut observing = app.watchers.watch(&Watched {
        id: &info.id,
        bot: info.bot(),
        transport,
        level: ReportLevel::default(),
        consent: info.consents_to_recording(),
        traceparent: traceparent.as_deref(),
        bot_allows: app.bots.observed(info.bot()),
    });
    framing.set_session(&info.id, observing.recorded());
    let mut bot = match app
        .bots
        .build(&info, out_rate, observing.sink(Box::new(sink)))
    {
        Ok(bot) => bot,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the bot");
            for message in framing.encode(Outbound::Error(e.to_string())) {
                if let WsMessage::Text(text) = message {
                    let _ = sender.send(Message::Text(text.into())).await;
                }
            }
            let _ = sender.close().await;
            return Ended::Left;
        }
    };
    bot.params.skip_tts |= skip_tts;
    let mut input = RtviInput::new(
        bot.context.clone(),
        bot.params.skip_tts,
        app.options.allow_evals,
        bot.report_level,
    );
    let report_level = input.report_level();
    observing.report_level(bot.report_level);
    let mut builder = Session::builder(bot.pipeline)
        .params(bot.params)
        .resources(bot.resources);
    if let Some(observer) = observing.observer() {
        builder = builder.observer(observer);
    }
    let events = builder.subscribe();
    let watched = builder.subscribe();
    let session = builder.spawn();
    let handle = session.handle();
    admission.attach(handle.clone());
    let watching = tokio::spawn(observing.follow(watched, handle.clone()));
    let handing_over = carrier.map(|carrier| {
        tokio::spawn(hand_over(
            app.clone(),
            (carrier, call.clone()),
            asked,
            handle.clone(),
        ))
    });

    // Events go to the metrics and to the client.
    let forward = tokio::spawn(forward_events(
        app.clone(),
        (info.id.clone(), events),
        (out_tx.clone(), report_level),
    ));
    // Reader and writer share the framing: Twilio's stream id arrives in, and is needed out.
    let framing = Arc::new(std::sync::Mutex::new(framing));
    let beat = Arc::new(Beat::new(Heartbeat::new(
        Instant::now().into_std(),
        CLIENT_WRITE_TIMEOUT,
    )));
    let (gone_tx, gone) = oneshot::channel::<Gone>();
    let writer = tokio::spawn(write_socket(
        sender,
        out_rx,
        (framing.clone(), beat.clone()),
        (CLIENT_WRITE_TIMEOUT, gone_tx),
    ));
    // The writer ends first only when the client cannot be written to: gone, or not reading.
    // What the client said last is read first: a carrier's `stop` (the callee hung up), then
    // its socket's close, must not read as voxide hanging up.
    let ended = tokio::select! {
        biased;
        ended = read_socket(receiver, (&framing, &beat), (&app, &handle, &mut input), (&out_tx, &call)) => ended,
        gone = gone => match gone {
            Ok(Gone::NotReading) => Ended::NotReading,
            _ => Ended::Left,
        },
    };
    match ended {
        Ended::NotReading => app.metrics.closed_not_reading(),
        Ended::TooFast => app.metrics.closed_too_fast(),
        Ended::Stopped | Ended::Left | Ended::Over => {}
    }
    if let (Ended::NotReading | Ended::TooFast, Some(ip)) = (ended, client) {
        app.access.cool_down(ip);
    }
    if ended == Ended::Stopped {
        // Let the bot finish what it is saying.
        let _ = handle.stop_when_done().await;
    } else {
        handle.cancel();
    }
    let _ = session.join().await;
    let _ = forward.await;
    let _ = watching.await;
    if let Some(task) = handing_over {
        task.abort();
    }
    // The session is over: its slot is free before the socket is (a close can wait on a
    // client that reads nothing, up to the write timeout).
    drop(admission);
    drop(out_tx);
    let _ = writer.await;
    ended
}

/// The session's events, to the metrics and, as a client may see them, to the client; who
/// answered a call placed, to its entry in the book.
async fn forward_events(
    app: Arc<App>,
    (id, mut events): (String, tokio::sync::broadcast::Receiver<SessionEvent>),
    (out, level): (mpsc::Sender<Outbound>, watch::Receiver<ReportLevel>),
) {
    loop {
        match events.recv().await {
            Ok(event) => {
                app.metrics.observe(&event.event);
                if let Event::CallAnswered { by, because } = &event.event {
                    app.outbound.note_answerer(&id, *by, *because);
                }
                let ended = matches!(event.event, Event::SessionEnded { .. });
                let seen = event.event.for_client(*level.borrow());
                if let Some(seen) = seen {
                    let event = SessionEvent {
                        event: seen,
                        ..event
                    };
                    let _ = out.send(Outbound::Event(event)).await;
                }
                if ended {
                    break;
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(_) => break,
        }
    }
}

/// How a session's socket ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The client asked the bot to finish first (`stop`, an RTVI disconnect).
    Stopped,
    /// The client's socket closed, or failed, without a word.
    Left,
    /// The session ended on voxide's side: the bot hung up, or its time ran out.
    Over,
    /// The client sent audio faster than real time.
    TooFast,
    /// The client read nothing for the write timeout: a ping unanswered, or a write stuck.
    NotReading,
}

impl Ended {
    /// Who ended a call voxide placed through Twilio, as `GET /calls/{id}` says it. Twilio
    /// closes the stream when the call ends, and says `stop` first; a close without it (a
    /// reset can lose the `stop` with the bot's audio unread) is the callee's hang-up too.
    fn placed_call_ended(self) -> &'static str {
        match self {
            Ended::Stopped | Ended::Left => "callee_hung_up",
            Ended::Over | Ended::TooFast => "hung_up",
            Ended::NotReading => "lost",
        }
    }
}

/// Why the writer gave up before the session ended.
#[derive(Debug)]
enum Gone {
    /// The socket failed: the client is gone.
    Left,
    /// The client read nothing for the write timeout.
    NotReading,
}

/// The client's heartbeat, shared by the reader (pongs) and the writer (pings), and the writer's
/// wake-up when a pong makes the next ping due: a writer that waits only for the session's
/// messages while the bot and the user are both silent would send no ping, and the client,
/// owing one from when it was due, would stop being listened to.
struct Beat {
    heartbeat: std::sync::Mutex<Heartbeat>,
    answered: tokio::sync::Notify,
}

impl Beat {
    fn new(heartbeat: Heartbeat) -> Self {
        Self {
            heartbeat: std::sync::Mutex::new(heartbeat),
            answered: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Heartbeat> {
        self.heartbeat.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pong arrived at `now`.
    fn pong(&self, payload: &[u8], now: std::time::Instant) {
        self.lock().pong(payload, now);
        self.answered.notify_one();
    }
}

/// Writes what the session sends, framed, and the heartbeat's pings, until the session is done
/// or the client is gone or has read nothing for `timeout`; then says which through `gone`.
async fn write_socket<S>(
    mut sender: S,
    mut out: mpsc::Receiver<Outbound>,
    (framing, beat): (Arc<std::sync::Mutex<Framing>>, Arc<Beat>),
    (timeout, gone): (std::time::Duration, oneshot::Sender<Gone>),
) where
    S: futures_util::Sink<Message> + Unpin,
{
    let lock_beat = || beat.lock();
    let ended = loop {
        let next_ping = lock_beat().next_ping().map(Instant::from_std);
        let messages = tokio::select! {
            // The pong came: the next ping is due at a time the loop reads afresh.
            () = beat.answered.notified(), if next_ping.is_none() => Vec::new(),
            outbound = out.recv() => match outbound {
                Some(outbound) => framing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .encode(outbound)
                    .into_iter()
                    .map(|message| match message {
                        WsMessage::Text(text) => Message::Text(text.into()),
                        WsMessage::Binary(bytes) => Message::Binary(bytes.into()),
                    })
                    .collect(),
                None => break None,
            },
            () = tokio::time::sleep_until(next_ping.unwrap_or_else(Instant::now)), if next_ping.is_some() => {
                match lock_beat().ping(Instant::now().into_std()) {
                    Some(payload) => vec![Message::Ping(payload.to_vec().into())],
                    None => Vec::new(),
                }
            }
        };
        let mut failed = None;
        for message in messages {
            match tokio::time::timeout(timeout, sender.send(message)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    failed = Some(Gone::Left);
                    break;
                }
                Err(_) => {
                    failed = Some(Gone::NotReading);
                    break;
                }
            }
        }
        if failed.is_some() {
            break failed;
        }
    };
    match ended {
        Some(Gone::NotReading) => {
            tracing::warn!(
                timeout_s = timeout.as_secs_f64(),
                "the client reads nothing: its session is closed"
            );
            let _ = gone.send(Gone::NotReading);
        }
        Some(Gone::Left) => {
            let _ = gone.send(Gone::Left);
            let _ = tokio::time::timeout(timeout, sender.close()).await;
        }
        None => {
            drop(gone);
            let _ = tokio::time::timeout(timeout, sender.close()).await;
        }
    }
}

/// Reads the client's messages into the session until it leaves, and how it ended. Audio that
/// arrives while the client owes an answer to a ping is dropped (it is not hearing the bot); a
/// client that owes one for the give-up time is closed.
async fn read_socket(
    mut receiver: impl futures_util::Stream<Item = Result<Message, axum::Error>> + Unpin,
    (framing, beat): (&std::sync::Mutex<Framing>, &Beat),
    (app, handle, input): (&App, &crate::pipeline::SessionHandle, &mut RtviInput),
    (out, call): (&mpsc::Sender<Outbound>, &CallId),
) -> Ended {
    let lock_beat = || beat.lock();
    let mut pace = Pace::default();
    let mut typed = TextPace::default();
    loop {
        let keypad = input.keypad_deadline().map(Instant::from_std);
        let give_up = Instant::from_std(lock_beat().give_up_at());
        let message = tokio::select! {
            message = receiver.next() => message,
            () = tokio::time::sleep_until(keypad.unwrap_or_else(Instant::now)), if keypad.is_some() => {
                if input.keypad_due(handle).await.is_err() {
                    return Ended::Over;
                }
                continue;
            }
            () = tokio::time::sleep_until(give_up) => {
                if lock_beat().given_up(Instant::now().into_std()) {
                    tracing::warn!("the client answers no ping: its session is closed");
                    return Ended::NotReading;
                }
                continue;
            }
        };
        let Some(message) = message else { break };
        let message = match message {
            Ok(Message::Text(text)) => WsMessage::Text(text.to_string()),
            Ok(Message::Binary(bytes)) => WsMessage::Binary(bytes.to_vec()),
            Ok(Message::Close(_)) => break,
            Ok(Message::Pong(payload)) => {
                beat.pong(&payload, Instant::now().into_std());
                continue;
            }
            Ok(Message::Ping(_)) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "the client's socket failed");
                break;
            }
        };
        let decoded = framing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .decode(message);
        let queued = match decoded {
            Ok(Inbound::Audio {
                samples,
                sample_rate,
            }) => {
                let now = Instant::now().into_std();
                if let Err(too_fast) = pace.take(samples.len(), sample_rate, now) {
                    tracing::warn!(%too_fast, "a client sends audio faster than real time: closed");
                    let _ = out.send(Outbound::Error(too_fast.to_string())).await;
                    return Ended::TooFast;
                }
                if !lock_beat().listening(now) {
                    app.metrics.unheard_frame();
                    continue;
                }
                let audio = AudioFrame::new(samples, sample_rate, 1);
                handle.queue_live_audio(audio).await
            }
            Ok(Inbound::Text(text)) => {
                if let Err(refused) = typed.take(&text, Instant::now().into_std()) {
                    tracing::debug!(%refused, "a typed message dropped");
                    let _ = out.send(Outbound::Error(refused.to_string())).await;
                    continue;
                }
                let append = DataFrame::LlmMessagesAppend {
                    messages: vec![ChatMessage::user(text)],
                    run_llm: true,
                };
                handle.queue_frame(append).await
            }
            Ok(Inbound::Call(started))
                if call
                    .expected
                    .as_ref()
                    .is_some_and(|sid| *sid != started.call_sid) =>
            {
                tracing::warn!(
                    call_sid = started.call_sid,
                    "a placed call's stream names another call"
                );
                let _ = out
                    .send(Outbound::Error("this stream carries another call".into()))
                    .await;
                return Ended::Left;
            }
            Ok(Inbound::Call(started)) => match app.access.take_call(&started) {
                Ok(()) => {
                    let _ = call.named.set(started.call_sid.clone());
                    Ok(())
                }
                Err(refused) => {
                    tracing::warn!(call_sid = started.call_sid, %refused, "a call's stream refused");
                    let _ = out.send(Outbound::Error(refused.to_string())).await;
                    return Ended::Left;
                }
            },
            Ok(Inbound::Rtvi(rtvi::ClientMessage::Audio { .. }))
                if !lock_beat().listening(Instant::now().into_std()) =>
            {
                app.metrics.unheard_frame();
                Ok(())
            }
            Ok(Inbound::Rtvi(message)) => match input.apply(message, handle).await {
                Ok(replies) => {
                    for reply in replies {
                        let _ = out.send(Outbound::Text(reply)).await;
                    }
                    Ok(())
                }
                Err(Leave::Disconnect) => return Ended::Stopped,
                Err(Leave::Cancel | Leave::Ended) => return Ended::Left,
                Err(Leave::TooFast(too_fast)) => {
                    tracing::warn!(%too_fast, "a client sends audio faster than real time: closed");
                    let _ = out
                        .send(Outbound::Text(rtvi::fatal_error(&too_fast.to_string())))
                        .await;
                    return Ended::TooFast;
                }
            },
            Ok(Inbound::Dtmf(key)) => input.press(&key.to_string(), handle).await,
            Ok(Inbound::Stop) => return Ended::Stopped,
            Ok(Inbound::Nothing) => Ok(()),
            Err(e) => {
                // A bad message is answered and skipped; the session goes on.
                tracing::debug!(error = %e, "unusable client message");
                let _ = out.send(Outbound::Error(e.to_string())).await;
                Ok(())
            }
        };
        if queued.is_err() {
            return Ended::Over;
        }
    }
    Ended::Left
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use super::*;

    /// A client whose socket takes nothing: every write waits forever.
    struct NeverReads;

    impl futures_util::Sink<Message> for NeverReads {
        type Error = std::convert::Infallible;
        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Pending
        }
        fn start_send(self: Pin<&mut Self>, _: Message) -> Result<(), Self::Error> {
            Ok(())
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Pending
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Pending
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_answers_is_pinged_again_while_nothing_else_is_sent() {
        let (_out_tx, out_rx) = mpsc::channel(4);
        let (gone_tx, _gone) = oneshot::channel();
        let framing = Arc::new(std::sync::Mutex::new(Framing::pcm(
            16_000,
            EvalFlags::default(),
        )));
        let beat = Arc::new(Beat::new(Heartbeat::new(
            Instant::now().into_std(),
            Duration::from_secs(15),
        )));
        let (sent_tx, mut sent) = mpsc::unbounded_channel();
        let sink = Box::pin(futures_util::sink::unfold(
            sent_tx,
            |sent_tx, message: Message| async move {
                let _ = sent_tx.send(message);
                Ok::<_, std::convert::Infallible>(sent_tx)
            },
        ));
        let writer = tokio::spawn(write_socket(
            sink,
            out_rx,
            (framing, beat.clone()),
            (Duration::from_secs(15), gone_tx),
        ));
        // The bot and the user are silent: the session sends nothing, only pings go out, each
        // once the last is answered.
        for _ in 0..3 {
            let ping = tokio::time::timeout(Duration::from_secs(5), sent.recv())
                .await
                .expect("a ping within the ping interval")
                .expect("the writer runs");
            let Message::Ping(payload) = ping else {
                panic!("{ping:?} where a ping was due");
            };
            beat.pong(&payload, Instant::now().into_std());
            assert!(beat.lock().listening(Instant::now().into_std()));
        }
        writer.abort();
    }

    #[test]
    fn a_placed_call_whose_stream_closes_unasked_was_hung_up_by_the_callee() {
        // `stop`, or the socket's close or reset that lost it: Twilio ended the call.
        assert_eq!(Ended::Stopped.placed_call_ended(), "callee_hung_up");
        assert_eq!(Ended::Left.placed_call_ended(), "callee_hung_up");
        // The bot hung up, or voxide closed a client it could not keep.
        assert_eq!(Ended::Over.placed_call_ended(), "hung_up");
        assert_eq!(Ended::TooFast.placed_call_ended(), "hung_up");
        assert_eq!(Ended::NotReading.placed_call_ended(), "lost");
    }

    #[test]
    fn a_carriers_sink_presses_keys_as_tones_and_asks_for_transfers() {
        let (out, mut audio) = mpsc::channel(4);
        let (transfers, mut asked) = mpsc::channel(4);
        let mut sink = SocketSink {
            out: out.clone(),
            rate: 16_000,
            transfers: Some(transfers),
        };
        assert!(sink.phone(&PhoneAction::SendKeys("5#".into())));
        match audio.try_recv() {
            Ok(Outbound::Audio(tones, 16_000)) => {
                assert_eq!(
                    tones.len(),
                    2 * (1_600 + 960),
                    "two keys of 100 ms and their gaps"
                );
            }
            other => panic!("the keys' tones, not {other:?}"),
        }
        assert!(sink.phone(&PhoneAction::Transfer("+15550001111".into())));
        assert_eq!(asked.try_recv().ok().as_deref(), Some("+15550001111"));
        let mut plain = SocketSink {
            out,
            rate: 16_000,
            transfers: None,
        };
        assert!(
            !plain.phone(&PhoneAction::SendKeys("1".into())),
            "a /ws client has no phone line"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_nothing_is_given_up_on_after_the_write_timeout() {
        let (out_tx, out_rx) = mpsc::channel(4);
        let (gone_tx, gone) = oneshot::channel();
        let framing = Arc::new(std::sync::Mutex::new(Framing::pcm(
            16_000,
            EvalFlags::default(),
        )));
        let started = Instant::now();
        let beat = Arc::new(Beat::new(Heartbeat::new(
            started.into_std(),
            Duration::from_secs(15),
        )));
        let writer = tokio::spawn(write_socket(
            NeverReads,
            out_rx,
            (framing, beat),
            (Duration::from_secs(15), gone_tx),
        ));
        out_tx
            .send(Outbound::Audio(vec![0; 320], 16_000))
            .await
            .expect("queued");
        assert!(
            matches!(gone.await, Ok(Gone::NotReading)),
            "the writer gave up"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(15));
        writer.await.expect("the writer ended");
    }
}
