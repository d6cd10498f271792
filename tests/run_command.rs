//! `voxide run` end to end: a recorded question in, the bot's spoken answer and the event log
//! out. Needs the models (`scripts/setup.sh`).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const HELLO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav");

fn voxide() -> Command {
    Command::new(env!("CARGO_BIN_EXE_voxide"))
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("voxide-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("events file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

fn first(events: &[Value], kind: &str) -> Option<u64> {
    events
        .iter()
        .find(|e| e["type"] == kind)
        .and_then(|e| e["t_ms"].as_u64())
}

#[test]
fn a_recorded_question_gets_a_spoken_answer_and_an_event_log() {
    let (out, log) = (temp("answer.wav"), temp("events.jsonl"));
    let result = voxide()
        .args([
            "run",
            "--voice",
            "espeak",
            "--max-tail-secs",
            "20",
            "--input",
            HELLO,
        ])
        .arg("--output")
        .arg(&out)
        .arg("--events")
        .arg(&log)
        .output()
        .expect("voxide runs");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    let summary: Value = serde_json::from_slice(&result.stdout).expect("a JSON summary");

    let events = events(&log);
    let times: Vec<u64> = events.iter().filter_map(|e| e["t_ms"].as_u64()).collect();
    assert_eq!(times.len(), events.len(), "every event has t_ms");
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "ordered: {times:?}");
    let started = first(&events, "user_started_speaking").expect("the user was heard");
    let stopped = first(&events, "user_stopped_speaking").expect("the turn ended");
    let bot = first(&events, "bot_started_speaking").expect("the bot answered");
    // The speech in the file runs from 1.0 s to about 4.2 s.
    assert!((1000..2000).contains(&started), "{started}");
    assert!((4000..7000).contains(&stopped), "{stopped}");
    assert!(bot > stopped);
    assert!(events.iter().any(|e| e["type"] == "user_transcription"
        && e["final"] == true
        && e["text"].as_str().is_some_and(|t| t.contains("weather"))));
    assert!(events.iter().any(|e| e["type"] == "bot_text"));
    assert!(first(&events, "bot_stopped_speaking").is_some_and(|t| t > bot));
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "metrics" && e["data"][0]["type"] == "voice_to_voice")
    );
    assert_eq!(
        events.last().map(|e| e["type"].clone()),
        Some("session_ended".into())
    );
    assert!(
        summary["voice_to_voice_ms"][0]
            .as_f64()
            .is_some_and(|ms| ms > 0.0)
    );

    // The answer is time-aligned: silent while the user speaks, speech after.
    let wav = voxide::audio::wav::read(&out).expect("a WAV");
    let rate = wav.sample_rate as usize;
    let samples = wav.to_mono();
    assert!(
        samples.len() as f64 / rate as f64 >= 5.0,
        "at least as long as the input"
    );
    let user_part = &samples[..rate * stopped as usize / 1000];
    assert!(
        user_part.iter().all(|&s| s == 0),
        "no bot audio while the user spoke"
    );
    let from = rate * bot as usize / 1000;
    let answer = &samples[from.min(samples.len())..];
    assert!(
        answer.iter().any(|s| s.unsigned_abs() > 1000),
        "the answer is audible"
    );
}

#[test]
fn a_missing_or_broken_input_is_a_clear_error() {
    let out = temp("never.wav");
    let missing = voxide()
        .args(["run", "--input", "/nonexistent.wav", "--output"])
        .arg(&out)
        .output()
        .expect("voxide runs");
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("/nonexistent.wav"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let garbage = temp("garbage.wav");
    std::fs::write(&garbage, b"RIFF\x10\x00\x00\x00WAVEjunkjunk").expect("write");
    let broken = voxide()
        .args(["run", "--input"])
        .arg(&garbage)
        .arg("--output")
        .arg(&out)
        .output()
        .expect("voxide runs");
    assert!(!broken.status.success());
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(stderr.contains("cannot read the input"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn local_names_a_missing_audio_device_instead_of_panicking() {
    let result = voxide()
        .args(["local", "--input-device", "no-such-device-xyz"])
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("voxide runs");
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains("no audio input device named \"no-such-device-xyz\""),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn check_says_a_bot_file_is_fine_or_names_the_key_and_the_file() {
    let good = temp("desk.toml");
    std::fs::write(
        &good,
        "greeting = \"Hello.\"\nbuiltin = [\"clock\"]\n\n[[tool]]\nname = \"lookup\"\n\
         description = \"Looks up.\"\nurl = \"http://127.0.0.1:9/lookup\"\n",
    )
    .expect("a bot file");
    let result = voxide()
        .arg("check")
        .arg("--bot")
        .arg(&good)
        .output()
        .expect("voxide runs");
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(
        stdout.contains("bot \"desk\"") && stdout.contains("1 HTTP tools"),
        "{stdout}"
    );

    let typo = temp("typo.toml");
    std::fs::write(
        &typo,
        "greeting = \"Hello.\"\ninstructoins = \"Be brief.\"\n",
    )
    .expect("a bot file");
    let result = voxide()
        .arg("check")
        .arg("--bot")
        .arg(&typo)
        .output()
        .expect("voxide runs");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success());
    assert!(
        stderr.contains("typo.toml") && stderr.contains("instructoins"),
        "{stderr}"
    );
}

#[test]
fn serve_on_a_public_address_without_a_token_says_so_and_names_the_flag() {
    use std::io::{BufRead, BufReader};
    let mut child = voxide()
        .args([
            "serve", "--host", "0.0.0.0", "--port", "0", "--voice", "espeak",
        ])
        .env_remove("VOXIDE_AUTH_TOKEN")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("voxide serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut warned = None;
    for line in BufReader::new(stderr).lines().take(20) {
        let line = line.expect("a line");
        if line.contains("without --auth-token") {
            warned = Some(line);
            break;
        }
        if line.contains("voxide serve: http://") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let warned = warned.expect("a warning before it serves");
    assert!(warned.contains("VOXIDE_AUTH_TOKEN"), "{warned}");
}
