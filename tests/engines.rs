//! The embedded engines against known output on shipped audio. They need the models that
//! `scripts/setup.sh` fetches.

use voxide::audio::vad::SileroVad;
use voxide::audio::wav;

const HELLO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav");
/// "…a frog and a toad?" in espeak-ng's voice `en-gb-x-gbclan+m3` (the end of a held-out
/// question), after 0.3 s of digital silence: the closures of its stop consonants are digital
/// silence too.
const FROG_AND_TOAD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/test/frog_and_toad_16k.wav"
);

/// Speech probabilities of every 512-sample window of `samples` at 16 kHz.
fn vad_probabilities(samples: &[i16]) -> Vec<f32> {
    let vad = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
    let mut state = vad.new_state(16_000);
    wav::to_f32(samples)
        .chunks_exact(512)
        .map(|w| vad.probability(&mut state, w).expect("inference"))
        .collect()
}

#[test]
fn silero_hears_speech_in_speech_and_none_in_silence() {
    let hello = wav::read(HELLO).expect("test audio");
    assert_eq!(hello.sample_rate, 16_000);
    let probs = vad_probabilities(&hello.to_mono());
    // The file is 1 s of silence, about 3.2 s of speech, 1 s of silence (31.25 windows a second).
    let lead = &probs[..28];
    let speech = &probs[34..120];
    assert!(lead.iter().all(|&p| p < 0.1), "silence: {lead:?}");
    let voiced = speech.iter().filter(|&&p| p > 0.7).count();
    assert!(voiced > speech.len() / 2, "speech: {speech:?}");

    let silence = vec![0i16; 16_000];
    assert!(vad_probabilities(&silence).iter().all(|&p| p < 0.05));
}

/// Runs `silero_vad.onnx` through ONNX Runtime, one window at a time from a zero state: the
/// probabilities the file's own graph gives.
fn onnx_runtime_probabilities(samples: &[f32], rate: u32) -> Vec<f32> {
    use ort::value::Tensor;
    let (window, context) = if rate == 8_000 { (256, 32) } else { (512, 64) };
    let mut session = voxide::onnx::session("silero-vad", "silero_vad.onnx", 1).expect("ORT");
    let mut state = vec![0.0f32; 256];
    let mut last = vec![0.0f32; context];
    let mut out = Vec::new();
    for w in samples.chunks_exact(window) {
        let mut input = last.clone();
        input.extend_from_slice(w);
        let outputs = session
            .run(ort::inputs![
                "input" => Tensor::from_array(([1, window + context], input)).expect("input"),
                "state" => Tensor::from_array(([2, 1, 128], state.clone())).expect("state"),
                "sr" => Tensor::from_array(((), vec![i64::from(rate)])).expect("rate"),
            ])
            .expect("inference");
        out.push(
            outputs["output"]
                .try_extract_tensor::<f32>()
                .expect("output")
                .1[0],
        );
        state = outputs["stateN"]
            .try_extract_tensor::<f32>()
            .expect("state")
            .1
            .to_vec();
        last.copy_from_slice(&w[window - context..]);
    }
    out
}

#[test]
fn voxides_silero_network_gives_the_probabilities_onnx_runtime_gives_at_both_rates() {
    use voxide::audio::resample::StreamResampler;
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let narrow = StreamResampler::new(16_000, 8_000)
        .expect("resampler")
        .process(&hello);
    let vad = SileroVad::shared().expect("model");
    for (rate, audio) in [(16_000u32, &hello), (8_000, &narrow)] {
        let samples = wav::to_f32(audio);
        let want = onnx_runtime_probabilities(&samples, rate);
        let mut state = vad.new_state(rate);
        let got: Vec<f32> = samples
            .chunks_exact(state.window())
            .map(|w| vad.probability(&mut state, w).expect("inference"))
            .collect();
        assert_eq!(got.len(), want.len());
        assert!(
            want.iter().any(|&p| p > 0.9),
            "{rate} Hz: the file has speech"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() < 1e-4,
                "{rate} Hz, window {i}: {g} against {w}"
            );
        }
    }
}

#[test]
fn a_batch_gives_what_separate_calls_give() {
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let vad = SileroVad::shared().expect("model");
    let samples = wav::to_f32(&hello);
    let quiet = vec![0.0f32; samples.len()];
    let mut a = vad.new_state(16_000);
    let mut b = vad.new_state(16_000);
    let mut sa = vad.new_state(16_000);
    let mut sb = vad.new_state(16_000);
    for (wa, wb) in samples
        .chunks_exact(512)
        .zip(quiet.chunks_exact(512))
        .take(80)
    {
        let batched = vad
            .probabilities(&mut [(&mut a, wa), (&mut b, wb)])
            .expect("batch");
        let single = [
            vad.probability(&mut sa, wa).expect("a"),
            vad.probability(&mut sb, wb).expect("b"),
        ];
        for (x, y) in batched.iter().zip(single) {
            assert!((x - y).abs() < 1e-4, "{x} vs {y}");
        }
    }
}

