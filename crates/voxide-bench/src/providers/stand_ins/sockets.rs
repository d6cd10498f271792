//! The socket stand-ins: Deepgram's live transcription and Cartesia's TTS.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::audit::Fault;
use super::{StandIns, turn};

pub(super) async fn listen(
    State(stand_ins): State<StandIns>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    accept(stand_ins, &headers, "authorization", upgrade, transcribe)
}

/// Upgrades to `serve`, the session named by the key in `key_header`, unless the upgrade is
/// refused as a fault.
fn accept<F, Fut>(
    stand_ins: StandIns,
    headers: &HeaderMap,
    key_header: &str,
    upgrade: WebSocketUpgrade,
    serve: F,
) -> Response
where
    F: FnOnce(WebSocket, StandIns, String) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if let Some(refusal) = stand_ins.refused(Fault::UpgradeRefused) {
        return refusal;
    }
    let session = stand_ins.session(headers, key_header);
    upgrade.on_upgrade(move |socket| serve(socket, stand_ins, session))
}

/// A message to write at a time; once written, `noted` is noted in the log (and the ledger).
type Due = (Instant, Option<(String, Noted)>, String);
/// What a written message is, for the log.
#[derive(Clone, Copy)]
enum Noted {
    Final,
    FirstAudio,
}

/// The socket's writer: each message at its time, in order, until the socket fails.
fn writer(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut outgoing: mpsc::Receiver<Due>,
    stand_ins: StandIns,
) -> tokio::task::JoinHandle<()> {
    use futures_util::SinkExt;
    tokio::spawn(async move {
        while let Some((at, noted, text)) = outgoing.recv().await {
            super::until(at).await;
            if sink.send(Message::Text(text.into())).await.is_err() {
                return;
            }
            match noted {
                Some((key, Noted::Final)) => {
                    stand_ins.ledger().final_written(&key);
                    stand_ins.note(Instant::now(), key, |log| &mut log.final_sent);
                }
                Some((key, Noted::FirstAudio)) => {
                    stand_ins.note(Instant::now(), key, |log| &mut log.audio_sent);
                }
                None => {}
            }
        }
    })
}

