//! One caller: connects the way a client does, speaks its recorded turns paced by a 20 ms clock
//! (silence between them, as a microphone sends), and times what it hears from the audio itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_tungstenite::tungstenite::Message;

use super::signal::{Change, Voice};
use super::{Protocol, Recorder};
use crate::audio::mulaw;
use crate::audio::resample::StreamResampler;

/// The bot's audio is over after this much quiet.
const HANGOVER_SECS: f64 = 0.8;
/// Samples of one 20 ms frame at 16 kHz.
const FRAME: usize = 320;

/// One recorded user turn, encoded once for every session.
pub struct TurnAudio {
    /// The WAV it came from.
    pub name: String,
    /// 20 ms frames as the wire carries them (PCM bytes, or μ-law bytes for Twilio).
    frames: Vec<Vec<u8>>,
    /// Where its speech ends, in seconds from its start.
    pub speech_end: f64,
}

impl TurnAudio {
    /// `samples` (mono 16 kHz) encoded for `protocol`; `None` when it holds no speech.
    pub fn new(name: String, samples: &[i16], protocol: Protocol) -> Option<Self> {
        let (_, end) = super::signal::speech_bounds(samples, 16_000)?;
        let frames = match protocol {
            Protocol::Ws => samples
                .chunks(FRAME)
                .map(|c| {
                    let mut frame: Vec<u8> = c.iter().flat_map(|s| s.to_le_bytes()).collect();
                    frame.resize(FRAME * 2, 0);
                    frame
                })
                .collect(),
            Protocol::Twilio => {
                let narrow = StreamResampler::new(16_000, 8_000)
                    .map(|mut r| r.process(samples))
                    .unwrap_or_default();
                narrow
                    .chunks(FRAME / 2)
                    .map(|c| {
                        let mut frame: Vec<u8> = c.iter().map(|s| mulaw::encode(*s)).collect();
                        frame.resize(FRAME / 2, mulaw::encode(0));
                        frame
                    })
                    .collect()
            }
        };
        Some(Self {
            name,
            frames,
            speech_end: end as f64 / 16_000.0,
        })
    }
}

/// What the session's driver is told of each turn.
#[derive(Debug, Clone, Default)]
pub struct TurnResult {
    pub session: usize,
    pub turn: usize,
    pub audio: String,
    /// When its first frame went, in seconds from the run's start.
    pub user_start: f64,
    /// When its speech ended.
    pub speech_end: f64,
    pub onset: Option<f64>,
    pub reply_end: Option<f64>,
    /// What went wrong, by kind.
    pub error: Option<String>,
}

impl TurnResult {
    /// The end of the user's speech to the bot's first sound, in ms.
    pub fn v2v_ms(&self) -> Option<f64> {
        self.onset.map(|o| (o - self.speech_end) * 1000.0)
    }
}

/// One session's outcome.
#[derive(Debug, Clone, Default)]
pub struct SessionResult {
    pub session: usize,
    /// Seconds from the run's start.
    pub started: f64,
    pub connected: Option<f64>,
    pub first_audio: Option<f64>,
    pub turns: Vec<TurnResult>,
    /// Why it ended early, by kind (`connect`, `dropped`).
    pub error: Option<String>,
    /// How late each 20 ms frame went out, in ms.
    pub pacing_lag_ms: Vec<f64>,
}

/// What the reader heard, shared with the speaker.
struct Heard {
    /// Follows the bot's audio (the speaker's clock ends speech that no audio follows).
    voice: Voice,
    onsets: Vec<f64>,
    offsets: Vec<f64>,
    /// Server events: (seconds, type).
    events: Vec<(f64, String)>,
    closed: Option<String>,
}

impl Heard {
    fn note(
        &mut self,
        changes: impl IntoIterator<Item = Change>,
        index: usize,
        recorder: &Recorder,
    ) {
        for change in changes {
            match change {
                Change::Onset(at) => {
                    self.onsets.push(at);
                    recorder.event(at, index, "bot_audio_onset", json!({}));
                }
                Change::Offset(at) => {
                    self.offsets.push(at);
                    recorder.event(at, index, "bot_audio_end", json!({}));
                }
            }
        }
    }
}

/// How a session speaks.
pub struct Plan {
    pub protocol: Protocol,
    /// The socket's URL.
    pub url: String,
    pub turns: usize,
    pub think: Duration,
    pub response_timeout: Duration,
    pub audio: Arc<Vec<TurnAudio>>,
    /// The run's clock.
    pub origin: Instant,
}

impl Plan {
    fn secs(&self, at: Instant) -> f64 {
        at.duration_since(self.origin).as_secs_f64()
    }

