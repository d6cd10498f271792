//! The latency voxide itself adds around network providers, against local stand-ins that speak
//! Deepgram's live transcription, an OpenAI-compatible or Anthropic chat stream and Cartesia's TTS
//! socket, each with a realistic delay before it answers: K sessions, each speaking T questions
//! in turn through the whole chain (STT, user aggregator, LLM, TTS, the transport's door).
//!
//! Each leg is timed on one clock from a stand-in's write or read, so the providers' own time is
//! left out:
//! - **final → LLM request**: Deepgram writing a turn's final to the LLM stand-in holding the
//!   request (the STT core and service, the user aggregator, the request built and sent);
//! - **request**: the context reaching the LLM service to the stand-in holding the request;
//! - **first token**: the stand-in writing the first token to that text leaving the LLM service;
//! - **first token → TTS request**: the same write to Cartesia holding the turn's first text
//!   (SSE decoding, the first sentence cut, the TTS core);
//! - **first audio → transport**: Cartesia writing the turn's first audio to that audio reaching
//!   the output transport.
//!
//! Run it pinned (`taskset -c 0`) to read it per core; the stand-ins share that core.

pub mod stand_ins;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::sessions::LagReport;
use crate::aggregators::UserAggregator;
use crate::context::{ContextHandle, LlmContext, Message};
use crate::frames::{AudioFrame, ControlFrame, DataFrame, Frame, FrameBody, SystemFrame};
use crate::loadtest::stats::cpu_seconds;
use crate::services::llm::anthropic::{AnthropicLlm, AnthropicSettings};
use crate::services::llm::openai::{OpenAiLlm, OpenAiSettings};
use crate::services::llm::{LlmEngine, LlmError, LlmService};
use crate::services::stt::SttService;
use crate::services::stt::deepgram::{DeepgramSettings, DeepgramStt};
use crate::services::tts::TtsService;
use crate::services::tts::cartesia::{CartesiaSettings, CartesiaTts};
use crate::turns::{TurnStop, UserTurns};
use stand_ins::StandIns;
use voxide_core::pipeline::{
    Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session,
};

/// Which provider's stream the LLM stand-in speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// OpenAI-compatible chat completions.
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

/// What the bench runs.
#[derive(Debug, Clone)]
pub struct ProvidersOptions {
    /// Concurrent sessions.
    pub sessions: usize,
    /// Questions each session asks, one after another.
    pub turns: usize,
    /// Each stand-in's time to its answer (the STT's final, the first token, the first audio).
    pub provider_delay: Duration,
    /// The stream the LLM stand-in speaks.
    pub protocol: Protocol,
}

/// The figures, one JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct ProvidersReport {
    /// The LLM stream spoken.
    pub protocol: Protocol,
    /// Concurrent sessions.
    pub sessions: usize,
    /// Answers timed to the transport.
    pub answers: usize,
    /// Turns that did not reach the transport.
    pub failed: usize,
    /// Cores the process may use (its affinity).
    pub cores: usize,
    /// Each stand-in's time to its answer, ms.
    pub provider_delay_ms: f64,
    /// From Deepgram writing the final to the LLM stand-in holding the request, ms.
    pub final_to_llm_request_ms: LagReport,
    /// From the context reaching the LLM service to the stand-in holding the request, ms.
    pub request_ms: LagReport,
    /// From the stand-in writing the first token to its text leaving the LLM service, ms.
    pub first_token_ms: LagReport,
    /// From the stand-in writing the first token to Cartesia holding the turn's first text, ms.
    pub first_token_to_tts_request_ms: LagReport,
    /// From Cartesia writing the turn's first audio to that audio reaching the transport, ms.
    pub first_audio_to_transport_ms: LagReport,
    /// CPU seconds of the whole run (voxide and the stand-ins).
    pub cpu_s: f64,
    /// Wall seconds of the whole run.
    pub wall_s: f64,
}

/// One session's clock readings, turn by turn.
#[derive(Default)]
struct Marks {
    /// The context reached the LLM service.
    asked: Vec<Instant>,
    /// The first text left it (none: the answer had no text).
    first_text: Vec<Option<Instant>>,
    /// The first audio reached the transport.
    first_audio: Vec<Instant>,
}

fn lock(marks: &Mutex<Marks>) -> std::sync::MutexGuard<'_, Marks> {
    marks.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stands before the LLM service: notes when each context passes.
struct Asked(Arc<Mutex<Marks>>);

