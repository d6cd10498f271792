//! `voxide loadtest`: its flags, checked, and its exit status.

use std::path::PathBuf;
use std::time::Duration;

/// `voxide loadtest`.
#[derive(clap::Args)]
pub struct LoadtestArgs {
    /// The server: `http://host:port`.
    #[arg(long)]
    target: String,
    /// `webrtc` (SmallWebRTC: POST /api/offer, Opus, RTVI on the data channel), `webrtc-start`
    /// (pipecat's runner: POST /start, then /sessions/{id}/api/offer), `ws` (voxide's /ws: PCM
    /// and JSON), `twilio` (Twilio Media Streams at /ws/twilio), `sip` (a phone call: --target
    /// sip:[user@]host[:port], PCMU over RTP), `sip-g722` (the same call in wideband G.722) or
    /// `sip-opus` (in Opus).
    /// A path in --target replaces the default one.
    #[arg(long, default_value = "webrtc")]
    protocol: String,
    /// A WAV of one user turn; repeat for more (the sessions take them in turn, each from where
    /// the one before stopped). A `.txt` beside a WAV is what it says: the run then scores the
    /// bot's transcripts against it (the WER in the summary).
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
    /// The token a guarded server wants (its --auth-token): sent as `Authorization: Bearer` on
    /// every request and WebSocket.
    #[arg(long, env = "VOXIDE_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// A noise floor under the speech and in every gap, as a microphone in a room sends: its
    /// RMS level in dBFS (a quiet room is about -55). Without it, the gaps are digital silence.
    #[arg(long, value_name = "DBFS", allow_negative_numbers = true)]
    noise_dbfs: Option<f64>,
    /// The floor's sound: `brown`, `pink`, `babble` (four people talking around the speaker,
    /// made by the embedded Piper voice), or a WAV to loop (a café, an office).
    #[arg(long, default_value = "brown", requires = "noise_dbfs")]
    noise: String,
    /// Loses this percentage of the frames each caller sends (a lossy network; on WebRTC the
    /// RTP packets, whose sequence numbers show the holes).
    #[arg(long, value_name = "PCT", default_value_t = 0.0)]
    loss: f64,
    /// Losses come in bursts of this mean length, in frames (with --loss).
    #[arg(long, value_name = "MEAN_LEN", requires = "loss")]
    burst_loss: Option<f64>,
    /// Delays each frame by up to this much, uniformly (frames can overtake each other on
    /// WebRTC; on a socket they keep their order).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    jitter_ms: u64,
    /// Holds this percentage of the frames back, so the next overtakes them (WebRTC).
    #[arg(long, value_name = "PCT", default_value_t = 0.0)]
    reorder: f64,
    /// Sends this percentage of the frames twice (WebRTC).
    #[arg(long, value_name = "PCT", default_value_t = 0.0)]
    duplicate: f64,
    /// Loses this percentage of the bot's packets on their way back (WebRTC; the callers say so
    /// in their RTCP receiver reports, as a browser does).
    #[arg(long, value_name = "PCT", default_value_t = 0.0)]
    recv_loss: f64,
    /// The bot's lost packets come in bursts of this mean length (with --recv-loss).
    #[arg(long, value_name = "MEAN_LEN", requires = "recv_loss")]
    recv_burst_loss: Option<f64>,
    /// Delays each of the bot's packets by up to this much on its way back (WebRTC).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    recv_jitter_ms: u64,
    /// Copies of earlier frames a WebRTC caller sends in each packet when the bot's answer puts
    /// RED first (RFC 2198), as Chrome does with one; 0 sends plain Opus.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=8))]
    red: u8,
}

