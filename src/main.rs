//! The `voxide` command.

use anyhow::Result;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use voxide::bench::pipeline::PipelineBench;
use voxide::bot::{BotOptions, TurnEnd, Voice};
use voxide::config::{BotConfig, Config};
use voxide::server::ServeOptions;
use voxide::transports::file::{RunOptions, run};

/// A realtime voice-agent server.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the HTTP server: the browser page at /, the WebSocket transport at /ws (and
    /// Twilio Media Streams at /ws/twilio), /healthz, /readyz, /status and /metrics.
    /// Stops on SIGINT or SIGTERM, letting live sessions finish.
    Serve {
        /// Address to bind. [default: 127.0.0.1]
        #[arg(long, env = "VOXIDE_HOST")]
        host: Option<String>,
        /// Port. [default: 7860]
        #[arg(long, env = "VOXIDE_PORT")]
        port: Option<u16>,
        /// Live sessions at most; more get 503. [default: 32]
        #[arg(long, env = "VOXIDE_MAX_SESSIONS")]
        max_sessions: Option<usize>,
        /// Seconds live sessions get to finish on shutdown. [default: 10]
        #[arg(long, env = "VOXIDE_SHUTDOWN_GRACE_SECS")]
        shutdown_grace_secs: Option<f64>,
        /// A STUN or TURN server for WebRTC (repeatable). Without one, host candidates only,
        /// which is all a local network or loopback needs.
        #[arg(long = "ice-server", value_name = "URL")]
        ice_servers: Vec<String>,
        /// Serves every bot file (`*.toml`) of this folder: a client picks one by name
        /// (`{"bot": "name"}` in `/start`'s body or the offer's `requestData`, `?bot=name` on the
        /// WebSockets); the first in name order is the default. The flags here override each.
        #[arg(long, env = "VOXIDE_BOTS", value_name = "DIR", conflicts_with = "bot")]
        bots: Option<PathBuf>,
        #[command(flatten)]
        bot: BotArgs,
    },
    /// Checks a bot file (or a folder of them, or a config file) without starting anything:
    /// unknown keys, values out of range, provider keys missing from the environment, tool
    /// schemas, environment variables the headers name. Exit status 0 when all is well.
    Check {
        /// A folder of bot files to check.
        #[arg(long, value_name = "DIR", conflicts_with = "bot")]
        bots: Option<PathBuf>,
        #[command(flatten)]
        bot: BotArgs,
    },
    /// Talks with the bot through this machine's default microphone and speaker (or the named
    /// ones). Prints what was heard and said; Ctrl-C ends it. An echo canceller takes the bot's
    /// own voice out of what the microphone hears, so it is not taken for the user.
    Local {
        /// Lists the audio devices and exits.
        #[arg(long)]
        list_devices: bool,
        /// The microphone, by name (see --list-devices). [default: the system's default]
        #[arg(long, env = "VOXIDE_INPUT_DEVICE")]
        input_device: Option<String>,
        /// The speaker, by name. [default: the system's default]
        #[arg(long, env = "VOXIDE_OUTPUT_DEVICE")]
        output_device: Option<String>,
        /// What keeps the bot's voice from the speaker out of the input: `cancel` subtracts it
        /// (AEC3, with what was played as the reference), `guard` silences input no louder than
        /// its echo, `off` for headphones or a device that cancels echo itself.
        #[arg(long, value_enum, default_value_t = EchoArg::Cancel)]
        echo: EchoArg,
        /// Where the events go: one JSON object per line, with `type` and `t_ms` (as `run`).
        #[arg(long)]
        events: Option<PathBuf>,
        #[command(flatten)]
        bot: BotArgs,
    },
    /// Runs one session on a recorded WAV file: the file is the user, the bot's answers are
    /// written time-aligned with it, and the session's events are written as JSON lines.
    /// Prints a summary (transcripts, what the bot said, latencies) as one JSON line.
    Run {
        /// The user's audio (any PCM or float WAV; stereo is mixed down).
        #[arg(long)]
        input: PathBuf,
        /// Where the bot's audio goes (mono WAV, as long as the input plus the bot's last answer).
        #[arg(long)]
        output: PathBuf,
        /// Where the events go: one JSON object per line, with `type` and `t_ms`.
        #[arg(long)]
        events: Option<PathBuf>,
        /// Feed the input as fast as the pipeline takes it instead of at real-time pace
        /// (latencies are then not meaningful).
        #[arg(long)]
        fast: bool,
        /// After the input ends, seconds to wait at most for the bot to finish.
        #[arg(long, default_value_t = 30.0)]
        max_tail_secs: f64,
        #[command(flatten)]
        bot: BotArgs,
    },
    /// Lists the embedded models: where each comes from, its size, and whether it is installed.
    /// `scripts/setup.sh` fetches them.
    Models,
    /// Benchmarks you can run on your own hardware; each prints one JSON line.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
    /// Load-tests a running voice bot with recorded audio, as callers reach it, and measures
    /// from the audio: v2v (the end of the user's speech to the bot's first sound), the first
    /// audio after connecting, the connect time. Exit status: 0 every SLO passed, 1 an SLO
    /// failed, 2 a usage error, 3 no session connected, 4 the generator could not keep time.
    Loadtest(LoadtestArgs),
}

