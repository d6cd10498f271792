//! `voxide loadtest` against `voxide serve` on loopback: the bot's replies timed from the audio,
//! the files a run writes, and the exit status of an SLO that cannot hold and of a target that
//! is not there. Needs the models (`scripts/setup.sh`).

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod common;

use common::{HELLO, start};

/// Runs the `voxide loadtest` binary; its exit status and what it printed.
async fn loadtest(args: Vec<String>) -> (Option<i32>, String) {
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_voxide"))
            .arg("loadtest")
            .args(args)
            .output()
            .expect("the binary runs")
    })
    .await
    .expect("joined");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

mod whole_bot {
    use super::*;
    use voxide::loadtest::LoadtestOptions;
    use voxide::loadtest::impair::Impairment;

    /// One WebRTC caller asking `HELLO` `turns` times over `network`, hearing the bot's voice
    /// over `received`, sending RED as Chrome does when asked.
    fn webrtc_caller(
        server: &common::Server,
        turns: usize,
        network: Impairment,
        received: Impairment,
    ) -> LoadtestOptions {
        LoadtestOptions {
            target: format!("http://{}", server.addr),
            protocol: voxide::loadtest::Protocol::WebRtc,
            audio: vec![HELLO.into()],
            sessions: 1,
            concurrency: 1,
            turns,
            think: Duration::from_millis(200),
            barge_in_at: None,
            ramp: Duration::ZERO,
            stages: Vec::new(),
            seed: 5,
            response_timeout: Duration::from_secs(30),
            slos: Vec::new(),
            out: None,
            max_pacing_lag: Duration::from_secs(1),
            auth_token: None,
            room: None,
            network,
            received,
            red: 1,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_callers_over_the_websocket_are_timed_and_an_impossible_slo_fails_the_run() {
        let server = start(4).await;
        let out = std::env::temp_dir().join(format!("voxide-loadtest-{}", std::process::id()));
        let (code, table) = loadtest(
            [
                "--target",
                &format!("http://{}", server.addr),
                "--protocol",
                "ws",
                "--audio",
                HELLO,
                "--sessions",
                "2",
                "--slo",
                "p50(v2v)<1ms",
                "--max-pacing-lag-ms",
                "1000",
                "--out",
                out.to_str().expect("utf-8"),
            ]
            .map(str::to_owned)
            .to_vec(),
        )
        .await;
        assert_eq!(
            code,
            Some(1),
            "an SLO no bot can meet fails the run:\n{table}"
        );
        let summary: Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("summary.json")).expect("summary.json"),
        )
        .expect("JSON");
        assert_eq!(summary["schema"], 1);
        assert_eq!(summary["sessions"]["connected"], 2, "{summary}");
        assert_eq!(summary["turns"], 2);
        let v2v = &summary["metrics"]["v2v"];
        assert_eq!(v2v["n"], 2, "both turns were answered: {summary}");
        let p50 = v2v["p50"].as_f64().expect("a figure");
        assert!(p50 > 150.0, "the reply came after the question: {p50}");
        assert_eq!(summary["slos"][0]["pass"], false);
        for file in ["turns.csv", "sessions.csv", "timeline.jsonl", "report.html"] {
            assert!(out.join(file).exists(), "{file}");
        }
        let turns = std::fs::read_to_string(out.join("turns.csv")).expect("turns.csv");
        assert_eq!(
            turns.lines().count(),
            3,
            "a header and a line a turn:\n{turns}"
        );
        let timeline = std::fs::read_to_string(out.join("timeline.jsonl")).expect("timeline");
        assert!(timeline.contains("\"bot_audio_onset\""));
        assert!(
            timeline.contains("bot_started_speaking"),
            "the server's own events too"
        );
        let _ = std::fs::remove_dir_all(&out);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_webrtc_callers_get_bot_ready_and_their_replies_are_timed() {
        let server = start(4).await;
        let options = LoadtestOptions {
            sessions: 2,
            concurrency: 2,
            ramp: Duration::from_millis(500),
            ..webrtc_caller(&server, 1, Impairment::default(), Impairment::default())
        };
        let summary = voxide::loadtest::run(options).await.expect("runs");
        assert_eq!(summary.sessions.connected, 2, "{summary:?}");
        assert_eq!(summary.metrics["v2v"].map(|d| d.n), Some(2), "{summary:?}");
        assert_eq!(
            summary.nodes.get("test"),
            Some(&2),
            "the node that answered"
        );
        assert!(summary.trickle.refused.is_empty(), "{:?}", summary.trickle);
        let connect = summary.metrics["connect"].expect("connect times");
        assert!(
            connect.max < 15_000.0,
            "offer, ICE and bot-ready in time: {connect:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_that_reports_losing_the_bots_voice_gets_it_in_red_and_plays_holes_from_copies()
     {
        let server = start(2).await;
        let received = Impairment {
            loss: 0.10,
            seed: 3,
            ..Default::default()
        };
        let options = webrtc_caller(&server, 2, Impairment::default(), received);
        let summary = voxide::loadtest::run(options).await.expect("runs");
        assert_eq!(summary.metrics["v2v"].map(|d| d.n), Some(2), "{summary:?}");
        let seen = summary.network_seen.to_caller.expect("the callers counted");
        eprintln!("the bot's voice at the caller: {seen:?}");
        assert!(seen.lost > 0, "{seen:?}");
        // Once the caller's receiver reports tell the bot of the loss, its packets carry a
        // copy of the one before.
        assert!(seen.redundant > 0, "{seen:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_webrtc_caller_on_a_lossy_jittery_network_is_answered_and_the_bot_counts_the_damage()
    {
        let server = start(2).await;
        let network = Impairment {
            loss: 0.10,
            burst: 1.0,
            jitter: Duration::from_millis(30),
            reorder: 0.05,
            duplicate: 0.05,
            seed: 11,
        };
        let options = webrtc_caller(&server, 1, network, Impairment::default());
        let summary = voxide::loadtest::run(options).await.expect("runs");
        assert_eq!(summary.metrics["v2v"].map(|d| d.n), Some(1), "{summary:?}");
        assert!(summary.network.contains("10 % loss"), "{}", summary.network);
        // The session's last report lands in /metrics as it ends.
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..50 {
            let (_, metrics) = common::get(server.addr, "/metrics").await;
            counts = metrics
                .lines()
                .filter_map(|l| l.strip_prefix("voxide_webrtc_packets_total{outcome=\""))
                .filter_map(|l| l.split_once("\"} "))
                .map(|(k, v)| (k.to_owned(), v.parse::<u64>().unwrap_or(0)))
                .collect();
            if counts.get("received").copied().unwrap_or(0) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let count = |k: &str| counts.get(k).copied().unwrap_or(0);
        assert!(count("received") > 50, "{counts:?}");
        assert!(
            count("lost") > 0,
            "a tenth of the packets never came: {counts:?}"
        );
        // The caller sends RED, as Chrome does when the answer puts it first: a lost packet
        // plays from its copy in the next one.
        assert!(count("red") > 50, "{counts:?}");
        assert!(
            count("redundant") > 0,
            "losses are played from the copies in later packets: {counts:?}"
        );
        eprintln!("packets: {counts:?}");
        // Duplicates never reach it: SRTP's replay window drops them first, as in a browser.
        assert!(count("reordered") > 0, "{counts:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_twilio_caller_is_answered_in_mulaw() {
        let server = start(2).await;
        let options = voxide::loadtest::LoadtestOptions {
            target: format!("http://{}", server.addr),
            protocol: voxide::loadtest::Protocol::Twilio,
            audio: vec![HELLO.into()],
            sessions: 1,
            concurrency: 1,
            turns: 1,
            think: Duration::from_millis(200),
            barge_in_at: None,
            ramp: Duration::ZERO,
            stages: Vec::new(),
            seed: 3,
            response_timeout: Duration::from_secs(20),
            slos: vec![voxide::loadtest::stats::Slo::parse("p95(v2v)<15s").expect("valid")],
            out: None,
            max_pacing_lag: Duration::from_secs(1),
            auth_token: None,
            room: None,
            network: Default::default(),
            received: Default::default(),
            red: 1,
        };
        let summary = voxide::loadtest::run(options).await.expect("runs");
        assert_eq!(summary.sessions.completed, 1, "{summary:?}");
        assert_eq!(summary.metrics["v2v"].map(|d| d.n), Some(1));
        assert_eq!(summary.verdict.exit_code(), 0);
    }
}

#[tokio::test]
async fn a_target_that_is_not_there_exits_3_and_a_bad_slo_exits_2() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let target = format!("http://{closed}");
    let (code, table) = loadtest(
        ["--target", &target, "--audio", HELLO]
            .map(str::to_owned)
            .to_vec(),
    )
    .await;
    assert_eq!(code, Some(3), "{table}");
    assert!(table.contains("0 connected"), "{table}");
    let (code, _) = loadtest(
        ["--target", &target, "--audio", HELLO, "--slo", "fast(v2v)"]
            .map(str::to_owned)
            .to_vec(),
    )
    .await;
    assert_eq!(code, Some(2));
}

#[tokio::test]
async fn a_capacity_search_that_cannot_go_on_still_writes_what_it_found() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let out = std::env::temp_dir().join(format!("voxide-capacity-{}", std::process::id()));
    let args = [
        "--target",
        &format!("http://{closed}"),
        "--audio",
        HELLO,
        "--find-capacity",
        "8",
        "--slo",
        "p95(v2v)<2000ms",
        "--out",
        &out.display().to_string(),
    ];
    let (code, table) = loadtest(args.map(|a| a.to_owned()).to_vec()).await;
    assert_eq!(code, Some(3), "{table}");
    let capacity: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("capacity.json")).expect("capacity.json"),
    )
    .expect("JSON");
    assert_eq!(capacity["verdict"], "unreachable");
    assert_eq!(capacity["capacity"], Value::Null);
    assert_eq!(capacity["steps"].as_array().map(Vec::len), Some(1));
    let _ = std::fs::remove_dir_all(out);
}
