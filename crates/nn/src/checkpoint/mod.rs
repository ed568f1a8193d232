//! Pretrained checkpoints in formats other than a Hugging Face directory, read into the
//! tensors a Hugging Face checkpoint would hold, so the models load them through the same
//! path ([`crate::models::llama::Llama::load_hf`]).
//!
//! Not for: Hugging Face directories themselves (`config.json` + safetensors), or writing any
//! checkpoint.

pub mod gguf;