#[derive(clap::Args)]
struct LoadtestArgs {
    /// The server: `http://host:port`.
    #[arg(long)]
    target: String,
    /// `webrtc` (SmallWebRTC: POST /api/offer, Opus, RTVI on the data channel), `webrtc-start`
    /// (pipecat's runner: POST /start, then /sessions/{id}/api/offer), `ws` (voxide's /ws: PCM
    /// and JSON) or `twilio` (Twilio Media Streams at /ws/twilio). A path in --target replaces
    /// the default one.
    #[arg(long, default_value = "webrtc")]
    protocol: String,
    /// A WAV of one user turn; repeat for more (the turns cycle through them).
    #[arg(long, required = true)]
    audio: Vec<PathBuf>,
    /// Sessions in all.
    #[arg(long, default_value_t = 1)]
    sessions: usize,
    /// Sessions at once [default: --sessions].
    #[arg(long)]
    concurrency: Option<usize>,
    /// Turns per session.
    #[arg(long, default_value_t = 1)]
    turns: usize,
    /// Silence after the bot's reply before the next turn, ms.
    #[arg(long, default_value_t = 400)]
    think_ms: u64,
    /// A load shape, k6's way: `30s:5,2m:20,30s:0` ramps to 5 sessions at once over 30 s, to 20
    /// over 2 minutes, down to none over 30 s; each slot runs sessions back to back. Replaces
    /// --sessions.
    #[arg(long, conflicts_with = "duration")]
    stages: Option<String>,
    /// Keeps --concurrency sessions going, back to back, for this many seconds (after --ramp).
    #[arg(long)]
    duration: Option<f64>,
    /// Each turn after the first talks over the bot this many ms after its reply starts, and
    /// `barge_in_stop` times how long the bot takes to fall silent.
    #[arg(long)]
    barge_in_at_ms: Option<u64>,
    /// Seconds over which the first wave of sessions starts.
    #[arg(long, default_value_t = 0.0)]
    ramp: f64,
    /// Seeds the sessions' start offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A turn with no reply this many seconds after the user's speech ended is an error.
    #[arg(long, default_value_t = 20.0)]
    response_timeout: f64,
    /// An SLO, as `p95(v2v)<1200ms`, `p99(connect)<2s` or `error_rate<1%`; repeatable. A metric
    /// with no data fails.
    #[arg(long)]
    slo: Vec<String>,
    /// Where summary.json, turns.csv, sessions.csv, timeline.jsonl and report.html go.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Raises the concurrency (1, 2, 4, …, up to N, then bisecting) until an --slo breaks, and
    /// reports the largest that held: what an autoscaler's per-node target is set to. Each step
    /// runs that many sessions at once; results go under --out/concurrency-K/ and
    /// --out/capacity.json.
    #[arg(long, value_name = "N")]
    find_capacity: Option<usize>,
    /// The run is invalid (exit 4) when the p99 lag of the 20 ms send clock is above this, ms.
    #[arg(long, default_value_t = 10.0)]
    max_pacing_lag_ms: f64,
}

