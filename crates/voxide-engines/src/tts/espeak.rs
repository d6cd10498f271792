//! The libespeak-ng binding: text to IPA phonemes (the front end of the Piper voices), and
//! espeak-ng's own formant voice, a second engine that is robotic but nearly free to run.
//!
//! This is the crate's only `unsafe` code. espeak-ng keeps global state and is not thread-safe,
//! so every call goes through one process-wide lock.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_short, c_uint, c_void};
use std::sync::Mutex;

use super::{Speech, Synthesizer, TtsError, WordTiming};

#[link(name = "espeak-ng")]
unsafe extern "C" {
    fn espeak_Initialize(
        output: c_int,
        buflength: c_int,
        path: *const c_char,
        options: c_int,
    ) -> c_int;
    fn espeak_SetVoiceByName(name: *const c_char) -> c_int;
    fn espeak_TextToPhonemes(
        textptr: *mut *const c_void,
        textmode: c_int,
        phonememode: c_int,
    ) -> *const c_char;
    fn espeak_SetSynthCallback(callback: SynthCallback);
    fn espeak_Synth(
        text: *const c_void,
        size: usize,
        position: c_uint,
        position_type: c_int,
        end_position: c_uint,
        flags: c_uint,
        unique_identifier: *mut c_uint,
        user_data: *mut c_void,
    ) -> c_int;
}

type SynthCallback = extern "C" fn(*mut c_short, c_int, *mut EspeakEvent) -> c_int;

/// `espeak_EVENT` as speak_lib.h lays it out.
#[repr(C)]
struct EspeakEvent {
    kind: c_int,
    unique_identifier: c_uint,
    text_position: c_int,
    length: c_int,
    audio_position: c_int,
    sample: c_int,
    user_data: *mut c_void,
    id: *const c_void,
}

/// `espeakEVENT_LIST_TERMINATED` and `espeakEVENT_WORD`.
const EVENT_LIST_END: c_int = 0;
const EVENT_WORD: c_int = 1;
/// `POS_CHARACTER`.
const POSITION_CHARACTER: c_int = 1;

/// `AUDIO_OUTPUT_SYNCHRONOUS`: no audio thread; we only translate text.
const AUDIO_OUTPUT_SYNCHRONOUS: c_int = 2;
/// `espeakCHARS_UTF8`.
const CHARS_UTF8: c_int = 1;
/// `espeakPHONEMES_IPA`: plain IPA, no separators or ties.
const PHONEMES_IPA: c_int = 0x02;

/// Why espeak-ng could not phonemize.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EspeakError {
    /// The library could not start (its data files are missing).
    #[error(
        "espeak-ng could not start; install the espeak-ng-data package (scripts/setup.sh does)"
    )]
    Init,
    /// The voice is unknown.
    #[error("espeak-ng has no voice {0:?}")]
    Voice(String),
    /// The text holds a NUL byte.
    #[error("text with a NUL character cannot be phonemized")]
    Nul,
}

/// The library's state once started: its sample rate and the voice currently set.
struct Library {
    sample_rate: u32,
    voice: String,
}

static STATE: Mutex<Option<Library>> = Mutex::new(None);

/// Runs `f` with the library started and `voice` set, under the process-wide lock.
fn with_voice<T>(voice: &str, f: impl FnOnce(u32) -> T) -> Result<T, EspeakError> {
    let name = CString::new(voice).map_err(|_| EspeakError::Nul)?;
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if state.is_none() {
        // SAFETY: a null path selects the default data directory; the lock serialises every
        // call into the library, and the callback is a plain function that lives forever.
        let rate = unsafe {
            let rate = espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, std::ptr::null(), 0);
            espeak_SetSynthCallback(collect_audio);
            rate
        };
        if rate <= 0 {
            return Err(EspeakError::Init);
        }
        *state = Some(Library {
            sample_rate: rate as u32,
            voice: String::new(),
        });
    }
    let library = state.as_mut().ok_or(EspeakError::Init)?;
    if library.voice != voice {
        // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
        if unsafe { espeak_SetVoiceByName(name.as_ptr()) } != 0 {
            return Err(EspeakError::Voice(voice.to_owned()));
        }
        library.voice = voice.to_owned();
    }
    Ok(f(library.sample_rate))
}

/// The IPA phonemes of `text` in `voice` (e.g. `en-us`). Clauses are translated one after the
/// other and joined with a space; punctuation is not part of the output.
pub fn phonemize(text: &str, voice: &str) -> Result<String, EspeakError> {
    let text = CString::new(text).map_err(|_| EspeakError::Nul)?;
    with_voice(voice, |_| phonemize_locked(&text))
}

fn phonemize_locked(text: &CStr) -> String {
    let mut out = Vec::new();
    let mut cursor: *const c_void = text.as_ptr().cast();
    // Each call translates one clause and moves the cursor past it; null means the end.
    while !cursor.is_null() {
        // SAFETY: `cursor` points into `text`, which lives until the end of this function; the
        // returned string is owned by the library and valid until the next call, so it is copied
        // at once.
        let phonemes = unsafe {
            let ptr = espeak_TextToPhonemes(&mut cursor, CHARS_UTF8, PHONEMES_IPA);
            if ptr.is_null() {
                break;
            }
            CStr::from_ptr(ptr).to_string_lossy().into_owned()
        };
        let phonemes = phonemes.trim();
        if !phonemes.is_empty() {
            out.push(phonemes.to_owned());
        }
    }
    out.join(" ")
}

