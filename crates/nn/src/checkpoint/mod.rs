//! Pretrained weights from the formats people download them in: a Hugging Face model
//! directory (`config.json` and safetensors, one file or shards listed by
//! `model.safetensors.index.json`), written back as such a directory with the LoRA adapters as
//! PEFT's `adapter_model.safetensors` and `adapter_config.json`; and a GGUF file (`gguf`: its
//! quantised tensors dequantised into the tensors a Hugging Face checkpoint would hold, so the
//! models load both through the same path, `Llama::load_hf`).
//!
//! Not for: headroom's own saves of a run (the train crate's `save` module), or building the
//! model (`models`).

mod error;
pub mod gguf;
mod hf_dir;
mod hf_write;
mod pretrained;
mod safetensors_io;

pub use error::CheckpointError;
pub use hf_dir::{HfCheckpoint, is_hf_dir};
pub use hf_write::{NamedTensor, write_hf_dir, write_peft_adapter};
pub use pretrained::{Pretrained, TokenizerSource, is_gguf};
