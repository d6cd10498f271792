//! The embedded LLM: SmolLM2-135M-Instruct from its GGUF file, run with candle.
//!
//! The file's Q4_1 weights are re-quantized to Q8_0 once at load time: candle has no fast Q4_1
//! path on this CPU, while its Q8_0 kernels generate 3x faster than f32 (decoding is bound by
//! memory bandwidth, and Q8_0 reads a quarter of the bytes). The weights are shared by every
//! session; each engine instance keeps its own KV cache, so a turn only processes the messages
//! added since the last one.

mod tokenizer;

use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use futures_util::stream::BoxStream;
use tokio::sync::mpsc;

pub use tokenizer::Tokenizer;

use super::{LlmEngine, LlmError, LlmEvent, LlmRequest};
use crate::context::{Content, Message};
use crate::frames::TokenUsage;
use crate::models::{ModelError, model_path};

const NAME: &str = "smollm2-135m";
const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The model name reported in metrics and the price table.
pub const MODEL: &str = "SmolLM2-135M-Instruct";

/// How the local model generates.
#[derive(Debug, Clone)]
pub struct LocalLlmOptions {
    /// Tokens one reply may have at most.
    pub max_tokens: usize,
    /// Penalty on tokens generated recently (1.0: none); a model this small loops without one.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_window: usize,
}

impl Default for LocalLlmOptions {
    fn default() -> Self {
        Self {
            max_tokens: 120,
            repeat_penalty: 1.2,
            repeat_window: 64,
        }
    }
}

/// Weights and tokenizer, loaded once per process.
pub struct LocalModel {
    weights: ModelWeights,
    tokenizer: Tokenizer,
    im_start: u32,
    im_end: u32,
    eos: u32,
}

static SHARED: OnceLock<Arc<LocalModel>> = OnceLock::new();

