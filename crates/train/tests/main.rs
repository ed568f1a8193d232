//! The integration tests of this crate, linked as one binary: one module per file in
//! `tests/` (a binary per file would link the whole engine again for each; see
//! `scripts/check-test-targets.py`, which CI runs, for the rule that keeps this list whole).

mod common;

mod activation_offload;
mod adafactor;
mod auto;
mod bitwise_16bit;
mod chunked_loss;
mod data_parallel;
mod eight_bit;
mod gguf_tokenizer;
mod hf_levers;
mod hf_models;
mod hostile_files;
mod loader;
mod lora;
mod offload;
mod paged;
mod planned_arena;
mod prediction;
mod recompute;
mod save_dir;
mod step_in_backward;
mod strategy_toml;
mod tensor_parallel;
mod training;
mod zero;
