//! The cost model against the ZeRO paper's model-state figures, and its properties: more GPUs
//! never raise per-device model states; checkpointing never raises activations; a plan marked
//! as fitting is under capacity; every plan's categories sum to its peak.

use crate::support;

use headroom_memory::Category;
use headroom_plan::cost::{Problem, activation, evaluate, memory};
use headroom_plan::model::load_model;
use headroom_plan::search::{search, strategies};
use headroom_plan::strategy::{
    Attention, Checkpoint, Loss, Offload, Optimizer, Pins, Placement, Precision, Strategy,
    ZeroStage,
};
use headroom_plan::workload::{BatchSpec, LoaderSpec, Workload};
use support::problem;

fn adam(zero_stage: u8) -> Strategy {
    Strategy {
        precision: Precision::Bf16Mixed,
        optimizer: Optimizer::AdamW,
        placement: Placement {
            zero_stage: ZeroStage::new(zero_stage).unwrap(),
            ..Placement::default()
        },
        checkpoint: Checkpoint::None,
        attention: Attention::MemoryEfficient,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch: 1,
        accumulation: 1,
    }
}

/// Per-device model states for Ψ parameters on N GPUs, with the ZeRO-3 gather terms (modules
/// fetched, prefetched and persistent) removed so the accounting is exactly the paper's
/// (Fig. 1 omits working buffers).
fn zero_states(psi: u64, n: u64, stage: u8) -> f64 {
    let mut p = problem("gpt2", "V100-32GB", 1, n, 128, n);
    p.facts.params = psi;
    p.facts.gather_unit_params = 0;
    p.facts.largest_layer_params = 0;
    p.facts.persistent_params = 0;
    memory::model_state_bytes(&p, &adam(stage)) as f64
}

#[test]
fn zero_paper_figure_1_for_7_5b_on_64_gpus() {
    // ZeRO §3.1/§5, Fig. 1: Ψ = 7.5B, N_d = 64, K = 12.
    //   baseline (2 + 2 + K)Ψ = 120 GB; P_os 4Ψ + KΨ/64 = 31.4 GB;
    //   P_os+g 2Ψ + 14Ψ/64 = 16.6 GB; P_os+g+p 16Ψ/64 = 1.875 GB (GB = 10^9).
    let psi = 7_500_000_000;
    let gb = |b: f64| b / 1e9;
    assert!((gb(zero_states(psi, 64, 0)) - 120.0).abs() < 1e-6);
    assert!((gb(zero_states(psi, 64, 1)) - 31.4).abs() < 0.05);
    assert!((gb(zero_states(psi, 64, 2)) - 16.6).abs() < 0.05);
    assert!((gb(zero_states(psi, 64, 3)) - 1.875).abs() < 1e-6);
}

#[test]
fn zero_paper_table_1_rows() {
    // Table 1 (GB per device): (Ψ, N_d, P_os, P_os+g, P_os+g+p).
    let rows: [(u64, u64, f64, f64, f64); 6] = [
        (7_500_000_000, 4, 52.5, 41.3, 30.0),
        (7_500_000_000, 1024, 30.1, 15.1, 0.12),
        (128_000_000_000, 16, 608.0, 368.0, 128.0),
        (128_000_000_000, 256, 518.0, 263.0, 8.0),
        (1_000_000_000_000, 64, 4187.5, 2218.8, 250.0),
        (1_000_000_000_000, 1024, 4011.7, 2013.7, 15.6),
    ];
    for (psi, n, os, osg, osgp) in rows {
        for (stage, expected) in [(1, os), (2, osg), (3, osgp)] {
            let got = zero_states(psi, n, stage) / 1e9;
            // The table rounds to one decimal (three significant digits for small values).
            let tol = (expected * 0.005).max(0.06);
            assert!(
                (got - expected).abs() <= tol,
                "Ψ={psi} N={n} stage {stage}: {got} vs {expected}"
            );
        }
    }
}

#[test]
fn more_gpus_never_raise_per_device_model_states() {
    for model in ["gpt2", "llama-2-7b", "t5-large"] {
        let mut last: Option<Vec<u64>> = None;
        for nodes in [1, 2, 4, 8, 16, 64, 256] {
            let p = problem(model, "A100-80GB", 1, nodes, 128, nodes);
            // The step in backward runs on one GPU only: pinned off, so every GPU count has the
            // same strategies to compare.
            let pins = Pins {
                checkpoint: Some(Checkpoint::None),
                attention: Some(Attention::Naive),
                optimizer_in_backward: Some(false),
                ..Pins::default()
            };
            let mut all = strategies(
                &p,
                &Pins {
                    zero_stage: Some(ZeroStage::new(0).unwrap()),
                    ..pins
                },
            )
            .unwrap();
            for z in 1..=3 {
                all.extend(
                    strategies(
                        &p,
                        &Pins {
                            zero_stage: Some(ZeroStage::new(z).unwrap()),
                            ..pins
                        },
                    )
                    .unwrap(),
                );
            }
            all.retain(|s| s.micro_batch == 1);
            let states: Vec<u64> = all
                .iter()
                .map(|s| memory::model_state_bytes(&p, s))
                .collect();
            if let Some(prev) = &last {
                assert_eq!(prev.len(), states.len());
                for (i, (a, b)) in prev.iter().zip(&states).enumerate() {
                    assert!(b <= a, "{model} {:?}: {a} → {b} with {nodes} GPUs", all[i]);
                }
            }
            last = Some(states);
        }
    }
}

