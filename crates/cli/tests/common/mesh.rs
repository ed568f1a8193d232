//! What the mesh tests share: Llama 3.1 405B planned on 64 nodes of 8 H100s, and the checks of
//! a recommended mesh's stages.

use super::headroom;
use serde_json::Value;
use std::process::Output;

/// Llama 3.1 405B on 64 nodes of 8 H100 80GB, with extra flags.
pub fn plan_405b(extra: &[&str]) -> Output {
    let mut args = vec![
        "plan",
        "--model",
        "llama-3.1-405b",
        "--gpu",
        "H100-80GB",
        "--gpus-per-node",
        "8",
        "--nodes",
        "64",
    ];
    args.extend_from_slice(extra);
    headroom(&args)
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// Stage peaks of a recommended mesh: each at most the usable memory, the plan's peak their
/// maximum, and the most loaded stage the one holding it.
pub fn assert_stages_consistent(mesh: &Value) {
    let stages = mesh["stages"].as_array().unwrap();
    assert_eq!(stages.len() as u64, u(&mesh["mesh"]["pp"]));
    let usable = u(&mesh["usable_bytes"]);
    let peaks: Vec<u64> = stages.iter().map(|s| u(&s["peak_bytes"])).collect();
    let max = *peaks.iter().max().unwrap();
    assert_eq!(u(&mesh["peak_bytes"]), max);
    assert_eq!(peaks[u(&mesh["peak_stage"]) as usize], max);
    assert_eq!(u(&mesh["most_loaded"]["peak_bytes"]), max);
    assert!(mesh["fits"].as_bool().unwrap());
    for p in peaks {
        assert!(p <= usable, "stage peak {p} above usable {usable}");
    }
}
