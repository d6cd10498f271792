//! `voxide serve` and `voxide run`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use super::bot::{BotArgs, preloaded};
use voxide::bot::run::{RunOptions, run};
use voxide::config::BotConfig;
use voxide::server::{AccessOptions, NodeId, Peers, ServeOptions};
use voxide::transports::webrtc::RedVoice;

/// `--webrtc-red-voice`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum RedVoiceArg {
    OnLoss,
    Always,
}

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
    /// Seconds live sessions get to end by themselves once the node drains (SIGTERM, SIGINT or
    /// `POST /admin/drain`); then the rest are ended and the process exits. A second signal
    /// ends it at once. [default: 60]
    #[arg(long, env = "VOXIDE_DRAIN_TIMEOUT_SECS", alias = "shutdown-grace-secs")]
    drain_timeout_secs: Option<f64>,
    /// This node's name (letters, digits, '-', '_'): every session and connection id it mints
    /// is `<node>.<uuid>`, and every answer carries it in `X-Voxide-Node`. [default: the host
    /// name]
    #[arg(long, env = "VOXIDE_NODE_ID")]
    node_id: Option<String>,
    /// The other nodes, `NODE=URL,...` (`n2=http://10.0.0.12:7860`): a request for a
    /// connection another node holds is forwarded to it.
    #[arg(long, env = "VOXIDE_PEERS", value_name = "NODE=URL,...")]
    peers: Option<String>,
    /// The URL of a node not in --peers, with `{node}` in it: a headless Service's DNS, e.g.
    /// `http://{node}.voxide-nodes:7860`.
    #[arg(long, env = "VOXIDE_PEER_URL", value_name = "URL")]
    peer_url: Option<String>,
    /// A secret every node of the cluster shares: forwarded requests carry an HMAC made with
    /// it, and a request that claims to be forwarded without a valid one is refused (401) and
    /// counted against its address's session limit. Without it, no claim is believed.
    #[arg(long, env = "VOXIDE_CLUSTER_SECRET", hide_env_values = true)]
    cluster_secret: Option<String>,
    /// Answer HAProxy's agent check on this port (same host): `ready up N%` with the node's free
    /// capacity, `drain` while it drains.
    #[arg(long, env = "VOXIDE_AGENT_PORT")]
    agent_port: Option<u16>,
    /// Serve health, readiness, status, metrics and `/admin/*` on this port (same host)
    /// instead of the main one; the main port keeps `/healthz` and `/readyz`.
    #[arg(long, env = "VOXIDE_ADMIN_PORT")]
    admin_port: Option<u16>,
    /// A token that signalling, `/start`, the WebSockets and `/admin/*` need:
    /// `Authorization: Bearer <token>`, or `?token=` on a WebSocket.
    #[arg(long, env = "VOXIDE_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// The Twilio account's auth token: a media stream whose `X-Twilio-Signature` checks out
    /// needs no --auth-token.
    #[arg(long, env = "TWILIO_AUTH_TOKEN", hide_env_values = true)]
    twilio_auth_token: Option<String>,
    /// The Twilio account (`AC…`) whose calls this server takes: a media stream whose `start`
    /// names another account is closed.
    #[arg(long, env = "TWILIO_ACCOUNT_SID")]
    twilio_account_sid: Option<String>,
    /// The server's URL as Twilio calls it (`wss://voice.example.com`), to check its
    /// signature; without it, the request's Host and X-Forwarded-Proto. With it and the
    /// account's sid and token, `POST /calls` places calls through Twilio.
    #[arg(long, env = "VOXIDE_PUBLIC_URL")]
    public_url: Option<String>,
    /// Twilio's REST API, for the calls placed through it. [default: https://api.twilio.com]
    #[arg(long, env = "TWILIO_API_URL", value_name = "URL")]
    twilio_api_url: Option<String>,
    /// The Telnyx account's API key: `transfer_call` on a Telnyx stream hands the call over
    /// through Telnyx's Call Control API.
    #[arg(long, env = "TELNYX_API_KEY", hide_env_values = true)]
    telnyx_api_key: Option<String>,
    /// Telnyx's Call Control API. [default: https://api.telnyx.com]
    #[arg(long, env = "TELNYX_API_URL", value_name = "URL")]
    telnyx_api_url: Option<String>,
    /// An origin whose pages may call the API from a browser (repeatable; `*`: any).
    #[arg(
        long = "cors-origin",
        env = "VOXIDE_CORS_ORIGINS",
        value_delimiter = ','
    )]
    cors_origins: Vec<String>,
    /// New sessions one client address may open a minute (0: no limit). [default: 120]
    #[arg(long, env = "VOXIDE_SESSIONS_PER_MINUTE_PER_IP")]
    sessions_per_minute_per_ip: Option<u32>,
    /// Take the client's address from the last X-Forwarded-For entry (behind a proxy that sets
    /// it, e.g. HAProxy's `option forwardfor`).
    #[arg(long, env = "VOXIDE_TRUST_FORWARDED_FOR")]
    trust_forwarded_for: bool,
    /// The UDP ports WebRTC connections bind, `A-B`, one port a connection (open just these in
    /// a firewall or a pod's ports). [default: any free port]
    #[arg(long, env = "VOXIDE_WEBRTC_UDP_PORTS", value_name = "A-B")]
    webrtc_udp_ports: Option<String>,
    /// The IP callers reach this host at behind a 1:1 NAT (a VM's public IP; on Kubernetes the
    /// node's, from the downward API): WebRTC host candidates carry it.
    #[arg(long, env = "VOXIDE_WEBRTC_PUBLIC_IP")]
    webrtc_public_ip: Option<std::net::IpAddr>,
    /// Asks WebRTC clients that offer RED (Chrome does) to send each packet with a copy of the
    /// one before (RFC 2198): a lost packet arrives again in the next, for twice the upload
    /// (`true` or `false`). [default: true]
    #[arg(long, env = "VOXIDE_WEBRTC_RED")]
    webrtc_red: Option<bool>,
    /// When the bot's voice goes in RED to a client that takes it: `on-loss`, once the client
    /// reports losing some of it; `always`, from the first packet (a call's first losses come
    /// before its first report), for about twice the download. [default: on-loss]
    #[arg(long, env = "VOXIDE_WEBRTC_RED_VOICE", value_enum)]
    webrtc_red_voice: Option<RedVoiceArg>,
    /// Takes SIP calls on this UDP address (`0.0.0.0:5060`): INVITEs answered directly, audio
    /// in Opus, G.722 or G.711 over RTP. [default: no SIP]
    #[arg(long, env = "VOXIDE_SIP_LISTEN", value_name = "ADDR:PORT")]
    sip_listen: Option<SocketAddr>,
    /// SIP's transports: `udp`, or `udp,tcp` to take SIP over TCP too, on the same address and
    /// port (calls that come over TCP are answered on their connection).
    #[arg(
        long,
        env = "VOXIDE_SIP_TRANSPORT",
        default_value = "udp",
        value_name = "udp[,tcp]"
    )]
    sip_transport: String,
    /// The IP callers reach this host at behind a 1:1 NAT: SIP's Contact and the SDP carry it.
    #[arg(long, env = "VOXIDE_SIP_PUBLIC_IP")]
    sip_public_ip: Option<std::net::IpAddr>,
    /// The UDP ports calls' RTP binds, `A-B`, one port a call.
    #[arg(
        long,
        env = "VOXIDE_SIP_RTP_PORTS",
        value_name = "A-B",
        default_value = "10000-10999"
    )]
    sip_rtp_ports: String,
    /// Registers as a PBX's extension, `sip:USER@HOST[:PORT]` (digest authentication with
    /// `--sip-password`; renewed before it expires); the PBX may then call in.
    #[arg(long, env = "VOXIDE_SIP_REGISTER", value_name = "sip:USER@HOST")]
    sip_register: Option<String>,
    /// The extension's password for `--sip-register` (better in the environment than on the
    /// command line).
    #[arg(long, env = "VOXIDE_SIP_PASSWORD", hide_env_values = true)]
    sip_password: Option<String>,
    /// Takes Asterisk's AudioSocket connections on this TCP address (`AudioSocket(uuid,host:port)`
    /// in a dialplan): each a call with the default bot. [default: none]
    #[arg(long, env = "VOXIDE_AUDIOSOCKET_LISTEN", value_name = "ADDR:PORT")]
    audiosocket_listen: Option<SocketAddr>,
    /// Who may call over SIP or AudioSocket: an address or `address/bits` (repeatable; a PBX's
    /// or a trunk's addresses). [default: loopback only]
    #[arg(long = "sip-allow", value_name = "NETWORK")]
    sip_allow: Vec<voxide::server::Network>,
    /// SIP callers from outside --sip-allow who may call with a password: a file of
    /// `user:password` lines. Such a caller is challenged (digest, MD5) and taken when its
    /// answer holds; its offer must put its audio at its own address. [default: none]
    #[arg(long, env = "VOXIDE_SIP_USERS", value_name = "FILE")]
    sip_users: Option<PathBuf>,
    /// A STUN or TURN server for WebRTC (repeatable). Without one, host candidates only,
    /// which is all a local network or loopback needs.
    #[arg(long = "ice-server", value_name = "URL")]
    ice_servers: Vec<String>,
    /// Serves every bot file (`*.toml`) of this folder: a client picks one by name
    /// (`{"bot": "name"}` in `/start`'s body or the offer's `requestData`, `?bot=name` on the
    /// WebSockets); the first in name order is the default. The flags here override each.
    #[arg(long, env = "VOXIDE_BOTS", value_name = "DIR", conflicts_with = "bot")]
    bots: Option<PathBuf>,
    /// Take the messages of pipecat's eval harness that change a session's bot:
    /// `eval-context` (replace the conversation) and `eval-configure` (tell the client every
    /// function call's arguments and result). For a server under test, never one for callers.
    #[arg(long, env = "VOXIDE_ALLOW_EVALS")]
    allow_evals: bool,
    /// Records each session into this folder (created if missing): a stereo WAV (the user
    /// left, the bot right) and a JSON transcript of its turns with their timings, tool calls
    /// and metrics, which `voxide report` draws. A caller refuses with `record=false` (`/ws`)
    /// or `"record": false` in what it sends `/start`. Off by default.
    #[arg(long, env = "VOXIDE_RECORD_DIR", value_name = "DIR")]
    record_dir: Option<PathBuf>,
    /// Uploads each finished recording and transcript to S3-compatible storage
    /// (`s3://bucket/prefix`; keys, region and a compatible store's endpoint from `AWS_*`).
    /// With --record-dir the files stay there too; without it they are written to a folder
    /// under the system's temporary one and removed once uploaded (kept if the upload fails).
    #[arg(long, env = "VOXIDE_RECORD_URL", value_name = "URL")]
    record_url: Option<String>,
    /// Exports a trace per session to this OpenTelemetry collector (OTLP/HTTP protobuf; the
    /// base URL, `/v1/traces` is added). `OTEL_EXPORTER_OTLP_ENDPOINT`, `_HEADERS` and
    /// `_TIMEOUT` (and their `_TRACES_` forms) and `OTEL_SERVICE_NAME` are read too.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// The share of sessions traced, 0 to 1.
    #[arg(
        long,
        env = "VOXIDE_TRACE_SAMPLE",
        default_value_t = 1.0,
        value_name = "RATIO"
    )]
    trace_sample: f64,
    #[command(flatten)]
    bot: BotArgs,
}

