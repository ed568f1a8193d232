//! `headroom plan` on meshes with pins, run as the built binary: the pins kept (an uneven
//! 8-stage pipeline, overlapped tensor parallelism included) and the constraints they break.

use crate::common;

use common::mesh::{assert_stages_consistent, plan_405b, u};
use common::{headroom, json, stderr};

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
