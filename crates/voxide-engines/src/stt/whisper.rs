//! Whisper speech-to-text with candle, loaded from a CTranslate2 `model.bin`.
//!
//! The CTranslate2 file stores the same weights as OpenAI's checkpoint in float16 under its own
//! names, with self-attention q/k/v fused into one matrix and cross-attention k/v into another.
//! Loading splits them back and drops the key biases (Whisper's keys have none; the file stores
//! zeros). The [`encoder`](super::encoder) reads the audio; the [`decoder`](super::decoder),
//! which caches its self-attention, writes the text.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use super::ct2::{self, Ct2Model};
use super::decoder::{CachedDecoder, DecoderState};
use super::encoder::AudioEncoder;
use super::layers::Dims;
use crate::audio::mel::{self, LogMel};
use crate::bpe::{Digits, Tokenizer};
use crate::models::{ModelError, model_path};
use voxide_core::text::{word_edits, word_list};

const NAME: &str = "whisper-tiny.en";
const DIR: &str = "whisper-tiny.en";
/// Tokens one utterance may produce at most.
const MAX_TOKENS: usize = 200;

/// A loaded Whisper model with its tokenizer, shared by every session.
pub struct Whisper {
    encoder: AudioEncoder,
    decoder: CachedDecoder,
    tokens: Tokenizer,
    special: SpecialTokens,
    suppress: Vec<u32>,
    suppress_begin: Vec<u32>,
    window: WindowPolicy,
}

/// How much audio the encoder reads. Whisper was trained on 30 s windows; its encoder also runs
/// on shorter ones (the cost falls with the length), which stay accurate while the speech is
/// followed by enough silence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowPolicy {
    /// Silence added after the audio, seconds.
    pub trailing_secs: f32,
    /// Shortest window, seconds.
    pub min_secs: f32,
}

impl WindowPolicy {
    /// Always the full 30 s window, as Whisper was trained.
    pub const FULL: WindowPolicy = WindowPolicy {
        trailing_secs: 30.0,
        min_secs: 30.0,
    };

    /// Whole seconds of audio the encoder reads for `samples` of audio.
    fn samples(&self, samples: usize) -> usize {
        let rate = mel::SAMPLE_RATE as usize;
        let secs = samples as f32 / rate as f32 + self.trailing_secs;
        let secs = secs.clamp(self.min_secs, 30.0).ceil() as usize;
        secs * rate
    }
}

