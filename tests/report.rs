//! `voxide report` in a real browser: a recorded session's page, screenshot by headless
//! Chromium, shows both voices where they spoke, every kind of work as a bar, and nothing cut
//! off. Needs Chromium (`scripts/setup.sh --test`).

use std::path::Path;
use std::process::Command;

use voxide::audio::wav::{self, Wav};
use voxide::observe::journal::{Interval, Journal, LlmStep, Step, ToolCall, Turn};

const RATE: u32 = 16_000;

fn span(start_ms: u64, end_ms: u64) -> Interval {
    Interval {
        start_ms,
        end_ms: Some(end_ms),
    }
}

/// Ten seconds: the user asks from 1 s to 2 s, the bot answers from 3 s to 4 s after a tool
/// call, the user cuts in at 6 s over the second answer.
fn session() -> (Journal, Wav) {
    let turns = vec![
        Turn {
            index: 0,
            user: Some(span(1_000, 2_300)),
            user_text: vec!["Book a table for two.".into()],
            stt: Some(Step {
                at_ms: 2_200,
                processor: "SttService#2".into(),
                ttfb_ms: Some(200.0),
                ..Step::default()
            }),
            turn_wait_ms: Some(300.0),
            llm: vec![LlmStep {
                span: Some(span(2_300, 2_700)),
                ttfb_ms: Some(150.0),
                model: Some("m".into()),
                ..LlmStep::default()
            }],
            tools: vec![ToolCall {
                id: "c1".into(),
                name: "book".into(),
                span: span(2_400, 2_800),
                arguments: None,
                result: None,
                intermediate_ms: Vec::new(),
                cancelled: None,
            }],
            tts: vec![Step {
                at_ms: 3_000,
                processor: "TtsService#5".into(),
                ttfb_ms: Some(120.0),
                ..Step::default()
            }],
            bot: Some(span(3_000, 4_000)),
            bot_text: vec!["Booked.".into()],
            voice_to_voice_ms: Some(1_000.0),
            ..Turn::default()
        },
        Turn {
            index: 1,
            user: Some(span(5_000, 6_500)),
            user_text: vec!["Wait, make it three.".into()],
            bot: Some(span(5_500, 6_000)),
            interrupted_ms: Some(6_000),
            ..Turn::default()
        },
    ];
    let journal = Journal {
        session: "ws-report".into(),
        transport: "websocket".into(),
        turns,
        audio: Some("ws-report.wav".into()),
        ..Journal::default()
    };
    let mut samples = vec![0i16; 2 * 10 * RATE as usize];
    let mut tone = |channel: usize, from_s: f64, to_s: f64| {
        for i in (from_s * f64::from(RATE)) as usize..(to_s * f64::from(RATE)) as usize {
            samples[2 * i + channel] = if i % 8 < 4 { 12_000 } else { -12_000 };
        }
    };
    tone(0, 1.0, 2.0);
    tone(1, 3.0, 4.0);
    let audio = Wav {
        samples,
        sample_rate: RATE,
        channels: 2,
    };
    (journal, audio)
}

/// The screenshot's pixels, RGB.
fn screenshot(page: &Path, out: &Path) -> (usize, usize, Vec<u8>) {
    let profile = out.with_extension("profile");
    let status = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--window-size=1300,1300",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", out.display()))
        .arg(format!("file://{}", page.display()))
        .status()
        .expect("chromium runs (scripts/setup.sh --test installs it)");
    assert!(status.success());
    let _ = std::fs::remove_dir_all(&profile);
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(out).expect("the screenshot"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buffer = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buffer).expect("a frame");
    let channels = info.color_type.samples();
    let rgb = buffer[..info.buffer_size()]
        .chunks(channels)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect();
    (info.width as usize, info.height as usize, rgb)
}

/// The (x, y) of each pixel within a few levels of `color`.
fn pixels_of(width: usize, rgb: &[u8], color: [u8; 3]) -> Vec<(usize, usize)> {
    rgb.chunks(3)
        .enumerate()
        .filter(|(_, p)| {
            p.iter()
                .zip(color)
                .all(|(a, b)| (i16::from(*a) - i16::from(b)).abs() <= 8)
        })
        .map(|(i, _)| (i % width, i / width))
        .collect()
}

/// A waveform's extent, left to right: on the row where it is widest (its middle line, filled
/// wherever there was sound).
fn waveform_extent(pixels: &[(usize, usize)]) -> (usize, usize) {
    let mut rows = std::collections::BTreeMap::<usize, Vec<usize>>::new();
    for &(x, y) in pixels {
        rows.entry(y).or_default().push(x);
    }
    let middle = rows
        .values()
        .max_by_key(|xs| xs.len())
        .expect("the waveform");
    (
        *middle.iter().min().expect("a pixel"),
        *middle.iter().max().expect("a pixel"),
    )
}

#[test]
fn a_sessions_page_draws_both_voices_where_they_spoke_and_every_kind_of_work() {
    let dir = std::env::temp_dir().join(format!("voxide-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder");
    let (journal, audio) = session();
    let transcript = dir.join("ws-report.json");
    std::fs::write(&transcript, serde_json::to_vec(&journal).expect("json")).expect("write");
    wav::write(dir.join("ws-report.wav"), &audio).expect("write");

    let made = Command::new(env!("CARGO_BIN_EXE_voxide"))
        .arg("report")
        .arg(&transcript)
        .output()
        .expect("voxide report runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let page = dir.join("ws-report.html");
    assert_eq!(
        String::from_utf8_lossy(&made.stdout).trim(),
        page.display().to_string()
    );

    let (width, _, rgb) = screenshot(&page, &dir.join("shot.png"));
    // Each kind of work is drawn, as bars well beyond the legend's swatches (100 pixels).
    for (what, color) in [
        ("user", [0x25, 0x63, 0xeb]),
        ("turn end and STT", [0x7c, 0x3a, 0xed]),
        ("LLM", [0x05, 0x96, 0x69]),
        ("tool", [0xdb, 0x27, 0x77]),
        ("voice", [0xea, 0x58, 0x0c]),
        ("bot", [0xd9, 0x77, 0x06]),
    ] {
        let pixels = pixels_of(width, &rgb, color).len();
        assert!(pixels > 300, "{what}: {pixels} pixels");
    }
    // The waveforms (drawn at 80 %): the bot's begins as far after the user's start as the
    // audio says (3 s against 1 s to 2 s).
    let (user_start, user_end) = waveform_extent(&pixels_of(width, &rgb, [0x51, 0x82, 0xef]));
    let (bot_start, _) = waveform_extent(&pixels_of(width, &rgb, [0xe0, 0x92, 0x38]));
    let ratio = (bot_start - user_start) as f64 / (user_end - user_start) as f64;
    assert!(
        (ratio - 2.0).abs() < 0.1,
        "the bot starts at {ratio:.2} user-lengths"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
