//! The models headroom trains: a GPT-style decoder (optionally with LoRA adapters on a frozen
//! base) and a deep residual MLP, and their presets.

pub mod gpt;
mod limits;
pub mod llama;
pub mod lora;
pub mod presets;
pub mod qlora;
pub mod resmlp;

pub use gpt::{Gpt, GptConfig};
pub use llama::{Llama, LlamaConfig};
pub use presets::{ModelSpec, ModelSpecError, build_model, build_parallel_model, preset};
pub use resmlp::{ResMlp, ResMlpConfig};
