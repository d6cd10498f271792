//! The `voxide` command.

use anyhow::Result;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use std::path::PathBuf;
use std::time::Duration;

use voxide::bench::pipeline::PipelineBench;
use voxide::bot::{BotOptions, TurnEnd, Voice};
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
}

/// The bot's options, shared by the commands that run one.
#[derive(clap::Args, Debug)]
struct BotArgs {
    /// The voice: `piper` (natural) or `espeak` (robotic, nearly free).
    #[arg(long, value_enum, default_value_t = VoiceArg::Piper)]
    voice: VoiceArg,
    /// How a user turn ends: `smart` (the Smart Turn model judges each pause) or `silence`
    /// (a fixed silence of --turn-timeout-secs).
    #[arg(long, value_enum, default_value_t = TurnArg::Smart)]
    turn: TurnArg,
    /// With `--turn silence` the silence that ends a turn; with `--turn smart` the silence after
    /// which a turn that sounds unfinished ends anyway.
    #[arg(long, default_value_t = 2.0)]
    turn_timeout_secs: f64,
    /// Tokens one reply may have at most.
    #[arg(long, default_value_t = 60)]
    max_tokens: usize,
    /// The system instruction (default: a short one of voxide's own).
    #[arg(long)]
    instructions: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum VoiceArg {
    Piper,
    Espeak,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum TurnArg {
    Smart,
    Silence,
}

impl BotArgs {
    fn options(&self) -> Result<BotOptions> {
        if !(self.turn_timeout_secs > 0.0 && self.turn_timeout_secs < 60.0) {
            anyhow::bail!("--turn-timeout-secs must be between 0 and 60");
        }
        Ok(BotOptions {
            voice: match self.voice {
                VoiceArg::Piper => Voice::Piper,
                VoiceArg::Espeak => Voice::Espeak,
            },
            turn_end: match self.turn {
                TurnArg::Smart => TurnEnd::SmartTurn,
                TurnArg::Silence => TurnEnd::Silence,
            },
            turn_timeout: Duration::from_secs_f64(self.turn_timeout_secs),
            max_tokens: self.max_tokens,
            instructions: self
                .instructions
                .clone()
                .unwrap_or_else(|| voxide::bot::INSTRUCTIONS.to_owned()),
            ..BotOptions::default()
        })
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
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Models => list_models(),
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
            let bot = bot.options()?;
            eprintln!("loading the models…");
            let preload = bot.clone();
            tokio::task::spawn_blocking(move || voxide::bot::preload(&preload)).await??;
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
        Command::Bench { bench: Bench::Wer } => {
            let report = tokio::task::spawn_blocking(voxide::bench::wer::run).await??;
            println!("{}", serde_json::to_string(&report)?);
        }
    }
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