/// The bot's options, shared by the commands that run one. Each falls back to its
/// environment variable, then to the bot file, then to the config file's `[bot]` table, then
/// to the default.
#[derive(clap::Args, Debug)]
struct BotArgs {
    /// A bot file: its instruction, greeting, providers and tools (see `voxide::config` for
    /// its keys; `voxide check --bot FILE` checks one). The flags here override it.
    #[arg(long, env = "VOXIDE_BOT", value_name = "FILE")]
    bot: Option<PathBuf>,
    /// The voice: `piper` (natural) or `espeak` (robotic, nearly free). [default: piper]
    #[arg(long, value_enum, env = "VOXIDE_VOICE")]
    voice: Option<Voice>,
    /// How a user turn ends: `smart` (the Smart Turn model judges each pause) or `silence`
    /// (a fixed silence of --turn-timeout-secs). [default: smart]
    #[arg(long, value_enum, env = "VOXIDE_TURN")]
    turn: Option<TurnEnd>,
    /// With `--turn silence` the silence that ends a turn; with `--turn smart` the silence after
    /// which a turn that sounds unfinished ends anyway. [default: 2]
    #[arg(long, env = "VOXIDE_TURN_TIMEOUT_SECS")]
    turn_timeout_secs: Option<f64>,
    /// Tokens one reply may have at most. [default: 60]
    #[arg(long, env = "VOXIDE_MAX_TOKENS")]
    max_tokens: Option<usize>,
    /// Words the user must say over the bot before it stops; shorter remarks ("mm-hm") are
    /// dropped. 0: the start of speech interrupts. [default: 0]
    #[arg(long, env = "VOXIDE_INTERRUPT_MIN_WORDS")]
    interrupt_min_words: Option<usize>,
    /// Pause the bot when the user starts speaking over it, and resume it when no words come
    /// within this many seconds after they stop (a cough, a door). [default: off]
    #[arg(long, env = "VOXIDE_RESUME_AFTER_SECS")]
    resume_after_secs: Option<f64>,
    /// Hold the bot's audio from the first moment of speech over it, before the VAD confirms
    /// the start, and play on if it fades (`true` or `false`). [default: true]
    #[arg(long, env = "VOXIDE_PAUSE_AT_ONSET")]
    pause_at_onset: Option<bool>,
    /// The system instruction (default: a short one of voxide's own).
    #[arg(long, env = "VOXIDE_INSTRUCTIONS")]
    instructions: Option<String>,
    /// The model: `local` (embedded, offline); a text LLM over HTTP: `openai` (any
    /// OpenAI-compatible chat-completions server: OPENAI_API_KEY, OPENAI_BASE_URL, e.g.
    /// Ollama's http://127.0.0.1:11434/v1 with no key), `anthropic` (ANTHROPIC_API_KEY,
    /// ANTHROPIC_BASE_URL) or `gemini` (GEMINI_API_KEY, GEMINI_BASE_URL); a comma-separated list
    /// of those falls back from each to the next (`openai,local`). Or a realtime model that
    /// listens and speaks itself: `openai-realtime` (OPENAI_API_KEY; OPENAI_REALTIME_URL) or
    /// `gemini-live` (GEMINI_API_KEY; GEMINI_LIVE_URL). [default: local]
    #[arg(long, env = "VOXIDE_LLM")]
    llm: Option<String>,
    /// The text LLM's model (the first of a fallback list). [default: gpt-4.1-mini for
    /// openai, claude-haiku-4-5 for anthropic, gemini-2.5-flash for gemini]
    #[arg(long, env = "VOXIDE_LLM_MODEL")]
    llm_model: Option<String>,
    /// Who listens (with a text LLM): `whisper` (embedded, offline), `deepgram` (live
    /// streaming: DEEPGRAM_API_KEY; DEEPGRAM_URL, scheme and host, for another server),
    /// `assemblyai` (Universal-Streaming: ASSEMBLYAI_API_KEY; ASSEMBLYAI_URL) or `openai`
    /// (realtime transcription: OPENAI_API_KEY; OPENAI_BASE_URL); a comma-separated list falls
    /// back from each to the next (`deepgram,whisper`). [default: whisper]
    #[arg(long, env = "VOXIDE_STT")]
    stt: Option<String>,
    /// The STT's model (the first provider of the list). [default: nova-3 for deepgram,
    /// universal-streaming-english for assemblyai, gpt-4o-transcribe for openai]
    #[arg(long, env = "VOXIDE_STT_MODEL")]
    stt_model: Option<String>,
    /// Who speaks (with a text LLM): `piper` or `espeak` (embedded, offline; the same as
    /// --voice), `cartesia` (streaming: CARTESIA_API_KEY; CARTESIA_URL, scheme and host, for
    /// another server), `openai` (OpenAI's speech API or a server that speaks it:
    /// OPENAI_API_KEY, OPENAI_BASE_URL), `deepgram` (Aura, streaming: DEEPGRAM_API_KEY,
    /// DEEPGRAM_URL) or `elevenlabs` (streaming: ELEVENLABS_API_KEY; ELEVENLABS_URL); a
    /// comma-separated list falls back from each to the next (`cartesia,piper`).
    /// [default: the --voice]
    #[arg(long, env = "VOXIDE_TTS")]
    tts: Option<String>,
    /// The TTS provider's model (the first provider of the list). [default: sonic-3.5 for
    /// cartesia, gpt-4o-mini-tts for openai, eleven_flash_v2_5 for elevenlabs]
    #[arg(long, env = "VOXIDE_TTS_MODEL")]
    tts_model: Option<String>,
    /// The TTS provider's voice id (the first provider of the list).
    #[arg(long, env = "VOXIDE_TTS_VOICE")]
    tts_voice: Option<String>,
    /// The text LLMs' sampling temperature (0 to 2). [default: the provider's]
    #[arg(long, env = "VOXIDE_LLM_TEMPERATURE")]
    llm_temperature: Option<f32>,
    /// A TOML config file (see `voxide::config` for its keys).
    #[arg(long, env = "VOXIDE_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum EchoArg {
    Cancel,
    Guard,
    Off,
}

