//! `voxide local`: the bot on this machine's microphone and speaker.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use super::bot::BotArgs;
use voxide::bot::BotOptions;
use voxide::config::BotConfig;
use voxide::events::ReportLevel;
use voxide::observe::{Watched, Watchers};

/// `voxide local`.
#[derive(clap::Args)]
pub struct LocalArgs {
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
    /// Records the conversation into this folder (created if missing), as `serve` does: a
    /// stereo WAV (the microphone left, as it reached the bot, before the echo canceller; the
    /// bot right) and a JSON transcript of its turns, which `voxide report` draws.
    #[arg(long, env = "VOXIDE_RECORD_DIR", value_name = "DIR")]
    record_dir: Option<PathBuf>,
    #[command(flatten)]
    bot: BotArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum EchoArg {
    Cancel,
    Guard,
    Off,
}

impl LocalArgs {
    /// Lists the devices, or talks until Ctrl-C.
    pub async fn run(self) -> Result<()> {
        if self.list_devices {
            return list_devices();
        }
        let mut bot = self.bot.bot(BotConfig::default()).await?;
        match self.echo {
            EchoArg::Cancel => bot.echo_canceller = true,
            EchoArg::Guard => bot.echo_guard = Some(Default::default()),
            EchoArg::Off => {}
        }
        let record_dir = match self.record_dir {
            Some(dir) => {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| anyhow::anyhow!("--record-dir {}: {e}", dir.display()))?;
                Some(dir)
            }
            None => None,
        };
        local(
            bot,
            (self.input_device, self.output_device),
            self.events,
            record_dir,
        )
        .await
    }
}

/// Prints the audio devices, with their roles.
fn list_devices() -> Result<()> {
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
    Ok(())
}

/// `voxide local`: the default bot on the microphone and speaker (by name; none: the system's
/// default) until Ctrl-C, or until a device goes away.
async fn local(
    mut bot: BotOptions,
    (input, output): (Option<String>, Option<String>),
    events_path: Option<PathBuf>,
    record_dir: Option<PathBuf>,
) -> Result<()> {
    use anyhow::Context;
    use voxide::events::{EndReason, Event};
    use voxide::frames::AudioFrame;
    use voxide::transports::OutputOptions;
    use voxide::transports::file::EventLog;

    let log = match &events_path {
        Some(path) => Some(
            EventLog::create(path)
                .await
                .with_context(|| format!("cannot write the events to {}", path.display()))?,
        ),
        None => None,
    };
    let mut audio = voxide::transports::local::open(input.as_deref(), output.as_deref())?;
    eprintln!("audio: {}", audio.description);
    eprintln!("loading the models…");
    let preload = bot.clone();
    tokio::task::spawn_blocking(move || voxide::bot::preload(&preload)).await??;
    bot.audio_out_sample_rate = audio.speaker.sample_rate();
    let id = local_session_id();
    let watchers = Watchers::new(record_dir, None, Default::default());
    let mut observing = watchers.watch(&Watched {
        id: &id,
        bot: bot.name.as_deref(),
        transport: "local",
        level: ReportLevel::default(),
        consent: true,
        traceparent: None,
        // A bot file's `record = false` holds here too.
        bot_allows: (bot.record, false),
    });
    let speaker = observing.sink(Box::new(audio.speaker.clone()));
    let built = voxide::bot::build(&bot, speaker, OutputOptions::default())?;
    observing.report_level(built.report_level);
    let mut builder = voxide::pipeline::Session::builder(built.pipeline).params(built.params);
    if let Some(observer) = observing.observer() {
        builder = builder.observer(observer);
    }
    let events = builder.subscribe();
    let watched = builder.subscribe();
    let session = builder.spawn();
    let handle = session.handle();
    let watching = tokio::spawn(observing.follow(watched, handle.clone()));
    let printer = tokio::spawn(print_events(events, log));
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
                if handle.queue_live_audio(AudioFrame::new(chunk, rate, 1)).await.is_err() {
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
    let _ = watching.await;
    drop(audio);
    Ok(())
}

/// This conversation's id, which names its recording: `local-` and the Unix time.
fn local_session_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("local-{}", now.as_secs())
}

/// Prints what was heard and said as the session goes, and writes every event to `log`.
async fn print_events(
    mut events: tokio::sync::broadcast::Receiver<voxide::events::SessionEvent>,
    mut log: Option<voxide::transports::file::EventLog>,
) {
    use voxide::events::Event;
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
}
