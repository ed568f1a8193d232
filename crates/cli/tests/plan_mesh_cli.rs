//! `headroom plan` on meshes, run as the built binary: the search over tensor, pipeline and
//! data parallelism for a model that outgrows data parallelism, its pins and the constraints
//! they break, and the report's mesh object (stages, most loaded rank, rejected axes).

use crate::common;

use common::{headroom, json, stderr};
use serde_json::Value;
use std::process::Output;

/// Llama 3.1 405B on 64 nodes of 8 H100 80GB, with extra flags.
fn plan_405b(extra: &[&str]) -> Output {
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

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// Stage peaks of a recommended mesh: each at most the usable memory, the plan's peak their
/// maximum, and the most loaded stage the one holding it.
fn assert_stages_consistent(mesh: &Value) {
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

#[test]
fn llama_405b_with_the_llama_3_batch_per_gpu_takes_tensor_parallel_8() {
    // Llama 3 trained 405B with 2,048 sequences on 16,384 GPUs: 1/8 sequence per GPU. On 512
    // GPUs that is 64 sequences, so plain data parallelism is impossible and dp·m·b = 64 with
    // dp = 512/(tp·pp) ≤ 64 forces tp·pp ≥ 8. tp 4 × pp 2 leaves dp 64 and m = 1, a 1F1B
    // bubble of (p − 1)/m = 1 that doubles the step: tp 8 (within the node) wins.
    let o = plan_405b(&["--global-batch", "64", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let mesh = &v["mesh"];
    assert_eq!(mesh["recommended_layout"], "mesh");
    let best = &mesh["recommended"];
    assert_eq!(u(&best["mesh"]["tp"]), 8);
    assert!(best["mesh"]["sequence_parallel"].as_bool().unwrap());
    assert_stages_consistent(best);
    let tokens = best["tokens_per_s"].as_f64().unwrap();
    let tp4 = mesh["rejected_axes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["axis"] == "tp" && r["value"] == "4")
        .expect("a verdict for tp 4");
    assert!(tp4["reason"].as_str().unwrap().contains("slower"));
    assert!(tp4["best"]["tokens_per_s"].as_f64().unwrap() < 0.6 * tokens);
    // pp 8 (torchtitan's depth) does not divide the 126 = 2·3²·7 layers, but 126 + 2 = 128
    // does: one layer fewer on the first and last stage (15, 16 × 6, 15), as torchtitan and
    // Llama 3 split them. It fits, behind its pipeline bubble.
    let verdicts = mesh["rejected_axes"].as_array().unwrap();
    let pp8 = verdicts
        .iter()
        .find(|r| r["axis"] == "pp" && r["value"] == "8")
        .expect("a verdict for pp 8");
    assert!(
        pp8["best"]["layout"]
            .as_str()
            .unwrap()
            .contains("ends −1 layer"),
        "{pp8}"
    );
    assert!(
        pp8["reason"].as_str().unwrap().contains("fits but slower"),
        "{pp8}"
    );
    // tp 1 needs pp ≥ 8 for dp ≤ 64: its best layout is the uneven 8-stage pipeline.
    let tp1 = verdicts
        .iter()
        .find(|r| r["axis"] == "tp" && r["value"] == "1")
        .expect("a verdict for tp 1");
    assert_eq!(u(&tp1["best"]["pp"]), 8, "{tp1}");
    assert!(
        tp1["best"]["layout"]
            .as_str()
            .unwrap()
            .contains("ends −1 layer"),
        "{tp1}"
    );
}

#[test]
fn model_states_of_the_405b_tp_8_rank_match_a_hand_count() {
    // tp 8, pp 1, ZeRO-3 over dp 64 (pinned). Parameters on one rank: per layer the matrices
    // 3,187,671,040 / 8 = 398,458,880 plus two norms 32,768 (not split): 398,491,648, × 126 =
    // 50,209,947,648; the embedding and the untied head 2 × 2,101,346,304 / 8 = 525,336,576;
    // the final norm 16,384: 50,735,300,608. Bytes: 18/dp per parameter at stage 3 (2 weight +
    // 4 gradient + 12 master and moments, all sharded): 50,735,300,608 · 18 / 64 =
    // 14,269,303,296.
    let o = plan_405b(&[
        "--global-batch",
        "64",
        "--tp",
        "8",
        "--pp",
        "1",
        "--zero",
        "3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let best = &json(&o)["mesh"]["recommended"];
    assert_eq!(u(&best["mesh"]["dp"]), 64);
    let stage = &best["stages"][0];
    assert_eq!(stage["parameters"].as_f64().unwrap(), 50_735_300_608.0);
    assert_eq!(u(&stage["model_states_bytes"]), 14_269_303_296);
}

#[test]
fn the_default_405b_plan_ranks_every_layout_it_rejects_below_its_choice() {
    // One sequence per GPU by default (512 at seq 8192, the model's pre-training length). The
    // recommendation is the fastest fitting layout up to the 5 % tie rule: no fitting rejected
    // value runs more than 5 % faster, and every rejected value's best layout is reported.
    let o = plan_405b(&["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(u(&v["workload"]["global_batch"]), 512);
    assert_eq!(u(&v["workload"]["seq_len"]), 8192);
    let mesh = &v["mesh"];
    let recommended = match mesh["recommended_layout"].as_str().unwrap() {
        "mesh" => mesh["recommended"]["tokens_per_s"].as_f64().unwrap(),
        "data-parallel" => v["recommended"]["time"]["tokens_per_s"].as_f64().unwrap(),
        other => panic!("nothing recommended: {other}"),
    };
    let verdicts = mesh["rejected_axes"].as_array().unwrap();
    for tp in ["2", "4", "8"] {
        assert!(
            verdicts
                .iter()
                .any(|r| r["axis"] == "tp" && r["value"] == tp),
            "no verdict for tp {tp}"
        );
    }
    for r in verdicts {
        let best = &r["best"];
        if best.is_null() {
            // No layout takes the value: the reason names the constraint.
            assert!(!r["reason"].as_str().unwrap().is_empty());
        } else if best["fits"].as_bool().unwrap() {
            assert!(best["tokens_per_s"].as_f64().unwrap() <= recommended * 1.05);
        } else {
            assert!(u(&best["peak_bytes"]) > u(&best["usable_bytes"]));
            assert!(r["reason"].as_str().unwrap().starts_with("does not fit"));
        }
    }
}

#[test]
fn pins_are_kept() {
    // tp 4 × pp 2 on 512 GPUs: dp 64, so the 512 sequences make m·b = 8.
    let o = plan_405b(&[
        "--tp",
        "4",
        "--pp",
        "2",
        "--pp-schedule",
        "interleaved:3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let best = &json(&o)["mesh"]["recommended"];
    assert_eq!(u(&best["mesh"]["tp"]), 4);
    assert_eq!(u(&best["mesh"]["pp"]), 2);
    assert_eq!(u(&best["mesh"]["dp"]), 64);
    assert_eq!(best["mesh"]["schedule"], "interleaved:3");
    assert_eq!(
        u(&best["mesh"]["microbatches"]) * u(&best["micro_batch"]),
        8
    );
    assert_stages_consistent(best);
    // Sequence parallelism pinned off with tp 8.
    let o = plan_405b(&[
        "--global-batch",
        "64",
        "--tp",
        "8",
        "--sequence-parallel",
        "off",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let best = &json(&o)["mesh"]["recommended"];
    assert_eq!(best["mesh"]["sequence_parallel"], false);
}

#[test]
fn impossible_pins_name_the_constraint() {
    let cases: [(&[&str], &str); 5] = [
        (&["--tp", "16"], "must stay within a node"),
        (
            &["--pp", "4", "--pp-schedule", "interleaved:3"],
            "126 layers are not divisible by pp·v = 4·3",
        ),
        (
            &["--pp", "8", "--pp-schedule", "interleaved:3"],
            "not divisible by pp·v",
        ),
        (&["--tp", "8", "--microbatches", "3"], "global batch of 512"),
        (
            &["--tp", "1", "--sequence-parallel", "on"],
            "sequence parallelism",
        ),
    ];
    for (flags, want) in cases {
        let o = plan_405b(flags);
        assert!(!o.status.success(), "{flags:?} was accepted");
        assert!(stderr(&o).contains(want), "{flags:?}: {}", stderr(&o));
    }
    // 64 attention heads (Llama 3.1 70B) on 6 GPUs per node: tp 3 divides the GPUs, not the heads.
    let o = headroom(&[
        "plan",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "H100-80GB",
        "--gpus-per-node",
        "6",
        "--tp",
        "3",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("64 attention heads are not divisible by tp 3"),
        "{}",
        stderr(&o)
    );
    let o = plan_405b(&["--pp-schedule", "interleaved:1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("interleaved:V"), "{}", stderr(&o));
}

#[test]
fn plain_data_parallelism_is_the_plan_it_was() {
    // The same 7B run as plan_cli's: the data-parallel search is unchanged by the mesh search,
    // and pinning tp 1 and pp 1 leaves it alone (no mesh object).
    let base = [
        "plan",
        "--model",
        "llama-2-7b",
        "--gpu",
        "A100-80GB",
        "--gpus-per-node",
        "8",
        "--seq-len",
        "4096",
        "--global-batch",
        "64",
        "--json",
    ];
    let free = headroom(&base);
    let mut pinned_args = base.to_vec();
    pinned_args.extend(["--tp", "1", "--pp", "1"]);
    let pinned = headroom(&pinned_args);
    assert!(free.status.success() && pinned.status.success());
    let (free, pinned) = (json(&free), json(&pinned));
    assert_eq!(free["recommended"], pinned["recommended"]);
    assert_eq!(free["plans"], pinned["plans"]);
    assert!(pinned["mesh"].is_null());
    // A mesh's micro-batch count beside plain data parallelism's pins: refused with the flag
    // plain data parallelism takes instead.
    let mut counted = pinned_args.clone();
    counted.extend(["--microbatches", "4"]);
    let o = headroom(&counted);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("give --accumulation 4"),
        "{}",
        stderr(&o)
    );
    // A 7B model fits with data parallelism, which the meshes do not beat by more than 5 %.
    assert_eq!(free["mesh"]["recommended_layout"], "data-parallel");
}

#[test]
fn the_text_report_names_the_mesh_its_most_loaded_rank_and_the_rejected_axes() {
    let o = plan_405b(&["--global-batch", "64"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "Recommended mesh: dp 64 × tp 8 × pp 1",
        "Most loaded rank: stage 0 (ranks 0–7)",
        "Memory per stage",
        "bubble",
        "Why each rejected axis value lost",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn llama_70b_on_16_gpus_fits_no_mesh_and_offloads() {
    // Every mesh of 16 GPUs shards at most all 70,553,706,496 parameters' 18 bytes (ZeRO-3 over
    // dp, the rest split by tp·pp) over the 16: 79,372,919,808 B = 73.9 GiB per GPU before any
    // activation, × 1.1 for the fragmentation reserve = 81.3 GiB > 75.67 GiB usable. So no mesh
    // fits, and plain data parallelism with states offloaded to the host is the plan.
    let o = headroom(&[
        "plan",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "H100-80GB",
        "--gpus-per-node",
        "8",
        "--nodes",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(u(&v["mesh"]["fitting"]), 0);
    assert_eq!(v["mesh"]["recommended_layout"], "data-parallel");
    let placement = &v["recommended"]["strategy"];
    assert!(
        placement["offload_optimizer"] != "none" || placement["offload_params"] != "none",
        "{placement}"
    );
}

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

#[test]
fn a_pinned_pipeline_of_8_stages_takes_the_uneven_split() {
    // torchtitan's 405B layout (FSDP 8 × TP 8 × PP 8, global batch 256): 126 layers on 8
    // stages only with one fewer at both ends, which the pin takes as the search does.
    let o = plan_405b(&[
        "--global-batch",
        "256",
        "--tp",
        "8",
        "--pp",
        "8",
        "--pp-schedule",
        "1f1b",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let best = &json(&o)["mesh"]["recommended"];
    assert_eq!(u(&best["mesh"]["fewer_layers_at_ends"]), 1);
    let layers: Vec<u64> = best["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| u(&s["layers"]))
        .collect();
    assert_eq!(layers, vec![15, 16, 16, 16, 16, 16, 16, 15]);
    assert_stages_consistent(best);
}

#[test]
fn a_micro_batch_plain_data_parallelism_cannot_split_is_left_to_the_meshes() {
    // torchtitan's 70B run: 512 sequences in micro-batches of 16 on 256 GPUs. Plain data
    // parallelism would need 2 per GPU, not a multiple of 16; dp 32 × tp 8 takes 16 per
    // replica in one micro-batch. Pinned or searched, the mesh is planned, not refused.
    let base = [
        "plan",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "H100-80GB",
        "--gpus-per-node",
        "8",
        "--nodes",
        "32",
        "--global-batch",
        "512",
        "--micro-batch",
        "16",
        "--checkpoint",
        "all",
        "--json",
    ];
    for pins in [&["--tp", "8", "--pp", "1"][..], &[][..]] {
        let mut args = base.to_vec();
        args.extend_from_slice(pins);
        let o = headroom(&args);
        assert!(o.status.success(), "{pins:?}: {}", stderr(&o));
        let best = &json(&o)["mesh"]["recommended"];
        let mesh = &best["mesh"];
        assert_eq!(u(&best["micro_batch"]), 16, "{pins:?}");
        assert_eq!(
            u(&mesh["dp"]) * u(&mesh["microbatches"]) * 16,
            512,
            "{pins:?}"
        );
        assert_eq!(u(&mesh["dp"]) * u(&mesh["tp"]) * u(&mesh["pp"]), 256);
        if pins.is_empty() {
            assert!(
                stderr(&o).contains("plain data parallelism cannot split this batch"),
                "{}",
                stderr(&o)
            );
        }
    }
}

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

#[test]
fn overlapping_tensor_parallelism_hides_its_collectives_behind_the_matmuls() {
    // Every lever pinned, so both plans run the same mesh: dp 8 × tp 8 × pp 8, m 8 of one
    // sequence. Overlap changes the step's time, not its memory.
    let pins = [
        "--global-batch",
        "64",
        "--tp",
        "8",
        "--pp",
        "8",
        "--pp-schedule",
        "1f1b",
        "--zero",
        "1",
        "--checkpoint",
        "all",
        "--micro-batch",
        "1",
        "--precision",
        "bf16-mixed",
        "--json",
    ];
    let plain = plan_405b(&pins);
    let overlapped = plan_405b(&[&pins[..], &["--tp-comm-overlap"]].concat());
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert!(overlapped.status.success(), "{}", stderr(&overlapped));
    let (plain, overlapped) = (
        &json(&plain)["mesh"]["recommended"],
        &json(&overlapped)["mesh"]["recommended"],
    );
    assert_eq!(plain["mesh"]["tp_comm_overlap"], false);
    assert_eq!(overlapped["mesh"]["tp_comm_overlap"], true);
    assert!(
        overlapped["summary"]["layout"]
            .as_str()
            .unwrap()
            .contains("TP overlapped")
    );
    assert_eq!(u(&plain["peak_bytes"]), u(&overlapped["peak_bytes"]));
    assert!(overlapped["tokens_per_s"].as_f64().unwrap() > plain["tokens_per_s"].as_f64().unwrap());
    // Overlap runs TP's collectives as sequence parallelism's all-gathers and reduce-scatters.
    let o = plan_405b(
        &[
            &pins[..],
            &["--tp-comm-overlap", "--sequence-parallel", "off"],
        ]
        .concat(),
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("sequence parallelism"),
        "{}",
        stderr(&o)
    );
}