impl BotArgs {
    /// The config file, or an empty one.
    fn config(&self) -> Result<Config> {
        Ok(match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        })
    }

    /// The flags (and their environment variables) as the top layer of the bot's settings.
    fn layer(&self) -> BotConfig {
        BotConfig {
            voice: self.voice,
            turn: self.turn,
            turn_timeout_secs: self.turn_timeout_secs,
            max_tokens: self.max_tokens,
            interrupt_min_words: self.interrupt_min_words,
            resume_after_secs: self.resume_after_secs,
            pause_at_onset: self.pause_at_onset,
            instructions: self.instructions.clone(),
            llm: self.llm.clone(),
            llm_model: self.llm_model.clone(),
            llm_temperature: self.llm_temperature,
            stt: self.stt.clone(),
            stt_model: self.stt_model.clone(),
            tts: self.tts.clone(),
            tts_model: self.tts_model.clone(),
            tts_voice: self.tts_voice.clone(),
            ..BotConfig::default()
        }
    }

    /// The bot: the flags over `--bot`'s file over the config's `[bot]` over `defaults`,
    /// resolved, its MCP servers started.
    async fn bot(&self, defaults: BotConfig) -> Result<BotOptions> {
        let file = match &self.bot {
            Some(path) => BotConfig::load(path)?,
            None => BotConfig::default(),
        };
        let bot = self
            .layer()
            .over(file.over(self.config()?.bot.over(defaults)))
            .resolve()?;
        bot.start_tools().await?;
        Ok(bot)
    }

    /// Each bot of `dir`, layered as [`BotArgs::bot`] does with its file, started.
    async fn bots(&self, dir: &std::path::Path) -> Result<Vec<BotOptions>> {
        let base = self.config()?.bot;
        let mut bots = Vec::new();
        for file in BotConfig::load_dir(dir)? {
            let bot = self.layer().over(file.over(base.clone())).resolve()?;
            bot.start_tools().await?;
            bots.push(bot);
        }
        Ok(bots)
    }
}

#[derive(Subcommand)]
enum Bench {
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
    Tools,
    /// Word error rate of the embedded STT on sentences voiced by both embedded voices (the TTS
    /// round trip), with each voice's speed. Needs the models (`scripts/setup.sh`).
    Wer,
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

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = run_command(Cli::parse()).await;
    // The models' threads may be mid-inference: let them finish before the runtime goes.
    voxide::onnx::close();
    result
}

