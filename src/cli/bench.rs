//! `voxide bench …`: each benchmark's flags, checked, and its one JSON line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use super::bot::{BotArgs, preloaded};
use voxide::bench::pipeline::PipelineBench;
use voxide::bot::{Denoise, TurnEnd};
use voxide::config::BotConfig;

/// `voxide bench`.
#[derive(clap::Subcommand)]
pub enum Bench {
    /// Frame throughput and latency through a line of pass-through processors.
    Pipeline {
        /// Pass-through processors in the line.
        #[arg(long, default_value_t = 1)]
        processors: usize,
        /// Frames pushed at once in the saturated run.
        #[arg(long, default_value_t = 20_000)]
        frames: usize,
        /// Frames sent one at a time in the closed-loop latency run.
        #[arg(long, default_value_t = 2_000)]
        latency_frames: usize,
    },
    /// Cost of the embedded engines: VAD per 20 ms, Smart Turn per inference, Piper latency and
    /// real-time factor. Needs the models (`scripts/setup.sh`).
    Engines {
        /// Streams batched into one VAD inference for the batched figure.
        #[arg(long, default_value_t = 64)]
        vad_batch: usize,
    },
    /// Tool-call accuracy of the embedded LLM on a suite of spoken requests, and its time per
    /// decision. Needs the models (`scripts/setup.sh`).
    Tools {
        /// espeak-ng voices that say each request to the embedded Whisper first (e.g.
        /// `en-us+f3,en-gb-scotland`); none: the requests go in as text.
        #[arg(long, value_delimiter = ',')]
        voices: Vec<String>,
        /// Without Whisper's second listen to a garbled request (spoken runs).
        #[arg(long)]
        no_second_listen: bool,
    },
    /// Word error rate of the embedded STT on sentences voiced by both embedded voices (the TTS
    /// round trip), with each voice's speed. Needs the models (`scripts/setup.sh`).
    Wer,
    /// Where the VAD ends turns in a room: the --audio questions one after another, room tone
    /// before, under and after each, through the VAD as a session runs it. Reports how long
    /// after each question's voice its turn stopped, the questions missed or split, and the
    /// turns the room started on its own. Only the VAD runs: seconds for a set of questions.
    Turns {
        /// The questions (WAV files), asked in this order; repeat the flag.
        #[arg(long = "audio", required = true)]
        audio: Vec<PathBuf>,
        /// The room: `brown`, `pink`, `babble` (four talkers by the embedded Piper voice) or a
        /// WAV to loop.
        #[arg(long, default_value = "brown")]
        noise: String,
        /// The room's RMS level, dBFS.
        #[arg(long, default_value_t = -55.0, allow_negative_numbers = true, conflicts_with = "snr")]
        noise_dbfs: f64,
        /// The room's level as dB under the questions' active speech level (a café at SNR 10 dB:
        /// `--snr 10`), instead of --noise-dbfs.
        #[arg(long, allow_negative_numbers = true)]
        snr: Option<f64>,
        /// Seconds of room tone before each question and after the last.
        #[arg(long, default_value_t = 3.0)]
        gap_secs: f64,
        /// The noise's seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The bot's recogniser hears the turns as a session's STT does; the report adds the
        /// word error rate against the `.txt` beside each WAV, and what was heard.
        #[arg(long)]
        transcribe: bool,
    },
    /// Interruption latency: a Piper-voiced user asks for a long answer and talks over it
    /// --after-secs after asking, --rounds times; reports the ms from the first sample of the
    /// interrupting speech to the last sample of bot audio (p50/p99). The bot is told to answer
    /// at length (up to 200 tokens) unless --instructions or --max-tokens say otherwise.
    Interruptions {
        /// Rounds played.
        #[arg(long, default_value_t = 20)]
        rounds: usize,
        /// Seconds after the question ends that the user cuts in.
        #[arg(long, default_value_t = 3.5)]
        after_secs: f64,
        /// Where the WAVs and the event log go.
        #[arg(long, default_value = "target/bench-interruptions")]
        workdir: PathBuf,
        #[command(flatten)]
        bot: BotArgs,
    },
    /// Sessions per core: --sessions input-only sessions (VAD, user turns, user aggregator) in
    /// this process, each fed --input at real-time pace; prints CPU per session-second, memory
    /// per session and the sinks' lag behind real time as one JSON line. Pin it with taskset.
    Sessions {
        /// Concurrent sessions.
        #[arg(long, default_value_t = 10)]
        sessions: usize,
        /// The recording every session plays (any PCM or float WAV).
        #[arg(long)]
        input: PathBuf,
        /// How turns end: the Smart Turn model, or a silence timeout.
        #[arg(long, value_enum, default_value_t = TurnEnd::SmartTurn)]
        turn: TurnEnd,
        /// Seconds of the recording to play (0: all).
        #[arg(long, default_value_t = 0.0)]
        seconds: f64,
        /// Smart Turn's worker threads, each judging one pause at a time (default: one per
        /// two cores).
        #[arg(long)]
        turn_workers: Option<usize>,
        /// Noise suppression before the VAD in every session (`rnnoise`), to read its cost.
        #[arg(long, value_enum, default_value_t = Denoise::Off)]
        denoise: Denoise,
    },
    /// The latency voxide adds around network providers, against local stand-ins of Deepgram,
    /// an LLM stream and Cartesia with a realistic time to each answer: the STT's final to the
    /// LLM request, the first token to the TTS request, the first audio to the transport. Pin it
    /// (`taskset -c 0`) to read it per core.
    Providers {
        /// Concurrent sessions.
        #[arg(long, default_value_t = 1)]
        sessions: usize,
        /// Questions each session asks.
        #[arg(long, default_value_t = 20)]
        turns: usize,
        /// The stream the stand-in speaks: `openai` or `anthropic`.
        #[arg(long, default_value = "openai")]
        llm: String,
        /// The stand-in's time to the first token, ms.
        #[arg(long, default_value_t = 300)]
        provider_ms: u64,
    },
    /// Voice-to-voice latency over a conversation: a Piper-voiced user asks --turns questions
    /// (room for each answer after it) and the default bot answers through `voxide run` at
    /// real-time pace. Writes the input, the answers and the events to --workdir.
    Conversation {
        /// Questions asked.
        #[arg(long, default_value_t = 10)]
        turns: usize,
        /// Seconds of silence after each question.
        #[arg(long, default_value_t = 10.0)]
        gap_secs: f64,
        /// Where the WAVs and the event log go.
        #[arg(long, default_value = "target/bench-conversation")]
        workdir: PathBuf,
        #[command(flatten)]
        bot: BotArgs,
    },
}

