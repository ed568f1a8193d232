//! Every lever on a pretrained Llama (the parity fixture's directory): each lever alone and
//! ZeRO-1/2/3 over three ranks, the dry run predicting the run's peaks per category exactly,
//! and ZeRO's ranks training bitwise the data-parallel run (one micro-batch per rank).

use crate::common;

use common::run_ranks;
use headroom_train::config::TrainConfig;
use headroom_train::data::Corpus;
use headroom_train::predict::error::evaluate;
use std::path::PathBuf;

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../nn/tests/data/llama/llama")
        .display()
        .to_string()
}

fn base() -> TrainConfig {
    TrainConfig {
        model: Some(fixture()),
        micro_batch: Some(2),
        accumulation: Some(2),
        seq_len: Some(16),
        steps: Some(2),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some("256MiB".parse().unwrap()),
        ..Default::default()
    }
}

#[test]
fn each_lever_on_a_pretrained_llama_is_predicted_exactly() {
    let corpus = Corpus::bundled();
    let levers: Vec<(&str, TrainConfig)> = vec![
        (
            "fp16-mixed",
            TrainConfig {
                precision: Some("fp16-mixed".parse().unwrap()),
                ..base()
            },
        ),
        (
            "bf16",
            TrainConfig {
                precision: Some("bf16".parse().unwrap()),
                ..base()
            },
        ),
        (
            "checkpoint all",
            TrainConfig {
                checkpoint: Some("all".parse().unwrap()),
                ..base()
            },
        ),
        (
            "selective",
            TrainConfig {
                checkpoint: Some("selective".parse().unwrap()),
                ..base()
            },
        ),
        (
            "memory-efficient attention",
            TrainConfig {
                attention: Some("memory-efficient".parse().unwrap()),
                ..base()
            },
        ),
        (
            "chunked loss",
            TrainConfig {
                loss: Some("chunked:4".parse().unwrap()),
                ..base()
            },
        ),
        (
            "adamw-8bit",
            TrainConfig {
                optimizer: Some("adamw-8bit".parse().unwrap()),
                ..base()
            },
        ),
        (
            "adafactor",
            TrainConfig {
                optimizer: Some("adafactor".parse().unwrap()),
                ..base()
            },
        ),
        (
            "optimizer offload",
            TrainConfig {
                offload_optimizer: Some("cpu".parse().unwrap()),
                zero_stage: Some(headroom_train::strategy::ZeroStage::new(1).unwrap()),
                ..base()
            },
        ),
        (
            "activation offload",
            TrainConfig {
                checkpoint: Some("all".parse().unwrap()),
                offload_activations: Some("cpu".parse().unwrap()),
                ..base()
            },
        ),
        (
            "step in backward",
            TrainConfig {
                optimizer_in_backward: Some(true),
                accumulation: Some(1),
                ..base()
            },
        ),
    ];
    for (label, c) in levers {
        let row = evaluate(c, &corpus).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(
            row.dry_run.peak_bytes_by_category, row.measured.peak_bytes_by_category,
            "{label}"
        );
        assert_eq!(
            row.dry_run.peak_allocated_bytes, row.measured.peak_allocated_bytes,
            "{label}"
        );
    }
}

#[test]
fn zero_stages_on_a_pretrained_llama_are_bitwise_ddp_and_predicted_per_rank() {
    // One micro-batch per rank: the case where ZeRO's sums are grouped as DDP's (README).
    let ddp = TrainConfig {
        data_parallel: Some(3),
        deterministic: Some(true),
        accumulation: Some(1),
        ..base()
    }
    .resolve()
    .unwrap();
    let expected = run_ranks(&ddp, 3);
    for stage in [1u8, 2, 3] {
        let mut c = ddp.clone();
        c.strategy.placement.zero_stage = headroom_train::strategy::ZeroStage::new(stage).unwrap();
        let got = run_ranks(&c, 3);
        for (rank, (g, w)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g.bits.0, w.bits.0, "losses: ZeRO-{stage} rank {rank}");
            assert!(g.bits.1 == w.bits.1, "weights: ZeRO-{stage} rank {rank}");
        }
        let predicted = headroom_train::predict::predict(&c, &Corpus::bundled()).unwrap();
        assert_eq!(
            predicted.memory.peak_bytes_by_category, got[0].memory.peak_bytes_by_category,
            "ZeRO-{stage}: rank 0"
        );
    }
}