#[test]
fn checkpointing_never_raises_activations() {
    for model in [
        "gpt2",
        "llama-3-8b",
        "mixtral-8x7b",
        "t5-large",
        "bert-base-cased",
    ] {
        let spec = load_model(model).unwrap();
        for (s, b) in [(128.0, 1.0), (512.0, 4.0), (2048.0, 2.0)] {
            for attention in [Attention::Naive, Attention::MemoryEfficient] {
                for e in [2.0, 4.0] {
                    let none = activation::model_activations(
                        &spec,
                        s,
                        b,
                        e,
                        attention,
                        Checkpoint::None,
                        Loss::Plain,
                    );
                    for policy in [
                        Checkpoint::Selective,
                        Checkpoint::EveryNth(1),
                        Checkpoint::EveryNth(2),
                        Checkpoint::EveryNth(5),
                    ] {
                        let with = activation::model_activations(
                            &spec,
                            s,
                            b,
                            e,
                            attention,
                            policy,
                            Loss::Plain,
                        );
                        assert!(with <= none + 1e-6, "{model} {policy}: {with} > {none}");
                    }
                }
            }
        }
    }
}

#[test]
fn fitting_plans_are_under_capacity_and_categories_sum_to_the_peak() {
    for (model, gpu, per_node, seq, batch) in [
        ("llama-2-7b", "A100-80GB", 8, 4096, 64),
        ("gpt2", "L4", 1, 1024, 16),
        ("mixtral-8x7b", "H100-80GB", 8, 4096, 32),
        ("mistral-7b", "RTX-4090", 1, 2048, 4),
    ] {
        let p = problem(model, gpu, per_node, 1, seq, batch);
        for s in strategies(&p, &Pins::default()).unwrap() {
            let plan = evaluate(&p, &s);
            let m = &plan.memory;
            assert_eq!(
                m.breakdown.at_peak.total(),
                m.per_device_peak_bytes,
                "{s:?}"
            );
            if plan.fits {
                assert!(m.per_device_peak_bytes <= p.hardware.gpu.memory_bytes);
                assert!(m.per_device_peak_bytes <= m.usable_bytes);
                assert!(m.host_bytes_per_node <= p.hardware.host_memory_bytes);
            }
        }
    }
}

#[test]
fn offload_moves_states_off_the_device() {
    // ZeRO-Offload (docs/sources.md §8): with optimizer offload the device keeps only the 2Ψ of
    // 16-bit parameters among the model states; master weights and Adam states go to the host.
    let p = problem("llama-2-7b", "A100-80GB", 1, 1, 512, 1);
    let s = Strategy {
        placement: Placement {
            offload_optimizer: Offload::Cpu,
            ..adam(2).placement
        },
        ..adam(2)
    };
    let m = evaluate(&p, &s).memory;
    assert_eq!(m.breakdown.at_peak[Category::MasterWeight], 0);
    assert_eq!(m.breakdown.at_peak[Category::OptimizerState], 0);
    assert_eq!(m.breakdown.at_peak[Category::Parameter], 2 * 6_738_415_616);
    // Host: fp32 master 4Ψ + Adam 8Ψ + fp32 gradients 4Ψ = 16Ψ.
    assert_eq!(m.host_bytes_per_node, 16 * 6_738_415_616);
}

#[test]
fn the_host_estimate_counts_each_ranks_data_loader() {
    // 8 GPUs on one node, micro-batch 1 of 512 tokens, each rank's loader with 4 workers and a
    // queue of 3: 4 staging buffers of 2 × 8 B × 1 × 512 = 8 KiB (i64 inputs and targets)
    // and 4 workers of a 256 KiB stack and 4 × 513 B of scratch, times 8 ranks.
    let p = problem("llama-2-7b", "A100-80GB", 8, 1, 512, 16);
    let without = evaluate(&p, &adam(2)).memory.host_bytes_per_node;
    let w = p.workload.clone().with_loader(LoaderSpec {
        workers: 4,
        prefetch: 3,
    });
    let p = Problem { workload: w, ..p };
    let with = evaluate(&p, &adam(2)).memory.host_bytes_per_node;
    let per_rank = 4 * 8_192 + 4 * (262_144 + 4 * 513);
    assert_eq!(with - without, 8 * per_rank);
}

#[test]
fn pinning_everything_evaluates_exactly_one_plan() {
    let p = problem("llama-2-7b", "A100-80GB", 8, 1, 4096, 64);
    let pins = Pins {
        precision: Some(Precision::Bf16Mixed),
        optimizer: Some(Optimizer::AdamW),
        zero_stage: Some(ZeroStage::new(2).unwrap()),
        offload_optimizer: Some(Offload::None),
        offload_params: Some(Offload::None),
        offload_activations: Some(Offload::None),
        checkpoint: Some(Checkpoint::ALL_BLOCKS),
        attention: Some(Attention::MemoryEfficient),
        loss: Some(Loss::Plain),
        ..Pins::default()
    };
    let w = Workload::new(&p.spec, 4096, BatchSpec::Samples(64), Some(2), None, 8).unwrap();
    let p = Problem { workload: w, ..p };
    let out = search(&p, &pins, None).unwrap();
    assert_eq!(out.evaluated, 1);
}

#[test]
fn gpus_without_bf16_never_get_bf16_plans() {
    let p = problem("gpt2", "V100-16GB", 1, 1, 512, 8);
    let out = search(&p, &Pins::default(), None).unwrap();
    assert!(!out.fitting.is_empty());
    assert!(out.fitting.iter().all(|pl| !matches!(
        pl.strategy.precision,
        Precision::Bf16 | Precision::Bf16Mixed
    )));
    let e = search(
        &p,
        &Pins {
            precision: Some(Precision::Bf16Mixed),
            ..Pins::default()
        },
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("V100-16GB"), "{e}");
}