#[test]
fn piper_speaks_a_sentence_that_the_vad_hears_as_speech() {
    use voxide::services::tts::{PiperVoice, Synthesizer};
    let voice = PiperVoice::shared().expect("the Piper voice loads; run scripts/setup.sh");
    let started = std::time::Instant::now();
    let speech = voice
        .synthesize("Hello there, how can I help you today?")
        .expect("speech");
    let took = started.elapsed();
    assert_eq!(speech.sample_rate, 22_050);
    let seconds = speech.samples.len() as f64 / 22_050.0;
    assert!((1.0..5.0).contains(&seconds), "{seconds} s of audio");
    let words: Vec<_> = speech.words.iter().map(|w| w.word.as_str()).collect();
    assert_eq!(
        words,
        ["Hello", "there", "how", "can", "I", "help", "you", "today"]
    );
    assert!((speech.words.last().map_or(0.0, |w| w.end_secs) - seconds).abs() < 1e-6);
    eprintln!("piper: {seconds:.2} s of audio in {took:?}");

    // Speech-likeness: resampled to 16 kHz, the VAD hears speech in most of it.
    let resampled: Vec<i16> = (0..(speech.samples.len() * 16_000 / 22_050))
        .map(|i| speech.samples[i * 22_050 / 16_000])
        .collect();
    let probs = vad_probabilities(&resampled);
    let voiced = probs.iter().filter(|&&p| p > 0.5).count();
    assert!(
        voiced * 2 > probs.len(),
        "voiced {voiced} of {}",
        probs.len()
    );
    // Nothing to say is no audio, not an error.
    assert!(voice.synthesize(" ... ").expect("empty").samples.is_empty());
}

#[test]
fn smart_turn_hears_a_finished_question_as_complete_and_a_cut_one_as_not() {
    use voxide::audio::turn::SmartTurn;
    let model = SmartTurn::shared().expect("the Smart Turn model loads; run scripts/setup.sh");
    let hello = wav::to_f32(&wav::read(HELLO).expect("test audio").to_mono());
    // The whole question, with the trailing silence cut to 200 ms as VAD would leave it.
    let end_of_speech = 16_000 + 3 * 16_000 + 3_400;
    let whole = &hello[..(end_of_speech + 3_200).min(hello.len())];
    let started = std::time::Instant::now();
    let complete = model.predict(whole).expect("prediction");
    eprintln!("smart turn: {:?} in {:?}", complete, started.elapsed());
    // Cut in the middle of "What is the weather like ...".
    let cut = model
        .predict(&hello[..16_000 + 28_000])
        .expect("prediction");
    eprintln!("smart turn, cut: {cut:?}");
    assert!(
        complete.probability > cut.probability,
        "{complete:?} vs {cut:?}"
    );
    assert!(complete.complete, "{complete:?}");
}

#[test]
fn smart_turn_skips_a_request_the_user_made_stale_and_counts_its_work() {
    use voxide::audio::turn::SmartTurn;
    // A model of its own, so other tests' inferences do not show in its counts.
    let model = SmartTurn::load().expect("the Smart Turn model loads; run scripts/setup.sh");
    let hello = wav::to_f32(&wav::read(HELLO).expect("test audio").to_mono());
    let skipped = model.predict_unless(&hello, || true).expect("no error");
    assert_eq!(skipped, None);
    let ran = model.predict_unless(&hello, || false).expect("prediction");
    assert!(ran.is_some());
    let stats = model.stats();
    assert_eq!((stats.inferences, stats.skipped), (1, 1));
    assert!(stats.busy_secs > 0.0);
}

#[tokio::test]
async fn smart_turn_judges_on_its_thread_and_skips_what_nobody_awaits() {
    use std::sync::{Arc, Mutex};
    let model = Arc::new(one_worker());
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    // The first request holds the model's thread (in its staleness check) until released, so
    // the second is queued behind it when its caller gives up on it.
    let (release, held) = std::sync::mpsc::channel::<()>();
    let held = Mutex::new(held);
    let first = model.judge(hello.clone(), move || {
        let _ = held.lock().map(|h| h.recv());
        false
    });
    drop(model.judge(hello.clone(), || false));
    release.send(()).expect("release");
    drop(release);
    assert!(first.await.expect("judged").is_some());
    // Stale when its turn comes: skipped.
    assert_eq!(model.judge(hello, || true).await.expect("no error"), None);
    let stats = model.stats();
    assert_eq!((stats.inferences, stats.skipped), (1, 2));
}

/// A model of its own with one worker, so that one held request holds all of it.
fn one_worker() -> voxide::audio::turn::SmartTurn {
    use voxide::audio::turn::{SmartTurn, SmartTurnEngine};
    SmartTurn::load_with(SmartTurnEngine::best(), 1)
        .expect("the Smart Turn model; run scripts/setup.sh")
}

/// Queues a request that holds the worker taking it (in its staleness check) until the
/// returned sender sends or drops; returns once a worker holds it.
fn held_request(
    model: &std::sync::Arc<voxide::audio::turn::SmartTurn>,
    audio: Vec<i16>,
) -> (
    impl std::future::Future<
        Output = Result<Option<voxide::audio::turn::TurnPrediction>, voxide::models::ModelError>,
    >,
    std::sync::mpsc::Sender<()>,
) {
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (entered, holding) = std::sync::mpsc::channel::<()>();
    let held = std::sync::Mutex::new(held);
    let verdict = model.judge(audio, move || {
        let _ = entered.send(());
        let _ = held.lock().map(|h| h.recv());
        false
    });
    holding.recv().expect("a worker took the request");
    (verdict, release)
}

#[tokio::test]
async fn smart_turn_with_two_workers_judges_a_request_while_another_is_held() {
    use std::sync::Arc;
    use voxide::audio::turn::{SmartTurn, SmartTurnEngine};
    let model = Arc::new(
        SmartTurn::load_with(SmartTurnEngine::best(), 2)
            .expect("the Smart Turn model; run scripts/setup.sh"),
    );
    assert_eq!(model.workers(), 2);
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let (first, release) = held_request(&model, hello.clone());
    // With one worker this would wait for the release, which never comes before it.
    let second = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        model.judge(hello, || false),
    )
    .await;
    assert!(
        second
            .expect("judged by the other worker")
            .expect("no error")
            .is_some()
    );
    release.send(()).expect("release");
    drop(release);
    assert!(first.await.expect("judged").is_some());
    assert_eq!(model.stats().inferences, 2);
}