impl Bench {
    /// Runs the benchmark and prints its report.
    pub async fn run(self) -> Result<()> {
        let report = match self {
            Bench::Pipeline {
                processors,
                frames,
                latency_frames,
            } => {
                let bench = PipelineBench {
                    processors,
                    frames,
                    latency_frames,
                };
                // On a worker, like every stage: block_on's thread would add a cross-thread wake
                // per frame.
                json(tokio::spawn(bench.run()).await?)?
            }
            Bench::Engines { vad_batch } => json(
                tokio::task::spawn_blocking(move || voxide::bench::engines::run(vad_batch))
                    .await??,
            )?,
            Bench::Tools {
                voices,
                no_second_listen,
            } if !voices.is_empty() => json(
                tokio::task::spawn_blocking(move || {
                    voxide::bench::tools::run_spoken(&voices, !no_second_listen)
                })
                .await??,
            )?,
            Bench::Tools { .. } => {
                json(tokio::task::spawn_blocking(voxide::bench::tools::run).await??)?
            }
            Bench::Wer => json(tokio::task::spawn_blocking(voxide::bench::wer::run).await??)?,
            Bench::Turns {
                audio,
                noise,
                noise_dbfs,
                snr,
                gap_secs,
                seed,
                transcribe,
            } => turns(audio, &noise, noise_dbfs, snr, gap_secs, seed, transcribe).await?,
            Bench::Conversation {
                turns,
                gap_secs,
                workdir,
                bot,
            } => conversation(turns, gap_secs, workdir, &bot).await?,
            Bench::Interruptions {
                rounds,
                after_secs,
                workdir,
                bot,
            } => interruptions(rounds, after_secs, workdir, &bot).await?,
            Bench::Sessions {
                sessions,
                input,
                turn,
                seconds,
                turn_workers,
                denoise,
            } => {
                let options = voxide::bench::sessions::SessionsOptions {
                    sessions,
                    smart_turn: turn == TurnEnd::SmartTurn,
                    seconds,
                    turn_workers,
                    denoise: denoise == Denoise::Rnnoise,
                };
                self::sessions(&input, options).await?
            }
            Bench::Providers {
                sessions,
                turns,
                llm,
                provider_ms,
            } => providers(sessions, turns, &llm, provider_ms).await?,
        };
        println!("{report}");
        Ok(())
    }
}