impl Default for WindowPolicy {
    fn default() -> Self {
        Self {
            trailing_secs: 1.0,
            min_secs: 3.0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct SpecialTokens {
    eot: u32,
    sot: u32,
    no_timestamps: u32,
    /// Opens the text before the audio (a prompt).
    prev: u32,
}

/// Hypotheses a second listen's beam search keeps ([`PromptedWhisper::with_reader`]).
const BEAM: usize = 5;

/// Prompt tokens Whisper reads at most: half its text context, as OpenAI's decoder allows.
const MAX_PROMPT_TOKENS: usize = 223;

/// Which tokens never to emit, from the model's `config.json`.
#[derive(Debug, Deserialize)]
struct SuppressConfig {
    #[serde(default)]
    suppress_ids: Vec<u32>,
    #[serde(default)]
    suppress_ids_begin: Vec<u32>,
}

static SHARED: OnceLock<Arc<Whisper>> = OnceLock::new();

/// Why transcription failed.
#[derive(Debug, thiserror::Error)]
#[error("transcription failed: {0}")]
pub struct SttError(pub String);

fn invalid(path: &Path, reason: impl ToString) -> ModelError {
    ModelError::Invalid {
        name: NAME.into(),
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

impl Whisper {
    /// Loads tiny.en from the models folder.
    pub fn load_default() -> Result<Self, ModelError> {
        let model = model_path(NAME, &format!("{DIR}/model.bin"))?;
        let dir = model.parent().map(Path::to_owned).unwrap_or_default();
        Self::load(&dir)
    }

    /// The process-wide model, loaded on first use.
    pub fn shared() -> Result<Arc<Self>, ModelError> {
        if let Some(model) = SHARED.get() {
            return Ok(model.clone());
        }
        let model = Arc::new(Self::load_default()?);
        Ok(SHARED.get_or_init(|| model).clone())
    }

    /// Loads `model.bin`, `tokenizer.json` and `config.json` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let bin = dir.join("model.bin");
        let bytes = std::fs::read(&bin).map_err(|e| invalid(&bin, e))?;
        let ct2 = Ct2Model::parse(&bytes).map_err(|e| invalid(&bin, e))?;
        drop(bytes);
        let (tensors, dims) = named_tensors(&ct2).map_err(|e| invalid(&bin, e))?;
        drop(ct2);
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
        let encoder =
            AudioEncoder::load(vb.pp("model.encoder"), &dims).map_err(|e| invalid(&bin, e))?;
        let decoder =
            CachedDecoder::load(vb.pp("model.decoder"), &dims).map_err(|e| invalid(&bin, e))?;

        let tokenizer = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&tokenizer).map_err(|e| invalid(&tokenizer, e))?;
        let tokens = tokenizer_from_json(&text).map_err(|e| invalid(&tokenizer, e))?;
        let id = |token: &str| {
            tokens
                .token(token)
                .ok_or_else(|| invalid(&tokenizer, format!("the tokenizer lacks {token}")))
        };
        let special = SpecialTokens {
            eot: id("<|endoftext|>")?,
            sot: id("<|startoftranscript|>")?,
            no_timestamps: id("<|notimestamps|>")?,
            prev: id("<|startofprev|>")?,
        };
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|e| invalid(&config_path, e))?;
        let suppress: SuppressConfig =
            serde_json::from_str(&text).map_err(|e| invalid(&config_path, e))?;
        Ok(Self {
            encoder,
            decoder,
            tokens,
            special,
            suppress: suppress.suppress_ids,
            suppress_begin: suppress.suppress_ids_begin,
            window: WindowPolicy::default(),
        })
    }

    /// The same model reading windows as `policy` says.
    pub fn with_window(mut self, policy: WindowPolicy) -> Self {
        self.window = policy;
        self
    }

    /// Transcribes 16 kHz mono audio in [-1, 1]. Blocking (hundreds of ms): call it off the
    /// async runtime.
    pub fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
        self.transcribe_after(audio, &[])
    }

    /// `words` as a prompt: the text Whisper reads as said before the audio, which leans it
    /// towards their words and spellings (OpenAI's `prompt`). At most the last
    /// [`MAX_PROMPT_TOKENS`] are kept.
    pub fn prompt(&self, words: &str) -> Vec<u32> {
        let words = words.split_whitespace().collect::<Vec<_>>().join(" ");
        if words.is_empty() {
            return Vec::new();
        }
        let tokens = self.tokens.encode(&format!(" {words}"));
        tokens[tokens.len().saturating_sub(MAX_PROMPT_TOKENS)..].to_vec()
    }

    /// Transcribes `audio` as said after `prompt` ([`Whisper::prompt`]).
    pub fn transcribe_after(&self, audio: &[f32], prompt: &[u32]) -> Result<String, SttError> {
        self.decode(&self.encode(audio)?, prompt)
    }

    /// The encoder's reading of `audio`: the costly half, which any prompt's decoding reuses.
    fn encode(&self, audio: &[f32]) -> Result<Tensor, SttError> {
        let err = |e: candle_core::Error| SttError(e.to_string());
        let window = self.window.samples(audio.len());
        let mut padded = audio[..audio.len().min(window)].to_vec();
        padded.resize(window, 0.0);
        let features = LogMel::shared().features(&padded, false);
        let frames = features.len() / mel::N_MELS;
        let mel =
            Tensor::from_vec(features, (1, mel::N_MELS, frames), &Device::Cpu).map_err(err)?;
        self.encoder.forward(&mel).map_err(err)
    }

    /// The decoder's opening: the prompt (if any), then the start of a transcript.
    fn prefix(&self, prompt: &[u32]) -> Vec<u32> {
        let mut prefix = Vec::with_capacity(prompt.len() + 3);
        if !prompt.is_empty() {
            prefix.push(self.special.prev);
            prefix.extend_from_slice(prompt);
        }
        prefix.extend([self.special.sot, self.special.no_timestamps]);
        prefix
    }

    /// The text of `audio_features` as said after `prompt`, greedy, with the suppress lists and
    /// the repetition stop.
    fn decode(&self, audio_features: &Tensor, prompt: &[u32]) -> Result<String, SttError> {
        let always = || true;
        Ok(self
            .decode_while(audio_features, prompt, &always)?
            .unwrap_or_default())
    }

    /// As [`decode`](Self::decode), given up between two tokens once `wanted` says no: `None`.
    fn decode_while(
        &self,
        audio_features: &Tensor,
        prompt: &[u32],
        wanted: &dyn Fn() -> bool,
    ) -> Result<Option<String>, SttError> {
        let err = |e: candle_core::Error| SttError(e.to_string());
        let prefix = self.prefix(prompt);
        let state = self.decoder.start(audio_features).map_err(err)?;
        let limit = MAX_TOKENS.min(self.decoder.max_tokens().saturating_sub(prefix.len()));
        let tokens = self.greedy(state, prefix, limit, wanted).map_err(err)?;
        Ok(tokens.map(|tokens| self.text(&tokens)))
    }

    /// The readings of `audio_features` a beam search of [`BEAM`] ends with, likeliest first
    /// (by mean log-probability per token).
    fn hypotheses(&self, audio_features: &Tensor, prompt: &[u32]) -> Result<Vec<String>, SttError> {
        let err = |e: candle_core::Error| SttError(e.to_string());
        let prefix = self.prefix(prompt);
        let state = self.decoder.start(audio_features).map_err(err)?;
        let limit = MAX_TOKENS.min(self.decoder.max_tokens().saturating_sub(prefix.len()));
        let ended = self.beam_search(state, prefix, limit).map_err(err)?;
        Ok(ended.iter().map(|tokens| self.text(tokens)).collect())
    }

    fn text(&self, tokens: &[u32]) -> String {
        let text = without_repeated_sentences(self.tokens.decode(tokens).trim());
        if stutter(&text) {
            tracing::debug!(%text, "a word begun over and over and never said: no words");
            return String::new();
        }
        text
    }

    /// Which tokens may come: 0 for the allowed, minus infinity for the suppressed and every
    /// special token past the end of text (timestamps are never wanted here).
    fn mask(&self) -> Vec<f32> {
        let mut mask = vec![0f32; self.decoder.vocab()];
        for &id in &self.suppress {
            if let Some(m) = mask.get_mut(id as usize) {
                *m = f32::NEG_INFINITY;
            }
        }
        for m in mask.iter_mut().skip(self.special.eot as usize + 1) {
            *m = f32::NEG_INFINITY;
        }
        mask
    }

    /// Applies `mask` to `logits` and, at the first step, the begin-suppress list.
    fn restrict(&self, logits: &mut [f32], mask: &[f32], first: bool) {
        for (l, m) in logits.iter_mut().zip(mask) {
            *l += m;
        }
        if first {
            for &id in &self.suppress_begin {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// The likeliest token at each step, until the end of text.
    fn greedy(
        &self,
        mut state: DecoderState,
        prefix: Vec<u32>,
        limit: usize,
        wanted: &dyn Fn() -> bool,
    ) -> candle_core::Result<Option<Vec<u32>>> {
        let mask = self.mask();
        let mut tokens = Vec::new();
        let mut logits = self.decoder.step(&mut state, &prefix)?;
        for step in 0..limit {
            if !wanted() {
                return Ok(None);
            }
            self.restrict(&mut logits, &mask, step == 0);
            let next = argmax(&logits);
            if next == self.special.eot {
                break;
            }
            tokens.push(next);
            if let Some(copy) = repeated_tail(&tokens) {
                tokens.truncate(tokens.len() - copy);
                break;
            }
            logits = self.decoder.step(&mut state, &[next])?;
        }
        Ok(Some(tokens))
    }

    /// Beam search as OpenAI's decoder does it: [`BEAM`] hypotheses, each extended by its
    /// `BEAM + 1` likeliest tokens, the best [`BEAM`] kept, until [`BEAM`] have ended. Returns
    /// the ended ones by mean log-probability per token, highest first. The hypotheses run as
    /// the rows of one decoder pass.
    fn beam_search(
        &self,
        mut state: DecoderState,
        prefix: Vec<u32>,
        limit: usize,
    ) -> candle_core::Result<Vec<Vec<u32>>> {
        let mask = self.mask();
        // (tokens, summed log-probability), one per row of `state` and of `logits`.
        let mut beams: Vec<(Vec<u32>, f32)> = vec![(Vec::new(), 0.0)];
        let mut logits = vec![self.decoder.step(&mut state, &prefix)?];
        let mut ended: Vec<(Vec<u32>, f32)> = Vec::new();
        for step in 0..limit {
            let mut candidates = Vec::new();
            for (row, ((_, score), row_logits)) in beams.iter().zip(&mut logits).enumerate() {
                self.restrict(row_logits, &mask, step == 0);
                for (token, logprob) in top_log_probs(row_logits, BEAM + 1) {
                    candidates.push((score + logprob, row, token));
                }
            }
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
            // (tokens, score) of the next hypotheses, their parents' rows, their last tokens.
            let mut next = Vec::with_capacity(BEAM);
            let (mut parents, mut last) = (Vec::new(), Vec::new());
            for (score, row, token) in candidates {
                let tokens = &beams[row].0;
                if token == self.special.eot {
                    ended.push((tokens.clone(), score));
                    continue;
                }
                let mut tokens = tokens.clone();
                tokens.push(token);
                if let Some(copy) = repeated_tail(&tokens) {
                    tokens.truncate(tokens.len() - copy);
                    ended.push((tokens, score));
                    continue;
                }
                next.push((tokens, score));
                parents.push(row as u32);
                last.push(token);
                if next.len() == BEAM {
                    break;
                }
            }
            if ended.len() >= BEAM || next.is_empty() || step + 1 == limit {
                beams = next;
                break;
            }
            state = self.decoder.select(&state, &parents)?;
            logits = self.decoder.step_rows(&mut state, &last)?;
            beams = next;
        }
        if ended.is_empty() {
            ended = beams;
        }
        let mean = |(tokens, score): &(Vec<u32>, f32)| score / tokens.len().max(1) as f32;
        ended.sort_by(|a, b| mean(b).total_cmp(&mean(a)));
        Ok(ended.into_iter().map(|(tokens, _)| tokens).collect())
    }
}

/// What a bot makes of a transcript, for Whisper's second listen
/// ([`PromptedWhisper::with_reader`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// A request the bot can act on as it stands ("Cancel my timer").
    Request,
    /// The words of a request the bot cannot make out ("Console my timer", "How much is 4 B
    /// minus 18?"): worth a second listen.
    Garbled,
    /// Anything else: talk.
    Talk,
}

/// Reads a transcript as a bot would ([`Reading`]).
pub type Reader = Arc<dyn Fn(&str) -> Reading + Send + Sync>;

/// Whisper told which words to expect ([`Whisper::prompt`]): names and terms it should spell
/// its way. Shared weights; the prompt is this bot's.
///
/// A prompt leaks: on unclear speech Whisper may write the prompt's own words ("What is the
/// time?" for a question it could not make out). A transcript made only of the prompt's words
/// is decoded again without it, so the prompt never puts words in the user's mouth.
///
/// With a [`Reader`], a transcript that reads as a garbled request gets a second listen: a beam
/// search without the prompt, whose likeliest reading that makes a request the bot can act on
/// replaces it. Greedy decoding is right for most turns and about twice as fast, so only the
/// turns the beam can help pay for it.
pub struct PromptedWhisper {
    whisper: Arc<Whisper>,
    prompt: Vec<u32>,
    /// The prompt's words, as [`plain_words`] writes them.
    words: String,
    reader: Option<Reader>,
}

impl PromptedWhisper {
    /// `whisper` expecting `words` (none: plain Whisper).
    pub fn new(whisper: Arc<Whisper>, words: &str) -> Self {
        let prompt = whisper.prompt(words);
        Self {
            whisper,
            prompt,
            words: plain_words(words),
            reader: None,
        }
    }

    /// Listens again, with a beam search, where `reader` finds a garbled request.
    pub fn with_reader(mut self, reader: Reader) -> Self {
        self.reader = Some(reader);
        self
    }

    /// Transcribes `audio` after the prompt, with a second listen to a garbled request.
    pub fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
        let always = || true;
        Ok(self.transcribe_while(audio, &always)?.unwrap_or_default())
    }

    /// As [`PromptedWhisper::transcribe`], given up (`None`) as soon as `wanted` says no.
    pub fn transcribe_while(
        &self,
        audio: &[f32],
        wanted: &dyn Fn() -> bool,
    ) -> Result<Option<String>, SttError> {
        let features = self.whisper.encode(audio)?;
        let Some(text) = self.first_listen_while(&features, wanted)? else {
            return Ok(None);
        };
        if !wanted() {
            return Ok(None);
        }
        self.second_listen(&features, text).map(Some)
    }

    /// Transcribes `audio` after the prompt, greedy alone: for the words so far of an
    /// utterance still going on, which a request half said would make garbled. Given up
    /// (`None`) as soon as `wanted` says no: newer audio is waiting to be heard.
    pub fn transcribe_partial(
        &self,
        audio: &[f32],
        wanted: &dyn Fn() -> bool,
    ) -> Result<Option<String>, SttError> {
        let features = self.whisper.encode(audio)?;
        self.first_listen_while(&features, wanted)
    }

    fn first_listen_while(
        &self,
        features: &Tensor,
        wanted: &dyn Fn() -> bool,
    ) -> Result<Option<String>, SttError> {
        let Some(text) = self.whisper.decode_while(features, &self.prompt, wanted)? else {
            return Ok(None);
        };
        if !self.prompt.is_empty() && echoes(&self.words, &text) {
            tracing::debug!(%text, "the transcript only repeats the prompt: decoding without it");
            return self.whisper.decode_while(features, &[], wanted);
        }
        Ok(Some(text))
    }

    fn second_listen(&self, features: &Tensor, text: String) -> Result<String, SttError> {
        let Some(reader) = &self.reader else {
            return Ok(text);
        };
        if reader(&text) != Reading::Garbled {
            return Ok(text);
        }
        // Without the prompt: its words may have leaked into the first reading ("Multiply 5."
        // for "My name is Anna."), and a beam that leans on them would make that a request.
        let heard = self
            .whisper
            .hypotheses(features, &[])?
            .into_iter()
            .find(|h| reader(h) == Reading::Request);
        match heard {
            Some(heard) => {
                tracing::debug!(greedy = %text, %heard, "a second listen made out the request");
                Ok(heard)
            }
            None => Ok(text),
        }
    }
}

/// Lowercase words, without punctuation, one space apart, with a space at each end.
fn plain_words(text: &str) -> String {
    format!(" {} ", word_list(text).join(" "))
}

/// Whether every word of `text`, in order, is a run of the prompt's `words` ([`plain_words`]).
fn echoes(words: &str, text: &str) -> bool {
    let text = plain_words(text);
    !text.trim().is_empty() && words.contains(&text)
}

/// `text` with every sentence that repeats the one before it dropped. On a short window Whisper
/// tends to say a short utterance twice ("Stop," heard as "Stop. Stop."); the token-level loop
/// check misses that, as the copy's first token carries a leading space the original lacks. The
/// copy is not always exact: "Could you recommend a good book for a long flight? Good you
/// recommend a good book for a long flight." A sentence of three words or more that differs from
/// the one before by at most one word in four ([`near_repeat`]) is a copy too.
fn without_repeated_sentences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last: Vec<String> = Vec::new();
    for sentence in sentences(text) {
        let this = word_list(sentence);
        if this.is_empty() || !near_repeat(&last, &this) {
            out.push_str(sentence);
        }
        if !this.is_empty() {
            last = this;
        }
    }
    out.trim().to_owned()
}

/// Whether `text` is one word begun again and again and never finished ("Post-post-post-",
/// "I- I-"): what Whisper makes of a café's talk it cannot make out, and no words.
fn stutter(text: &str) -> bool {
    let mut starts = text
        .split(|c: char| c == '-' || c.is_whitespace())
        .filter(|piece| !piece.is_empty())
        .map(str::to_lowercase);
    let Some(first) = starts.next() else {
        return false;
    };
    let mut count = 1;
    for start in starts {
        if start != first {
            return false;
        }
        count += 1;
    }
    count >= 2 && text.ends_with('-')
}

/// Whether the words `this` repeat `last`: the same words, or (from three words on) as many
/// words with at most one in four replaced, added or left out.
fn near_repeat(last: &[String], this: &[String]) -> bool {
    if last == this {
        return true;
    }
    let longer = last.len().max(this.len());
    if last.len().min(this.len()) < 3 {
        return false;
    }
    word_edits(last, this) * 4 <= longer
}

/// `text` cut after each run of sentence-ending marks, each piece keeping its leading space.
fn sentences(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let ends = matches!(c, '.' | '!' | '?' | '…');
        let next_ends = chars
            .peek()
            .is_some_and(|&(_, n)| matches!(n, '.' | '!' | '?' | '…'));
        if ends && !next_ends {
            let end = i + c.len_utf8();
            pieces.push(&text[start..end]);
            start = end;
        }
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

fn argmax(values: &[f32]) -> u32 {
    values
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

/// The `n` likeliest tokens of `logits` with their log-probabilities, likeliest first.
fn top_log_probs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    for (i, &l) in logits.iter().enumerate() {
        if top.len() < n || l > top[top.len() - 1].1 {
            let at = top.partition_point(|&(_, t)| t >= l);
            top.insert(at, (i as u32, l));
            top.truncate(n);
        }
    }
    top.into_iter()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, l)| (i, l - log_sum))
        .collect()
}

