//! The integration tests of this crate, linked as one binary: one module per file in
//! `tests/` (a binary per file would link the whole engine again for each; see
//! `scripts/check-test-targets.py`, which CI runs, for the rule that keeps this list whole).

mod gguf_common;

mod attention_kinds;
mod gguf_blocks;
mod gguf_corrupt;
mod gguf_llama;
mod gguf_smollm2;
mod hf_checkpoint;
mod llama_dry_run;
mod llama_parity;
mod lora;
mod models;
mod modules;
