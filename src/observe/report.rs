//! One conversation as one self-contained HTML page: the two voices' waveforms on one
//! timeline, each turn's work as a waterfall under it, the words under that, and each turn's
//! voice-to-voice latency, so that "why was this slow" is answered by looking. Drawn as SVG
//! on the server: the page needs no script and no network.

use std::fmt::Write as _;

use super::journal::{Journal, Millis, Turn};
use crate::audio::wav::Wav;

/// Width of the drawing, in SVG units (it scales to the window).
const WIDTH: f64 = 1200.0;
/// Left margin for the row labels.
const LABEL: f64 = 110.0;
/// Height of one waveform.
const WAVE: f64 = 56.0;
/// Height of one waterfall row.
const ROW: f64 = 16.0;

/// The page for `journal`, with the waveforms from `audio` (the stereo recording: user left,
/// bot right) and, where `audio_href` is given, a player for it.
pub fn render(journal: &Journal, audio: Option<&Wav>, audio_href: Option<&str>) -> String {
    let end = session_end(journal, audio);
    let scale = Scale { end };
    let mut page = String::new();
    let title = format!("voxide session {}", journal.session);
    let _ = write!(
        page,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <style>{STYLE}</style></head><body><main>",
        escape(&title)
    );
    header(&mut page, journal, end);
    if let Some(href) = audio_href {
        let _ = write!(
            page,
            "<audio controls preload=\"none\" src=\"{}\"></audio>",
            escape(href)
        );
    }
    let _ = write!(
        page,
        "<figure><svg viewBox=\"0 0 {WIDTH} {}\" role=\"img\" aria-label=\"the conversation on a timeline\">",
        drawing_height(journal)
    );
    let mut y = 0.0;
    axis(&mut page, &scale, y);
    y += 22.0;
    if let Some(wav) = audio.filter(|w| w.channels == 2) {
        waveform(&mut page, &scale, wav, 0, ("user", "user"), y);
        y += WAVE + 6.0;
        waveform(&mut page, &scale, wav, 1, ("bot", "bot"), y);
        y += WAVE + 10.0;
    }
    for turn in &journal.turns {
        y = waterfall(&mut page, &scale, turn, y);
    }
    page.push_str("</svg><figcaption>");
    legend(&mut page);
    page.push_str("</figcaption></figure>");
    transcript(&mut page, journal);
    page.push_str("</main></body></html>\n");
    page
}

const STYLE: &str = "\
:root{--user:#2563eb;--bot:#d97706;--stt:#7c3aed;--llm:#059669;--tool:#db2777;--tts:#ea580c;\
--wait:#94a3b8;--ink:#0f172a;--muted:#64748b;--line:#e2e8f0}\
body{margin:0;font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:var(--ink);background:#f8fafc}\
main{max-width:1240px;margin:0 auto;padding:24px}\
h1{font-size:20px;margin:0 0 4px}.meta{color:var(--muted);margin:0 0 16px}\
.figures{display:flex;gap:12px;flex-wrap:wrap;margin:0 0 16px;padding:0;list-style:none}\
.figures li{background:#fff;border:1px solid var(--line);border-radius:8px;padding:8px 12px}\
.figures b{display:block;font-size:18px}.figures span{color:var(--muted);font-size:12px}\
audio{width:100%;margin:0 0 12px}\
figure{margin:0 0 20px;background:#fff;border:1px solid var(--line);border-radius:8px;padding:12px}\
svg{width:100%;height:auto;display:block}\
svg text{font:11px system-ui,sans-serif;fill:var(--ink)}svg .tick{fill:var(--muted)}\
figcaption{display:flex;gap:14px;flex-wrap:wrap;font-size:12px;color:var(--muted);margin-top:8px}\
figcaption i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}\
.turn{background:#fff;border:1px solid var(--line);border-radius:8px;padding:10px 14px;margin:0 0 10px}\
.turn h2{font-size:13px;margin:0 0 6px;color:var(--muted);font-weight:600}\
.turn p{margin:2px 0}.who{font-weight:600;margin-right:6px}.user .who{color:var(--user)}.bot .who{color:var(--bot)}\
.badge{display:inline-block;border-radius:999px;padding:0 8px;font-size:12px;margin-left:6px;background:#ecfdf5;color:#047857}\
.badge.slow{background:#fef2f2;color:#b91c1c}.badge.cut{background:#fff7ed;color:#c2410c}\
.errors{color:#b91c1c}";

