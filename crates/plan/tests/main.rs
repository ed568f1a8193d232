//! The integration tests of this crate, linked as one binary: one module per file in
//! `tests/` (a binary per file would link the whole engine again for each; see
//! `scripts/check-test-targets.py`, which CI runs, for the rule that keeps this list whole).

mod support;

mod advice;
mod backward_peaks;
mod calibration;
mod checkpoint_costs;
mod estimators;
mod export_rules;
mod exports;
mod exports_activation_offload;
mod exports_mesh;
mod fine_tuning_costs;
mod frameworks;
mod hostile_configs;
mod levers;
mod lora_costs;
mod loss_tensors;
mod megatron_estimator;
mod memtracker;
mod mesh_memory;
mod mesh_models;
mod mesh_search;
mod mesh_torchtitan;
mod optimizer_step;
mod param_counts;
mod published_hf_runs;
mod published_meshes;
mod published_runs;
mod search;
mod small_model_speed;
mod speed_saturation;
mod transformers_activations;
mod zero_and_properties;
