//! Where the VAD ends turns in a room: recorded questions one after another, each with room tone
//! before and after it and under it (a quiet room's floor, a café's babble), through the VAD
//! exactly as a session runs it, 10 ms at a time. Each question's voice is found in its clean
//! recording, so the report says how long after the voice each turn stopped, which questions
//! were missed or split, and how many turns the room started on its own. Only the VAD runs: a
//! set of 45 questions takes seconds, where a whole bot over the network takes ten minutes.
//!
//! With `transcribe`, the bot's recogniser (the embedded Whisper as the default bot runs it)
//! hears the stream as a session's STT does: all of the audio, cut into utterances at the
//! VAD's starts, silences and stops. Each question's words are then scored against the text
//! beside its WAV, and the words written in the room's own turns are counted: a minute or so
//! for 45 questions.

use std::path::{Path, PathBuf};

use serde::Serialize;
use voxide_engines::speaker::SpeakerEncoder;

use crate::audio::resample::{ResampleError, StreamResampler};
use crate::audio::vad::{SileroVad, VadAnalyzer, VadError, VadEvent, VadParams, VadState};
use crate::audio::wav;
use crate::bot::{BotError, BotOptions};
use crate::loadtest::room::{Noise, Room};
use crate::loadtest::stats::Distribution;
use crate::models::ModelError;
use crate::services::stt::{SttEvent, SttInput};

/// The VAD's rate, and the rate everything here is mixed at.
const RATE: usize = 16_000;
/// The VAD is fed 10 ms at a time, as a session's transport does.
const PIECE: usize = RATE / 100;
/// A 10 ms piece with a voice in it: RMS over about -45 dBFS.
const VOICED_RMS: f64 = 180.0;

/// What the bench runs.
#[derive(Debug, Clone)]
pub struct TurnEndsOptions {
    /// The questions, asked in this order.
    pub audio: Vec<PathBuf>,
    /// The room's noise.
    pub noise: Noise,
    /// Its level: dBFS, or (`Snr`) under the questions' active speech level.
    pub level: NoiseLevel,
    /// Room tone alone before the first question, between two and after the last.
    pub gap_secs: f64,
    /// The noise's seed.
    pub seed: u64,
    /// Whether the bot's recogniser hears the turns, scored against each WAV's `.txt`.
    pub transcribe: bool,
}

/// How loud the room is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NoiseLevel {
    /// RMS in dBFS.
    Dbfs(f64),
    /// This many dB under the questions' active speech level.
    Snr(f64),
}