/// A decoding loop: the last `len >= 3` tokens repeat the `len` before them (Whisper's typical
/// failure on short windows). Returns how many tokens to drop (the repeated copy), if any.
fn repeated_tail(tokens: &[u32]) -> Option<usize> {
    let n = tokens.len();
    (3..=n / 2).find(|&len| tokens[n - len..] == tokens[n - 2 * len..n - len])
}

#[derive(Deserialize)]
struct TokenizerJson {
    model: TokenizerModel,
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
}

#[derive(Deserialize)]
struct TokenizerModel {
    vocab: HashMap<String, u32>,
    #[serde(default)]
    merges: Vec<Merge>,
}

/// A merge rule: `"a b"` in older `tokenizer.json` files, `["a", "b"]` in newer ones.
#[derive(Deserialize)]
#[serde(untagged)]
enum Merge {
    Joined(String),
    Pair(String, String),
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
}

/// Whisper's byte-level BPE from its `tokenizer.json`: the vocabulary, the special tokens added
/// to it, and the merges.
fn tokenizer_from_json(text: &str) -> Result<Tokenizer, String> {
    let json: TokenizerJson = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut ids = json.model.vocab;
    for added in json.added_tokens {
        ids.insert(added.content, added.id);
    }
    let size = ids.values().copied().max().map_or(0, |m| m as usize + 1);
    let mut pieces = vec![String::new(); size];
    for (piece, id) in ids {
        pieces[id as usize] = piece;
    }
    let merges: Vec<String> = json
        .model
        .merges
        .into_iter()
        .map(|m| match m {
            Merge::Joined(m) => m,
            Merge::Pair(a, b) => format!("{a} {b}"),
        })
        .collect();
    Tokenizer::new(pieces, &merges, Digits::Runs)
}