/// Deepgram: audio is counted (and kept, to hear it); each `Finalize` is answered `delay` later
/// (or, as a fault, the socket is dropped instead). As Deepgram does with `interim_results`,
/// a second of audio without a final gets an interim result, so that a long stretch of speech
/// is not a silent socket.
async fn transcribe(socket: WebSocket, stand_ins: StandIns, session: String) {
    use futures_util::StreamExt;
    let (sink, mut stream) = socket.split();
    let (out, outgoing) = mpsc::channel::<Due>(16);
    let writer = writer(sink, outgoing, stand_ins.clone());
    let (mut received, mut finalized, mut question) = (0usize, 0usize, 0usize);
    let mut heard: Vec<i16> = Vec::new();
    let mut interim_at = 0usize;
    while let Some(Ok(message)) = stream.next().await {
        match message {
            Message::Binary(bytes) => {
                received += bytes.len() / 2;
                if received - interim_at.max(finalized) >= INTERIM_EVERY {
                    interim_at = received;
                    let interim = json!({"type": "Results", "channel_index": [0, 1],
                        "start": finalized as f64 / 16_000.0,
                        "duration": (received - finalized) as f64 / 16_000.0,
                        "is_final": false, "speech_final": false,
                        "channel": {"alternatives": [{"transcript": "", "confidence": 0.0,
                            "words": []}]}});
                    if out
                        .send((Instant::now(), None, interim.to_string()))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                if stand_ins.options.hearing.is_some() {
                    heard.extend(
                        bytes
                            .chunks_exact(2)
                            .map(|b| i16::from_le_bytes([b[0], b[1]])),
                    );
                    // A turn is heard whole up to a minute; older audio goes.
                    let over = heard.len().saturating_sub(HEARD_AT_MOST);
                    heard.drain(..over);
                }
            }
            Message::Text(text) if text.contains("\"Finalize\"") => {
                if stand_ins.faults.strike(Fault::SocketDropped) {
                    // Gone without a word: the finalize and the audio before it unanswered.
                    // The turn struck is the one of the socket's last final, if it wrote one (a
                    // final the new socket then writes names a session the turn's earlier
                    // finals did not).
                    if let Some(last) = question.checked_sub(1) {
                        stand_ins.ledger().struck(&turn(&session, last));
                    }
                    writer.abort();
                    return;
                }
                let arrived = Instant::now();
                let key = turn(&session, question);
                question += 1;
                let transcript = match &stand_ins.options.hearing {
                    Some(whisper) => hear(whisper.clone(), std::mem::take(&mut heard)).await,
                    None => format!("{key}."),
                };
                let results = json!({"type": "Results", "channel_index": [0, 1],
                    "start": finalized as f64 / 16_000.0,
                    "duration": (received - finalized) as f64 / 16_000.0,
                    "is_final": true, "speech_final": true, "from_finalize": true,
                    // Punctuated, as Deepgram writes it with `punctuate=true`: a whole sentence.
                    "channel": {"alternatives": [{"transcript": transcript,
                        "confidence": 0.99, "words": []}]}});
                finalized = received;
                // Hearing took what it took; the delay counts from the finalize, not after it.
                let due = (arrived + stand_ins.delays.stt).max(Instant::now());
                let noted = Some((key, Noted::Final));
                if out.send((due, noted, results.to_string())).await.is_err() {
                    break;
                }
            }
            Message::Text(_) | Message::Ping(_) | Message::Pong(_) => {}
            Message::Close(_) => break,
        }
    }
    drop(out);
    let _ = writer.await;
}

/// Audio between interim results: a second at 16 kHz.
const INTERIM_EVERY: usize = 16_000;
/// The most audio kept between finalizes: a minute at 16 kHz.
const HEARD_AT_MOST: usize = 16_000 * 60;

/// What Whisper hears in `audio` (16 kHz); nothing when it cannot.
async fn hear(whisper: Arc<voxide_engines::stt::whisper::Whisper>, audio: Vec<i16>) -> String {
    let samples = voxide_engines::audio::wav::to_f32(&audio);
    tokio::task::spawn_blocking(move || whisper.transcribe(&samples))
        .await
        .ok()
        .and_then(Result::ok)
        .map(|text| text.trim().to_owned())
        .unwrap_or_default()
}

pub(super) async fn speak(
    State(stand_ins): State<StandIns>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    accept(stand_ins, &headers, "x-api-key", upgrade, voice)
}

/// Cartesia: each context's text is answered with its timestamps and audio, the first `delay`
/// after its first text; its end with `done` after its audio. As a fault, a new context's text
/// drops the socket instead.
async fn voice(socket: WebSocket, stand_ins: StandIns, session: String) {
    use futures_util::StreamExt;
    let (sink, mut stream) = socket.split();
    let (out, outgoing) = mpsc::channel::<Due>(64);
    let writer = writer(sink, outgoing, stand_ins.clone());
    // Each context's turn name and when its first audio is due.
    let mut contexts: HashMap<String, (String, Instant)> = HashMap::new();
    let mut questions = 0usize;
    while let Some(Ok(message)) = stream.next().await {
        let text = match message {
            Message::Text(text) => text,
            // A client's keepalive pings (pipecat's, every 20 s) are answered by the socket.
            Message::Binary(_) | Message::Ping(_) | Message::Pong(_) => continue,
            Message::Close(_) => break,
        };
        let arrived = Instant::now();
        let Ok(message) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let Some(context) = message["context_id"].as_str().map(str::to_owned) else {
            continue;
        };
        if message["cancel"] == true {
            contexts.remove(&context);
            continue;
        }
        let known = contexts.contains_key(&context);
        if !known && stand_ins.faults.strike(Fault::SocketDropped) {
            // Gone without a word, this context's text unanswered.
            stand_ins
                .ledger()
                .struck(message["transcript"].as_str().unwrap_or_default());
            writer.abort();
            return;
        }
        if !known {
            let key = turn(&session, questions);
            questions += 1;
            stand_ins.note(arrived, key.clone(), |log| &mut log.text_arrived);
            contexts.insert(context.clone(), (key, arrived + stand_ins.delays.tts));
        }
        let Some((key, due)) = contexts.get(&context).cloned() else {
            continue;
        };
        let transcript = message["transcript"].as_str().unwrap_or_default();
        let at = due.max(Instant::now());
        if message["continue"] == false {
            contexts.remove(&context);
            let done =
                json!({"type": "done", "done": true, "status_code": 206, "context_id": context});
            if out.send((at, None, done.to_string())).await.is_err() {
                break;
            }
            continue;
        }
        let words: Vec<&str> = transcript.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        let timestamps = json!({"type": "timestamps", "done": false, "status_code": 206,
            "context_id": context, "word_timestamps": {"words": words,
            "start": (0..words.len()).map(|i| i as f64 * 0.3).collect::<Vec<_>>(),
            "end": (0..words.len()).map(|i| i as f64 * 0.3 + 0.25).collect::<Vec<_>>()}});
        let chunk = json!({"type": "chunk", "data": WORD_B64.as_str(), "done": false,
            "status_code": 206, "step_time": 10, "context_id": context})
        .to_string();
        // A quarter second a text, or with long answers a quarter second a word.
        let chunks = match stand_ins.options.long_answers {
            Some(_) => words.len(),
            None => 1,
        };
        let mut first = (!known).then_some((key, Noted::FirstAudio));
        if out.send((at, None, timestamps.to_string())).await.is_err() {
            break;
        }
        for _ in 0..chunks {
            if out.send((at, first.take(), chunk.clone())).await.is_err() {
                break;
            }
        }
    }
    drop(out);
    let _ = writer.await;
}

/// A spoken word: a quarter second of a 220 Hz tone at 24 kHz, base64.
static WORD_B64: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use base64::Engine as _;
    let bytes: Vec<u8> = (0..6_000)
        .map(|i| (3_000.0 * (i as f64 * 220.0 * std::f64::consts::TAU / 24_000.0).sin()) as i16)
        .flat_map(i16::to_le_bytes)
        .collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
});