/// Why the bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum TurnEndsError {
    /// A question could not be read.
    #[error("cannot read {path}: {reason}")]
    Input {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The room's tone could not be made.
    #[error("the room: {0}")]
    Room(String),
    /// A model is missing.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The VAD failed.
    #[error(transparent)]
    Vad(#[from] VadError),
    /// A question's rate cannot be converted.
    #[error(transparent)]
    Resample(#[from] ResampleError),
    /// The recogniser could not be made.
    #[error("the recogniser: {0}")]
    Recogniser(#[from] BotError),
    /// No runtime for the recogniser's stream.
    #[error("the recogniser's runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// The figures, one JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct TurnEndsReport {
    /// The room: its noise and level.
    pub room: String,
    /// The noise's RMS, dBFS.
    pub noise_dbfs: f64,
    /// The questions' active speech level (RMS over their voiced 20 ms windows), dBFS.
    pub speech_dbfs: f64,
    /// Questions asked.
    pub questions: usize,
    /// Questions no turn covered.
    pub missed: usize,
    /// Questions covered by more than one turn.
    pub split: usize,
    /// Questions whose last turn stopped before their voice ended.
    pub cut_short: usize,
    /// From the end of each question's voice to the stop of its last turn, ms (negative: cut
    /// short); none when every question was missed.
    pub stop_after_voice_ms: Option<Distribution>,
    /// From the start of each question's voice to the start of its first turn, ms (negative:
    /// the room started it); none when every question was missed.
    pub start_after_voice_ms: Option<Distribution>,
    /// Turns that covered no question: started by the room.
    pub room_turns: usize,
    /// Their length in all, seconds.
    pub room_turn_secs: f64,
    /// What the recogniser wrote, with `transcribe`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub words: Option<Words>,
}

/// What the recogniser wrote for the turns.
#[derive(Debug, Clone, Serialize)]
pub struct Words {
    /// Word error rate over the questions, %: each question against the words of the turns
    /// over its voice (a question no turn covered loses every word).
    pub wer_pct: f64,
    /// Words said in the questions.
    pub said: usize,
    /// Words written for them.
    pub written: usize,
    /// Words written in the room's own turns (each one an answer a bot would give to nobody).
    pub room_words: usize,
    /// Words said that no final has: left out, not misheard.
    pub left_out: usize,
    /// The finals of the room's own turns that have words, each a transcript of nothing said
    /// to the bot: where the room is noise, not talk, the recogniser made them up.
    pub room_finals: Vec<String>,
    /// Questions whose words repeat themselves: four words in a row heard more often than said.
    pub repeated: usize,
    /// Each question: what was said and what was heard.
    pub heard: Vec<Heard>,
}

/// One question's words.
#[derive(Debug, Clone, Serialize)]
pub struct Heard {
    /// Its text.
    pub said: String,
    /// The recogniser's finals for the turns over its voice.
    pub heard: String,
    /// Its words that no final has.
    pub left_out: usize,
    /// Whether the finals say four of its words in a row more often than it did.
    pub repeated: bool,
}

/// A stretch of the stream, in 10 ms pieces: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The first piece.
    pub start: usize,
    /// The piece after the last.
    pub end: usize,
}

impl Span {
    fn overlaps(&self, other: &Span) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The questions mixed into one stream over the room, and the VAD's turns over it.
pub fn run(options: &TurnEndsOptions) -> Result<TurnEndsReport, TurnEndsError> {
    let questions = options
        .audio
        .iter()
        .map(|path| read_16k(path))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some((path, _)) = options
        .audio
        .iter()
        .zip(&questions)
        .find(|(_, q)| !q.chunks(PIECE).any(|piece| rms(piece) > VOICED_RMS))
    {
        return Err(TurnEndsError::Input {
            path: path.clone(),
            reason: "no voice in it".to_owned(),
        });
    }
    let texts = match options.transcribe {
        true => Some(
            options
                .audio
                .iter()
                .map(|path| text_of(path))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        false => None,
    };
    let speech_dbfs = active_dbfs(&questions);
    let noise_dbfs = round1(match options.level {
        NoiseLevel::Dbfs(dbfs) => dbfs,
        NoiseLevel::Snr(snr) => speech_dbfs - snr,
    });
    let gap = (options.gap_secs.max(0.0) * RATE as f64) as usize / PIECE * PIECE;
    let (mut stream, voices) = line_up(&questions, gap);
    let room = Room {
        noise: options.noise.clone(),
        dbfs: noise_dbfs,
    };
    let tone = room
        .tone(stream.len(), options.seed)
        .map_err(TurnEndsError::Room)?;
    for (s, n) in stream.iter_mut().zip(tone) {
        *s = s.saturating_add(n);
    }
    let (turns, cues) = vad_turns(&stream)?;
    let scores = score(&turns, &voices);
    let words = match texts {
        Some(texts) => {
            let finals = transcribe(&stream, cues)?;
            Some(words(&texts, &turns, &finals, &voices))
        }
        None => None,
    };
    Ok(TurnEndsReport {
        room: room.to_string(),
        noise_dbfs,
        speech_dbfs: round1(speech_dbfs),
        questions: voices.len(),
        missed: scores.missed,
        split: scores.split,
        cut_short: scores.cut_short,
        stop_after_voice_ms: scores.stop_after_voice_ms,
        start_after_voice_ms: scores.start_after_voice_ms,
        room_turns: scores.room_turns,
        room_turn_secs: round1(scores.room_turn_pieces as f64 / 100.0),
        words,
    })
}

/// What the WAV at `path` says: the `.txt` beside it.
fn text_of(path: &Path) -> Result<String, TurnEndsError> {
    let input = |reason: String| TurnEndsError::Input {
        path: path.to_owned(),
        reason,
    };
    crate::loadtest::reference(path)
        .map_err(|e| input(e.to_string()))?
        .ok_or_else(|| input("no .txt beside it to score the words against".to_owned()))
}

/// A question as mono 16 kHz.
fn read_16k(path: &Path) -> Result<Vec<i16>, TurnEndsError> {
    let input = |reason: String| TurnEndsError::Input {
        path: path.to_owned(),
        reason,
    };
    let wav = wav::read(path).map_err(|e| input(e.to_string()))?;
    let mono = wav.to_mono();
    if mono.is_empty() {
        return Err(input("no audio in it".to_owned()));
    }
    if wav.sample_rate as usize == RATE {
        return Ok(mono);
    }
    Ok(StreamResampler::new(wav.sample_rate, RATE as u32)?.process(&mono))
}

/// The questions with `gap` samples of silence before each and after the last, and where each
/// one's voice is, in 10 ms pieces: from its first piece over [`VOICED_RMS`] to its last.
fn line_up(questions: &[Vec<i16>], gap: usize) -> (Vec<i16>, Vec<Span>) {
    let mut stream = Vec::new();
    let mut voices = Vec::new();
    for question in questions {
        stream.resize(stream.len() + gap, 0);
        // Each question starts on a piece's boundary.
        let at = stream.len() / PIECE;
        let voiced: Vec<usize> = question
            .chunks(PIECE)
            .enumerate()
            .filter(|(_, piece)| rms(piece) > VOICED_RMS)
            .map(|(i, _)| i)
            .collect();
        if let (Some(first), Some(last)) = (voiced.first(), voiced.last()) {
            voices.push(Span {
                start: at + first,
                end: at + last + 1,
            });
        }
        stream.extend_from_slice(question);
        stream.resize(stream.len().div_ceil(PIECE) * PIECE, 0);
    }
    stream.resize(stream.len() + gap, 0);
    (stream, voices)
}

/// What the STT is told after a 10 ms piece of the stream, as a session's VAD stage tells it.
type Cue = (usize, SttInput);

/// The VAD's turns over `stream`, fed 10 ms at a time: from each start to its stop, in 10 ms
/// pieces (a turn still open at the end ends there); and the cues the STT gets.
fn vad_turns(stream: &[i16]) -> Result<(Vec<Span>, Vec<Cue>), TurnEndsError> {
    let model = SileroVad::shared()?;
    let mut vad = VadAnalyzer::new(model, RATE as u32, VadParams::default())?
        .with_voiceprint(SpeakerEncoder::shared()?);
    let mut turns = Vec::new();
    let mut cues = Vec::new();
    let mut open = None;
    let pieces = stream.len().div_ceil(PIECE);
    for (i, piece) in stream.chunks(PIECE).enumerate() {
        let speaking = vad.state() == VadState::Speaking;
        let events = vad.analyze(piece)?;
        if speaking && matches!(vad.state(), VadState::Stopping | VadState::Quiet) {
            cues.push((i, SttInput::SilenceStarted));
        }
        for event in events {
            match event {
                VadEvent::Onset { near_speaker } => {
                    cues.push((i, SttInput::SpeechOnset { near_speaker }))
                }
                VadEvent::OnsetNearSpeaker => cues.push((i, SttInput::OnsetNearSpeaker)),
                VadEvent::OnsetFaded => cues.push((i, SttInput::OnsetFaded)),
                VadEvent::Started => {
                    open = Some(i + 1);
                    cues.push((i, SttInput::SpeechStarted));
                }
                VadEvent::Stopped => {
                    if let Some(start) = open.take() {
                        turns.push(Span { start, end: i + 1 });
                        cues.push((i, SttInput::Finalize));
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(start) = open {
        turns.push(Span { start, end: pieces });
        cues.push((pieces, SttInput::SilenceStarted));
        cues.push((pieces, SttInput::Finalize));
    }
    Ok((turns, cues))
}

/// The bot's recogniser over `stream` with the VAD's `cues`: each turn's final, in order.
fn transcribe(stream: &[i16], cues: Vec<Cue>) -> Result<Vec<String>, TurnEndsError> {
    let stt = BotOptions::default().recogniser()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(async move {
        let mut stream_of = stt.start();
        let finals = tokio::spawn(async move {
            let mut finals = Vec::new();
            while let Some(event) = stream_of.events.recv().await {
                if let SttEvent::Finalized(words) = event {
                    finals.push(words);
                }
            }
            finals
        });
        let mut cues = cues.into_iter().peekable();
        for (i, piece) in stream.chunks(PIECE).enumerate() {
            let _ = stream_of.input.send(SttInput::Audio(piece.to_vec())).await;
            while let Some((_, cue)) = cues.next_if(|(at, _)| *at <= i) {
                let _ = stream_of.input.send(cue).await;
            }
        }
        for (_, cue) in cues {
            let _ = stream_of.input.send(cue).await;
        }
        drop(stream_of.input);
        finals.await.unwrap_or_default()
    }))
}

/// The questions' words against the finals of the `turns` over their `voices`.
fn words(texts: &[String], turns: &[Span], finals: &[String], voices: &[Span]) -> Words {
    let (mut errors, mut said, mut written, mut left_out) = (0, 0, 0, 0);
    let mut heard = Vec::new();
    for (text, voice) in texts.iter().zip(voices) {
        let over: Vec<&str> = turns
            .iter()
            .zip(finals)
            .filter(|(turn, _)| turn.overlaps(voice))
            .map(|(_, words)| words.as_str())
            .collect();
        let joined = over.join(" ");
        let (wrong, words) = crate::loadtest::word_errors(text, &joined);
        let lost = crate::loadtest::words_left_out(text, &joined);
        errors += wrong;
        said += words;
        written += joined.split_whitespace().count();
        left_out += lost;
        heard.push(Heard {
            said: text.clone(),
            repeated: repeats(text, &joined),
            heard: joined,
            left_out: lost,
        });
    }
    let room_finals: Vec<String> = turns
        .iter()
        .zip(finals)
        .filter(|(turn, words)| {
            !voices.iter().any(|v| turn.overlaps(v)) && words.split_whitespace().next().is_some()
        })
        .map(|(_, words)| words.clone())
        .collect();
    Words {
        wer_pct: round1(100.0 * errors as f64 / said.max(1) as f64),
        said,
        written,
        room_words: room_finals
            .iter()
            .map(|w| w.split_whitespace().count())
            .sum(),
        left_out,
        room_finals,
        repeated: heard.iter().filter(|h| h.repeated).count(),
        heard,
    }
}

/// Whether `heard` says some four words in a row more often than `said` does: Whisper repeating
/// itself ("Could you recommend a good book for a long flight? Good you recommend a good book
/// for a long flight."), exactly or not.
fn repeats(said: &str, heard: &str) -> bool {
    let counts = |text: &str| {
        let words = crate::loadtest::scored_words(text);
        let mut counts = std::collections::HashMap::new();
        for four in words.windows(4) {
            *counts.entry(four.to_vec()).or_insert(0usize) += 1;
        }
        counts
    };
    let said = counts(said);
    counts(heard)
        .into_iter()
        .any(|(four, n)| n > 1 && n > said.get(&four).copied().unwrap_or(0))
}

/// How the turns fell on the questions' voices.
#[derive(Debug, Clone, PartialEq)]
struct Scores {
    missed: usize,
    split: usize,
    cut_short: usize,
    stop_after_voice_ms: Option<Distribution>,
    start_after_voice_ms: Option<Distribution>,
    room_turns: usize,
    room_turn_pieces: usize,
}

fn score(turns: &[Span], voices: &[Span]) -> Scores {
    let (mut missed, mut split, mut cut_short) = (0, 0, 0);
    let (mut after, mut started) = (Vec::new(), Vec::new());
    for voice in voices {
        let covering: Vec<&Span> = turns.iter().filter(|t| t.overlaps(voice)).collect();
        let (Some(first), Some(last)) = (covering.first(), covering.last()) else {
            missed += 1;
            continue;
        };
        started.push((first.start as f64 - voice.start as f64) * 10.0);
        if covering.len() > 1 {
            split += 1;
        }
        if last.end < voice.end {
            cut_short += 1;
        }
        after.push((last.end as f64 - voice.end as f64) * 10.0);
    }
    let room: Vec<&Span> = turns
        .iter()
        .filter(|t| !voices.iter().any(|v| t.overlaps(v)))
        .collect();
    Scores {
        missed,
        split,
        cut_short,
        stop_after_voice_ms: Distribution::of(&after),
        start_after_voice_ms: Distribution::of(&started),
        room_turns: room.len(),
        room_turn_pieces: room.iter().map(|t| t.end - t.start).sum(),
    }
}

fn rms(samples: &[i16]) -> f64 {
    let power = samples.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>();
    (power / samples.len().max(1) as f64).sqrt()
}

/// The questions' active speech level, dBFS: the RMS over their 20 ms windows louder than 2 %
/// of each one's peak (and than 100), as `scripts/noise.py` sets a café's SNR.
fn active_dbfs(questions: &[Vec<i16>]) -> f64 {
    let (mut power, mut n) = (0.0, 0usize);
    for question in questions {
        let peak = question
            .iter()
            .map(|s| f64::from(*s).abs())
            .fold(0.0, f64::max);
        let floor = (peak * 0.02).max(100.0);
        for window in question.chunks_exact(RATE / 50) {
            if rms(window) > floor {
                power += window.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>();
                n += window.len();
            }
        }
    }
    10.0 * (power / n.max(1) as f64 / 32_768f64.powi(2))
        .max(1e-12)
        .log10()
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: usize, end: usize) -> Span {
        Span { start, end }
    }

    #[test]
    fn each_question_is_judged_by_the_turns_over_its_voice_and_the_rest_are_the_rooms() {
        let voices = [span(100, 200), span(500, 600), span(900, 1000)];
        let turns = [
            // The room, before anyone spoke.
            span(10, 30),
            // The first question, ending 250 ms after its voice.
            span(110, 225),
            // The second, split in two, its last part stopping 20 ms before the voice did.
            span(505, 550),
            span(560, 598),
            // The room again, between questions.
            span(700, 760),
        ];
        let scores = score(&turns, &voices);
        assert_eq!(scores.missed, 1, "the third question had no turn");
        assert_eq!(scores.split, 1);
        assert_eq!(scores.cut_short, 1);
        assert_eq!(scores.room_turns, 2);
        assert_eq!(scores.room_turn_pieces, 80);
        let after = scores.stop_after_voice_ms.expect("two questions had turns");
        assert_eq!((after.p50, after.max, after.n), (-20.0, 250.0, 2));
        let started = scores
            .start_after_voice_ms
            .expect("two questions had turns");
        assert_eq!((started.p50, started.max, started.n), (50.0, 100.0, 2));
    }

    #[test]
    fn each_question_is_scored_on_the_finals_of_its_turns_and_the_rooms_words_apart() {
        let voices = [span(100, 200), span(500, 600), span(900, 1000)];
        let turns = [
            span(110, 150),
            span(160, 210),
            span(300, 320),
            span(510, 610),
        ];
        let finals = [
            "What is",
            "eight times nine?",
            "Close button.",
            "Set a timer",
        ];
        let texts = [
            "What is eight times nine?",
            "Set a timer for two minutes.",
            "Thank you.",
        ]
        .map(String::from);
        let words = words(&texts, &turns, &finals.map(String::from), &voices);
        // 0 errors, 3 of 6 words missing, 2 of 2 missing: 5 errors in 13 words.
        assert_eq!((words.said, words.written), (13, 8));
        assert_eq!(words.wer_pct, 38.5);
        assert_eq!(words.room_words, 2);
        assert_eq!(words.room_finals, ["Close button."]);
        assert_eq!(words.heard[0].heard, "What is eight times nine?");
        assert_eq!(words.heard[2].heard, "");
        // Missing, not misheard: three words of the second question, both of the third.
        assert_eq!(words.left_out, 5);
        assert_eq!(words.heard[1].left_out, 3);
        assert_eq!(words.repeated, 0);
    }

    #[test]
    fn a_question_heard_twice_over_repeats_itself_and_one_said_twice_does_not() {
        let flight = "Could you recommend a good book for a long flight?";
        assert!(repeats(
            flight,
            "Could you recommend a good book for a long flight? Good you recommend a good book \
             for a long flight."
        ));
        assert!(!repeats(flight, flight));
        assert!(!repeats(
            flight,
            "Could you recommend a good book for a long flight? Thanks."
        ));
        let twice = "Say it again, say it again please.";
        assert!(!repeats(twice, twice), "said so");
        assert!(repeats(
            twice,
            "Say it again, say it again, say it again please."
        ));
    }

    #[test]
    fn questions_line_up_after_gaps_with_their_voices_found() {
        let mut question = vec![0i16; 320];
        question.extend(vec![3_000; 800]);
        question.extend(vec![0; 100]);
        let (stream, voices) = line_up(&[question.clone(), question], 1_600);
        // 1,600 + 1,220 rounded up to whole pieces (1,280), twice, and the last gap.
        assert_eq!(stream.len(), 1_600 + 1_280 + 1_600 + 1_280 + 1_600);
        assert_eq!(voices, [span(12, 17), span(30, 35)]);
    }

    #[test]
    fn over_a_quiet_rooms_floor_the_turns_are_those_of_digital_silence() {
        let hello = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/test/hello_16k.wav"
        );
        let run_at = |dbfs: f64| {
            run(&TurnEndsOptions {
                audio: vec![hello.into(), hello.into()],
                noise: Noise::Brown,
                level: NoiseLevel::Dbfs(dbfs),
                gap_secs: 2.0,
                seed: 1,
                transcribe: false,
            })
            .expect("the VAD model loads; run scripts/setup.sh")
        };
        // Brown noise at -120 dBFS is digital zero in 16-bit samples.
        let (silence, room) = (run_at(-120.0), run_at(-55.0));
        assert_eq!(room.questions, 2, "{room:?}");
        assert_eq!((room.missed, room.room_turns), (0, 0), "{room:?}");
        assert_eq!(room.split, silence.split, "{room:?} / {silence:?}");
        let stop = |report: &TurnEndsReport| report.stop_after_voice_ms.map(|after| after.max);
        assert!(
            stop(&room)
                .zip(stop(&silence))
                .is_some_and(|(r, s)| (r - s).abs() <= 30.0),
            "{room:?} / {silence:?}"
        );
    }
}