/// How one CTranslate2 variable group becomes tensors.
#[derive(Clone, Copy)]
enum Rename {
    /// `gamma`/`beta` → `weight`/`bias`.
    Norm,
    /// `weight`/`bias` as they are.
    Linear,
    /// Fused rows split into these projections (keys get no bias).
    Fused(&'static [&'static str]),
}

/// Every layer: self-attention and feed-forward (CTranslate2 suffix, our suffix).
const BLOCK: &[(Rename, &str, &str)] = &[
    (
        Rename::Norm,
        "self_attention/layer_norm",
        "self_attn_layer_norm",
    ),
    (
        Rename::Fused(&["q_proj", "k_proj", "v_proj"]),
        "self_attention/linear_0",
        "self_attn",
    ),
    (
        Rename::Linear,
        "self_attention/linear_1",
        "self_attn.out_proj",
    ),
    (Rename::Norm, "ffn/layer_norm", "final_layer_norm"),
    (Rename::Linear, "ffn/linear_0", "fc1"),
    (Rename::Linear, "ffn/linear_1", "fc2"),
];

/// Decoder layers also attend to the audio.
const CROSS_ATTENTION: &[(Rename, &str, &str)] = &[
    (
        Rename::Norm,
        "attention/layer_norm",
        "encoder_attn_layer_norm",
    ),
    (Rename::Linear, "attention/linear_0", "encoder_attn.q_proj"),
    (
        Rename::Fused(&["k_proj", "v_proj"]),
        "attention/linear_1",
        "encoder_attn",
    ),
    (
        Rename::Linear,
        "attention/linear_2",
        "encoder_attn.out_proj",
    ),
];