#[tokio::test]
async fn smart_turn_judges_the_newest_waiting_request_first() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let model = Arc::new(one_worker());
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    // The first request holds the model's thread until both others wait behind it.
    let (first, release) = held_request(&model, hello.clone());
    // The older request notes how many inferences had run each time it was asked whether it
    // is stale: the last time is just before its own.
    let seen_by_older = Arc::new(AtomicU64::new(0));
    let older = {
        let (model, seen) = (model.clone(), seen_by_older.clone());
        model.clone().judge(hello.clone(), move || {
            seen.fetch_max(model.stats().inferences, Ordering::SeqCst);
            false
        })
    };
    let newer = model.judge(hello, || false);
    release.send(()).expect("release");
    drop(release);
    let (first, older, newer) = tokio::join!(first, older, newer);
    for verdict in [first, older, newer] {
        assert!(verdict.expect("judged").is_some());
    }
    // The first and the newer request had run when the older one's turn came.
    assert_eq!(seen_by_older.load(Ordering::SeqCst), 2);
    assert_eq!(model.stats().inferences, 3);
}

#[test]
fn the_vad_confirms_speech_after_start_secs_of_it_with_no_wait_for_the_loudness() {
    use voxide::audio::vad::{VadAnalyzer, VadEvent, VadParams};
    let vad = SileroVad::shared().expect("model");
    let params = VadParams::default();
    let mut analyzer = VadAnalyzer::new(vad, 16_000, params).expect("analyzer");
    let loud: Vec<f32> = (0..512).map(|i| (i as f32 * 0.3).sin() * 0.1).collect();
    let quiet = vec![0.0f32; 512];
    for _ in 0..20 {
        assert_eq!(analyzer.apply(0.0, &quiet), None);
    }
    // Confident, loud windows from silence: started on the window that completes start_secs
    // (6 windows of 32 ms), not later while a smoothed loudness catches up.
    let needed = (params.start_secs * 16_000.0 / 512.0).round() as usize;
    assert_eq!(
        analyzer.apply(0.99, &loud),
        Some(VadEvent::Onset { near_speaker: true })
    );
    let started = (2..=20)
        .find(|_| analyzer.apply(0.99, &loud) == Some(VadEvent::Started))
        .expect("started");
    assert_eq!(started, needed);
    // Speaking on: a tick every 0.2 s of it.
    let tick = (voxide::audio::vad::SPEAKING_TICK_SECS * 16_000.0 / 512.0).round() as usize;
    let ticks: Vec<_> = (0..tick * 3)
        .filter_map(|_| analyzer.apply(0.99, &loud))
        .collect();
    assert_eq!(ticks, [VadEvent::Speaking; 3]);
    // A burst shorter than start_secs is an onset that fades, not a start.
    let mut analyzer =
        VadAnalyzer::new(SileroVad::shared().expect("model"), 16_000, params).expect("analyzer");
    let windows = (0..needed - 1)
        .map(|_| (0.99, &loud))
        .chain((0..needed).map(|_| (0.0, &quiet)));
    let burst: Vec<_> = windows
        .filter_map(|(confidence, window)| analyzer.apply(confidence, window))
        .collect();
    assert_eq!(
        burst,
        [VadEvent::Onset { near_speaker: true }, VadEvent::OnsetFaded]
    );
    // Confident but quiet windows (speech far away) never start a turn.
    let mut analyzer =
        VadAnalyzer::new(SileroVad::shared().expect("model"), 16_000, params).expect("analyzer");
    let faint: Vec<f32> = loud.iter().map(|s| s * 0.001).collect();
    assert!((0..40).all(|_| analyzer.apply(0.99, &faint).is_none()));
}

#[test]
fn a_word_after_digital_silence_inside_speech_stays_in_the_utterance() {
    use voxide::audio::vad::{QuickChange, VadAnalyzer, VadEvent, VadParams, VadState};
    let audio = wav::read(FROG_AND_TOAD).expect("test audio").to_mono();
    let model = SileroVad::shared().expect("model");
    let mut state = model.new_state(16_000);
    let mut vad = VadAnalyzer::new(model.clone(), 16_000, VadParams::default()).expect("vad");
    // As the VAD stage runs it: 20 ms chunks, the model on each whole window, then the pieces'
    // verdict. Each moment the VAD went silent (a first silence) or back to speech, in ms.
    let mut silences = Vec::new();
    let mut resumed = 0;
    let mut events = Vec::new();
    for (i, chunk) in audio.chunks(320).enumerate() {
        let end_ms = (i + 1) * 20;
        for window in vad.windows(chunk) {
            let confidence = model.probability(&mut state, &window).expect("model");
            let before = vad.state();
            events.extend(vad.apply(confidence, &window));
            match (before, vad.state()) {
                (VadState::Speaking, VadState::Stopping | VadState::Quiet) => {
                    silences.push(end_ms);
                }
                (VadState::Stopping, VadState::Speaking) => resumed += 1,
                _ => {}
            }
        }
        match vad.between_windows() {
            Some(QuickChange::SilenceStarted) => silences.push(end_ms),
            Some(QuickChange::SpeechResumed) => resumed += 1,
            None => {}
        }
    }
    events.retain(|e| matches!(e, VadEvent::Started | VadEvent::Stopped));
    assert_eq!(events, [VadEvent::Started, VadEvent::Stopped]);
    // The last 10 ms with a voice in it (over -50 dBFS).
    let voice_end_ms = audio
        .chunks(160)
        .rposition(|piece| {
            let power = piece.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>() / 160.0;
            power.sqrt() > 100.0
        })
        .map(|i| (i + 1) * 10)
        .expect("a voice");
    assert!(silences.len() >= 2, "the closures: {silences:?}");
    assert_eq!(resumed, silences.len() - 1, "{silences:?}");
    // The first silence the STT decodes up to is after "toad", not in the closure before it.
    let last = silences[silences.len() - 1];
    assert!(
        (voice_end_ms..voice_end_ms + 40).contains(&last),
        "voice ended at {voice_end_ms} ms, the last first silence came at {last} ms: {silences:?}"
    );
}

