//! The integration tests of this crate, linked as one binary: one module per file in
//! `tests/` (a binary per file would link the whole engine again for each; see
//! `scripts/check-test-targets.py`, which CI runs, for the rule that keeps this list whole).

mod allocator_properties;
mod allocator_rules;
mod doctor_carryover;
mod doctor_fragmentation;
mod doctor_leaks;
mod doctor_peak;
mod doctor_support;
mod doctor_trace_reading;
mod hostile_traces;
mod planned_arena;
mod snapshot_export;
