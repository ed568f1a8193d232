//! The integration tests of this crate, linked as one binary: one module per file in
//! `tests/` (a binary per file would link the whole engine again for each; see
//! `scripts/check-test-targets.py`, which CI runs, for the rule that keeps this list whole).

mod common;

mod auto_cli;
mod data_cli;
mod doctor_cli;
mod fault_cli;
mod input_bounds_cli;
mod memory_cli;
mod offload_cli;
mod outputs_cli;
mod plan_cli;
mod plan_estimate_cli;
mod plan_exports_cli;
mod plan_hardware_cli;
mod plan_inputs_cli;
mod plan_lora_cli;
mod plan_mesh_axes_cli;
mod plan_mesh_cli;
mod plan_mesh_exports_cli;
mod plan_mesh_pins_cli;
mod plan_models_cli;
mod plan_trace_cli;
mod resume_cli;
mod signal_cli;
mod trace_cli;
mod train_cli;
