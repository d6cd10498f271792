//! One spoken turn through the embedded voice stack, offline: a recorded question goes in at
//! real-time pace, the bot hears it (Silero VAD), transcribes it (Whisper), answers it (SmolLM2)
//! and speaks the answer (Piper). Prints what was heard and said and the voice-to-voice latency,
//! and writes the bot's audio to a WAV file.
//!
//! Run with `cargo run --release --example voice_turn -- [QUESTION.wav] [ANSWER.wav]`
//! (defaults: the shipped `assets/test/hello_16k.wav` and `voice_turn_answer.wav`). Needs the
//! models: `scripts/setup.sh` fetches them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use voxide::aggregators::{AssistantAggregator, UserAggregator};
use voxide::audio::vad::{VadBatcher, VadParams, VadStage};
use voxide::audio::wav;
use voxide::context::{ContextHandle, LlmContext, Message};
use voxide::frames::{
    AudioFrame, ControlFrame, DataFrame, Frame, FrameBody, StartParams, SystemFrame,
};
use voxide::pipeline::{
    Direction, FrameContext, FrameProcessor, Pipeline, ProcessorError, Session,
};
use voxide::services::llm::LlmService;
use voxide::services::llm::local::{LocalLlm, LocalLlmOptions, LocalModel};
use voxide::services::stt::{SttService, Whisper};
use voxide::services::tts::{PiperVoice, TtsService};

/// The simplest turn rule: the VAD's speech is the user's turn.
struct VadTurns;

impl FrameProcessor for VadTurns {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match frame.body {
            FrameBody::System(SystemFrame::VadUserStartedSpeaking) => {
                cx.push_downstream(SystemFrame::UserStartedSpeaking)
            }
            FrameBody::System(SystemFrame::VadUserStoppedSpeaking) => {
                cx.push_downstream(SystemFrame::UserStoppedSpeaking)
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// What was heard and said, and how long each answer took.
#[derive(Default)]
struct Heard {
    /// The end of the user's last turn that has no answer yet.
    unanswered: Option<Instant>,
    /// A new answer began (its first audio is next).
    answer_began: bool,
    first_audio: Option<Instant>,
    transcripts: Vec<String>,
    spoken: Vec<String>,
    latencies: Vec<Duration>,
    audio: Vec<i16>,
}

/// Records the bot's output, as an output transport would play it.
struct Recorder(Arc<Mutex<Heard>>);

impl FrameProcessor for Recorder {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        {
            let mut heard = self.0.lock().unwrap_or_else(|p| p.into_inner());
            match &frame.body {
                FrameBody::System(SystemFrame::UserStoppedSpeaking) => {
                    heard.unanswered = Some(Instant::now())
                }
                FrameBody::Data(DataFrame::Transcription(t)) => {
                    heard.transcripts.push(t.text.clone())
                }
                FrameBody::Data(DataFrame::TtsText(t)) => heard.spoken.push(t.text.clone()),
                FrameBody::Control(ControlFrame::TtsStarted) => heard.answer_began = true,
                FrameBody::Data(DataFrame::OutputAudio(a)) => {
                    let now = Instant::now();
                    heard.first_audio.get_or_insert(now);
                    // Only a new answer's first audio counts, not the rest of an earlier one.
                    if std::mem::take(&mut heard.answer_began)
                        && let Some(stopped) = heard.unanswered.take()
                    {
                        heard.latencies.push(now - stopped);
                    }
                    heard.audio.extend_from_slice(&a.samples);
                }
                _ => {}
            }
        }
        cx.push(frame, direction);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let input = args.next().unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav").into()
    });
    let output = args
        .next()
        .unwrap_or_else(|| "voice_turn_answer.wav".into());

    eprintln!("loading the models…");
    let loading = Instant::now();
    let vad = VadBatcher::shared()?;
    let whisper = Whisper::shared()?;
    let llm = LocalModel::shared()?;
    let voice = PiperVoice::shared()?;
    eprintln!("loaded in {:.1} s", loading.elapsed().as_secs_f64());

    let context = ContextHandle::new(LlmContext::new(vec![Message::system(
        "You are a friendly voice assistant. Answer in one or two short sentences.",
    )]));
    let heard = Arc::new(Mutex::new(Heard::default()));
    let params = VadParams::default();
    let pipeline = Pipeline::new()
        .then(VadStage::new(vad, params))
        .then(VadTurns)
        .then(SttService::new(whisper, "user"))
        .then(UserAggregator::new(context.clone()))
        .then(LlmService::new(LocalLlm::new(
            llm,
            // Spoken answers are short.
            LocalLlmOptions {
                max_tokens: 60,
                ..LocalLlmOptions::default()
            },
        )))
        .then(TtsService::new(voice))
        .then(Recorder(heard.clone()))
        .then(AssistantAggregator::new(context.clone()));
    let out_rate = 24_000;
    let session = Session::builder(pipeline)
        .idle_timeout(None)
        .params(StartParams {
            audio_out_sample_rate: out_rate,
            ..StartParams::default()
        })
        .spawn();
    let handle = session.handle();

    let question = wav::read(&input).with_context(|| format!("reading {input}"))?;
    let rate = question.sample_rate;
    let mono = question.to_mono();
    eprintln!(
        "playing {input} ({:.1} s) at real-time pace…",
        question.seconds()
    );
    // The question, then silence while the bot answers, in 20 ms frames.
    let chunk = rate as usize / 50;
    let silence = vec![0i16; chunk];
    let frames = mono
        .chunks(chunk)
        .map(<[i16]>::to_vec)
        .chain(std::iter::repeat_n(silence, 50 * 8));
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for samples in frames {
        tick.tick().await;
        let frame = SystemFrame::InputAudio(AudioFrame::new(samples, rate, 1));
        handle
            .queue_frame(frame)
            .await
            .context("the session stopped")?;
        let done = {
            let heard = heard.lock().unwrap_or_else(|p| p.into_inner());
            heard
                .first_audio
                .is_some_and(|t| t.elapsed() > Duration::from_secs(3))
                && heard.unanswered.is_none()
        };
        if done {
            break;
        }
    }
    handle
        .stop_when_done()
        .await
        .context("the session stopped")?;
    let reason = session.join().await;

    let heard = heard.lock().unwrap_or_else(|p| p.into_inner());
    println!("heard:  {}", heard.transcripts.join(" | "));
    println!("said:   {}", heard.spoken.join(" "));
    if heard.latencies.is_empty() {
        println!("the bot did not answer ({reason:?})");
    }
    for latency in &heard.latencies {
        // The VAD confirms the end of speech `stop_secs` after it.
        let latency = *latency + Duration::from_secs_f32(params.stop_secs);
        println!(
            "voice-to-voice: {:.0} ms (end of speech to first bot audio)",
            latency.as_secs_f64() * 1e3
        );
    }
    wav::write(
        &output,
        &wav::Wav {
            samples: heard.audio.clone(),
            sample_rate: out_rate,
            channels: 1,
        },
    )?;
    println!("answer: {output}");
    Ok(())
}