#[test]
fn the_vad_analyzer_finds_one_utterance_at_any_input_rate() {
    use voxide::audio::resample::StreamResampler;
    use voxide::audio::vad::{VadAnalyzer, VadEvent, VadParams, VadState};
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    for rate in [16_000u32, 48_000] {
        let audio = if rate == 16_000 {
            hello.clone()
        } else {
            let mut up = StreamResampler::new(16_000, rate).expect("resampler");
            up.process(&hello)
        };
        let vad = SileroVad::shared().expect("model");
        let mut analyzer = VadAnalyzer::new(vad, rate, VadParams::default()).expect("analyzer");
        let chunk = rate as usize / 50; // 20 ms, as transports deliver it
        let mut events = Vec::new();
        for (i, piece) in audio.chunks(chunk).enumerate() {
            for e in analyzer.analyze(piece).expect("analysis") {
                events.push((e, i as f32 * 0.02));
            }
        }
        // Onsets come and go before the start; the starts and stops are the utterance.
        events.retain(|(e, _)| matches!(e, VadEvent::Started | VadEvent::Stopped));
        let kinds: Vec<_> = events.iter().map(|(e, _)| *e).collect();
        // espeak's pauses between sentences may split the utterance; it always starts first
        // and ends last.
        assert_eq!(
            kinds.first(),
            Some(&VadEvent::Started),
            "{rate}: {events:?}"
        );
        assert_eq!(kinds.last(), Some(&VadEvent::Stopped), "{rate}: {events:?}");
        let started = events[0].1;
        let stopped = events[events.len() - 1].1;
        assert!(
            (1.0..1.5).contains(&started),
            "{rate}: started at {started}"
        );
        assert!(
            (4.0..4.8).contains(&stopped),
            "{rate}: stopped at {stopped}"
        );
        assert_eq!(analyzer.state(), VadState::Quiet);
    }
}

