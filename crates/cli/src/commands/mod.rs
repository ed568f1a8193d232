//! One module per `headroom` subcommand: argument definitions and the code that runs them.

pub mod bench;
pub mod data;
pub mod doctor;
pub mod doctor_html;
pub mod doctor_side;
pub mod estimate;
pub mod memory;
pub mod params;
pub mod plan;
mod plan_emit;
pub mod plan_mesh;
pub mod plan_output;
mod plan_own;
mod plan_trace;
mod plan_trace_context;
mod plan_trace_output;
mod plan_trace_sweep;
pub mod recorded;
pub mod trace;
pub mod train;
mod train_group;