fn invalid(path: &Path, reason: impl ToString) -> ModelError {
    ModelError::Invalid {
        name: NAME.into(),
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

impl LocalModel {
    /// The process-wide model, loaded on first use.
    pub fn shared() -> Result<Arc<Self>, ModelError> {
        if let Some(model) = SHARED.get() {
            return Ok(model.clone());
        }
        let model = Arc::new(Self::load(&model_path(NAME, FILE)?)?);
        Ok(SHARED.get_or_init(|| model).clone())
    }

    /// Loads a llama-architecture GGUF file with a GPT-2 style tokenizer.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let mut file = std::fs::File::open(path).map_err(|e| invalid(path, e))?;
        let content = gguf_file::Content::read(&mut file).map_err(|e| invalid(path, e))?;
        let strings = |key: &str| -> Result<Vec<String>, ModelError> {
            content
                .metadata
                .get(key)
                .ok_or_else(|| invalid(path, format!("no {key} in the metadata")))?
                .to_vec()
                .map_err(|e| invalid(path, e))?
                .iter()
                .map(|v| v.to_string().cloned().map_err(|e| invalid(path, e)))
                .collect()
        };
        let pieces = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let tokenizer = Tokenizer::new(pieces, &merges).map_err(|e| invalid(path, e))?;
        let token = |piece: &str| {
            tokenizer
                .token(piece)
                .ok_or_else(|| invalid(path, format!("the vocabulary lacks {piece}")))
        };
        let (im_start, im_end, eos) = (
            token("<|im_start|>")?,
            token("<|im_end|>")?,
            token("<|endoftext|>")?,
        );

        // Re-quantize every matrix to Q8_0 and hand candle a GGUF of those.
        let device = Device::Cpu;
        let mut tensors = Vec::with_capacity(content.tensor_infos.len());
        for name in content.tensor_infos.keys() {
            let q = content
                .tensor(&mut file, name, &device)
                .map_err(|e| invalid(path, e))?;
            let t = q
                .dequantize(&device)
                .and_then(|t| QTensor::quantize(&t, GgmlDType::Q8_0))
                .map_err(|e| invalid(path, e))?;
            tensors.push((name.clone(), t));
        }
        let metadata: Vec<(&str, &gguf_file::Value)> = content
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        let tensor_refs: Vec<(&str, &QTensor)> =
            tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut buffer = Cursor::new(Vec::new());
        gguf_file::write(&mut buffer, &metadata, &tensor_refs).map_err(|e| invalid(path, e))?;
        drop(tensors);
        buffer.set_position(0);
        let dense = gguf_file::Content::read(&mut buffer).map_err(|e| invalid(path, e))?;
        let weights =
            ModelWeights::from_gguf(dense, &mut buffer, &device).map_err(|e| invalid(path, e))?;
        Ok(Self {
            weights,
            tokenizer,
            im_start,
            im_end,
            eos,
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The ChatML prompt for `messages`, ending with the assistant's turn opened.
    pub fn prompt(&self, messages: &[Message]) -> Vec<u32> {
        let newline = self.tokenizer.encode("\n");
        let mut ids = Vec::new();
        for message in messages {
            let Some((role, text)) = render(message) else {
                continue;
            };
            ids.push(self.im_start);
            ids.extend(self.tokenizer.encode(&format!("{role}\n{text}")));
            ids.push(self.im_end);
            ids.extend(&newline);
        }
        ids.push(self.im_start);
        ids.extend(self.tokenizer.encode("assistant\n"));
        ids
    }
}

/// A message as a ChatML role and text; the model knows system, user and assistant only.
fn render(message: &Message) -> Option<(&'static str, String)> {
    Some(match message {
        Message::System(m) | Message::Developer(m) => ("system", m.content.joined_text()),
        Message::User(m) => ("user", m.content.joined_text()),
        Message::Assistant(m) => {
            let mut text = m
                .content
                .as_ref()
                .and_then(Option::as_ref)
                .map(Content::joined_text)
                .unwrap_or_default();
            for call in m.tool_calls.iter().flatten() {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(&format!(
                    "[called {} with {}]",
                    call.function.name, call.function.arguments
                ));
            }
            ("assistant", text)
        }
        Message::Tool(m) => (
            "system",
            format!(
                "Tool result for call {}: {}",
                m.tool_call_id,
                m.content.joined_text()
            ),
        ),
        Message::ProviderSpecific(_) => return None,
    })
}

/// One conversation's use of the model: the shared weights plus its own KV cache.
pub struct LocalLlm {
    model: Arc<LocalModel>,
    state: Arc<Mutex<CacheState>>,
    options: LocalLlmOptions,
}

struct CacheState {
    weights: ModelWeights,
    /// Tokens whose keys and values are in the cache.
    cached: Vec<u32>,
}

impl LocalLlm {
    /// A conversation on the shared model.
    pub fn new(model: Arc<LocalModel>, options: LocalLlmOptions) -> Self {
        let weights = model.weights.clone();
        Self {
            model,
            state: Arc::new(Mutex::new(CacheState {
                weights,
                cached: Vec::new(),
            })),
            options,
        }
    }
}

impl LlmEngine for LocalLlm {
    fn model(&self) -> &str {
        MODEL
    }

    fn provider(&self) -> &str {
        "local"
    }

    fn generate(&self, request: LlmRequest) -> BoxStream<'static, Result<LlmEvent, LlmError>> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let model = self.model.clone();
        let state = self.state.clone();
        let options = self.options.clone();
        tokio::task::spawn_blocking(move || {
            let prompt = model.prompt(&request.messages);
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = run(&model, &mut state, &prompt, &options, &tx) {
                // The cache may hold half a step: start clean next time.
                state.weights.clear_kv_cache();
                state.cached.clear();
                let _ = tx.send(Err(LlmError::Provider(e.to_string())));
            }
        });
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}

/// Prefills what the cache lacks, then generates until the end of the turn.
fn run(
    model: &LocalModel,
    state: &mut CacheState,
    prompt: &[u32],
    options: &LocalLlmOptions,
    tx: &mpsc::UnboundedSender<Result<LlmEvent, LlmError>>,
) -> candle_core::Result<()> {
    let device = Device::Cpu;
    let reuse = state.cached.len() < prompt.len() && prompt.starts_with(&state.cached);
    if !reuse {
        state.weights.clear_kv_cache();
        state.cached.clear();
    }
    let start = state.cached.len();
    let fresh = &prompt[start..];
    let input = Tensor::new(fresh, &device)?.unsqueeze(0)?;
    let mut logits = state.weights.forward(&input, start)?.squeeze(0)?;
    state.cached.extend_from_slice(fresh);
    let mut generated: Vec<u32> = Vec::new();
    let mut pending = Vec::new();
    for _ in 0..options.max_tokens {
        let window = &generated[generated.len().saturating_sub(options.repeat_window)..];
        let logits_vec = candle_transformers::utils::apply_repeat_penalty(
            &logits,
            options.repeat_penalty,
            window,
        )?
        .to_vec1::<f32>()?;
        let next = logits_vec
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(model.eos, |(i, _)| i as u32);
        if next == model.im_end || next == model.eos {
            break;
        }
        generated.push(next);
        pending.extend(model.tokenizer.bytes(next));
        // Send whole characters only: a token may end inside a multi-byte one.
        let valid = match std::str::from_utf8(&pending) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        if valid > 0 {
            let text = String::from_utf8_lossy(&pending[..valid]).into_owned();
            pending.drain(..valid);
            if tx.send(Ok(LlmEvent::Text(text))).is_err() {
                // The listener is gone (an interruption): stop here, the cache stays valid.
                break;
            }
        }
        let input = Tensor::new(&[next], &device)?.unsqueeze(0)?;
        logits = state
            .weights
            .forward(&input, state.cached.len())?
            .squeeze(0)?;
        state.cached.push(next);
    }
    let _ = tx.send(Ok(LlmEvent::Usage(TokenUsage {
        input: fresh.len() as u64,
        output: generated.len() as u64,
        cache_read: start as u64,
        cache_write: 0,
    })));
    Ok(())
}
