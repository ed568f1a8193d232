//! The integration tests of this crate, linked as one binary: one module per file in
//! `tests/` (a binary per file would link the whole engine again for each; see
//! `scripts/check-test-targets.py`, which CI runs, for the rule that keeps this list whole).

mod common;

mod attention_tests;
mod autocast_tests;
mod causal_attention_tests;
mod causal_softmax_tests;
mod decoder_ops_tests;
mod determinism_tests;
mod error_tests;
mod forward_tests;
mod gelu_linear_tests;
mod grad_tests;
mod grouped_attention_tests;
mod linear_loss_tests;
mod linear_tests;
mod memory_tests;
mod precision_tests;
mod sliding_window_tests;
mod tensor_parallel_tests;