/// One of the model's tensors, as f32.
fn tensor(ct2: &Ct2Model, name: &str) -> Result<Tensor, String> {
    let v = ct2.get(name).map_err(|e| e.to_string())?;
    let dtype = match v.dtype {
        ct2::DType::F16 => DType::F16,
        ct2::DType::F32 => DType::F32,
        ct2::DType::Bf16 => DType::BF16,
        other => return Err(format!("{name}: unsupported type {other:?}")),
    };
    Tensor::from_raw_buffer(&v.bytes, dtype, &v.dims, &Device::Cpu)
        .and_then(|t| t.to_dtype(DType::F32))
        .map_err(|e| format!("{name}: {e}"))
}

/// Puts the tensors of CTranslate2's `from` into `out` under the name `to`.
fn rename(
    out: &mut HashMap<String, Tensor>,
    ct2: &Ct2Model,
    (kind, from, to): (Rename, &str, &str),
) -> Result<(), String> {
    let get = |name: String| tensor(ct2, &name);
    match kind {
        Rename::Norm => {
            out.insert(format!("{to}.weight"), get(format!("{from}/gamma"))?);
            out.insert(format!("{to}.bias"), get(format!("{from}/beta"))?);
        }
        Rename::Linear => {
            out.insert(format!("{to}.weight"), get(format!("{from}/weight"))?);
            out.insert(format!("{to}.bias"), get(format!("{from}/bias"))?);
        }
        Rename::Fused(names) => {
            let weight = get(format!("{from}/weight"))?;
            let bias = get(format!("{from}/bias"))?;
            let rows = weight.dim(0).map_err(|e| e.to_string())? / names.len();
            for (i, name) in names.iter().enumerate() {
                let part = |t: &Tensor| t.narrow(0, i * rows, rows).map_err(|e| e.to_string());
                out.insert(format!("{to}.{name}.weight"), part(&weight)?);
                if *name != "k_proj" {
                    out.insert(format!("{to}.{name}.bias"), part(&bias)?);
                }
            }
        }
    }
    Ok(())
}

