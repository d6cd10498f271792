//! The embedded LLM's network: SmolLM2 (a llama) from its GGUF file on candle, with its weights
//! re-quantized and its prefill kernels chosen for this CPU.

pub mod llama;

/// The model's package name in `assets/models.json`.
pub const NAME: &str = "smollm2-135m";
/// Its file in the models folder.
pub const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