#[test]
fn a_corrupt_model_file_is_a_clear_error_not_a_crash() {
    let dir = std::env::temp_dir().join(format!("voxide-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("broken.onnx");
    std::fs::write(&path, b"this is not an onnx model").expect("write");
    let err = voxide::onnx::open("broken", &path, 1).expect_err("must fail");
    let text = err.to_string();
    assert!(
        text.contains("broken")
            && text.contains("could not be loaded")
            && text.contains("scripts/setup.sh"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn whisper_transcribes_the_test_sentence() {
    use voxide::services::stt::{Whisper, WindowPolicy};
    let whisper = Whisper::shared().expect("the Whisper model loads; run scripts/setup.sh");
    let audio = wav::to_f32(&wav::read(HELLO).expect("test audio").to_mono());
    let words = |text: &str| -> String {
        text.to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || c.is_whitespace())
            .collect()
    };
    // The short window the bot uses: fast, and the question comes through.
    let started = std::time::Instant::now();
    let text = whisper.transcribe(&audio).expect("transcript");
    eprintln!("whisper: {text:?} in {:?}", started.elapsed());
    assert!(
        words(&text).contains("what is the weather like in paris"),
        "{text}"
    );
    // The full 30 s window, as Whisper was trained: every word of the question.
    let full = Whisper::load_default()
        .expect("model")
        .with_window(WindowPolicy::FULL);
    let text = words(&full.transcribe(&audio).expect("transcript"));
    // tiny.en hears espeak's "there" as "now" at times; the question itself must be exact.
    assert!(text.starts_with("hello "), "{text}");
    assert!(
        text.ends_with("what is the weather like in paris today"),
        "{text}"
    );
}

#[test]
fn a_second_listen_takes_the_likeliest_reading_that_makes_a_request_or_keeps_the_first() {
    // Whisper's decodes in a debug build: about a minute.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use voxide::services::stt::{PromptedWhisper, Reading, Whisper};
    let whisper = Whisper::shared().expect("the Whisper model loads; run scripts/setup.sh");
    let audio = wav::to_f32(&wav::read(HELLO).expect("test audio").to_mono());
    let first = PromptedWhisper::new(whisper.clone(), "")
        .transcribe(&audio)
        .expect("transcript");
    let listen = |reader: voxide::services::stt::Reader| {
        PromptedWhisper::new(whisper.clone(), "")
            .with_reader(reader)
            .transcribe(&audio)
            .expect("transcript")
    };
    // Words the bot reads as they are: no second listen.
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = reads.clone();
    let heard = listen(Arc::new(move |_: &str| {
        counted.fetch_add(1, Ordering::Relaxed);
        Reading::Talk
    }));
    assert_eq!(heard, first);
    assert_eq!(reads.load(Ordering::Relaxed), 1);
    // Garbled, and no reading of the beam makes a request: the first reading stands.
    assert_eq!(listen(Arc::new(|_: &str| Reading::Garbled)), first);
    // The first reading is garbled and another is a request: that one, the same question.
    let garbled = first.clone();
    let reader: voxide::services::stt::Reader = Arc::new(move |text: &str| {
        if text == garbled {
            Reading::Garbled
        } else {
            Reading::Request
        }
    });
    let heard = listen(reader.clone());
    assert_ne!(heard, first);
    assert!(
        heard.to_lowercase().contains("paris"),
        "{first:?} -> {heard:?}"
    );
    // The words so far of an utterance still going on get no second listen: a request half
    // said reads as garbled.
    let partial = PromptedWhisper::new(whisper.clone(), "")
        .with_reader(reader)
        .transcribe_partial(&audio, &|| true)
        .expect("transcript")
        .expect("wanted throughout");
    assert_eq!(partial, first);
}

#[test]
fn whisper_encodes_a_prompt_as_its_tokenizer_does_and_still_hears_the_question() {
    use voxide::services::stt::Whisper;
    let whisper = Whisper::shared().expect("the Whisper model loads; run scripts/setup.sh");
    // Ids from the Hugging Face `tokenizers` library on the same tokenizer.json.
    assert_eq!(
        whisper.prompt("Set a timer for 5 minutes. Cancel   the timer."),
        [5345, 257, 19781, 329, 642, 2431, 13, 27910, 262, 19781, 13]
    );
    assert_eq!(
        whisper.prompt("What is 12 plus 30? It's 2024!"),
        [1867, 318, 1105, 5556, 1542, 30, 632, 338, 48609, 0]
    );
    assert!(whisper.prompt("  ").is_empty());
    assert_eq!(whisper.prompt(&"timer ".repeat(1000)).len(), 223);
    let audio = wav::to_f32(&wav::read(HELLO).expect("test audio").to_mono());
    let prompt = whisper.prompt("Set a timer for 5 minutes. What is the time?");
    let text = whisper
        .transcribe_after(&audio, &prompt)
        .expect("transcript")
        .to_lowercase();
    assert!(text.contains("weather like in paris"), "{text}");
}

#[test]
fn the_local_llm_tokenizer_matches_the_vocabulary() {
    use voxide::services::llm::local::LocalModel;
    let model = LocalModel::shared().expect("the local LLM loads; run scripts/setup.sh");
    let t = model.tokenizer();
    let id = |p: &str| t.token(p).expect(p);
    assert_eq!(t.encode("system"), vec![id("system")]);
    assert_eq!(t.encode("Hello world"), vec![id("Hello"), id("Ġworld")]);
    assert_eq!(
        t.encode(" 42"),
        vec![id("Ġ"), id("4"), id("2")],
        "digits one by one"
    );
    let prompt = model.prompt(&[voxide::context::Message::system("Be brief.")]);
    assert_eq!(&prompt[..3], &[id("<|im_start|>"), id("system"), id("Ċ")]);
    let text = "Ünïcödé, emoji 🎉 and <|im_end|> typed by a user\n  indented";
    let ids = t.encode(text);
    assert_eq!(t.decode(&ids), text);
    assert!(
        !ids.contains(&id("<|im_end|>")),
        "typed control tokens stay text"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_llm_answers_a_factual_question_and_reuses_its_cache() {
    use futures_util::StreamExt;
    use voxide::context::{Message, ToolsSchema};
    use voxide::services::llm::local::{LocalLlm, LocalLlmOptions, LocalModel};
    use voxide::services::llm::{LlmEngine, LlmEvent, LlmRequest};
    let model = LocalModel::shared().expect("the local LLM loads; run scripts/setup.sh");
    // A bot that shows the model the whole conversation (the default shows the last exchange
    // only): each turn reuses the cache of the turns before it.
    let options = LocalLlmOptions {
        history_turns: usize::MAX,
        ..LocalLlmOptions::default()
    };
    let llm = LocalLlm::new(model, options);
    let mut messages = vec![
        Message::system("You are a helpful assistant. Answer in one short sentence."),
        Message::user("What is the capital of France?"),
    ];
    let ask = |messages: Vec<Message>| {
        let mut stream = llm.generate(LlmRequest {
            messages,
            tools: ToolsSchema::default(),
            tool_choice: None,
        });
        async move {
            let (mut text, mut usage) = (String::new(), None);
            while let Some(event) = stream.next().await {
                match event.expect("no error") {
                    LlmEvent::Text(t) => text.push_str(&t),
                    LlmEvent::Usage(u) => usage = Some(u),
                    _ => {}
                }
            }
            (text, usage.expect("usage"))
        }
    };
    let started = std::time::Instant::now();
    let (answer, usage) = ask(messages.clone()).await;
    eprintln!("llm: {answer:?} {usage:?} in {:?}", started.elapsed());
    assert!(answer.contains("Paris"), "{answer}");
    assert_eq!(usage.cache_read, 0);

    messages.push(Message::assistant(answer.trim()));
    messages.push(Message::user("And of Italy?"));
    let (second, usage) = ask(messages.clone()).await;
    eprintln!("llm: {second:?} {usage:?}");
    assert!(
        usage.cache_read > 20,
        "the first turn came from the cache: {usage:?}"
    );

    // Interrupted after its first word: the context keeps only that, and departs from the
    // cache inside the answer. Everything before the answer still comes from the cache.
    let before_answer = usage.cache_read + usage.input;
    let first_word = second.split_whitespace().next().unwrap_or("The");
    messages.push(Message::assistant(first_word));
    messages.push(Message::user("Go on."));
    let (_, usage) = ask(messages).await;
    eprintln!("llm after an interruption: {usage:?}");
    assert!(
        usage.cache_read >= before_answer,
        "only the cut answer is run again: {usage:?}, {before_answer} tokens came before it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tts_stage_speaks_each_sentence_in_order_as_20_ms_frames() {
    use voxide::frames::{ControlFrame, DataFrame, Frame, FrameBody};
    use voxide::pipeline::Direction;
    use voxide::pipeline::testing::run_processor;
    use voxide::services::tts::{PiperVoice, TtsService};
    let voice = PiperVoice::shared().expect("the Piper voice loads; run scripts/setup.sh");
    let down = |f: Frame| (f, Direction::Downstream);
    let out = run_processor(
        TtsService::new(voxide::services::tts::Sentences::shared(voice)),
        vec![
            down(ControlFrame::LlmFullResponseStart.into()),
            down(DataFrame::LlmText("Hello there.".into()).into()),
            down(DataFrame::LlmText(" How are".into()).into()),
            down(DataFrame::LlmText(" you today?".into()).into()),
            down(ControlFrame::LlmFullResponseEnd.into()),
        ],
    )
    .await;
    let mut names: Vec<String> = Vec::new();
    let mut spoken = Vec::new();
    let mut audio = 0usize;
    for frame in &out.down {
        match &frame.body {
            FrameBody::Data(DataFrame::OutputAudio(a)) => {
                assert_eq!((a.sample_rate, a.channels), (24_000, 1));
                assert!(a.samples.len() <= 480, "20 ms frames");
                audio += a.samples.len();
                if names.last().map(String::as_str) != Some("output_audio") {
                    names.push("output_audio".into());
                }
                continue;
            }
            FrameBody::Data(DataFrame::TtsText(t)) => {
                let words = t.words.as_deref().unwrap_or_default();
                let said: Vec<&str> = words.iter().map(|w| w.word.as_str()).collect();
                assert_eq!(said.join(" "), t.text.trim_end_matches(['.', '?']));
                assert!(
                    words
                        .windows(2)
                        .all(|w| w[0].end_secs <= w[1].start_secs + 1e-9)
                );
                spoken.push(t.text.clone())
            }
            _ => {}
        }
        names.push(frame.name().to_owned());
    }
    // The LLM's text stops at the TTS: what goes on is what is spoken, with its word timings.
    assert_eq!(spoken, ["Hello there.", "How are you today?"]);
    assert_eq!(
        names,
        [
            "start",
            "llm_full_response_start",
            "tts_started",
            "tts_text",
            "output_audio",
            "tts_text",
            "output_audio",
            "tts_stopped",
            "llm_full_response_end",
            "end"
        ]
    );
    assert!(
        audio > 24_000,
        "about two seconds of speech: {audio} samples"
    );
}

/// Sends every frame that reaches it to a channel.
struct Collect(tokio::sync::mpsc::UnboundedSender<voxide::frames::Frame>);

impl voxide::pipeline::FrameProcessor for Collect {
    fn process(
        &mut self,
        frame: voxide::frames::Frame,
        direction: voxide::pipeline::Direction,
        cx: &mut voxide::pipeline::FrameContext<'_>,
    ) -> Result<(), voxide::pipeline::ProcessorError> {
        let _ = self.0.send(frame.clone());
        cx.push(frame, direction);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stt_stage_transcribes_a_turn_with_interim_results_first() {
    use voxide::frames::{AudioFrame, DataFrame, FrameBody, SystemFrame};
    use voxide::pipeline::{Pipeline, Session};
    use voxide::services::stt::{Segmented, SttService, Whisper};
    let whisper = Segmented::shared(
        Whisper::shared().expect("the Whisper model loads; run scripts/setup.sh"),
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pipeline = Pipeline::new()
        .then(SttService::new(whisper, "user"))
        .then(Collect(tx));
    let session = Session::builder(pipeline).idle_timeout(None).spawn();
    let handle = session.handle();
    // The shipped file at 48 kHz, as a browser sends it, in 20 ms frames; the VAD's verdicts
    // where it gives them (speech from about 1.2 s to 4.4 s, confirmed 0.2 s late).
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut up = voxide::audio::resample::StreamResampler::new(16_000, 48_000).expect("resampler");
    let audio = up.process(&hello);
    let mut interim = Vec::new();
    for (i, chunk) in audio.chunks(960).enumerate() {
        let t = i as f32 * 0.02;
        if (t - 1.4).abs() < 0.01 {
            handle
                .queue_frame(SystemFrame::VadUserStartedSpeaking)
                .await
                .expect("queued");
        }
        if (t - 4.6).abs() < 0.01 {
            // The audio comes faster than real time: the stop waits for the words so far, as
            // it would come after them when spoken, so that no interim decode is made stale
            // by the stop before it ran (on a loaded machine it could be).
            loop {
                let frame = rx.recv().await.expect("an interim transcript");
                if let FrameBody::Data(DataFrame::InterimTranscription(t)) = frame.body {
                    interim.push(t.text);
                    break;
                }
            }
            handle
                .queue_frame(SystemFrame::VadUserStoppedSpeaking)
                .await
                .expect("queued");
        }
        let frame = SystemFrame::InputAudio(AudioFrame::new(chunk.to_vec(), 48_000, 1));
        handle.queue_frame(frame).await.expect("queued");
    }
    let last = loop {
        let frame = rx.recv().await.expect("a final transcript");
        match frame.body {
            FrameBody::Data(DataFrame::InterimTranscription(t)) => interim.push(t.text),
            FrameBody::Data(DataFrame::Transcription(t)) => break t.text,
            _ => {}
        }
    };
    handle.cancel();
    let _ = session.join().await;
    eprintln!("stt stage: interim {interim:?}, final {last:?}");
    // The stage's plumbing is under test here (Whisper's accuracy is tested above): the turn's
    // audio, resampled from 48 kHz with its start kept, reaches the engine whole.
    let words = last.to_lowercase();
    assert!(
        words.starts_with("hello") && words.contains("weather") && words.contains("paris"),
        "{last}"
    );
    assert!(
        !interim.is_empty(),
        "interim transcripts while the user spoke"
    );
}

/// Answers with the number of samples it was given; remembers each call's length.
struct Counting(std::sync::Mutex<Vec<usize>>);

impl voxide::services::stt::Transcriber for Counting {
    fn name(&self) -> &str {
        "counting"
    }

    fn transcribe(&self, audio: &[f32]) -> Result<String, voxide::services::stt::SttError> {
        self.0.lock().expect("lock").push(audio.len());
        Ok(format!("heard {}", audio.len()))
    }
}

/// Feeds `chunks` 20 ms chunks of steady sound to an STT stage over [`Counting`], with the VAD
/// frame `marker` gives ahead of each chunk, and returns the first `finals` final transcripts
/// and the length of every decode.
async fn counting_stt(
    chunks: usize,
    marker: impl Fn(usize) -> Option<voxide::frames::SystemFrame>,
    finals: usize,
) -> (Vec<String>, Vec<usize>) {
    use voxide::frames::{AudioFrame, DataFrame, FrameBody, SystemFrame};
    use voxide::pipeline::{Pipeline, Session};
    use voxide::services::stt::{Segmented, SttService};
    let engine = std::sync::Arc::new(Counting(std::sync::Mutex::new(Vec::new())));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pipeline = Pipeline::new()
        .then(SttService::new(Segmented::shared(engine.clone()), "user"))
        .then(Collect(tx));
    let session = Session::builder(pipeline).idle_timeout(None).spawn();
    let handle = session.handle();
    for i in 0..chunks {
        if let Some(marker) = marker(i) {
            handle.queue_frame(marker).await.expect("queued");
        }
        let frame = SystemFrame::InputAudio(AudioFrame::new(vec![100; 320], 16_000, 1));
        handle.queue_frame(frame).await.expect("queued");
    }
    let mut texts = Vec::new();
    while texts.len() < finals {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("final transcripts in time")
            .expect("a final transcript");
        if let FrameBody::Data(DataFrame::Transcription(t)) = frame.body {
            texts.push(t.text);
        }
    }
    handle.cancel();
    let _ = session.join().await;
    let calls = engine.0.lock().expect("lock").clone();
    (texts, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_after_a_silence_start_takes_the_words_decoded_at_the_silence() {
    use voxide::frames::SystemFrame;
    // Speech confirmed at chunk 40, silence from chunk 60, stop at chunk 70.
    let marker = |i| match i {
        40 => Some(SystemFrame::VadUserStartedSpeaking),
        60 => Some(SystemFrame::VadSilenceStarted),
        70 => Some(SystemFrame::VadUserStoppedSpeaking),
        _ => None,
    };
    let (finals, calls) = counting_stt(80, marker, 1).await;
    // 0.6 s of pre-roll and 20 chunks of speech at the silence; 10 more chunks at the stop.
    let at_silence = 9_600 + 20 * 320;
    assert_eq!(finals, [format!("heard {at_silence}")]);
    assert!(
        !calls.contains(&(at_silence + 10 * 320)),
        "the whole utterance was decoded again: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speech_soon_after_an_utterance_gets_the_preroll_since_its_stop() {
    use voxide::frames::SystemFrame;
    // One utterance from chunk 40 to 70, the next confirmed 5 chunks after its stop, until
    // chunk 100.
    let marker = |i| match i {
        40 | 75 => Some(SystemFrame::VadUserStartedSpeaking),
        70 | 100 => Some(SystemFrame::VadUserStoppedSpeaking),
        _ => None,
    };
    let (finals, _) = counting_stt(110, marker, 2).await;
    // The first: the full 0.6 s pre-roll and 30 chunks. The second: the 5 chunks since the
    // stop and 0.15 s before it (the stop's silence), not 0.6 s, then 25 chunks.
    assert_eq!(
        finals,
        [
            format!("heard {}", 9_600 + 30 * 320),
            format!("heard {}", 5 * 320 + 2_400 + 25 * 320)
        ]
    );
}

/// Runs the shipped sentence through a VAD stage (optionally only its first `secs`) and returns
/// the VAD starts and stops that came out, waiting at most `wait` after the last audio.
async fn vad_stage_events(secs: f32, wait: std::time::Duration) -> Vec<String> {
    let mut events = vad_stage_frames(secs, wait).await;
    events.retain(|e| e.starts_with("vad_user_"));
    events
}

/// Every VAD frame [`vad_stage_events`] sees, onsets included.
async fn vad_stage_frames(secs: f32, wait: std::time::Duration) -> Vec<String> {
    use voxide::audio::vad::{VadBatcher, VadParams, VadStage};
    use voxide::frames::{AudioFrame, SystemFrame};
    use voxide::pipeline::{Pipeline, Session};
    let batcher = VadBatcher::shared().expect("the VAD model loads; run scripts/setup.sh");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stage = VadStage::new(batcher, VadParams::default())
        .audio_idle_timeout(std::time::Duration::from_millis(300));
    let pipeline = Pipeline::new().then(stage).then(Collect(tx));
    let session = Session::builder(pipeline).idle_timeout(None).spawn();
    let handle = session.handle();
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let end = ((secs * 16_000.0) as usize).min(hello.len());
    for chunk in hello[..end].chunks(320) {
        let frame = SystemFrame::InputAudio(AudioFrame::new(chunk.to_vec(), 16_000, 1));
        handle.queue_frame(frame).await.expect("queued");
    }
    let mut events = Vec::new();
    while let Ok(Some(frame)) = tokio::time::timeout(wait, rx.recv()).await {
        let name = frame.name();
        if name.starts_with("vad_") || name == "user_speaking" {
            events.push(name.to_owned());
        }
    }
    handle.cancel();
    let _ = session.join().await;
    // Every stop comes right after the silence start that marks where the speech ended.
    assert_each_follows(&events, "vad_user_stopped_speaking", "vad_silence_started");
    // Ticks come only between a start and its stop.
    let mut speaking = false;
    for e in &events {
        match e.as_str() {
            "vad_user_started_speaking" => speaking = true,
            "vad_user_stopped_speaking" => speaking = false,
            "user_speaking" => assert!(speaking, "{events:?}"),
            _ => {}
        }
    }
    // Every start is an onset that lasted; onsets may also fade.
    assert_each_follows(&events, "vad_user_started_speaking", "vad_speech_onset");
    events
}

/// Every `event` in `events` comes right after a `before`.
fn assert_each_follows(events: &[String], event: &str, before: &str) {
    for (i, e) in events.iter().enumerate() {
        if e == event {
            assert_eq!(
                i.checked_sub(1).map(|p| events[p].as_str()),
                Some(before),
                "{events:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vad_stage_reports_speech_for_several_sessions_at_once() {
    let wait = std::time::Duration::from_secs(3);
    // About 3 s of speech: ticks every 0.2 s of it.
    let frames = vad_stage_frames(10.0, wait).await;
    let ticks = frames.iter().filter(|e| *e == "user_speaking").count();
    assert!((8..=16).contains(&ticks), "{frames:?}");
    let runs = futures_util::future::join_all((0..3).map(|_| vad_stage_events(10.0, wait))).await;
    for events in runs {
        assert_eq!(
            events.first().map(String::as_str),
            Some("vad_user_started_speaking")
        );
        assert_eq!(
            events.last().map(String::as_str),
            Some("vad_user_stopped_speaking")
        );
        assert_eq!(events.len() % 2, 0, "{events:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_onset_whose_audio_stops_arriving_fades() {
    // Silero hears the speech from the window ending at 1.088 s; cut three windows in, well
    // before the six of the start delay.
    let events = vad_stage_frames(1.16, std::time::Duration::from_secs(2)).await;
    assert_eq!(events, ["vad_speech_onset", "vad_onset_faded"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vad_stage_ends_speech_when_audio_stops_arriving() {
    // Cut in the middle of the sentence: no silence ever arrives, the idle timeout ends it.
    let events = vad_stage_events(2.5, std::time::Duration::from_secs(3)).await;
    // Without the timeout the last event would be a start.
    assert_eq!(events.len() % 2, 0, "{events:?}");
    assert_eq!(
        events.last().map(String::as_str),
        Some("vad_user_stopped_speaking"),
        "{events:?}"
    );
}

#[test]
fn smart_turn_on_voxides_engine_agrees_with_onnx_runtime() {
    use voxide::audio::turn::{SmartTurn, SmartTurnEngine, engine};
    if cfg!(debug_assertions) && !engine::vectorised() {
        // voxide runs its engine only where the CPU has VNNI (`SmartTurnEngine::best`);
        // unoptimised, its plain-Rust products take minutes an inference.
        eprintln!("skipped: no AVX-512 VNNI here, and an unoptimised build");
        return;
    }
    let ort = SmartTurn::load_on(SmartTurnEngine::OnnxRuntime).expect("ORT; run scripts/setup.sh");
    let native = SmartTurn::load_on(SmartTurnEngine::Native).expect("voxide's engine");
    let hello = wav::to_f32(&wav::read(HELLO).expect("test audio").to_mono());
    // The question cut every half second: finished, unfinished and in between. (Few cuts: an
    // unoptimised test build runs voxide's engine slowly.)
    let mut differences = Vec::new();
    for end in (4_000..=hello.len()).step_by(8_000) {
        let audio = &hello[..end];
        let a = ort.predict(audio).expect("ort").probability;
        let b = native.predict(audio).expect("native").probability;
        eprintln!("{end}: onnx runtime {a:.4}, voxide {b:.4}");
        // The int8 model's verdict near one half moves with the last bit of its arithmetic
        // (ONNX Runtime's own does, on input changed by 1 % of a quantisation step); where ONNX
        // Runtime is sure, the engines agree.
        if !(0.3..=0.7).contains(&a) {
            assert_eq!(a > 0.5, b > 0.5, "at {end}: {a} vs {b}");
        }
        differences.push((a - b).abs());
    }
    differences.sort_by(f32::total_cmp);
    let median = differences[differences.len() / 2];
    assert!(median < 0.05, "median difference {median}: {differences:?}");
    // Silence: no turn to judge, both hear it the same.
    let silence = vec![0.0f32; 32_000];
    let (a, b) = (
        ort.predict(&silence).expect("ort"),
        native.predict(&silence).expect("native"),
    );
    assert!(
        (a.probability - b.probability).abs() < 0.05,
        "{a:?} vs {b:?}"
    );
}