impl FrameProcessor for Asked {
    fn name(&self) -> &str {
        "Asked"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if let FrameBody::Data(DataFrame::LlmContext(_)) = &frame.body {
            lock(&self.0).asked.push(Instant::now());
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Stands after the LLM service: notes the first text of each answer.
struct Heard {
    marks: Arc<Mutex<Marks>>,
    in_answer: bool,
}

impl FrameProcessor for Heard {
    fn name(&self) -> &str {
        "Heard"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::Control(ControlFrame::LlmFullResponseStart) => {
                self.in_answer = true;
                lock(&self.marks).first_text.push(None);
            }
            FrameBody::Data(DataFrame::LlmText(_)) if self.in_answer => {
                self.in_answer = false;
                let now = Instant::now();
                if let Some(last) = lock(&self.marks).first_text.last_mut() {
                    *last = Some(now);
                }
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Stands where the output transport would: notes each answer's first audio, and its end.
struct Played {
    marks: Arc<Mutex<Marks>>,
    in_answer: bool,
    ended: mpsc::Sender<()>,
}

impl FrameProcessor for Played {
    fn name(&self) -> &str {
        "Played"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::Control(ControlFrame::TtsStarted) => self.in_answer = true,
            FrameBody::Data(DataFrame::OutputAudio(_)) if self.in_answer => {
                self.in_answer = false;
                lock(&self.marks).first_audio.push(Instant::now());
            }
            FrameBody::Control(ControlFrame::TtsStopped) => {
                self.in_answer = false;
                let _ = self.ended.try_send(());
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

fn llm(protocol: Protocol, addr: std::net::SocketAddr) -> Result<Box<dyn LlmEngine>, LlmError> {
    Ok(match protocol {
        Protocol::Openai => Box::new(OpenAiLlm::new(OpenAiSettings {
            base_url: format!("http://{addr}/v1"),
            model: "bench".into(),
            ..OpenAiSettings::default()
        })?),
        Protocol::Anthropic => Box::new(AnthropicLlm::new(AnthropicSettings {
            base_url: format!("http://{addr}"),
            model: "bench".into(),
            ..AnthropicSettings::new("bench")
        })?),
    })
}

/// Why the bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProvidersError {
    /// The stand-ins could not listen.
    #[error("the stand-ins could not listen: {0}")]
    Listen(#[from] std::io::Error),
    /// An engine could not be set up.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// Answers came, but no turn of theirs could be timed on one leg: the stand-ins' log and
    /// the bench name the turns differently.
    #[error("no answer could be timed {0}")]
    Untimed(&'static str),
}

/// What a transport and its VAD would send for one spoken question: the VAD hears half a
/// second of speech, then silence.
fn question() -> Vec<Frame> {
    let mut frames = vec![Frame::new(SystemFrame::VadUserStartedSpeaking)];
    frames.extend((0..25).map(|_| {
        Frame::new(SystemFrame::InputAudio(AudioFrame::new(
            vec![200i16; 320],
            16_000,
            1,
        )))
    }));
    frames.push(Frame::new(SystemFrame::VadUserStoppedSpeaking));
    frames
}

/// Runs the bench.
pub async fn run_providers(options: ProvidersOptions) -> Result<ProvidersReport, ProvidersError> {
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let delays = stand_ins::Delays::all(options.provider_delay);
    let (stand_ins, addr, server) =
        StandIns::serve(loopback, delays, options.protocol, stand_ins::Faults::NONE).await?;
    let cpu_start = cpu_seconds();
    let wall_start = std::time::Instant::now();
    let k = options.sessions.max(1);
    let mut runs = Vec::with_capacity(k);
    for i in 0..k {
        let engine = llm(options.protocol, addr)?;
        // Connections are warm before the first question, as a session start leaves them.
        engine.warm().await;
        let key = format!("bench-{i}");
        let stt = DeepgramStt::new(DeepgramSettings {
            url: format!("ws://{addr}"),
            ..DeepgramSettings::new(key.clone())
        });
        let voice = CartesiaTts::new(CartesiaSettings {
            url: format!("ws://{addr}"),
            ..CartesiaSettings::new(key)
        });
        let marks = Arc::new(Mutex::new(Marks::default()));
        let (ended, mut answers) = mpsc::channel(1);
        let context = ContextHandle::new(LlmContext::new(vec![Message::system("Be brief.")]));
        let pipeline = Pipeline::new()
            .then(SttService::new(Arc::new(stt), "user"))
            // The turn ends at the VAD's stop; the VAD's own stop delay is not the providers'.
            .then(UserTurns::new(TurnStop::SpeechTimeout(Duration::ZERO)))
            .then(UserAggregator::new(context.clone()))
            .then(Asked(marks.clone()))
            .then(LlmService::new(engine))
            .then(Heard {
                marks: marks.clone(),
                in_answer: false,
            })
            .then(TtsService::new(Arc::new(voice)))
            .then(Played {
                marks: marks.clone(),
                in_answer: false,
                ended,
            });
        let session = Session::builder(pipeline).idle_timeout(None).spawn();
        let handle = session.handle();
        let turns = options.turns;
        // Sessions start spread over 100 ms, so they do not speak in lock step.
        let start = Instant::now() + Duration::from_micros(100_000 * i as u64 / k as u64);
        let asker = tokio::spawn(async move {
            tokio::time::sleep_until(start).await;
            for _ in 0..turns {
                if handle.queue_frames(question()).await.is_err() {
                    break;
                }
                // A turn that never reaches the transport ends the session's questions.
                let heard = tokio::time::timeout(Duration::from_secs(30), answers.recv()).await;
                if !matches!(heard, Ok(Some(()))) {
                    break;
                }
                // What an assistant aggregator would keep.
                context
                    .lock()
                    .messages
                    .push(Message::assistant("Sure, it is noon."));
            }
            let _ = handle.stop_when_done().await;
        });
        runs.push((i, session, asker, marks));
    }
    let mut legs: [Vec<f64>; 5] = Default::default();
    let mut failed = 0;
    for (i, session, asker, marks) in runs {
        let _ = asker.await;
        session.join().await;
        let marks = lock(&marks);
        let log = stand_ins.log.lock().unwrap_or_else(|p| p.into_inner());
        failed += options.turns.saturating_sub(marks.first_audio.len());
        let lag = |from: Option<&Instant>, to: Option<&Instant>| match (from, to) {
            (Some(from), Some(to)) => Some(ms(to.saturating_duration_since(*from))),
            _ => None,
        };
        for turn in 0..options.turns {
            let key = format!("session {i} question {turn}");
            let first_text = marks.first_text.get(turn).and_then(Option::as_ref);
            let readings = [
                lag(log.final_sent.get(&key), log.request_arrived.get(&key)),
                lag(marks.asked.get(turn), log.request_arrived.get(&key)),
                lag(log.first_token_sent.get(&key), first_text),
                lag(log.first_token_sent.get(&key), log.text_arrived.get(&key)),
                lag(log.audio_sent.get(&key), marks.first_audio.get(turn)),
            ];
            for (leg, reading) in legs.iter_mut().zip(readings) {
                leg.extend(reading);
            }
        }
    }
    server.abort();
    for leg in &mut legs {
        leg.sort_by(f64::total_cmp);
    }
    const LEGS: [&str; 5] = [
        "from the final to the LLM request",
        "from the question to the LLM request",
        "from the first token to the first text",
        "from the first token to the TTS request",
        "from the first audio to the transport",
    ];
    // With no answer at all the report says so (`failed`); with answers, every leg has times.
    if !legs[4].is_empty()
        && let Some(i) = legs.iter().position(Vec::is_empty)
    {
        return Err(ProvidersError::Untimed(LEGS[i]));
    }
    let [final_to_llm, request, first_token, to_tts, to_transport] = legs;
    Ok(ProvidersReport {
        protocol: options.protocol,
        sessions: k,
        answers: to_transport.len(),
        failed,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        provider_delay_ms: ms(options.provider_delay),
        final_to_llm_request_ms: LagReport::of(&final_to_llm),
        request_ms: LagReport::of(&request),
        first_token_ms: LagReport::of(&first_token),
        first_token_to_tts_request_ms: LagReport::of(&to_tts),
        first_audio_to_transport_ms: LagReport::of(&to_transport),
        cpu_s: cpu_seconds() - cpu_start,
        wall_s: wall_start.elapsed().as_secs_f64(),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_leg_of_every_answer_is_timed() {
        let report = run_providers(ProvidersOptions {
            sessions: 2,
            turns: 2,
            provider_delay: Duration::from_millis(20),
            protocol: Protocol::Openai,
        })
        .await
        .expect("the bench runs and times every leg");
        assert_eq!((report.answers, report.failed), (4, 0));
        assert!(report.final_to_llm_request_ms.max > 0.0);
        assert!(report.first_token_to_tts_request_ms.max > 0.0);
    }
}
