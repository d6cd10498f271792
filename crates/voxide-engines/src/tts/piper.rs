//! Piper voices: espeak-ng IPA phonemes mapped to the voice's ids, then VITS through ONNX Runtime.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use ort::session::Session;
use ort::value::Tensor;
use serde::Deserialize;

use super::espeak;
use super::{Speech, Synthesizer, TtsError, WordTiming};
use crate::models::{ModelError, model_path};

const NAME: &str = "piper-joe";
const MODEL: &str = "piper/en_US-joe-medium.onnx";
const CONFIG: &str = "piper/en_US-joe-medium.onnx.json";

/// The parts of a voice's `.onnx.json` that synthesis needs.
#[derive(Debug, Clone, Deserialize)]
struct VoiceConfig {
    audio: AudioConfig,
    espeak: EspeakConfig,
    inference: InferenceConfig,
    phoneme_id_map: HashMap<String, Vec<i64>>,
}

#[derive(Debug, Clone, Deserialize)]
struct AudioConfig {
    sample_rate: u32,
}

#[derive(Debug, Clone, Deserialize)]
struct EspeakConfig {
    voice: String,
}

#[derive(Debug, Clone, Deserialize)]
struct InferenceConfig {
    noise_scale: f32,
    length_scale: f32,
    noise_w: f32,
}

/// A loaded Piper voice, shared by every session.
pub struct PiperVoice {
    session: Mutex<Session>,
    sample_rate: u32,
    espeak_voice: String,
    ids: HashMap<char, Vec<i64>>,
    scales: [f32; 3],
}

static SHARED: OnceLock<Arc<PiperVoice>> = OnceLock::new();

/// A word and its phoneme count.
type WeightedWord = (String, usize);

impl PiperVoice {
    /// The same voice without sampling noise (`noise_scale` and `noise_w` zero): a text always
    /// gives the same audio, pauses included, as recorded test speech needs.
    pub fn deterministic(mut self) -> Self {
        self.scales[0] = 0.0;
        self.scales[2] = 0.0;
        self
    }

    /// Loads the default voice (en_US joe, medium) from the models folder.
    pub fn load_default() -> Result<Self, ModelError> {
        Self::load(&model_path(NAME, MODEL)?, &model_path(NAME, CONFIG)?)
    }

    /// The process-wide default voice, loaded on first use.
    pub fn shared() -> Result<Arc<Self>, ModelError> {
        if let Some(voice) = SHARED.get() {
            return Ok(voice.clone());
        }
        let voice = Arc::new(Self::load_default()?);
        Ok(SHARED.get_or_init(|| voice).clone())
    }

    /// Loads a voice from its model and config files.
    pub fn load(model: &Path, config: &Path) -> Result<Self, ModelError> {
        let invalid = |reason: String| ModelError::Invalid {
            name: NAME.into(),
            path: config.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(config).map_err(|e| invalid(e.to_string()))?;
        let config: VoiceConfig =
            serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let ids = config
            .phoneme_id_map
            .into_iter()
            .filter_map(|(k, v)| {
                let mut chars = k.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) => Some((c, v)),
                    _ => None,
                }
            })
            .collect::<HashMap<_, _>>();
        for needed in ['_', '^', '$'] {
            if !ids.contains_key(&needed) {
                return Err(invalid(format!("phoneme_id_map lacks {needed:?}")));
            }
        }
        // Two threads: synthesis is the one engine whose single call is long enough to share.
        let session = crate::onnx::open(NAME, model, 2)?;
        Ok(Self {
            session: Mutex::new(session),
            sample_rate: config.audio.sample_rate,
            espeak_voice: config.espeak.voice,
            ids,
            scales: [
                config.inference.noise_scale,
                config.inference.length_scale,
                config.inference.noise_w,
            ],
        })
    }

    /// The voice's ids for `text`, and the phoneme count of each word (for word timings).
    fn phoneme_ids(&self, text: &str) -> Result<(Vec<i64>, Vec<WeightedWord>), TtsError> {
        let pad = self.ids[&'_'][0];
        let mut ids = self.ids[&'^'].clone();
        ids.push(pad);
        let mut words = Vec::new();
        let mut first = true;
        for (clause, punctuation) in clauses(text) {
            let phonemes = espeak::phonemize(clause, &self.espeak_voice)
                .map_err(|e| TtsError::Engine(e.to_string()))?;
            if phonemes.is_empty() && punctuation.is_none() {
                continue;
            }
            if !first {
                self.push_char(&mut ids, ' ', pad);
            }
            first = false;
            for c in phonemes.chars() {
                self.push_char(&mut ids, c, pad);
            }
            if let Some(p) = punctuation {
                self.push_char(&mut ids, p, pad);
            }
            for word in clause.split_whitespace() {
                let weight = espeak::phonemize(word, &self.espeak_voice)
                    .map(|p| p.chars().count())
                    .unwrap_or(1);
                words.push((word.to_owned(), weight.max(1)));
            }
        }
        ids.extend_from_slice(&self.ids[&'$']);
        Ok((ids, words))
    }

    fn push_char(&self, ids: &mut Vec<i64>, c: char, pad: i64) {
        if let Some(id) = self.ids.get(&c) {
            ids.extend_from_slice(id);
            ids.push(pad);
        }
    }

    fn run(&self, ids: Vec<i64>) -> Result<Vec<f32>, TtsError> {
        let engine = |e: ort::Error| TtsError::Engine(e.to_string());
        let n = ids.len();
        let input = Tensor::from_array(([1, n], ids)).map_err(engine)?;
        let lengths = Tensor::from_array(([1], vec![n as i64])).map_err(engine)?;
        let scales = Tensor::from_array(([3], self.scales.to_vec())).map_err(engine)?;
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let _running = crate::onnx::running()
            .ok_or_else(|| TtsError::Engine("the process is exiting".into()))?;
        let outputs = session
            .run(ort::inputs!["input" => input, "input_lengths" => lengths, "scales" => scales])
            .map_err(engine)?;
        let (_, audio) = outputs["output"]
            .try_extract_tensor::<f32>()
            .map_err(engine)?;
        Ok(audio.to_vec())
    }
}

