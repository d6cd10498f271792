//! The run's files: `summary.json`, `turns.csv`, `sessions.csv`, `timeline.jsonl` and
//! `report.html` (one file, inline SVG: the v2v CDF, v2v over the run with the sessions live
//! overlaid, a swimlane per session, and the errors).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::Summary;
use super::session::SessionResult;

/// Writes every file into `dir`.
pub fn write(
    dir: &Path,
    summary: &Summary,
    results: &[SessionResult],
    mut timeline: Vec<Value>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_string_pretty(summary).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("summary.json"), json + "\n")?;

    let mut turns = String::from(
        "session,turn,audio,speech_end_ms,onset_ms,v2v_ms,reply_end_ms,barge_in_stop_ms,transcript,word_errors,reference_words,error\n",
    );
    let mut sessions = String::from(
        "session,started_ms,connect_ms,first_audio_ms,turns,failed_turns,error,trace_id\n",
    );
    let ms = |v: Option<f64>| v.map_or(String::new(), |v| format!("{:.1}", v * 1000.0));
    for result in results {
        for turn in &result.turns {
            let _ = writeln!(
                turns,
                "{},{},{},{},{},{},{},{},{},{},{},{}",
                turn.session,
                turn.turn,
                csv(&turn.audio),
                ms(Some(turn.speech_end)),
                ms(turn.onset),
                turn.v2v_ms().map_or(String::new(), |v| format!("{v:.1}")),
                ms(turn.reply_end),
                turn.barge_in_stop_ms
                    .map_or(String::new(), |v| format!("{v:.1}")),
                csv(turn.transcript.as_deref().unwrap_or_default()),
                turn.word_errors
                    .map_or(String::new(), |(e, _)| e.to_string()),
                turn.word_errors
                    .map_or(String::new(), |(_, w)| w.to_string()),
                turn.error.as_deref().unwrap_or_default()
            );
        }
        let _ = writeln!(
            sessions,
            "{},{},{},{},{},{},{},{}",
            result.session,
            ms(Some(result.started)),
            ms(result.connected.map(|c| c - result.started)),
            ms(result.connected.zip(result.first_audio).map(|(c, f)| f - c)),
            result.turns.len(),
            result.turns.iter().filter(|t| t.error.is_some()).count(),
            result.error.as_deref().unwrap_or_default(),
            result.trace_id
        );
    }
    std::fs::write(dir.join("turns.csv"), turns)?;
    std::fs::write(dir.join("sessions.csv"), sessions)?;

    timeline.sort_by(|a, b| {
        a["t_ms"]
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&b["t_ms"].as_f64().unwrap_or(0.0))
    });
    let mut lines = String::new();
    for event in &timeline {
        lines.push_str(&event.to_string());
        lines.push('\n');
    }
    std::fs::write(dir.join("timeline.jsonl"), lines)?;
    std::fs::write(dir.join("report.html"), html(summary, results))?;
    Ok(())
}