impl ServeArgs {
    /// Who may call over SIP or AudioSocket: `--sip-allow`, or loopback.
    fn callers(&self) -> Vec<voxide::server::Network> {
        if self.sip_allow.is_empty() {
            voxide::server::Network::loopback()
        } else {
            self.sip_allow.clone()
        }
    }

    /// Serves until SIGINT or SIGTERM.
    pub async fn run(self) -> Result<()> {
        let config = self.bot.config()?;
        let server = &config.server;
        let host = self
            .host
            .clone()
            .or(server.host.clone())
            .unwrap_or_else(|| "127.0.0.1".into());
        let port = self.port.or(server.port).unwrap_or(7860);
        let addr = socket_addr(&host, port)?;
        let max_sessions = self.max_sessions.or(server.max_sessions).unwrap_or(32);
        if max_sessions == 0 {
            anyhow::bail!("--max-sessions must be at least 1");
        }
        let drain_timeout = self
            .drain_timeout_secs
            .or(server.drain_timeout_secs)
            .unwrap_or(60.0);
        if !(0.0..=86_400.0).contains(&drain_timeout) {
            anyhow::bail!("--drain-timeout-secs must be between 0 and 86400");
        }
        let node_id = match self.node_id.as_ref().or(server.node_id.as_ref()) {
            Some(id) => id.parse().map_err(|e: String| anyhow::anyhow!(e))?,
            None => NodeId::from_hostname(),
        };
        let peers = Peers {
            known: match self.peers.as_ref().or(server.peers.as_ref()) {
                Some(list) => Peers::parse_list(list).map_err(|e| anyhow::anyhow!(e))?,
                None => Default::default(),
            },
            template: self.peer_url.clone().or(server.peer_url.clone()),
            secret: secret(&self.cluster_secret),
        };
        if let Some(template) = &peers.template {
            Peers::check_template(template).map_err(|e| anyhow::anyhow!(e))?;
        }
        if (!peers.known.is_empty() || peers.template.is_some()) && peers.secret.is_none() {
            eprintln!(
                "voxide serve: warning: peers without --cluster-secret (VOXIDE_CLUSTER_SECRET): \
                 requests other nodes forward count against their address's session limit"
            );
        }
        let agent_addr = match self.agent_port.or(server.agent_port) {
            Some(port) => Some(socket_addr(&host, port)?),
            None => None,
        };
        let admin_addr = match self.admin_port {
            Some(port) => Some(socket_addr(&host, port)?),
            None => None,
        };
        let access = AccessOptions {
            auth_token: secret(&self.auth_token),
            twilio_auth_token: secret(&self.twilio_auth_token),
            twilio_account_sid: self.twilio_account_sid.clone().filter(|s| !s.is_empty()),
            public_url: self.public_url.clone(),
            cors_origins: self.cors_origins.clone(),
            sessions_per_minute: self.sessions_per_minute_per_ip.unwrap_or(120),
            trust_forwarded_for: self.trust_forwarded_for,
        };
        let webrtc_udp_ports = match &self.webrtc_udp_ports {
            Some(range) => Some(port_range("--webrtc-udp-ports", range)?),
            None => None,
        };
        for (flag, url) in [
            ("--twilio-api-url", &self.twilio_api_url),
            ("--telnyx-api-url", &self.telnyx_api_url),
        ] {
            if let Some(url) = url
                && !(url.starts_with("https://") || url.starts_with("http://"))
            {
                anyhow::bail!("{flag} {url:?}: an http:// or https:// URL");
            }
        }
        let options = ServeOptions {
            max_sessions,
            webrtc_udp_ports,
            webrtc_public_ip: self.webrtc_public_ip,
            webrtc_red: self.webrtc_red.unwrap_or(true),
            webrtc_red_voice: match self.webrtc_red_voice {
                Some(RedVoiceArg::Always) => RedVoice::Always,
                Some(RedVoiceArg::OnLoss) | None => RedVoice::OnLoss,
            },
            admin_addr,
            access,
            drain_timeout: Duration::from_secs_f64(drain_timeout),
            ice_servers: self.ice_servers.clone(),
            node_id,
            peers,
            agent_addr,
            allow_evals: self.allow_evals,
            record_dir: match (&self.record_dir, &self.record_url) {
                (Some(dir), _) => Some(record_dir(dir)?),
                (None, Some(_)) => {
                    Some(record_dir(&std::env::temp_dir().join("voxide-recordings"))?)
                }
                (None, None) => None,
            },
            uploads: match &self.record_url {
                Some(url) => Some(voxide::observe::Uploads::new(
                    voxide::observe::upload::S3Target::resolve(url, |name| {
                        std::env::var(name).ok()
                    })?,
                    self.record_dir.is_some(),
                )),
                None => None,
            },
            sip: match self.sip_listen {
                None if self.sip_register.is_some() => {
                    anyhow::bail!("--sip-register needs --sip-listen: the PBX calls in there")
                }
                None if self.sip_users.is_some() => {
                    anyhow::bail!("--sip-users needs --sip-listen: its users call in there")
                }
                Some(listen) => {
                    let tcp = sip_over_tcp(&self.sip_transport)?;
                    Some(voxide::server::SipOptions {
                        listen,
                        tcp,
                        public_ip: self.sip_public_ip,
                        rtp_ports: port_range("--sip-rtp-ports", &self.sip_rtp_ports)?,
                        allow: self.callers(),
                        register: match &self.sip_register {
                            Some(aor) => Some(
                                voxide::transports::sip::register::Account::parse(
                                    aor,
                                    self.sip_password.clone().unwrap_or_default(),
                                )
                                .map_err(|e| anyhow::anyhow!(e))?,
                            ),
                            None => None,
                        },
                        users: match &self.sip_users {
                            Some(path) => Some(std::sync::Arc::new(
                                voxide::transports::sip::auth::Callers::load(path)?,
                            )),
                            None => None,
                        },
                    })
                }
                None => None,
            },
            audiosocket: self.audiosocket_listen.map(|addr| (addr, self.callers())),
            twilio_api_url: self.twilio_api_url.clone(),
            telnyx: self
                .telnyx_api_key
                .clone()
                .map(|key| (key.into(), self.telnyx_api_url.clone())),
            traces: voxide::observe::trace::TraceOptions::resolve(
                self.otlp_endpoint.as_deref(),
                self.trace_sample,
                |name| std::env::var(name).ok(),
            )?,
            ..ServeOptions::new(
                addr,
                match &self.bots {
                    Some(dir) => self.bot.bots(dir).await?,
                    None => vec![self.bot.bot(BotConfig::default()).await?],
                },
            )
        };
        if !addr.ip().is_loopback() && options.access.auth_token.is_none() {
            eprintln!(
                "voxide serve: warning: listening on {addr} without --auth-token \
                 (VOXIDE_AUTH_TOKEN): anyone who reaches this address can open sessions"
            );
        }
        eprintln!(
            "voxide serve: http://{addr}/ as node {} (models load in the background; /readyz says when)",
            options.node_id
        );
        voxide::server::serve(options).await?;
        Ok(())
    }
}

