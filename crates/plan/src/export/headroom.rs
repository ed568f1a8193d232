//! The TOML `headroom train` will read (schema in docs/planner.md): one key per strategy lever
//! plus the device-memory budget the plan was made for.

use crate::cost::{Plan, Problem};

/// Builds the TOML text of `plan`.
pub fn headroom_toml(problem: &Problem, plan: &Plan) -> String {
    let s = &plan.strategy;
    let mut t =
        String::from("# headroom train configuration written by `headroom plan --emit headroom`\n");
    t += &format!(
        "# model = \"{}\", seq_len = {}, global_batch = {}\n",
        problem.spec.name, problem.workload.seq_len, problem.workload.global_batch
    );
    t += &format!("precision = \"{}\"\n", s.precision);
    t += &format!("micro_batch = {}\n", s.micro_batch);
    t += &format!("accumulation = {}\n", s.accumulation);
    t += &format!("checkpoint = \"{}\"\n", s.checkpoint);
    t += &format!("attention = \"{}\"\n", s.attention);
    t += &format!("optimizer = \"{}\"\n", s.optimizer);
    t += &format!("zero_stage = {}\n", s.placement.zero_stage);
    t += &format!(
        "offload_optimizer = \"{}\"\n",
        s.placement.offload_optimizer
    );
    t += &format!("offload_params = \"{}\"\n", s.placement.offload_params);
    t += &format!(
        "offload_activations = \"{}\"\n",
        s.placement.offload_activations
    );
    t += &format!("device_memory = {}\n", problem.hardware.gpu.memory_bytes);
    t
}
