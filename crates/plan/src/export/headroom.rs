//! The TOML `headroom train --config` reads (schema in docs/planner.md): one key per strategy
//! lever plus the device-memory budget the plan was made for.
//!
//! `strategy_toml` is the one writer of a strategy's keys: it serialises the vocabulary's
//! `Strategy`, whose serde names are the flags' and the config file's, so every lever (the loss
//! and the step in backward included) is written and none by hand. The engine's configuration
//! reads the same text (`TrainConfig::of_strategy`), and a property test reads every strategy
//! back through it.
//!
//! Not for: the keys of a run beyond its strategy (the engine's `TrainConfig`).

use crate::cost::{Plan, Problem};
use headroom_strategy::Strategy;

/// The TOML keys of `strategy`, one per lever, in the vocabulary's names.
pub fn strategy_toml(strategy: &Strategy) -> String {
    // Every field is a string, an integer or a boolean: serialising cannot fail.
    toml::to_string(strategy).expect("a strategy serialises as flat TOML keys")
}

/// Builds the TOML text of `plan`.
pub fn headroom_toml(problem: &Problem, plan: &Plan) -> String {
    let mut t =
        String::from("# headroom train configuration written by `headroom plan --emit headroom`\n");
    t += &format!(
        "# model = \"{}\", seq_len = {}, global_batch = {}\n",
        problem.spec.name, problem.workload.seq_len, problem.workload.global_batch
    );
    t += &strategy_toml(&plan.strategy);
    t += &format!("device_memory = {}\n", problem.hardware.gpu.memory_bytes);
    t
}