/// `--webrtc-udp-ports A-B`.
/// Whether `--sip-transport` takes TCP beside UDP: `udp` or `udp,tcp` (in either order).
fn sip_over_tcp(transports: &str) -> Result<bool> {
    let mut udp = false;
    let mut tcp = false;
    for transport in transports.split(',').map(str::trim) {
        match transport.to_ascii_lowercase().as_str() {
            "udp" => udp = true,
            "tcp" => tcp = true,
            other => {
                anyhow::bail!("--sip-transport {other:?}: write udp or udp,tcp (TLS is not taken)")
            }
        }
    }
    if !udp {
        anyhow::bail!("--sip-transport {transports:?}: UDP is always taken: write udp or udp,tcp");
    }
    Ok(tcp)
}

fn port_range(flag: &str, text: &str) -> Result<std::ops::RangeInclusive<u16>> {
    let bad = || anyhow::anyhow!("{flag} {text:?}: write A-B, 1 <= A <= B <= 65535");
    let (a, b) = text.split_once('-').ok_or_else(bad)?;
    let (a, b): (u16, u16) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if a == 0 || a > b {
        return Err(bad());
    }
    Ok(a..=b)
}

fn socket_addr(host: &str, port: u16) -> Result<SocketAddr> {
    format!("{host}:{port}")
        .parse()
        .or_else(|_| format!("[{host}]:{port}").parse())
        .map_err(|_| anyhow::anyhow!("--host {host:?} is not an IP address"))
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

/// The recordings' folder, made if missing; one that cannot be written to is said at once
/// (each session then says so too, and goes on unrecorded).
fn record_dir(dir: &std::path::Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("--record-dir {}: {e}", dir.display()))?;
    let probe = dir.join(".voxide-write-probe");
    match std::fs::write(&probe, b"") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => eprintln!(
            "voxide serve: warning: --record-dir {} cannot be written to ({e}): sessions will not be recorded",
            dir.display()
        ),
    }
    Ok(dir.to_owned())
}

/// A flag's secret, where it is set and not blank.
fn secret(flag: &Option<String>) -> Option<voxide::secret::Secret> {
    flag.as_deref()
        .map(voxide::secret::Secret::new)
        .filter(|s| !s.is_blank())
}
