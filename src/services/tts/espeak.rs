//! The libespeak-ng binding: text to IPA phonemes, the front end of the Piper voices.
//!
//! This is the crate's only `unsafe` code. espeak-ng keeps global state and is not thread-safe,
//! so every call goes through one process-wide lock.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::Mutex;

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
}

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

/// The voice currently set, `None` before the library started.
static STATE: Mutex<Option<String>> = Mutex::new(None);

/// The IPA phonemes of `text` in `voice` (e.g. `en-us`). Clauses are translated one after the
/// other and joined with a space; punctuation is not part of the output.
pub fn phonemize(text: &str, voice: &str) -> Result<String, EspeakError> {
    let text = CString::new(text).map_err(|_| EspeakError::Nul)?;
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if state.is_none() {
        // SAFETY: a null path selects the default data directory; the lock serialises every
        // call into the library.
        let rate = unsafe { espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, std::ptr::null(), 0) };
        if rate <= 0 {
            return Err(EspeakError::Init);
        }
        *state = Some(String::new());
    }
    if state.as_deref() != Some(voice) {
        let name = CString::new(voice).map_err(|_| EspeakError::Nul)?;
        // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
        if unsafe { espeak_SetVoiceByName(name.as_ptr()) } != 0 {
            return Err(EspeakError::Voice(voice.to_owned()));
        }
        *state = Some(voice.to_owned());
    }
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
    Ok(out.join(" "))
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
}