async fn run_command(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Loadtest(args) => {
            let code = loadtest(args).await;
            if code != 0 {
                std::process::exit(i32::from(code));
            }
        }
        Command::Models => list_models(),
        Command::Check { bots, bot } => check(bots.as_deref(), &bot)?,
        Command::Local {
            list_devices,
            input_device,
            output_device,
            echo,
            events,
            bot,
        } => {
            if list_devices {
                for d in voxide::transports::local::list_devices()? {
                    let mut roles = Vec::new();
                    if d.input {
                        roles.push(if d.default_input {
                            "input (default)"
                        } else {
                            "input"
                        });
                    }
                    if d.output {
                        roles.push(if d.default_output {
                            "output (default)"
                        } else {
                            "output"
                        });
                    }
                    println!("{:<40} {}", d.name, roles.join(", "));
                }
                return Ok(());
            }
            let mut bot = bot.bot(BotConfig::default()).await?;
            match echo {
                EchoArg::Cancel => bot.echo_canceller = true,
                EchoArg::Guard => bot.echo_guard = Some(Default::default()),
                EchoArg::Off => {}
            }
            local(bot, input_device, output_device, events).await?;
        }
        Command::Serve {
            host,
            port,
            max_sessions,
            shutdown_grace_secs,
            ice_servers,
            bots,
            bot,
        } => {
            let config = bot.config()?;
            let host = host
                .or(config.server.host.clone())
                .unwrap_or_else(|| "127.0.0.1".into());
            let port = port.or(config.server.port).unwrap_or(7860);
            let addr: SocketAddr = format!("{host}:{port}")
                .parse()
                .or_else(|_| format!("[{host}]:{port}").parse())
                .map_err(|_| anyhow::anyhow!("--host {host:?} is not an IP address"))?;
            let max_sessions = max_sessions.or(config.server.max_sessions).unwrap_or(32);
            if max_sessions == 0 {
                anyhow::bail!("--max-sessions must be at least 1");
            }
            let grace = shutdown_grace_secs
                .or(config.server.shutdown_grace_secs)
                .unwrap_or(10.0);
            if !(0.0..=3600.0).contains(&grace) {
                anyhow::bail!("--shutdown-grace-secs must be between 0 and 3600");
            }
            let options = ServeOptions {
                addr,
                max_sessions,
                shutdown_grace: Duration::from_secs_f64(grace),
                bots: match &bots {
                    Some(dir) => bot.bots(dir).await?,
                    None => vec![bot.bot(BotConfig::default()).await?],
                },
                ice_servers,
            };
            eprintln!(
                "voxide serve: http://{addr}/ (models load in the background; /readyz says when)"
            );
            voxide::server::serve(options).await?;
        }
        Command::Run {
            input,
            output,
            events,
            fast,
            max_tail_secs,
            bot,
        } => {
            if !(0.0..=3600.0).contains(&max_tail_secs) {
                anyhow::bail!("--max-tail-secs must be between 0 and 3600");
            }
            eprintln!("loading the models…");
            let bot = preloaded(&bot, BotConfig::default()).await?;
            eprintln!("running {}…", input.display());
            let summary = run(RunOptions {
                input,
                output,
                events,
                fast,
                max_tail: Duration::from_secs_f64(max_tail_secs),
                settle: Duration::from_secs(2),
                bot,
            })
            .await?;
            println!("{}", serde_json::to_string(&summary)?);
        }
        Command::Bench {
            bench:
                Bench::Pipeline {
                    processors,
                    frames,
                    latency_frames,
                },
        } => {
            let bench = PipelineBench {
                processors,
                frames,
                latency_frames,
            };
            // On a worker, like every stage: block_on's thread would add a cross-thread wake per frame.
            let report = tokio::spawn(bench.run()).await?;
            println!("{}", serde_json::to_string(&report)?);
        }
        Command::Bench {
            bench: Bench::Engines { vad_batch },
        } => {
            let report =
                tokio::task::spawn_blocking(move || voxide::bench::engines::run(vad_batch))
                    .await??;
            println!("{}", serde_json::to_string(&report)?);
        }
        Command::Bench {
            bench: Bench::Tools,
        } => {
            let report = tokio::task::spawn_blocking(voxide::bench::tools::run).await??;
            println!("{}", serde_json::to_string(&report)?);
        }
        Command::Bench {
            bench:
                Bench::Conversation {
                    turns,
                    gap_secs,
                    workdir,
                    bot,
                },
        } => {
            if !(1..=100).contains(&turns) || !(1.0..=60.0).contains(&gap_secs) {
                anyhow::bail!("--turns must be 1 to 100 and --gap-secs 1 to 60");
            }
            let bot = preloaded(&bot, BotConfig::default()).await?;
            let report = voxide::bench::conversation::run_conversation(
                turns,
                Duration::from_secs_f64(gap_secs),
                bot,
                workdir,
            )
            .await?;
            println!("{}", serde_json::to_string(&report)?);
        }
        Command::Bench {
            bench:
                Bench::Interruptions {
                    rounds,
                    after_secs,
                    workdir,
                    bot,
                },
        } => {
            if !(1..=200).contains(&rounds) || !(0.5..=30.0).contains(&after_secs) {
                anyhow::bail!("--rounds must be 1 to 200 and --after-secs 0.5 to 30");
            }
            // Long answers, so that the user's cut-ins land on speech.
            let long_answers = BotConfig {
                instructions: Some(voxide::bench::interruptions::LONG_ANSWERS.to_owned()),
                max_tokens: Some(200),
                ..BotConfig::default()
            };
            let bot = preloaded(&bot, long_answers).await?;
            let report = voxide::bench::interruptions::run_interruptions(
                rounds,
                Duration::from_secs_f64(after_secs),
                bot,
                workdir,
            )
            .await?;
            println!("{}", serde_json::to_string(&report)?);
        }
        Command::Bench {
            bench:
                Bench::Sessions {
                    sessions,
                    input,
                    turn,
                    seconds,
                    turn_workers,
                },
        } => {
            if !(1..=10_000).contains(&sessions) || !(0.0..=3_600.0).contains(&seconds) {
                anyhow::bail!("--sessions must be 1 to 10000 and --seconds 0 to 3600");
            }
            if turn_workers.is_some_and(|n| !(1..=256).contains(&n)) {
                anyhow::bail!("--turn-workers must be 1 to 256");
            }
            let options = voxide::bench::sessions::SessionsOptions {
                sessions,
                smart_turn: turn == TurnEnd::SmartTurn,
                seconds,
                turn_workers,
            };
            let report = voxide::bench::sessions::run_sessions(&input, options).await?;
            println!("{}", serde_json::to_string(&report)?);
        }
        Command::Bench {
            bench:
                Bench::Providers {
                    sessions,
                    turns,
                    llm,
                    provider_ms,
                },
        } => {
            use voxide::bench::providers::{Protocol, ProvidersOptions, run_providers};
            if !(1..=10_000).contains(&sessions) || !(1..=10_000).contains(&turns) {
                anyhow::bail!("--sessions and --turns must be 1 to 10000");
            }
            let protocol = match llm.as_str() {
                "openai" => Protocol::Openai,
                "anthropic" => Protocol::Anthropic,
                other => anyhow::bail!("--llm {other:?}: the bench speaks openai or anthropic"),
            };
            let report = run_providers(ProvidersOptions {
                sessions,
                turns,
                provider_delay: Duration::from_millis(provider_ms),
                protocol,
            })
            .await?;
            println!("{}", serde_json::to_string(&report)?);
        }
        Command::Bench { bench: Bench::Wer } => {
            let report = tokio::task::spawn_blocking(voxide::bench::wer::run).await??;
            println!("{}", serde_json::to_string(&report)?);
        }
    }
    Ok(())
}

