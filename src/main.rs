//! The `voxide` command.

mod cli;

use anyhow::Result;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use cli::bench::Bench;
use cli::bot::CheckArgs;
use cli::loadtest::LoadtestArgs;
use cli::local::LocalArgs;
use cli::serve::{RunArgs, ServeArgs};

/// A realtime voice-agent server.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the HTTP server: the browser page at /, the WebSocket transport at /ws (and the
    /// telephone carriers' media streams at /ws/{twilio,telnyx,plivo,exotel,vonage}), SIP calls
    /// with --sip-listen, /healthz, /readyz, /status and /metrics. Drains on
    /// SIGINT, SIGTERM or `POST /admin/drain`: no new sessions, live ones finish, then it exits.
    Serve(Box<ServeArgs>),
    /// Checks a bot file (or a folder of them, or a config file) without starting anything:
    /// unknown keys, values out of range, provider keys missing from the environment, tool
    /// schemas, environment variables the headers name. Exit status 0 when all is well.
    Check(CheckArgs),
    /// Talks with the bot through this machine's default microphone and speaker (or the named
    /// ones). Prints what was heard and said; Ctrl-C ends it. An echo canceller takes the bot's
    /// own voice out of what the microphone hears, so it is not taken for the user.
    Local(LocalArgs),
    /// Runs one session on a recorded WAV file: the file is the user, the bot's answers are
    /// written time-aligned with it, and the session's events are written as JSON lines.
    /// Prints a summary (transcripts, what the bot said, latencies) as one JSON line.
    Run(RunArgs),
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
    /// Draws a session that `voxide serve --record-dir` recorded as one HTML page: the two
    /// voices on one timeline, each turn's work as a waterfall, the words, the latencies.
    Report(cli::report::ReportArgs),
}

fn main() -> Result<()> {
    size_candle_threads();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(start())
}

/// candle sizes each matrix multiplication by `RAYON_NUM_THREADS`. Without it, candle 0.11
/// counts the physical cores by reading `/proc/cpuinfo` on every multiplication (hundreds of
/// reads per transcript, a quarter of Whisper's time on a 2-core machine) and ignores the CPU
/// limit of a container. Set it once, from the CPUs this process may use.
#[allow(unsafe_code)]
fn size_candle_threads() {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    // SAFETY: called first thing in `main`, before any other thread exists, so nothing can read
    // the environment while it changes.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", cpus.to_string()) };
}

async fn start() -> Result<()> {
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
        Command::Serve(args) => args.run().await,
        Command::Check(args) => args.run(),
        Command::Local(args) => args.run().await,
        Command::Run(args) => args.run().await,
        Command::Report(args) => args.run(),
        Command::Models => {
            cli::list_models();
            Ok(())
        }
        Command::Bench { bench } => bench.run().await,
        Command::Loadtest(args) => {
            let code = cli::loadtest::loadtest(args).await;
            if code != 0 {
                std::process::exit(i32::from(code));
            }
            Ok(())
        }
    }
}
