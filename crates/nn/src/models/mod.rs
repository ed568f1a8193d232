//! The models headroom trains: a GPT-style decoder and a deep residual MLP, and their presets.

pub mod gpt;
mod limits;
pub mod presets;
pub mod resmlp;

pub use gpt::{Gpt, GptConfig};
pub use presets::{ModelSpec, ModelSpecError, build_model, preset};
pub use resmlp::{ResMlp, ResMlpConfig};