/// Runs `voxide loadtest`; the exit status.
pub async fn loadtest(args: LoadtestArgs) -> u8 {
    use voxide::loadtest::{LoadtestError, run, table};
    let usage = |message: String| {
        eprintln!("error: {message}");
        2
    };
    let find_capacity = args.find_capacity;
    let options = match options(args) {
        Ok(options) => options,
        Err(message) => return usage(message),
    };
    let outcome = match find_capacity {
        Some(max) => voxide::loadtest::find_capacity(options, max)
            .await
            .map(|capacity| print_capacity(&capacity)),
        None => run(options).await.map(|summary| {
            print!("{}", table(&summary));
            summary.verdict.exit_code()
        }),
    };
    match outcome {
        Ok(code) => code,
        Err(LoadtestError::Usage(message)) => usage(message),
        Err(e) => usage(e.to_string()),
    }
}

/// The flags as the load tester's options; an error says which flag is wrong.
fn options(args: LoadtestArgs) -> Result<voxide::loadtest::LoadtestOptions, String> {
    use voxide::loadtest::{LoadtestOptions, Protocol, Stage, stats::Slo};
    let protocol = match args.protocol.as_str() {
        "ws" => Protocol::Ws,
        "twilio" => Protocol::Twilio,
        "webrtc" => Protocol::WebRtc,
        "webrtc-start" => Protocol::WebRtcStart,
        "sip" => Protocol::Sip,
        "sip-g722" => Protocol::SipWideband,
        "sip-opus" => Protocol::SipOpus,
        other => {
            return Err(format!(
                "--protocol {other:?}: use webrtc, webrtc-start, ws, twilio, sip, sip-g722 or sip-opus"
            ));
        }
    };
    let slos = args
        .slo
        .iter()
        .map(|s| Slo::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !(positive(args.ramp) || args.ramp == 0.0)
        || !positive(args.response_timeout)
        || !positive(args.max_pacing_lag_ms)
    {
        return Err("--ramp, --response-timeout and --max-pacing-lag-ms must be positive".into());
    }
    let concurrency = args.concurrency.unwrap_or(args.sessions);
    let stages = match (&args.stages, args.duration) {
        (Some(text), _) => Stage::parse_list(text)?,
        (None, Some(seconds)) if seconds.is_finite() && seconds > 0.0 => vec![
            Stage {
                duration: Duration::from_secs_f64(args.ramp),
                target: concurrency,
            },
            Stage {
                duration: Duration::from_secs_f64(seconds),
                target: concurrency,
            },
        ],
        (None, Some(_)) => return Err("--duration must be positive".into()),
        (None, None) => Vec::new(),
    };
    let percent = |name: &str, value: f64| {
        if (0.0..=100.0).contains(&value) {
            Ok(value / 100.0)
        } else {
            Err(format!("--{name} is a percentage, 0 to 100"))
        }
    };
    let network = voxide::loadtest::impair::Impairment {
        loss: percent("loss", args.loss)?,
        burst: args.burst_loss.unwrap_or(1.0),
        jitter: Duration::from_millis(args.jitter_ms),
        reorder: percent("reorder", args.reorder)?,
        duplicate: percent("duplicate", args.duplicate)?,
        seed: args.seed,
    };
    let received = voxide::loadtest::impair::Impairment {
        loss: percent("recv-loss", args.recv_loss)?,
        burst: args.recv_burst_loss.unwrap_or(1.0),
        jitter: Duration::from_millis(args.recv_jitter_ms),
        seed: args.seed.wrapping_add(1),
        ..Default::default()
    };
    if network.loss >= 1.0 || received.loss >= 1.0 {
        return Err("--loss and --recv-loss must be under 100 %".into());
    }
    Ok(LoadtestOptions {
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
        auth_token: args.auth_token.filter(|t| !t.is_empty()),
        room: args.noise_dbfs.map(|dbfs| voxide::loadtest::room::Room {
            noise: voxide::loadtest::room::Noise::parse(&args.noise),
            dbfs,
        }),
        network,
        received,
        red: usize::from(args.red),
    })
}

/// Prints each step of the capacity search and the capacity; the exit status.
fn print_capacity(capacity: &voxide::loadtest::Capacity) -> u8 {
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