impl Synthesizer for PiperVoice {
    fn name(&self) -> &str {
        "piper"
    }

    fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    fn synthesize(&self, text: &str) -> Result<Speech, TtsError> {
        let (ids, words) = self.phoneme_ids(text)?;
        if words.is_empty() {
            return Ok(Speech {
                samples: Vec::new(),
                sample_rate: self.sample_rate,
                words: Vec::new(),
            });
        }
        let audio = self.run(ids)?;
        let samples: Vec<i16> = audio
            .iter()
            .map(|&s| (s.clamp(-1.0, 1.0) * 32767.0) as i16)
            .collect();
        let seconds = samples.len() as f64 / f64::from(self.sample_rate);
        Ok(Speech {
            words: spread(&words, seconds),
            samples,
            sample_rate: self.sample_rate,
        })
    }
}

/// Word timings estimated by sharing the audio's duration by phoneme count: the voice does not
/// report its durations, and phoneme counts follow speaking time closely enough to tell which
/// words an interruption cut.
fn spread(words: &[WeightedWord], seconds: f64) -> Vec<WordTiming> {
    let total: usize = words.iter().map(|(_, w)| w).sum();
    let mut start = 0.0;
    words
        .iter()
        .map(|(word, weight)| {
            let length = seconds * *weight as f64 / total.max(1) as f64;
            let timing = WordTiming {
                word: word.clone(),
                start_secs: start,
                end_secs: start + length,
            };
            start += length;
            timing
        })
        .collect()
}

/// Splits text at clause punctuation, keeping the mark that ended each clause.
fn clauses(text: &str) -> Vec<(&str, Option<char>)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if matches!(c, '.' | ',' | '!' | '?' | ';' | ':') {
            let clause = text[start..i].trim();
            if !clause.is_empty() {
                out.push((clause, Some(c)));
            }
            start = i + c.len_utf8();
        }
    }
    let rest = text[start..].trim();
    if !rest.is_empty() {
        out.push((rest, None));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clauses_keep_their_punctuation() {
        assert_eq!(
            clauses("Hi there, friend. How are you"),
            vec![
                ("Hi there", Some(',')),
                ("friend", Some('.')),
                ("How are you", None)
            ]
        );
        assert!(clauses(" ... ").is_empty());
    }

    #[test]
    fn word_timings_cover_the_audio_in_order() {
        let words = vec![("a".to_owned(), 1), ("bcd".to_owned(), 3)];
        let t = spread(&words, 2.0);
        assert_eq!(t[0].end_secs, 0.5);
        assert_eq!(t[1].start_secs, 0.5);
        assert_eq!(t[1].end_secs, 2.0);
    }
}
