//! `voxide serve` and `voxide run`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use super::bot::{BotArgs, preloaded};
use voxide::config::BotConfig;
use voxide::server::ServeOptions;
use voxide::transports::file::{RunOptions, run};

/// `voxide serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
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
}

impl ServeArgs {
    /// Serves until SIGINT or SIGTERM.
    pub async fn run(self) -> Result<()> {
        let ServeArgs {
            host,
            port,
            max_sessions,
            shutdown_grace_secs,
            ice_servers,
            bots,
            bot,
        } = self;
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
        Ok(())
    }
}

/// `voxide run`.
#[derive(clap::Args)]
pub struct RunArgs {
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
}

impl RunArgs {
    /// One session on the recording; prints its summary.
    pub async fn run(self) -> Result<()> {
        let RunArgs {
            input,
            output,
            events,
            fast,
            max_tail_secs,
            bot,
        } = self;
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
        Ok(())
    }
}