/// `voxide check`: every bot resolved as a run would resolve it, nothing started.
fn check(dir: Option<&std::path::Path>, args: &BotArgs) -> Result<()> {
    let base = args.config()?.bot;
    let files = match (dir, &args.bot) {
        (Some(dir), _) => BotConfig::load_dir(dir)?,
        (None, Some(path)) => vec![BotConfig::load(path)?],
        (None, None) => vec![BotConfig::default()],
    };
    for file in files {
        let bot = args.layer().over(file.over(base.clone())).resolve()?;
        let tools = bot.http_tools.len();
        let servers: Vec<&str> = bot.mcp.iter().map(|s| s.name()).collect();
        println!(
            "ok: bot {:?}: {} built-in tools, {tools} HTTP tools, MCP servers [{}] (not started)",
            bot.name.as_deref().unwrap_or("default"),
            bot.builtin.len(),
            servers.join(", ")
        );
    }
    Ok(())
}

/// The bot's options over `defaults`, with every engine they use loaded.
async fn preloaded(args: &BotArgs, defaults: BotConfig) -> Result<BotOptions> {
    let bot = args.bot(defaults).await?;
    let preload = bot.clone();
    tokio::task::spawn_blocking(move || voxide::bot::preload(&preload)).await??;
    Ok(bot)
}