/// What the synthesis callback collects: samples, and (character offset, ms) per word.
#[derive(Default)]
struct Collected {
    samples: Vec<i16>,
    words: Vec<(usize, usize, u32)>,
}

thread_local! {
    // espeak_Synth calls back on the calling thread, under the lock, before it returns.
    static COLLECTED: RefCell<Collected> = RefCell::new(Collected::default());
}

extern "C" fn collect_audio(wav: *mut c_short, count: c_int, events: *mut EspeakEvent) -> c_int {
    COLLECTED.with_borrow_mut(|out| {
        if !wav.is_null() && count > 0 {
            // SAFETY: espeak-ng hands `count` valid samples at `wav` for the length of the call.
            let samples = unsafe { std::slice::from_raw_parts(wav, count as usize) };
            out.samples.extend_from_slice(samples);
        }
        let mut event = events;
        // SAFETY: the event list is terminated by an EVENT_LIST_END entry.
        while !event.is_null() && unsafe { (*event).kind } != EVENT_LIST_END {
            // SAFETY: `event` is inside the terminated list.
            let e = unsafe { &*event };
            if e.kind == EVENT_WORD && e.text_position > 0 && e.length > 0 {
                out.words.push((
                    e.text_position as usize - 1,
                    e.length as usize,
                    e.audio_position.max(0) as u32,
                ));
            }
            // SAFETY: not past the terminator, checked above.
            event = unsafe { event.add(1) };
        }
    });
    0
}

/// espeak-ng's own voice as a TTS engine.
pub struct EspeakVoice {
    voice: String,
    sample_rate: u32,
}

impl EspeakVoice {
    /// The espeak-ng voice `voice` (e.g. `en-us`); fails when the library or voice is missing.
    pub fn new(voice: &str) -> Result<Self, EspeakError> {
        let sample_rate = with_voice(voice, |rate| rate)?;
        Ok(Self {
            voice: voice.to_owned(),
            sample_rate,
        })
    }
}

impl Synthesizer for EspeakVoice {
    fn name(&self) -> &str {
        "espeak-ng"
    }

    fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    fn synthesize(&self, text: &str) -> Result<Speech, TtsError> {
        let engine = |e: EspeakError| TtsError::Engine(e.to_string());
        let c_text = CString::new(text).map_err(|_| engine(EspeakError::Nul))?;
        let (status, collected) = with_voice(&self.voice, |_| {
            COLLECTED.with_borrow_mut(|c| *c = Collected::default());
            // SAFETY: `c_text` is NUL-terminated and outlives the call; synchronous mode runs
            // the callback on this thread before returning.
            let status = unsafe {
                espeak_Synth(
                    c_text.as_ptr().cast(),
                    c_text.as_bytes_with_nul().len(),
                    0,
                    POSITION_CHARACTER,
                    0,
                    CHARS_UTF8 as c_uint,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            (status, COLLECTED.with_borrow_mut(std::mem::take))
        })
        .map_err(engine)?;
        if status != 0 {
            return Err(TtsError::Engine(format!("espeak_Synth failed ({status})")));
        }
        let total = collected.samples.len() as f64 / f64::from(self.sample_rate);
        let chars: Vec<char> = text.chars().collect();
        let mut words: Vec<WordTiming> = collected
            .words
            .iter()
            .map(|&(at, len, ms)| WordTiming {
                word: chars.iter().skip(at).take(len).collect(),
                start_secs: f64::from(ms) / 1e3,
                end_secs: total,
            })
            .collect();
        for i in 1..words.len() {
            words[i - 1].end_secs = words[i].start_secs;
        }
        Ok(Speech {
            samples: collected.samples,
            sample_rate: self.sample_rate,
            words,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn english_text_becomes_ipa_across_clauses() {
        let ipa = phonemize("Hello world, how are you?", "en-us").expect("phonemes");
        assert!(ipa.contains("həlˈoʊ"), "{ipa}");
        assert!(ipa.contains("juː"), "every clause is translated: {ipa}");
        assert!(matches!(phonemize("a\0b", "en-us"), Err(EspeakError::Nul)));
        assert!(matches!(
            phonemize("x", "no-such-voice"),
            Err(EspeakError::Voice(_))
        ));
    }

    #[test]
    fn the_espeak_voice_speaks_with_word_timings() {
        let voice = EspeakVoice::new("en-us").expect("voice");
        let speech = voice.synthesize("Hello there, friend.").expect("speech");
        let secs = speech.samples.len() as f64 / f64::from(speech.sample_rate);
        assert!((0.6..3.0).contains(&secs), "{secs} s");
        let words: Vec<&str> = speech.words.iter().map(|w| w.word.as_str()).collect();
        assert_eq!(words, ["Hello", "there", "friend"]);
        assert!(
            speech
                .words
                .windows(2)
                .all(|w| w[0].start_secs < w[1].start_secs)
        );
        assert!(
            speech.samples.iter().any(|s| s.unsigned_abs() > 1000),
            "audible"
        );
        // Phonemizing between syntheses keeps working (shared state, one lock).
        assert!(phonemize("cat", "en-us").is_ok());
        assert!(voice.synthesize("Again.").is_ok());
    }
}
