//! `headroom plan` with context and expert parallelism, run as the built binary: each planned
//! when pinned, exported, and refused when the sequence or the experts do not split.

use crate::common;

use common::mesh::u;
use common::{headroom, json, stderr};

#[test]
fn context_parallelism_is_planned_when_pinned_and_exported_to_torchtitan() {
    // torchtitan's Table 2 layout, FSDP 4 × CP 2 on 8 GPUs, for Llama 3.1 8B at 32,768 tokens
    // (the table's 65,536 on its 96 GB parts would not fit the 80 GB preset).
    let dir = tempfile::tempdir().unwrap();
    let titan = dir.path().join("job.toml");
    let plan = |seq: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "H100-80GB",
            "--gpus-per-node",
            "8",
            "--seq-len",
            seq,
            "--global-batch",
            "4",
            "--micro-batch",
            "1",
            "--checkpoint",
            "all",
            "--tp",
            "1",
            "--pp",
            "1",
            "--cp",
            "2",
        ];
        args.extend_from_slice(extra);
        headroom(&args)
    };
    let o = plan(
        "32768",
        &["--json", "--emit", "torchtitan", titan.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let best = &json(&o)["mesh"]["recommended"];
    assert_eq!(u(&best["mesh"]["cp"]), 2);
    assert_eq!(u(&best["mesh"]["dp"]), 4);
    assert!(best["cp_s"].as_f64().unwrap() > 0.0, "{best}");
    let job: toml::Table = std::fs::read_to_string(&titan).unwrap().parse().unwrap();
    assert_eq!(
        job["parallelism"]["context_parallel_degree"].as_integer(),
        Some(2)
    );
    // A sequence that does not split into 2·cp load-balanced chunks is refused with the rule.
    let o = plan("32770", &[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("2·cp = 4 load-balanced chunks"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn expert_parallelism_splits_a_mixture_of_experts_and_exports_to_megatron() {
    // Mixtral 8x7B on 2 nodes of 8 H100s: ep 8 over dp 16 (tp 1, pp 1), each rank one expert
    // of each layer's eight.
    let dir = tempfile::tempdir().unwrap();
    let mega = dir.path().join("megatron.args");
    let plan = |model: &str, ep: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            model,
            "--gpu",
            "H100-80GB",
            "--gpus-per-node",
            "8",
            "--nodes",
            "2",
            "--seq-len",
            "4096",
            "--global-batch",
            "64",
            "--tp",
            "1",
            "--pp",
            "1",
            "--ep",
            ep,
        ];
        args.extend_from_slice(extra);
        headroom(&args)
    };
    let o = plan(
        "mixtral-8x7b",
        "8",
        &["--json", "--emit", "megatron", mega.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let best = &json(&o)["mesh"]["recommended"];
    assert_eq!(u(&best["mesh"]["ep"]), 8);
    assert_eq!(u(&best["mesh"]["dp"]), 16);
    assert!(best["ep_s"].as_f64().unwrap() > 0.0, "{best}");
    // One expert of eight per rank, by hand: attention 32 × (2·4096² + 2·4096·1024) =
    // 1,342,177,280, the norms 32 × 2 × 4096 + 4096, the routers 32 × 8 × 4096, the untied
    // embedding and output layer 2 × 32,000 × 4096, and an eighth of the experts' 32 × 8 × 3 ×
    // 4096 × 14,336.
    let dense = 1_342_177_280.0 + 262_144.0 + 4_096.0 + 1_048_576.0 + 262_144_000.0;
    let experts = 32.0 * 8.0 * 3.0 * 4096.0 * 14336.0 / 8.0;
    assert_eq!(
        best["stages"][0]["parameters"].as_f64().unwrap(),
        dense + experts
    );
    let args = std::fs::read_to_string(&mega).unwrap();
    for line in [
        "--expert-model-parallel-size 8\n",
        "--num-experts 8\n",
        "--moe-router-topk 2\n",
        "--moe-token-dispatcher-type alltoall\n",
    ] {
        assert!(args.contains(line), "{line}: {args}");
    }
    // An ep the experts do not divide, and an ep on a dense model: refused with the rule.
    for (model, ep, why) in [
        ("mixtral-8x7b", "3", "experts are not divisible by ep 3"),
        ("llama-3.1-8b", "2", "needs a mixture-of-experts model"),
    ] {
        let o = plan(model, ep, &[]);
        assert!(!o.status.success(), "{model} ep {ep}");
        assert!(stderr(&o).contains(why), "{}", stderr(&o));
    }
}
