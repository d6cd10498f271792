//! The `voxide` command.

use anyhow::Result;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use voxide::bench::pipeline::PipelineBench;

/// A realtime voice-agent server.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Lists the embedded models: where each comes from, its size, and whether it is installed.
    /// `scripts/setup.sh` fetches them.
    Models,
    /// Benchmarks you can run on your own hardware; each prints one JSON line.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
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