struct Scale {
    end: Millis,
}

impl Scale {
    fn x(&self, t: Millis) -> f64 {
        LABEL + (t as f64 / self.end.max(1) as f64) * (WIDTH - LABEL - 10.0)
    }
}

fn session_end(journal: &Journal, audio: Option<&Wav>) -> Millis {
    let audio_ms = audio.map_or(0, |w| (w.seconds() * 1e3) as Millis);
    let turns = journal
        .turns
        .iter()
        .flat_map(|turn| {
            turn.user
                .iter()
                .chain(turn.bot.iter())
                .flat_map(|i| [Some(i.start_ms), i.end_ms])
                .flatten()
                .chain(turn.tools.iter().filter_map(|c| c.span.end_ms))
        })
        .max()
        .unwrap_or(0);
    let ended = journal.ended.as_ref().map_or(0, |e| e.at_ms);
    audio_ms.max(turns).max(ended).max(1_000)
}

fn drawing_height(journal: &Journal) -> f64 {
    let rows: usize = journal.turns.iter().map(rows).sum();
    22.0 + 2.0 * WAVE + 16.0 + rows as f64 * ROW + journal.turns.len() as f64 * 8.0 + 10.0
}

/// Waterfall rows a turn takes.
fn rows(turn: &Turn) -> usize {
    1 + usize::from(turn.user.is_some())
        + usize::from(turn.stt.is_some() || turn.turn_wait_ms.is_some())
        + turn.llm.len()
        + turn.tools.len()
        + usize::from(!turn.tts.is_empty())
        + usize::from(turn.bot.is_some())
}