/// `voxide local`: the default bot on the microphone and speaker until Ctrl-C, or until a
/// device goes away.
async fn local(
    mut bot: BotOptions,
    input_device: Option<String>,
    output_device: Option<String>,
    events_path: Option<PathBuf>,
) -> Result<()> {
    use anyhow::Context;
    use voxide::events::{EndReason, Event};
    use voxide::frames::{AudioFrame, SystemFrame};
    use voxide::transports::OutputOptions;
    use voxide::transports::file::EventLog;

    let mut log = match &events_path {
        Some(path) => Some(
            EventLog::create(path)
                .await
                .with_context(|| format!("cannot write the events to {}", path.display()))?,
        ),
        None => None,
    };
    let mut audio =
        voxide::transports::local::open(input_device.as_deref(), output_device.as_deref())?;
    eprintln!("audio: {}", audio.description);
    eprintln!("loading the models…");
    let preload = bot.clone();
    tokio::task::spawn_blocking(move || voxide::bot::preload(&preload)).await??;
    bot.audio_out_sample_rate = audio.speaker.sample_rate();
    let built = voxide::bot::build(&bot, audio.speaker.clone(), OutputOptions::default())?;
    let builder = voxide::pipeline::Session::builder(built.pipeline).params(built.params);
    let mut events = builder.subscribe();
    let session = builder.spawn();
    let handle = session.handle();
    let printer = tokio::spawn(async move {
        loop {
            let event = match events.recv().await {
                Ok(event) => event,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(lost = n, "the event log fell behind");
                    continue;
                }
                Err(_) => break,
            };
            if let Some(file) = &mut log
                && let Err(e) = file.write(&event, event.elapsed).await
            {
                eprintln!("  cannot write the events: {e}");
                log = None;
            }
            match &event.event {
                Event::UserTranscription {
                    text,
                    is_final: true,
                } => eprintln!("you: {text}"),
                Event::BotText { text } => eprintln!("bot: {text}"),
                Event::ToolCallStarted {
                    name, arguments, ..
                } => eprintln!("  → {name}({arguments})"),
                Event::Interruption => eprintln!("  (interrupted)"),
                Event::Error { message, .. } => eprintln!("  error: {message}"),
                Event::SessionEnded { .. } => break,
                _ => {}
            }
        }
        if let Some(file) = &mut log {
            let _ = file.flush().await;
        }
    });
    eprintln!("listening: speak (Ctrl-C to stop)");
    audio.microphone.listen();
    let rate = audio.microphone.sample_rate;
    let mut watchdog = tokio::time::interval(Duration::from_millis(500));
    let ending = loop {
        tokio::select! {
            _ = watchdog.tick() => {
                if let Some(lost) = audio.stalled(std::time::Instant::now()) {
                    break Some(lost);
                }
            }
            chunk = audio.microphone.chunks.recv() => {
                let Some(chunk) = chunk else { break None };
                let frame = SystemFrame::InputAudio(AudioFrame::new(chunk, rate, 1));
                if handle.queue_frame(frame).await.is_err() {
                    break None;
                }
            }
            Some(lost) = audio.lost.recv() => break Some(lost),
            _ = tokio::signal::ctrl_c() => break None,
        }
    };
    match ending {
        Some(lost) => {
            eprintln!("  {lost}; ending the session");
            handle.emit(Event::Error {
                message: lost.to_string(),
                fatal: true,
                processor: Some("LocalAudio".into()),
            });
            handle.cancel_because(EndReason::DeviceLost(lost.to_string()));
        }
        None => handle.cancel(),
    }
    session.join().await;
    let _ = printer.await;
    drop(audio);
    Ok(())
}

