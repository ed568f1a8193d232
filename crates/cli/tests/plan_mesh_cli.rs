//! `headroom plan` on meshes, run as the built binary: the search over tensor, pipeline and
//! data parallelism for a model that outgrows data parallelism, what it leaves to plain data
//! parallelism, and the report's mesh object (stages, most loaded rank, rejected axes).

use crate::common;

use common::mesh::{assert_stages_consistent, plan_405b, u};
use common::{headroom, json, stderr};

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