fn header(page: &mut String, journal: &Journal, end: Millis) {
    let _ = write!(
        page,
        "<h1>Session {}</h1><p class=\"meta\">{} · {}{} · {:.1} s{}</p>",
        escape(&journal.session),
        escape(&journal.transport),
        journal
            .bot
            .as_deref()
            .map(|b| format!("bot {} · ", escape(b)))
            .unwrap_or_default(),
        journal.ended.as_ref().map_or_else(
            || "still running".to_owned(),
            |e| format!("ended: {}", escape(&e.reason))
        ),
        end as f64 / 1e3,
        journal
            .trace_id
            .as_deref()
            .map(|t| format!(" · trace {}", escape(t)))
            .unwrap_or_default(),
    );
    let mut v2v: Vec<f64> = journal
        .turns
        .iter()
        .filter_map(|t| t.voice_to_voice_ms)
        .collect();
    v2v.sort_by(f64::total_cmp);
    let interrupted = journal
        .turns
        .iter()
        .filter(|t| t.interrupted_ms.is_some())
        .count();
    let tools: usize = journal.turns.iter().map(|t| t.tools.len()).sum();
    page.push_str("<ul class=\"figures\">");
    let mut figure = |value: String, label: &str| {
        let _ = write!(page, "<li><b>{value}</b><span>{label}</span></li>");
    };
    figure(journal.turns.len().to_string(), "turns");
    if !v2v.is_empty() {
        figure(
            format!("{:.0} ms", percentile(&v2v, 0.5)),
            "voice-to-voice, median",
        );
        figure(
            format!("{:.0} ms", v2v[v2v.len() - 1]),
            "voice-to-voice, slowest",
        );
    }
    figure(interrupted.to_string(), "interrupted");
    figure(tools.to_string(), "tool calls");
    page.push_str("</ul>");
    if !journal.errors.is_empty() {
        page.push_str("<p class=\"errors\">");
        for error in &journal.errors {
            let _ = write!(
                page,
                "{:.2} s: {}<br>",
                error.at_ms as f64 / 1e3,
                escape(&error.message)
            );
        }
        page.push_str("</p>");
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

fn axis(page: &mut String, scale: &Scale, y: f64) {
    let step = [500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000]
        .into_iter()
        .find(|step| scale.end / step <= 12)
        .unwrap_or(600_000);
    let mut t = 0;
    while t <= scale.end {
        let x = scale.x(t);
        let _ = write!(
            page,
            "<line x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"2000\" stroke=\"#e2e8f0\"/>\
             <text class=\"tick\" x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            y + 14.0,
            y + 11.0,
            seconds_label(t)
        );
        t += step;
    }
}

fn seconds_label(t: Millis) -> String {
    if t.is_multiple_of(1_000) {
        format!("{} s", t / 1_000)
    } else {
        format!("{:.1} s", t as f64 / 1e3)
    }
}

/// One channel's envelope: the peak of each column, mirrored round the middle line.
fn waveform(
    page: &mut String,
    scale: &Scale,
    wav: &Wav,
    channel: usize,
    (label, class): (&str, &str),
    y: f64,
) {
    let frames = wav.samples.len() / 2;
    let columns = (WIDTH - LABEL - 10.0) as usize;
    let ms_per_frame = 1e3 / f64::from(wav.sample_rate);
    let mid = y + WAVE / 2.0;
    let mut top = String::new();
    let mut bottom = Vec::new();
    for column in 0..columns {
        let t0 = scale.end as f64 * column as f64 / columns as f64;
        let t1 = scale.end as f64 * (column + 1) as f64 / columns as f64;
        let (i0, i1) = (
            ((t0 / ms_per_frame) as usize).min(frames),
            ((t1 / ms_per_frame) as usize).min(frames),
        );
        let peak = wav.samples[i0 * 2..i1 * 2]
            .iter()
            .skip(channel)
            .step_by(2)
            .map(|s| s.unsigned_abs())
            .max()
            .unwrap_or(0);
        let h = (f64::from(peak) / 32768.0).sqrt() * (WAVE / 2.0 - 1.0);
        let x = LABEL + column as f64;
        let _ = write!(
            top,
            "{}{x:.0},{:.1}",
            if column == 0 { "M" } else { "L" },
            mid - h
        );
        bottom.push(format!("L{x:.0},{:.1}", mid + h));
    }
    bottom.reverse();
    let _ = write!(
        page,
        "<text x=\"4\" y=\"{:.1}\">{label}</text><path d=\"{top}{}Z\" fill=\"var(--{class})\" opacity=\"0.8\"/>",
        mid + 4.0,
        bottom.concat()
    );
}

/// A turn's rows; returns where the next turn starts.
fn waterfall(page: &mut String, scale: &Scale, turn: &Turn, mut y: f64) -> f64 {
    let title = match (turn.user.is_some(), turn.voice_to_voice_ms) {
        (false, _) => format!("turn {} (bot opens)", turn.index),
        (true, Some(v2v)) => format!("turn {} · {v2v:.0} ms", turn.index),
        (true, None) => format!("turn {}", turn.index),
    };
    let _ = write!(
        page,
        "<text x=\"4\" y=\"{:.1}\" font-weight=\"600\">{}</text>",
        y + 12.0,
        escape(&title)
    );
    y += ROW;
    let mut bar = |page: &mut String,
                   label: &str,
                   (start, end): (Millis, Millis),
                   color: &str,
                   note: String| {
        let (x0, x1) = (scale.x(start), scale.x(end.max(start)));
        let _ = write!(
            page,
            "<text x=\"14\" y=\"{:.1}\">{}</text><rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" rx=\"2\" fill=\"var(--{color})\"><title>{} {}</title></rect>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"tick\">{}</text>",
            y + 11.0,
            escape(label),
            y + 2.0,
            (x1 - x0).max(1.5),
            ROW - 4.0,
            escape(label),
            escape(&note),
            x1 + 4.0,
            y + 11.0,
            escape(&note)
        );
        y += ROW;
    };
    let end_of_turn = turn
        .bot
        .and_then(|b| b.end_ms)
        .or(turn.user.and_then(|u| u.end_ms))
        .unwrap_or(0);
    if let Some(user) = turn.user {
        let turn_end = user.end_ms.unwrap_or(user.start_ms);
        let wait = turn.turn_wait_ms.unwrap_or(0.0).round() as Millis;
        let speech_end = turn_end.saturating_sub(wait).max(user.start_ms);
        bar(
            page,
            "user speaks",
            (user.start_ms, speech_end),
            "user",
            String::new(),
        );
        if turn.stt.is_some() || turn.turn_wait_ms.is_some() {
            let stt_end = turn
                .stt
                .as_ref()
                .and_then(|s| s.ttfb_ms)
                .map_or(turn_end, |ms| speech_end + ms.round() as Millis);
            let note = format!(
                "turn wait {} · STT {}",
                ms_text(turn.turn_wait_ms),
                ms_text(turn.stt.as_ref().and_then(|s| s.ttfb_ms))
            );
            bar(
                page,
                "turn end · STT",
                (speech_end, stt_end.max(turn_end)),
                "stt",
                note,
            );
        }
    }
    for llm in &turn.llm {
        let Some(span) = llm.span else { continue };
        let note = format!(
            "{}first token {}{}",
            llm.model
                .as_deref()
                .map(|m| format!("{m} · "))
                .unwrap_or_default(),
            ms_text(llm.ttfb_ms),
            llm.usage
                .as_ref()
                .map(|u| format!(" · {} in / {} out", u.input, u.output))
                .unwrap_or_default()
        );
        bar(
            page,
            "LLM",
            (span.start_ms, span.end_ms.unwrap_or(end_of_turn)),
            "llm",
            note,
        );
    }
    for call in &turn.tools {
        let name = if call.name.is_empty() {
            "tool"
        } else {
            &call.name
        };
        let end = call.span.end_ms.unwrap_or(end_of_turn);
        let note = match &call.cancelled {
            Some(reason) => format!("cancelled ({reason})"),
            None => format!("{} ms", end.saturating_sub(call.span.start_ms)),
        };
        bar(page, name, (call.span.start_ms, end), "tool", note);
    }
    // The voice's first answer with a time to first audio (a usage report alone may come
    // before it).
    if let Some(first) = turn
        .tts
        .iter()
        .find(|s| s.ttfb_ms.is_some())
        .or(turn.tts.first())
    {
        let ttfb = first.ttfb_ms.unwrap_or(0.0).round() as Millis;
        let end = turn.bot.and_then(|b| b.end_ms).unwrap_or(first.at_ms);
        let note = format!("first audio {}", ms_text(first.ttfb_ms));
        bar(
            page,
            "voice",
            (first.at_ms.saturating_sub(ttfb), end),
            "tts",
            note,
        );
    }
    if let Some(bot) = turn.bot {
        let note = if turn.interrupted_ms.is_some() {
            "interrupted"
        } else {
            ""
        };
        bar(
            page,
            "bot speaks",
            (bot.start_ms, bot.end_ms.unwrap_or(bot.start_ms)),
            "bot",
            note.into(),
        );
    }
    if let Some(at) = turn.interrupted_ms {
        let x = scale.x(at);
        let _ = write!(
            page,
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{y:.1}\" stroke=\"#c2410c\" stroke-width=\"2\" stroke-dasharray=\"3 2\"><title>interrupted at {:.2} s</title></line>",
            y - rows(turn) as f64 * ROW,
            at as f64 / 1e3
        );
    }
    y + 8.0
}

fn ms_text(ms: Option<f64>) -> String {
    ms.map_or_else(|| "–".to_owned(), |ms| format!("{ms:.0} ms"))
}

fn legend(page: &mut String) {
    for (class, label) in [
        ("user", "user"),
        ("stt", "turn end and STT"),
        ("llm", "LLM"),
        ("tool", "tool call"),
        ("tts", "voice"),
        ("bot", "bot"),
    ] {
        let _ = write!(
            page,
            "<span><i style=\"background:var(--{class})\"></i>{label}</span>"
        );
    }
}

fn transcript(page: &mut String, journal: &Journal) {
    for turn in &journal.turns {
        let start = turn
            .user
            .map(|u| u.start_ms)
            .or(turn.bot.map(|b| b.start_ms))
            .unwrap_or(0);
        let _ = write!(
            page,
            "<section class=\"turn\"><h2>Turn {} · {:.1} s",
            turn.index,
            start as f64 / 1e3
        );
        if let Some(v2v) = turn.voice_to_voice_ms {
            let slow = if v2v > 1_500.0 { " slow" } else { "" };
            let _ = write!(
                page,
                "<span class=\"badge{slow}\">{v2v:.0} ms voice to voice</span>"
            );
        }
        if turn.interrupted_ms.is_some() {
            page.push_str("<span class=\"badge cut\">interrupted</span>");
        }
        page.push_str("</h2>");
        if turn.user.is_some() {
            let words = if turn.user_text.is_empty() {
                "(no words heard)".to_owned()
            } else {
                turn.user_text.join(" ")
            };
            let _ = write!(
                page,
                "<p class=\"user\"><span class=\"who\">User</span>{}</p>",
                escape(&words)
            );
        }
        for call in &turn.tools {
            let _ = write!(
                page,
                "<p><span class=\"who\">Tool</span>{}{}</p>",
                escape(if call.name.is_empty() {
                    "a call"
                } else {
                    &call.name
                }),
                call.arguments
                    .as_ref()
                    .map(|a| format!(" {}", escape(&a.to_string())))
                    .unwrap_or_default()
            );
        }
        if !turn.bot_text.is_empty() {
            let _ = write!(
                page,
                "<p class=\"bot\"><span class=\"who\">Bot</span>{}</p>",
                escape(&turn.bot_text.join(" "))
            );
        }
        page.push_str("</section>");
    }
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::journal::{Interval, LlmStep};

    fn journal() -> Journal {
        Journal {
            session: "ws-1".into(),
            transport: "websocket".into(),
            turns: vec![Turn {
                index: 0,
                user: Some(Interval {
                    start_ms: 500,
                    end_ms: Some(1_500),
                }),
                user_text: vec!["<script>alert(1)</script> what time is it?".into()],
                turn_wait_ms: Some(200.0),
                llm: vec![LlmStep {
                    span: Some(Interval {
                        start_ms: 1_550,
                        end_ms: Some(1_900),
                    }),
                    ttfb_ms: Some(180.0),
                    ..LlmStep::default()
                }],
                bot: Some(Interval {
                    start_ms: 2_100,
                    end_ms: Some(3_000),
                }),
                bot_text: vec!["It is noon.".into()],
                voice_to_voice_ms: Some(800.0),
                ..Turn::default()
            }],
            ..Journal::default()
        }
    }

    #[test]
    fn the_page_shows_each_turns_latency_and_words_and_escapes_what_was_said() {
        let stereo = Wav {
            samples: vec![0; 2 * 16_000 * 3],
            sample_rate: 16_000,
            channels: 2,
        };
        let page = render(&journal(), Some(&stereo), Some("ws-1.wav"));
        assert!(page.contains("800 ms voice to voice"));
        assert!(page.contains("It is noon."));
        assert!(page.contains("&lt;script&gt;"), "what a user says is text");
        assert!(!page.contains("<script>"));
        assert!(page.contains("src=\"ws-1.wav\""));
        assert_eq!(page.matches("<svg").count(), 1);
        assert!(page.contains("first token 180 ms"));
    }
}
