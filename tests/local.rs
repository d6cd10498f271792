//! `voxide local` end to end on a real sound server: PulseAudio as a user daemon the test starts,
//! with two null sinks, `spk` (the speaker) and `micmix` (what the microphone hears, its monitor
//! the default source), and a loopback carrying `spk.monitor` into `micmix` at full level: the
//! loudspeaker's echo. voxide reaches it the way it reaches any desktop, through ALSA's default
//! device and the pulse plugin.
//!
//! 1. A question played into `micmix` is transcribed and answered; the answer is recorded from
//!    `spk.monitor`, and with `--echo cancel` the bot's own echo interrupts nothing.
//! 2. With `--echo off` the same echo does interrupt the bot: the test can fail.
//! 3. The user talking over the bot, through the same echo, still interrupts it.
//!
//! Needs `pulseaudio`, `pulseaudio-utils` and `libasound2-plugins` (`scripts/setup.sh --test`
//! installs them) and the models.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use voxide::audio::wav::{self, Wav};

const HELLO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav");

/// A private PulseAudio daemon; dropping it stops it and removes its files.
struct SoundServer {
    daemon: Child,
    dir: PathBuf,
}

impl SoundServer {
    fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("voxide-pulse-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["run", "home"] {
            std::fs::create_dir_all(dir.join(sub)).expect("temp dir");
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("run"), std::fs::Permissions::from_mode(0o700))
            .expect("runtime dir");
        let log = std::fs::File::create(dir.join("pulseaudio.log")).expect("log");
        let mut command = Command::new("pulseaudio");
        command
            .args([
                "-n",
                "--daemonize=no",
                "--exit-idle-time=-1",
                "--log-target=stderr",
                "-L",
                "module-native-protocol-unix",
                "-L",
                "module-null-sink sink_name=spk rate=48000",
                "-L",
                "module-null-sink sink_name=micmix rate=48000",
                "-L",
                "module-loopback source=spk.monitor sink=micmix latency_msec=20",
            ])
            .stdout(Stdio::null())
            .stderr(log);
        let mut server = Self {
            daemon: Self::env_of(&dir, &mut command)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start pulseaudio ({e}); `scripts/setup.sh --test` installs it")
                }),
            dir,
        };
        let started = Instant::now();
        while !server.pactl(&["info"]) {
            if let Ok(Some(status)) = server.daemon.try_wait() {
                let log = std::fs::read_to_string(server.dir.join("pulseaudio.log"));
                panic!("pulseaudio exited ({status}): {log:?}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "pulseaudio never answered"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(server.pactl(&["set-default-sink", "spk"]));
        assert!(server.pactl(&["set-default-source", "micmix.monitor"]));
        server
    }

    fn env_of<'a>(dir: &Path, command: &'a mut Command) -> &'a mut Command {
        command
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env("HOME", dir.join("home"))
            .env_remove("PULSE_SERVER")
    }

    /// A command that talks to this server.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        Self::env_of(&self.dir, &mut command);
        command
    }

    fn pactl(&self, args: &[&str]) -> bool {
        self.command("pactl")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Plays a WAV file into `micmix` (what the microphone hears), returning once it has played.
    fn say(&self, file: &Path) {
        let status = self
            .command("pacat")
            .args(["--device=micmix", "--file-format=wav"])
            .arg(file)
            .status()
            .expect("pacat");
        assert!(status.success(), "pacat failed");
    }
}