fn json(report: impl serde::Serialize) -> Result<serde_json::Value> {
    Ok(serde_json::to_value(report)?)
}

async fn conversation(
    turns: usize,
    gap_secs: f64,
    workdir: PathBuf,
    bot: &BotArgs,
) -> Result<serde_json::Value> {
    if !(1..=100).contains(&turns) || !(1.0..=60.0).contains(&gap_secs) {
        anyhow::bail!("--turns must be 1 to 100 and --gap-secs 1 to 60");
    }
    let bot = preloaded(bot, BotConfig::default()).await?;
    let gap = Duration::from_secs_f64(gap_secs);
    json(voxide::bench::conversation::run_conversation(turns, gap, bot, workdir).await?)
}

async fn turns(
    audio: Vec<PathBuf>,
    noise: &str,
    noise_dbfs: f64,
    snr: Option<f64>,
    gap_secs: f64,
    seed: u64,
    transcribe: bool,
) -> Result<serde_json::Value> {
    use voxide::bench::turn_ends::{NoiseLevel, TurnEndsOptions};
    if audio.len() > 1_000 || !(0.0..=60.0).contains(&gap_secs) {
        anyhow::bail!("at most 1000 --audio files, and --gap-secs 0 to 60");
    }
    let level = match snr {
        Some(snr) if (-20.0..=60.0).contains(&snr) => NoiseLevel::Snr(snr),
        Some(_) => anyhow::bail!("--snr must be -20 to 60 dB"),
        None if (-120.0..0.0).contains(&noise_dbfs) => NoiseLevel::Dbfs(noise_dbfs),
        None => anyhow::bail!("--noise-dbfs must be under 0 (and over -120)"),
    };
    let options = TurnEndsOptions {
        audio,
        noise: voxide::loadtest::room::Noise::parse(noise),
        level,
        gap_secs,
        seed,
        transcribe,
    };
    json(tokio::task::spawn_blocking(move || voxide::bench::turn_ends::run(&options)).await??)
}

async fn interruptions(
    rounds: usize,
    after_secs: f64,
    workdir: PathBuf,
    bot: &BotArgs,
) -> Result<serde_json::Value> {
    if !(1..=200).contains(&rounds) || !(0.5..=30.0).contains(&after_secs) {
        anyhow::bail!("--rounds must be 1 to 200 and --after-secs 0.5 to 30");
    }
    // Long answers, so that the user's cut-ins land on speech.
    let long_answers = BotConfig {
        instructions: Some(voxide::bench::interruptions::LONG_ANSWERS.to_owned()),
        max_tokens: Some(200),
        ..BotConfig::default()
    };
    let bot = preloaded(bot, long_answers).await?;
    let after = Duration::from_secs_f64(after_secs);
    json(voxide::bench::interruptions::run_interruptions(rounds, after, bot, workdir).await?)
}

async fn sessions(
    input: &std::path::Path,
    options: voxide::bench::sessions::SessionsOptions,
) -> Result<serde_json::Value> {
    if !(1..=10_000).contains(&options.sessions) || !(0.0..=3_600.0).contains(&options.seconds) {
        anyhow::bail!("--sessions must be 1 to 10000 and --seconds 0 to 3600");
    }
    if options
        .turn_workers
        .is_some_and(|n| !(1..=256).contains(&n))
    {
        anyhow::bail!("--turn-workers must be 1 to 256");
    }
    json(voxide::bench::sessions::run_sessions(input, options).await?)
}

async fn providers(
    sessions: usize,
    turns: usize,
    llm: &str,
    provider_ms: u64,
) -> Result<serde_json::Value> {
    use voxide::bench::providers::{Protocol, ProvidersOptions, run_providers};
    if !(1..=10_000).contains(&sessions) || !(1..=10_000).contains(&turns) {
        anyhow::bail!("--sessions and --turns must be 1 to 10000");
    }
    let protocol = match llm {
        "openai" => Protocol::Openai,
        "anthropic" => Protocol::Anthropic,
        other => anyhow::bail!("--llm {other:?}: the bench speaks openai or anthropic"),
    };
    json(
        run_providers(ProvidersOptions {
            sessions,
            turns,
            provider_delay: Duration::from_millis(provider_ms),
            protocol,
        })
        .await?,
    )
}