    fn message(&self, frame: &[u8], n: usize, sid: &str) -> Message {
        match self.protocol {
            Protocol::Ws => Message::binary(frame.to_vec()),
            Protocol::Twilio => Message::text(
                json!({"event": "media", "sequenceNumber": (n + 2).to_string(), "streamSid": sid,
                    "media": {"track": "inbound", "chunk": (n + 1).to_string(),
                              "timestamp": (n * 20).to_string(), "payload": STANDARD.encode(frame)}})
                .to_string(),
            ),
        }
    }

    fn silence(&self) -> Vec<u8> {
        match self.protocol {
            Protocol::Ws => vec![0; FRAME * 2],
            Protocol::Twilio => vec![mulaw::encode(0); FRAME / 2],
        }
    }
}

/// Runs session `index`: connects, speaks every turn, and says how it went.
pub async fn run(index: usize, plan: Arc<Plan>, recorder: Recorder) -> SessionResult {
    let started = Instant::now();
    let mut result = SessionResult {
        session: index,
        started: plan.secs(started),
        ..SessionResult::default()
    };
    recorder.event(plan.secs(started), index, "connect_started", json!({}));
    let connecting = tokio_tungstenite::connect_async(plan.url.as_str());
    let socket = match tokio::time::timeout(Duration::from_secs(15), connecting).await {
        Ok(Ok((socket, _))) => socket,
        Ok(Err(e)) => {
            let kind = match &e {
                tokio_tungstenite::tungstenite::Error::Http(r) => {
                    format!("connect_http_{}", r.status().as_u16())
                }
                _ => "connect_refused".to_owned(),
            };
            recorder.event(
                plan.secs(Instant::now()),
                index,
                "error",
                json!({"kind": kind, "detail": e.to_string()}),
            );
            result.error = Some(kind);
            return result;
        }
        Err(_) => {
            recorder.event(
                plan.secs(Instant::now()),
                index,
                "error",
                json!({"kind": "connect_timeout"}),
            );
            result.error = Some("connect_timeout".into());
            return result;
        }
    };
    let connected = Instant::now();
    result.connected = Some(plan.secs(connected));
    recorder.event(plan.secs(connected), index, "connected", json!({}));
    let (mut tx, mut rx) = socket.split();
    let sid = format!("MZloadtest{index}");
    if plan.protocol == Protocol::Twilio {
        let hello = [
            json!({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
            json!({"event": "start", "sequenceNumber": "1", "streamSid": sid,
                "start": {"streamSid": sid, "accountSid": "ACloadtest", "callSid": format!("CA{index}"),
                          "tracks": ["inbound"], "customParameters": {},
                          "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}),
        ];
        for message in hello {
            if tx.send(Message::text(message.to_string())).await.is_err() {
                result.error = Some("dropped".into());
                return result;
            }
        }
    }

    let rate = match plan.protocol {
        Protocol::Ws => 16_000,
        Protocol::Twilio => 8_000,
    };
    let heard = Arc::new(Mutex::new(Heard {
        voice: Voice::new(rate, HANGOVER_SECS),
        onsets: Vec::new(),
        offsets: Vec::new(),
        events: Vec::new(),
        closed: None,
    }));
    let reader = {
        let (heard, plan, recorder) = (heard.clone(), plan.clone(), recorder.clone());
        tokio::spawn(async move {
            loop {
                let message = rx.next().await;
                let now = plan.secs(Instant::now());
                let samples: Option<Vec<i16>> = match message {
                    Some(Ok(Message::Binary(bytes))) => Some(
                        bytes
                            .chunks_exact(2)
                            .map(|b| i16::from_le_bytes([b[0], b[1]]))
                            .collect(),
                    ),
                    Some(Ok(Message::Text(text))) => {
                        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                        match plan.protocol {
                            Protocol::Twilio if value["event"] == "media" => {
                                value["media"]["payload"]
                                    .as_str()
                                    .and_then(|p| STANDARD.decode(p).ok())
                                    .map(|b| b.into_iter().map(mulaw::decode).collect())
                            }
                            _ => {
                                let kind = value["type"]
                                    .as_str()
                                    .or(value["event"].as_str())
                                    .unwrap_or("unknown")
                                    .to_owned();
                                recorder.event(now, index, "server", json!({"type": kind}));
                                let mut heard = heard.lock().unwrap_or_else(|p| p.into_inner());
                                heard.events.push((now, kind));
                                None
                            }
                        }
                    }
                    Some(Ok(_)) => None,
                    Some(Err(_)) | None => {
                        let mut heard = heard.lock().unwrap_or_else(|p| p.into_inner());
                        heard.closed = Some("dropped".into());
                        return;
                    }
                };
                let Some(samples) = samples else { continue };
                let mut heard = heard.lock().unwrap_or_else(|p| p.into_inner());
                let changes = heard.voice.feed(&samples, now);
                heard.note(changes, index, &recorder);
            }
        })
    };

    let frame = Duration::from_millis(20);
    let mut tick = tokio::time::interval(frame);
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut sent = 0usize;
    let silence = plan.silence();
    // Sends the next frame on the clock; when it went, in run seconds. A mic sends a frame once
    // it is captured, so that is when its last sample was spoken.
    macro_rules! send_frame {
        ($bytes:expr) => {{
            let scheduled = tick.tick().await;
            let now = Instant::now();
            result
                .pacing_lag_ms
                .push(now.saturating_duration_since(scheduled).as_secs_f64() * 1000.0);
            let message = plan.message($bytes, sent, &sid);
            sent += 1;
            match tx.send(message).await {
                Ok(()) => Ok(plan.secs(now)),
                Err(_) => Err(()),
            }
        }};
    }
    'turns: for turn in 0..plan.turns {
        let audio = &plan.audio[turn % plan.audio.len()];
        let mut outcome = TurnResult {
            session: index,
            turn,
            audio: audio.name.clone(),
            ..TurnResult::default()
        };
        // The frame holding the speech's last sample, and how much of it follows that sample.
        let end_frame = ((audio.speech_end / 0.02).ceil() as usize).saturating_sub(1);
        let after_end = (end_frame + 1) as f64 * 0.02 - audio.speech_end;
        let mut begun = None;
        for (k, bytes) in audio.frames.iter().enumerate() {
            match send_frame!(bytes) {
                Ok(at) => {
                    begun.get_or_insert(at);
                    if k == end_frame {
                        outcome.speech_end = at - after_end;
                    }
                }
                Err(()) => {
                    result.error = Some("dropped".into());
                    outcome.error = Some("dropped".into());
                    result.turns.push(outcome);
                    break 'turns;
                }
            }
        }
        let begun = begun.unwrap_or_default();
        outcome.user_start = begun;
        recorder.event(begun, index, "user_audio_start", json!({"turn": turn}));
        recorder.event(
            outcome.speech_end,
            index,
            "user_speech_end",
            json!({"turn": turn}),
        );
        let deadline = outcome.speech_end + plan.response_timeout.as_secs_f64();
        // Silence until the reply has ended (or never came), then the think time.
        let mut quiet_from: Option<f64> = None;
        loop {
            let at = match send_frame!(&silence) {
                Ok(at) => at,
                Err(()) => {
                    outcome.error = Some("dropped".into());
                    break;
                }
            };
            let mut heard = heard.lock().unwrap_or_else(|p| p.into_inner());
            // A server that sends nothing after a reply ends it on the clock.
            let quiet = heard.voice.quiet_until(at);
            heard.note(quiet, index, &recorder);
            if heard.closed.is_some() {
                outcome.error = Some("dropped".into());
                break;
            }
            if outcome.onset.is_none() {
                outcome.onset = heard
                    .onsets
                    .iter()
                    .copied()
                    .find(|o| *o > outcome.speech_end);
            }
            if let Some(onset) = outcome.onset
                && outcome.reply_end.is_none()
            {
                let stopped = heard
                    .events
                    .iter()
                    .find(|(t, kind)| *t > onset && kind == "bot_stopped_speaking")
                    .map(|(t, _)| *t);
                outcome.reply_end = heard
                    .offsets
                    .iter()
                    .copied()
                    .find(|o| *o > onset)
                    .or(stopped);
            }
            drop(heard);
            if outcome.reply_end.is_some() {
                let since = *quiet_from.get_or_insert(at);
                if at - since >= plan.think.as_secs_f64() {
                    break;
                }
            } else if outcome.onset.is_none() && at > deadline {
                outcome.error = Some("no_response".into());
                recorder.event(
                    at,
                    index,
                    "error",
                    json!({"kind": "no_response", "turn": turn}),
                );
                break;
            } else if at > deadline + 60.0 {
                outcome.error = Some("reply_never_ended".into());
                break;
            }
        }
        let dropped = outcome.error.as_deref() == Some("dropped");
        result.turns.push(outcome);
        if dropped {
            result.error = Some("dropped".into());
            break;
        }
    }
    {
        let heard = heard.lock().unwrap_or_else(|p| p.into_inner());
        result.first_audio = heard.onsets.first().copied();
    }
    let bye = match plan.protocol {
        Protocol::Ws => json!({"type": "stop"}),
        Protocol::Twilio => json!({"event": "stop", "streamSid": sid, "stop": {}}),
    };
    let _ = tx.send(Message::text(bye.to_string())).await;
    let _ = tx.close().await;
    reader.abort();
    recorder.event(
        plan.secs(Instant::now()),
        index,
        "closed",
        json!({"error": result.error}),
    );
    result
}