impl Drop for SoundServer {
    /// A failed test keeps the server's folder (the bot's log, events and recording) and says
    /// where.
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        if std::thread::panicking() {
            eprintln!(
                "the bot's log, events and recording: {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Stops a child with SIGINT (so it finishes its files) and waits for it.
fn interrupt(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `voxide local` on the sound server, its events in a file and its log captured.
struct Bot {
    child: Child,
    events: PathBuf,
    log: PathBuf,
}

impl Bot {
    fn start(server: &SoundServer, echo: &str) -> Self {
        let events = server.dir.join(format!("events-{echo}.jsonl"));
        let log = server.dir.join(format!("voxide-{echo}.log"));
        let child = server
            .command(env!("CARGO_BIN_EXE_voxide"))
            // The bot talks on over whatever it hears until speech is confirmed: no pause at an
            // onset may hide its echo from the test.
            .args(["local", "--voice", "espeak", "--pause-at-onset", "false"])
            .args(["--echo", echo, "--events"])
            .arg(&events)
            .arg("--record-dir")
            .arg(server.dir.join("recording"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("voxide local");
        let mut bot = Self { child, events, log };
        bot.wait_for(60, |events| has(events, "session_started"));
        bot
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.events)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Polls the event file until `done` holds; panics with the log after `seconds`.
    fn wait_for(&mut self, seconds: u64, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        loop {
            let events = self.events();
            if done(&events) {
                return events;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("voxide local exited ({status}): {}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "waited {seconds} s; events: {}\nlog: {}",
                summary(&events),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(mut self) -> String {
        interrupt(&mut self.child);
        self.log_text()
    }
}

impl Drop for Bot {
    /// A test that failed leaves no bot behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn has(events: &[Value], kind: &str) -> bool {
    events.iter().any(|e| e["type"] == kind)
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["type"] == kind).count()
}

/// Interruptions of the bot's voice: those that came while it was speaking. (One between its
/// answers is the user going on after a pause, cutting the answer in the making.)
fn interruptions_while_speaking(events: &[Value]) -> usize {
    let mut speaking = false;
    let mut count = 0;
    for event in events {
        match event["type"].as_str() {
            Some("bot_started_speaking") => speaking = true,
            Some("bot_stopped_speaking") => speaking = false,
            Some("interruption") if speaking => count += 1,
            _ => {}
        }
    }
    count
}

/// The events, one line each, metrics left out.
fn summary(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] != "metrics")
        .map(|e| {
            format!(
                "{} {} {}",
                e["t_ms"],
                e["type"],
                e.get("text").unwrap_or(&Value::Null)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The echo canceller's reports: (seconds, input dB, output dB).
fn echo_reports(events: &[Value]) -> Vec<(f64, f64, f64)> {
    events
        .iter()
        .filter(|e| e["type"] == "metrics")
        .flat_map(|e| e["data"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["type"] == "echo_cancellation")
        .map(|d| {
            let f = |k: &str| d[k].as_f64().unwrap_or(f64::NAN);
            (f("seconds"), f("input_db"), f("output_db"))
        })
        .collect()
}

/// The shipped question from 50 ms before its first word, 6 dB up (its loudest peaks clip): a
/// user who starts at once, nearer the microphone than the loudspeaker is. (At 0 dB from a
/// full-level echo AEC3 takes the first second or so of the user's voice for echo, and now and
/// then all of a short phrase.)
fn question_now(dir: &Path) -> PathBuf {
    let hello = wav::read(HELLO).expect("test audio");
    let mono = hello.to_mono();
    let frame = hello.sample_rate as usize / 100;
    let onset = mono
        .chunks(frame)
        .position(|c| rms_db(c) > -40.0)
        .expect("the question has speech");
    let skip = (onset * frame).saturating_sub(5 * frame);
    let path = dir.join("question-now.wav");
    let trimmed = Wav {
        samples: mono[skip..].iter().map(|&v| v.saturating_mul(2)).collect(),
        sample_rate: hello.sample_rate,
        channels: 1,
    };
    wav::write(&path, &trimmed).expect("wav");
    path
}

/// The shipped question's second sentence alone ("What's the weather like in Paris today?"),
/// from 50 ms before its first word, after half a second of silence. The file opens with
/// "Hello there." and 0.3 s of silence, where a turn may end (the greeting is complete); the
/// bot's answer then comes over the rest of the question, and the canceller, meeting the
/// echo path for the first time, takes its first second for echo. That race belongs to the
/// turn-taking tests, not to these.
fn one_question(dir: &Path) -> PathBuf {
    let hello = wav::read(HELLO).expect("test audio");
    let mono = hello.to_mono();
    let frame = hello.sample_rate as usize / 100;
    let loud: Vec<bool> = mono.chunks(frame).map(|c| rms_db(c) > -45.0).collect();
    let first = loud
        .iter()
        .position(|&l| l)
        .expect("the question has speech");
    // The first 200 ms of silence after the greeting, then the next word.
    let pause = (first..loud.len())
        .find(|&i| loud[i..].iter().take(20).all(|&l| !l))
        .expect("a pause after the greeting");
    let second = pause
        + loud[pause..]
            .iter()
            .position(|&l| l)
            .expect("a second sentence");
    let mut samples = vec![0_i16; hello.sample_rate as usize / 2];
    samples.extend_from_slice(&mono[(second - 5) * frame..]);
    let path = dir.join("one-question.wav");
    let question = Wav {
        samples,
        sample_rate: hello.sample_rate,
        channels: 1,
    };
    wav::write(&path, &question).expect("wav");
    path
}

/// The log's most repeated line (timestamps cut off) and how often it came.
fn most_repeated(log: &str) -> (usize, String) {
    let mut counts = std::collections::HashMap::<String, usize>::new();
    for line in log.lines() {
        // tracing's lines start with a timestamp; what follows is the message.
        let message = line.split_once(' ').map_or(line, |(_, rest)| rest);
        *counts.entry(message.to_owned()).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(line, n)| (n, line))
        .max()
        .unwrap_or_default()
}

fn rms_db(samples: &[i16]) -> f64 {
    let energy: f64 = samples
        .iter()
        .map(|&s| (f64::from(s) / 32_768.0).powi(2))
        .sum();
    10.0 * (energy / samples.len().max(1) as f64 + 1e-12).log10()
}

#[test]
fn a_spoken_question_is_answered_aloud_and_the_bots_own_echo_interrupts_nothing() {
    let server = SoundServer::start("answer");
    let recording = server.dir.join("speaker.wav");
    let mut recorder = server
        .command("parecord")
        .args([
            "--device=spk.monitor",
            "--rate=16000",
            "--channels=1",
            "--file-format=wav",
        ])
        .arg(&recording)
        .spawn()
        .expect("parecord");
    let mut bot = Bot::start(&server, "cancel");
    server.say(&one_question(&server.dir));
    // On a loaded machine the VAD may cut the question in two and the first half gets an
    // answer of its own, too short for an echo report: wait for an answer to the words that
    // hold the question (whatever the model makes of them, in whatever language), and for all
    // of that answer to have played out: a slow model pauses between its sentences, and the
    // canceller reports only once the bot has been audible for a while.
    bot.wait_for(90, |e| {
        e.iter()
            .skip_while(|x| {
                !(x["type"] == "user_transcription"
                    && x["final"] == true
                    && x["text"]
                        .as_str()
                        .is_some_and(|t| t.to_lowercase().contains("weather")))
            })
            .skip_while(|x| x["type"] != "llm_stopped")
            .any(|x| x["type"] == "bot_stopped_speaking")
    });
    // Let the whole answer play out.
    let started = Instant::now();
    loop {
        if !speaking(&bot.events()) || started.elapsed() > Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let events = bot.events();
    let log = bot.stop();
    interrupt(&mut recorder);
    eprintln!("{}", summary(&events));

    let heard: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "user_transcription" && e["final"] == true)
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(
        heard.iter().any(|t| t.to_lowercase().contains("weather")),
        "{heard:?}\n{}",
        summary(&events)
    );
    assert!(has(&events, "bot_text"), "{}", summary(&events));
    // The bot's voice came back through the loopback at full level and was cancelled.
    assert_eq!(
        interruptions_while_speaking(&events),
        0,
        "{}",
        summary(&events)
    );
    let reports = echo_reports(&events);
    eprintln!("echo canceller (seconds, input dB, output dB): {reports:?}");
    assert!(!reports.is_empty(), "no echo canceller report");
    let (seconds, input, output) = reports.iter().fold((0.0, 0.0, 0.0), |a, r| {
        (a.0 + r.0, a.1 + r.0 * r.1, a.2 + r.0 * r.2)
    });
    let suppression = (input - output) / seconds;
    eprintln!("echo suppressed by {suppression:.1} dB on average over {seconds:.1} s");
    assert!(suppression > 20.0, "{reports:?}");
    // The answer is audible on the speaker.
    let spoken = wav::read(&recording)
        .expect("the speaker's recording")
        .to_mono();
    let loudest = spoken
        .chunks(1_600)
        .map(rms_db)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(
        loudest > -40.0,
        "the speaker stayed silent ({loudest:.1} dBFS)"
    );
    // The conversation was recorded, the microphone on the left.
    let recorded: Vec<PathBuf> = std::fs::read_dir(server.dir.join("recording"))
        .expect("the recording's folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let audio = recorded
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "wav"))
        .unwrap_or_else(|| panic!("no recording: {recorded:?}"));
    assert!(
        recorded
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "json")),
        "no journal beside the recording: {recorded:?}"
    );
    let audio = wav::read(audio).expect("the recording");
    assert_eq!(audio.channels, 2);
    let microphone: Vec<i16> = audio.samples.iter().step_by(2).copied().collect();
    let loudest_heard = microphone
        .chunks(1_600)
        .map(rms_db)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(
        loudest_heard > -30.0,
        "the question is not in the recording ({loudest_heard:.1} dBFS)"
    );
    // No line repeats more than a few times: a device error per callback would.
    let (n, line) = most_repeated(&log);
    assert!(n <= 5, "{n} times: {line}\n{log}");
}

#[test]
fn without_the_canceller_the_bots_own_echo_interrupts_it() {
    let server = SoundServer::start("off");
    let mut bot = Bot::start(&server, "off");
    server.say(Path::new(HELLO));
    let events = bot.wait_for(90, |e| interruptions_while_speaking(e) > 0);
    bot.stop();
    assert!(
        interruptions_while_speaking(&events) >= 1,
        "{}",
        summary(&events)
    );
}

#[test]
fn the_user_talking_over_the_bot_through_the_echo_still_interrupts_it() {
    let server = SoundServer::start("barge");
    let mut bot = Bot::start(&server, "cancel");
    let over = question_now(&server.dir);
    let question = one_question(&server.dir);
    server.say(&question);
    // The bot's answers vary in length: the user talks over the next one that is still going
    // when their voice can be played (a short "Bonjour." may end first; then they ask again).
    // Under load the canceller may also take a phrase over the bot whole for echo: that is
    // retried too, a few times, as a user would repeat themselves.
    let mut starts = 0;
    for _ in 0..6 {
        let events = bot.wait_for(90, |e| count(e, "bot_started_speaking") > starts);
        starts = count(&events, "bot_started_speaking");
        assert_eq!(
            interruptions_while_speaking(&events),
            0,
            "the bot's echo interrupted it: {}",
            summary(&events)
        );
        if !speaking(&events) {
            // Done before the user could start: wait for any answer in the making, then ask.
            eprintln!("an answer too short to talk over");
            std::thread::sleep(Duration::from_millis(1_500));
            if !speaking(&bot.events()) {
                server.say(&question);
            }
            continue;
        }
        let spoke_at = last_t(&events, "bot_started_speaking");
        server.say(&over);
        // The phrase has played; give the VAD and the log a moment.
        std::thread::sleep(Duration::from_millis(1_000));
        let events = bot.events();
        if interruptions_while_speaking(&events) > 0 {
            eprintln!("{}", summary(&events));
            bot.stop();
            return;
        }
        let heard = first_t_after(&events, "user_started_speaking", spoke_at);
        let finished = first_t_after(&events, "bot_stopped_speaking", spoke_at);
        // Heard while the bot still spoke, and not interrupted: that is the failure.
        assert!(
            heard.is_none_or(|h| finished.is_some_and(|f| h >= f)),
            "the user talked over the bot and did not interrupt it: {}",
            summary(&events)
        );
        // Otherwise the bot finished first, or the canceller took the phrase for echo. A phrase
        // heard after the answer asks for one; one not heard at all does not, so the user asks
        // again once the bot is done.
        eprintln!(
            "attempt without an interruption (heard at {heard:?}, the bot done at {finished:?})"
        );
        if heard.is_none() {
            bot.wait_for(90, |e| !speaking(e));
            server.say(&question);
        }
    }
    panic!(
        "the bot never spoke long enough to be talked over: {}",
        summary(&bot.events())
    );
}

/// Whether the bot is speaking as of the last event.
fn speaking(events: &[Value]) -> bool {
    count(events, "bot_started_speaking") > count(events, "bot_stopped_speaking")
}

/// When the last event of `kind` came.
fn last_t(events: &[Value], kind: &str) -> u64 {
    events
        .iter()
        .rev()
        .find(|e| e["type"] == kind)
        .and_then(|e| e["t_ms"].as_u64())
        .unwrap_or(0)
}

/// When the first event of `kind` at or after `t` came.
fn first_t_after(events: &[Value], kind: &str, t: u64) -> Option<u64> {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .filter_map(|e| e["t_ms"].as_u64())
        .find(|&at| at >= t)
}

#[test]
fn a_sound_server_that_goes_away_ends_the_session_cleanly() {
    let mut server = SoundServer::start("gone");
    let mut bot = Bot::start(&server, "cancel");
    // The sound server dies under the running bot.
    let _ = server.daemon.kill();
    let _ = server.daemon.wait();
    let events = bot.wait_for(30, |e| has(e, "session_ended"));
    let ended = events
        .iter()
        .find(|e| e["type"] == "session_ended")
        .expect("session_ended");
    assert_eq!(
        ended["reason"]["kind"],
        "device_lost",
        "{}",
        summary(&events)
    );
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "error" && e["fatal"] == true),
        "{}",
        summary(&events)
    );
    // The process ends by itself, successfully.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Ok(Some(status)) = bot.child.try_wait() {
            break status;
        }
        assert!(Instant::now() < deadline, "voxide local did not exit");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}: {}", bot.log_text());
}