fn csv(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

const W: f64 = 640.0;
const H: f64 = 220.0;
const PAD: f64 = 40.0;

/// An SVG plot frame with axes labelled `x` and `y` and their ranges.
fn frame(title: &str, x: &str, y: &str, x_max: f64, y_max: f64, body: &str) -> String {
    format!(
        "<figure><figcaption>{title}</figcaption><svg viewBox=\"0 0 {w} {h}\" role=\"img\">\
         <line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" class=\"axis\"/>\
         <line x1=\"{PAD}\" y1=\"10\" x2=\"{PAD}\" y2=\"{b}\" class=\"axis\"/>\
         <text x=\"{r}\" y=\"{lb}\" text-anchor=\"end\">{x} (max {x_max:.0})</text>\
         <text x=\"4\" y=\"14\">{y} (max {y_max:.0})</text>{body}</svg></figure>",
        w = W + PAD,
        h = H + PAD,
        b = H,
        r = W + PAD - 10.0,
        lb = H + 28.0,
    )
}

fn html(summary: &Summary, results: &[SessionResult]) -> String {
    let mut v2v: Vec<f64> = results
        .iter()
        .flat_map(|r| r.turns.iter().filter_map(|t| t.v2v_ms()))
        .collect();
    v2v.sort_by(f64::total_cmp);
    let v_max = v2v.last().copied().unwrap_or(1.0).max(1.0);
    let end = results
        .iter()
        .flat_map(|r| r.turns.iter().filter_map(|t| t.reply_end.or(t.onset)))
        .fold(1.0f64, f64::max);
    let cdf = cdf_figure(&v2v, v_max);
    let over_time = over_time_figure(results, end, v_max);
    let swimlanes = swimlanes_figure(results, end);
    let (rows, verdicts, errors) = tables(summary);
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>voxide loadtest</title>\
<style>body{{font:14px system-ui,sans-serif;margin:24px auto;max-width:760px;color:#222}}\
table{{border-collapse:collapse}}td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}}\
td:first-child,th:first-child{{text-align:left}}figure{{margin:20px 0}}figcaption{{font-weight:600;margin-bottom:4px}}\
svg{{width:100%;background:#fafafa}}text{{font-size:11px;fill:#555}}.small{{font-size:9px}}\
.axis{{stroke:#888}}.line{{fill:none;stroke:#2563eb;stroke-width:2}}.live{{fill:none;stroke:#aaa;stroke-width:1.5}}\
.dot{{fill:#2563eb}}.connect{{fill:#bbb}}.user{{fill:#60a5fa}}.bot{{fill:#34d399}}.err{{fill:#dc2626}}\
.pass{{color:#15803d}}.fail{{color:#dc2626;font-weight:600}}</style></head><body>\
<h1>voxide loadtest</h1><p>{target} over {protocol}: {started} sessions started, {connected} connected, \
{completed} completed, {failed} failed; {turns} turns in {wall:.0} s. Verdict: <b>{verdict:?}</b>.</p>\
<table><tr><th>metric (ms)</th><th>p50</th><th>p90</th><th>p95</th><th>p99</th><th>max</th><th>n</th></tr>{rows}</table>\
<h2>SLOs</h2><ul>{verdicts}</ul><h2>Errors</h2><ul>{errors}</ul>{cdf}{over_time}{swimlanes}</body></html>\n",
        target = escape(&summary.target),
        protocol = format!("{:?}", summary.protocol).to_lowercase(),
        started = summary.sessions.started,
        connected = summary.sessions.connected,
        completed = summary.sessions.completed,
        failed = summary.sessions.failed,
        turns = summary.turns,
        wall = summary.wall_s,
        verdict = summary.verdict,
    )
}

fn x(v: f64, max: f64) -> f64 {
    PAD + (W - PAD - 10.0) * v / max.max(1e-9)
}

fn y(v: f64, max: f64) -> f64 {
    H - (H - 10.0) * v / max.max(1e-9)
}

/// The CDF of v2v.
fn cdf_figure(v2v: &[f64], v_max: f64) -> String {
    let points: Vec<String> = v2v
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                "{:.1},{:.1}",
                x(*v, v_max),
                y((i + 1) as f64, v2v.len() as f64)
            )
        })
        .collect();
    frame(
        "Voice-to-voice latency, cumulative",
        "v2v ms",
        "share of turns",
        v_max,
        100.0,
        &format!("<polyline points=\"{}\" class=\"line\"/>", points.join(" ")),
    )
}

/// v2v over the run, and the sessions live.
fn over_time_figure(results: &[SessionResult], end: f64, v_max: f64) -> String {
    let dots: String = results
        .iter()
        .flat_map(|r| r.turns.iter())
        .filter_map(|t| t.v2v_ms().map(|v| (t.speech_end, v)))
        .map(|(t, v)| {
            format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" class=\"dot\"/>",
                x(t, end),
                y(v, v_max)
            )
        })
        .collect();
    let mut edges: Vec<(f64, i32)> = Vec::new();
    for r in results {
        edges.push((r.started, 1));
        let last = r
            .turns
            .iter()
            .filter_map(|t| t.reply_end.or(t.onset))
            .fold(r.started, f64::max);
        edges.push((last, -1));
    }
    edges.sort_by(|a, b| a.0.total_cmp(&b.0));
    let most = results.len().max(1) as f64;
    let mut live = 0i32;
    let mut steps = vec![format!("{:.1},{:.1}", x(0.0, end), y(0.0, most))];
    for (t, d) in edges {
        steps.push(format!("{:.1},{:.1}", x(t, end), y(f64::from(live), most)));
        live += d;
        steps.push(format!("{:.1},{:.1}", x(t, end), y(f64::from(live), most)));
    }
    frame(
        "v2v over the run (dots, ms) with the sessions live (line)",
        "run seconds",
        "v2v ms",
        end,
        v_max,
        &format!(
            "<polyline points=\"{}\" class=\"live\"/>{dots}",
            steps.join(" ")
        ),
    )
}

/// A swimlane per session: connecting, each user turn, each reply.
fn swimlanes_figure(results: &[SessionResult], end: f64) -> String {
    let lane = 14.0;
    let lanes_h = lane * results.len() as f64 + 40.0;
    let sx = |t: f64| PAD + (W - PAD - 10.0) * t / end;
    let mut swim = String::new();
    for (i, r) in results.iter().enumerate() {
        let top = 10.0 + lane * i as f64;
        let _ = write!(
            swim,
            "<text x=\"2\" y=\"{:.1}\" class=\"small\">{}</text>",
            top + 10.0,
            r.session
        );
        if let Some(c) = r.connected {
            let _ = write!(
                swim,
                "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"10\" class=\"connect\"/>",
                sx(r.started),
                (sx(c) - sx(r.started)).max(1.0)
            );
        }
        for t in &r.turns {
            let _ = write!(
                swim,
                "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"10\" class=\"user\"/>",
                sx(t.user_start),
                (sx(t.speech_end) - sx(t.user_start)).max(1.0)
            );
            if let Some(o) = t.onset {
                let e = t.reply_end.unwrap_or(o + 0.5);
                let _ = write!(
                    swim,
                    "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"10\" class=\"bot\"/>",
                    sx(o),
                    (sx(e) - sx(o)).max(1.0)
                );
            }
            if t.error.is_some() {
                let _ = write!(
                    swim,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" class=\"err\"/>",
                    sx(t.speech_end),
                    top + 5.0
                );
            }
        }
    }
    format!(
        "<figure><figcaption>Sessions: connecting (grey), the user speaking (blue), \
         the bot's reply (green), errors (red)</figcaption><svg viewBox=\"0 0 {} {lanes_h:.0}\">{swim}</svg></figure>",
        W + PAD
    )
}

/// The metrics' rows, the SLOs' verdicts and the errors, as HTML.
fn tables(summary: &Summary) -> (String, String, String) {
    let mut rows = String::new();
    for (name, d) in &summary.metrics {
        match d {
            Some(d) => {
                let _ = write!(
                    rows,
                    "<tr><td>{name}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td></tr>",
                    d.p50, d.p90, d.p95, d.p99, d.max, d.n
                );
            }
            None => {
                let _ = write!(
                    rows,
                    "<tr><td>{name}</td><td colspan=\"6\">no data</td></tr>"
                );
            }
        }
    }
    let mut verdicts = String::new();
    for slo in &summary.slos {
        let _ = write!(
            verdicts,
            "<li class=\"{}\">{} — {}</li>",
            if slo.pass { "pass" } else { "fail" },
            escape(&slo.slo),
            slo.value.map_or("no data".into(), |v| format!("{v:.1}"))
        );
    }
    let mut errors = String::new();
    for (kind, n) in &summary.errors {
        let _ = write!(errors, "<li>{}: {n}</li>", escape(kind));
    }
    if errors.is_empty() {
        errors.push_str("<li>none</li>");
    }
    (rows, verdicts, errors)
}