/// Prints one line per model of the manifest.
fn list_models() {
    use voxide::models::{Installed, Manifest, models_dir};
    let dir = models_dir();
    println!("models folder: {}", dir.display());
    for model in Manifest::builtin().models {
        let state = match model.installed_in(&dir) {
            Installed::Yes => "installed",
            Installed::Missing => "missing (run scripts/setup.sh)",
            Installed::WrongSize => "damaged (delete it and run scripts/setup.sh)",
        };
        println!(
            "{:<16} {:>6.1} MB  {:<10} {}=={} ({})  {}",
            model.name,
            model.size() as f64 / 1e6,
            state,
            model.package,
            model.version,
            model.license,
            model.purpose,
        );
    }
}

/// Runs `voxide loadtest`; the exit status.
async fn loadtest(args: LoadtestArgs) -> u8 {
    use voxide::loadtest::{LoadtestError, LoadtestOptions, Protocol, run, stats::Slo, table};
    let usage = |message: String| {
        eprintln!("error: {message}");
        2
    };
    let protocol = match args.protocol.as_str() {
        "ws" => Protocol::Ws,
        "twilio" => Protocol::Twilio,
        "webrtc" => Protocol::WebRtc,
        "webrtc-start" => Protocol::WebRtcStart,
        other => {
            return usage(format!(
                "--protocol {other:?}: use webrtc, webrtc-start, ws or twilio"
            ));
        }
    };
    let slos = match args
        .slo
        .iter()
        .map(|s| Slo::parse(s))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(slos) => slos,
        Err(e) => return usage(e),
    };
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !(positive(args.ramp) || args.ramp == 0.0)
        || !positive(args.response_timeout)
        || !positive(args.max_pacing_lag_ms)
    {
        return usage("--ramp, --response-timeout and --max-pacing-lag-ms must be positive".into());
    }
    let concurrency = args.concurrency.unwrap_or(args.sessions);
    let stages = match (&args.stages, args.duration) {
        (Some(text), _) => match voxide::loadtest::Stage::parse_list(text) {
            Ok(stages) => stages,
            Err(e) => return usage(e),
        },
        (None, Some(seconds)) if seconds.is_finite() && seconds > 0.0 => vec![
            voxide::loadtest::Stage {
                duration: Duration::from_secs_f64(args.ramp),
                target: concurrency,
            },
            voxide::loadtest::Stage {
                duration: Duration::from_secs_f64(seconds),
                target: concurrency,
            },
        ],
        (None, Some(_)) => return usage("--duration must be positive".into()),
        (None, None) => Vec::new(),
    };
    let options = LoadtestOptions {
        target: args.target,
        protocol,
        audio: args.audio,
        sessions: args.sessions,
        concurrency,
        stages,
        turns: args.turns,
        think: Duration::from_millis(args.think_ms),
        barge_in_at: args.barge_in_at_ms.map(Duration::from_millis),
        ramp: Duration::from_secs_f64(args.ramp),
        seed: args.seed,
        response_timeout: Duration::from_secs_f64(args.response_timeout),
        slos,
        out: args.out,
        max_pacing_lag: Duration::from_secs_f64(args.max_pacing_lag_ms / 1000.0),
    };
    if let Some(max) = args.find_capacity {
        return match voxide::loadtest::find_capacity(options, max).await {
            Ok(capacity) => {
                for step in &capacity.steps {
                    println!(
                        "{:>4} at once: {:?}{}",
                        step.concurrency,
                        step.verdict,
                        step.v2v
                            .map_or(String::new(), |d| format!(", v2v p95 {:.0} ms", d.p95))
                    );
                }
                match capacity.capacity {
                    Some(k) => println!("capacity: {k} sessions at once"),
                    None => println!("capacity: none (one session already breaks an SLO)"),
                }
                capacity.verdict.exit_code()
            }
            Err(LoadtestError::Usage(message)) => usage(message),
            Err(e) => usage(e.to_string()),
        };
    }
    match run(options).await {
        Ok(summary) => {
            print!("{}", table(&summary));
            summary.verdict.exit_code()
        }
        Err(LoadtestError::Usage(message)) => usage(message),
        Err(e) => usage(e.to_string()),
    }
}
