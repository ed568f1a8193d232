//! `headroom plan --emit` for a mesh, run as the built binary: the torchtitan and Megatron
//! exports carry the recommended layout, and an export of data parallelism only beside them is
//! refused with nothing written.

use crate::common;

use common::mesh::{plan_405b, u};
use common::{json, stderr};

#[test]
fn the_recommended_mesh_exports_to_torchtitan_and_megatron() {
    let dir = tempfile::tempdir().unwrap();
    let titan = dir.path().join("job.toml");
    let mega = dir.path().join("megatron.args");
    let (t, m) = (titan.to_str().unwrap(), mega.to_str().unwrap());
    // Llama 3.1 405B with Llama 3's 1/8 sequence per GPU: a mesh is the only layout.
    let out = plan_405b(&[
        "--global-batch",
        "64",
        "--json",
        "--emit",
        "torchtitan",
        t,
        "--emit",
        "megatron",
        m,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rec = &json(&out)["mesh"]["recommended"]["mesh"];
    // The files carry the recommended layout.
    let job: toml::Table = std::fs::read_to_string(&titan).unwrap().parse().unwrap();
    let par = &job["parallelism"];
    assert_eq!(
        par["tensor_parallel_degree"].as_integer(),
        Some(u(&rec["tp"]) as i64)
    );
    assert_eq!(
        par["pipeline_parallel_degree"].as_integer(),
        Some(u(&rec["pp"]) as i64)
    );
    assert_eq!(job["model"]["flavor"].as_str(), Some("405B"));
    let args = std::fs::read_to_string(&mega).unwrap();
    assert!(args.contains(&format!("--tensor-model-parallel-size {}\n", u(&rec["tp"]))));
    assert!(args.contains("--global-batch-size 64\n"), "{args}");
    // An export of data parallelism only beside them: refused, and nothing written.
    let ds = dir.path().join("ds.json");
    let out = plan_405b(&[
        "--global-batch",
        "64",
        "--emit",
        "torchtitan",
        dir.path().join("other.toml").to_str().unwrap(),
        "--emit",
        "deepspeed",
        ds.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the deepspeed export cannot express"),
        "{}",
        stderr(&out)
    );
    assert!(!ds.exists() && !dir.path().join("other.toml").exists());
}