/// The model's tensors under the names the encoder and decoder load (those of Hugging Face's
/// Whisper checkpoints), and its sizes.
fn named_tensors(ct2: &Ct2Model) -> Result<(HashMap<String, Tensor>, Dims), String> {
    if ct2.spec != "WhisperSpec" {
        return Err(format!("expected a Whisper model, found {}", ct2.spec));
    }
    let mut out = HashMap::new();
    let layers = |prefix: &str| {
        (0..)
            .take_while(|i| {
                ct2.variables
                    .contains_key(&format!("{prefix}/layer_{i}/ffn/linear_0/weight"))
            })
            .count()
    };
    let enc_layers = layers("encoder");
    let dec_layers = layers("decoder");
    for conv in ["conv1", "conv2"] {
        let (from, to) = (format!("encoder/{conv}"), format!("model.encoder.{conv}"));
        rename(&mut out, ct2, (Rename::Linear, &from, &to))?;
    }
    for (part, count, parts) in [
        ("encoder", enc_layers, &[BLOCK][..]),
        ("decoder", dec_layers, &[BLOCK, CROSS_ATTENTION][..]),
    ] {
        for i in 0..count {
            for &(kind, from, to) in parts.iter().copied().flatten() {
                let from = format!("{part}/layer_{i}/{from}");
                let to = format!("model.{part}.layers.{i}.{to}");
                rename(&mut out, ct2, (kind, &from, &to))?;
            }
        }
        let (from, to) = (
            format!("{part}/layer_norm"),
            format!("model.{part}.layer_norm"),
        );
        rename(&mut out, ct2, (Rename::Norm, &from, &to))?;
    }
    let embeddings = tensor(ct2, "decoder/embeddings/weight")?;
    let (vocab_size, d_model) = embeddings.dims2().map_err(|e| e.to_string())?;
    let positions = tensor(ct2, "decoder/position_encodings/encodings")?;
    let max_target_positions = positions.dim(0).map_err(|e| e.to_string())?;
    out.insert("model.decoder.embed_tokens.weight".into(), embeddings);
    out.insert("model.decoder.embed_positions.weight".into(), positions);
    let heads = |name: &str| -> Result<usize, String> {
        ct2.scalar(name)
            .map(|h| h as usize)
            .map_err(|e| e.to_string())
    };
    let dims = Dims {
        mels: mel::N_MELS,
        size: d_model,
        audio_positions: 1500,
        encoder_heads: heads("encoder/num_heads")?,
        encoder_layers: enc_layers,
        vocab: vocab_size,
        text_positions: max_target_positions,
        decoder_heads: heads("decoder/num_heads")?,
        decoder_layers: dec_layers,
    };
    Ok((out, dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoder step that reads its cache gives what running every token again gives, token
    /// after token. Needs the model (scripts/setup.sh).
    #[test]
    fn the_cached_decoder_matches_running_every_token_again() {
        let whisper = Whisper::load_default().expect("the Whisper model");
        let (sr, tone) = (mel::SAMPLE_RATE as f32, 220.0);
        let audio: Vec<f32> = (0..3 * mel::SAMPLE_RATE as usize)
            .map(|i| 0.2 * (i as f32 * tone * std::f32::consts::TAU / sr).sin())
            .collect();
        let audio_features = whisper.encode(&audio).expect("encoder");
        let mut state = whisper.decoder.start(&audio_features).expect("state");
        let mut tokens = vec![whisper.special.sot, whisper.special.no_timestamps];
        let mut input = tokens.clone();
        for step in 0..4 {
            let cached = whisper
                .decoder
                .step(&mut state, &input)
                .expect("cached step");
            let mut fresh = whisper.decoder.start(&audio_features).expect("state");
            let full = whisper
                .decoder
                .step(&mut fresh, &tokens)
                .expect("full step");
            let worst = cached
                .iter()
                .zip(&full)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-3, "step {step}: logits differ by {worst}");
            let next = argmax(&cached);
            tokens.push(next);
            input = vec![next];
        }
    }

    /// A beam search's hypotheses run as rows of one pass: each row's logits are those its own
    /// tokens give alone. Needs the model (scripts/setup.sh).
    #[test]
    fn hypotheses_decoded_together_score_as_each_would_alone() {
        let whisper = Whisper::load_default().expect("the Whisper model");
        let audio: Vec<f32> = (0..3 * mel::SAMPLE_RATE as usize)
            .map(|i| 0.2 * (i as f32 * 0.09).sin())
            .collect();
        let features = whisper.encode(&audio).expect("encoder");
        let prefix = [whisper.special.sot, whisper.special.no_timestamps];
        // Three hypotheses of two tokens each; the second and third share a parent.
        let paths: [[u32; 2]; 3] = [[440, 318], [1867, 257], [1867, 340]];
        let mut together = whisper.decoder.start(&features).expect("state");
        whisper
            .decoder
            .step(&mut together, &prefix)
            .expect("prefix");
        let firsts = [440u32, 1867];
        together = whisper.decoder.select(&together, &[0, 0]).expect("rows");
        whisper
            .decoder
            .step_rows(&mut together, &firsts)
            .expect("first tokens");
        together = whisper.decoder.select(&together, &[0, 1, 1]).expect("rows");
        let seconds: Vec<u32> = paths.iter().map(|p| p[1]).collect();
        let rows = whisper
            .decoder
            .step_rows(&mut together, &seconds)
            .expect("second tokens");
        for (path, row) in paths.iter().zip(&rows) {
            let mut alone = whisper.decoder.start(&features).expect("state");
            let mut tokens = prefix.to_vec();
            tokens.extend(path);
            let logits = whisper.decoder.step(&mut alone, &tokens).expect("alone");
            let worst = logits
                .iter()
                .zip(row)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-3, "{path:?}: logits differ by {worst}");
        }
    }

    #[test]
    fn the_likeliest_tokens_come_first_with_their_log_probabilities() {
        let logits = [0.0, 2.0, f32::NEG_INFINITY, 1.0];
        let top = top_log_probs(&logits, 3);
        let ids: Vec<u32> = top.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![1, 3, 0]);
        let total: f32 = top.iter().map(|(_, lp)| lp.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{top:?}");
    }

    #[test]
    fn a_transcript_made_of_the_prompts_words_echoes_it() {
        let words = plain_words("Set a timer for 5 minutes. Hello, how are you?");
        for echo in [
            "Set a timer for 5 minutes.",
            "how are you",
            "Hello,",
            "5 minutes",
        ] {
            assert!(echoes(&words, echo), "{echo}");
        }
        for heard in [
            "Set a timer for 10 minutes.",
            "How old are you?",
            "",
            " . ",
            "Hell",
        ] {
            assert!(!echoes(&words, heard), "{heard}");
        }
    }

    #[test]
    fn a_decoding_loop_is_caught_and_normal_text_is_not() {
        assert_eq!(repeated_tail(&[1, 2, 3, 4, 5]), None);
        assert_eq!(repeated_tail(&[9, 1, 2, 3, 1, 2, 3]), Some(3));
        assert_eq!(
            repeated_tail(&[5, 5, 5, 5]),
            None,
            "short runs like '...' are fine"
        );
    }

    #[test]
    fn a_word_begun_over_and_over_and_never_finished_is_no_words() {
        assert!(stutter("Post-post-post-"));
        assert!(stutter("I- I-"));
        // Said, or said and then more.
        assert!(!stutter("No-no-no."));
        assert!(!stutter("No, no, no."));
        assert!(!stutter("Wait-"));
        assert!(!stutter("I- I want a cab-"));
        assert!(!stutter(""));
    }

    #[test]
    fn a_sentence_said_twice_in_a_row_is_kept_once() {
        assert_eq!(without_repeated_sentences("Stop. Stop."), "Stop.");
        assert_eq!(without_repeated_sentences("Sorry... Sorry..."), "Sorry...");
        assert_eq!(
            without_repeated_sentences("Stop. stop! Wait a moment."),
            "Stop. Wait a moment."
        );
        // Repeats that are not whole sentences in a row stay.
        assert_eq!(without_repeated_sentences("No, no, no."), "No, no, no.");
        assert_eq!(
            without_repeated_sentences("Stop. Wait. Stop."),
            "Stop. Wait. Stop."
        );
        assert_eq!(
            without_repeated_sentences("It is 3.5 degrees. Really"),
            "It is 3.5 degrees. Really"
        );
        assert_eq!(without_repeated_sentences(""), "");
    }

    #[test]
    fn a_sentence_said_again_with_a_word_misheard_is_dropped() {
        assert_eq!(
            without_repeated_sentences(
                "Could you recommend a good book for a long flight? Good you recommend a good \
                 book for a long flight."
            ),
            "Could you recommend a good book for a long flight?"
        );
        // Said again with a word left out.
        assert_eq!(
            without_repeated_sentences("What time is it in Tokyo? What time is it Tokyo?"),
            "What time is it in Tokyo?"
        );
        // Two different questions that share words stay.
        let two = "What time is it in Tokyo? What time is it in Paris now?";
        assert_eq!(without_repeated_sentences(two), two);
        // Short sentences only go when they are the same.
        assert_eq!(
            without_repeated_sentences("Yes, please. Yes, thanks."),
            "Yes, please. Yes, thanks."
        );
    }
}
