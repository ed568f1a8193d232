//! `--calibrate`: the cost model rescaled to one measured step. After calibration the model
//! predicts the measured tokens/s (and, given a peak, the measured allocated bytes) for the
//! measured strategy; it predicts other strategies through the same formulas. Checked against
//! Hugging Face's bert-large V100 measurements: calibrated on micro-batch 4, the model must
//! predict their micro-batch 1 × accumulation 4 run.

use crate::support;

use headroom_plan::calibrate::{Measurement, calibrate};
use headroom_plan::cost::{Problem, evaluate};
use headroom_plan::strategy::{Attention, Category, Checkpoint, Precision, Strategy, ZeroStage};
use headroom_plan::workload::{BatchSpec, Workload};
use support::{plain_strategy, problem};

fn measurement(s: Strategy, tokens_per_s: f64, peak: Option<u64>) -> Measurement {
    Measurement {
        strategy: s,
        seq_len: None,
        tokens_per_s,
        peak_allocated_bytes: peak,
        source: None,
    }
}

/// `p` with the batch of `s` (the measured run's split).
fn at_split(p: &Problem, s: &Strategy) -> Problem {
    let workload = Workload::new(
        &p.spec,
        p.workload.seq_len,
        BatchSpec::Split {
            micro_batch: s.micro_batch,
            accumulation: s.accumulation,
        },
        Some(s.micro_batch),
        Some(s.accumulation),
        p.hardware.world_size(),
    )
    .unwrap();
    Problem {
        workload,
        ..p.clone()
    }
}

fn allocated(p: &Problem, s: &Strategy) -> u64 {
    let at_peak = evaluate(p, s).memory.breakdown.at_peak;
    at_peak.total() - at_peak[Category::Other]
}

#[test]
fn calibrating_to_the_models_own_prediction_changes_nothing() {
    let p = problem("llama-2-7b", "H100-80GB", 1, 1, 4096, 8);
    let s = plain_strategy(Precision::Bf16Mixed, 1, 8);
    let own = evaluate(&at_split(&p, &s), &s);
    let peak = allocated(&at_split(&p, &s), &s);
    let (cost, c) = calibrate(&p, &measurement(s, own.time.tokens_per_s, Some(peak))).unwrap();
    assert!((cost.efficiency_scale - 1.0).abs() < 1e-12);
    assert!(
        (c.activation_scale - 1.0).abs() < 1e-9,
        "{}",
        c.activation_scale
    );
}

#[test]
fn the_calibrated_model_predicts_the_measured_step() {
    // One GPU, and ZeRO-3 on eight, whose overlapped communication depends on the compute time.
    let cases = [
        (
            problem("gpt2", "H100-80GB", 1, 1, 1024, 32),
            0,
            (8, 4),
            Checkpoint::None,
        ),
        (
            problem("llama-2-7b", "H100-80GB", 8, 1, 4096, 64),
            3,
            (2, 4),
            Checkpoint::ALL_BLOCKS,
        ),
    ];
    for (p, zero, (micro_batch, accumulation), checkpoint) in cases {
        let mut s = plain_strategy(Precision::Bf16Mixed, micro_batch, accumulation);
        s.placement.zero_stage = ZeroStage::new(zero).unwrap();
        s.checkpoint = checkpoint;
        let measured = at_split(&p, &s);
        let default = evaluate(&measured, &s).time.tokens_per_s;
        assert_eq!(
            evaluate(&measured, &s).memory.peak_phase,
            headroom_plan::cost::memory::Phase::ForwardBackward,
            "ZeRO-{zero}"
        );
        for factor in [0.6, 1.3] {
            let tokens_per_s = default * factor;
            let peak = (allocated(&measured, &s) as f64 * 1.1) as u64;
            let (cost, c) = calibrate(&p, &measurement(s, tokens_per_s, Some(peak))).unwrap();
            let after = Problem {
                cost,
                ..measured.clone()
            };
            let t = evaluate(&after, &s).time.tokens_per_s;
            assert!(
                (t / tokens_per_s - 1.0).abs() < 1e-9,
                "ZeRO-{zero} × {factor}: {t} against {tokens_per_s}"
            );
            assert!(c.efficiency_after > 0.0 && c.efficiency_after <= 1.0);
            // Activations absorb the whole difference; each category rounds to whole bytes.
            let got = allocated(&after, &s);
            assert!(got.abs_diff(peak) <= 16, "{got} against {peak}");
            assert!(c.activation_scale > 1.0, "{}", c.activation_scale);
        }
    }
}

#[test]
fn calibrated_on_hugging_faces_micro_batch_4_it_predicts_their_accumulation_run() {
    // Hugging Face's single-GPU guide, bert-large-uncased, 512 tokens, fp32, V100-SXM2 16 GB:
    // 8.86 samples/s at micro-batch 4, 7.75 at micro-batch 1 × accumulation 4.
    let p = problem("bert-large-uncased", "V100-16GB", 1, 1, 512, 4);
    let four = plain_strategy(Precision::Fp32, 4, 1);
    let (cost, c) = calibrate(&p, &measurement(four, 8.86 * 512.0, None)).unwrap();
    // The V100's fp32 efficiency is fitted to this very run (cost/efficiency.rs), so calibrating
    // on it changes (almost) nothing.
    assert!(
        (c.efficiency_after / c.efficiency_before - 1.0).abs() < 0.01,
        "{} -> {}",
        c.efficiency_before,
        c.efficiency_after
    );
    let one = plain_strategy(Precision::Fp32, 1, 4);
    let calibrated = Problem { cost, ..p.clone() };
    let predicted = evaluate(&at_split(&calibrated, &one), &one)
        .time
        .tokens_per_s
        / 512.0;
    assert!(
        (predicted / 7.75 - 1.0).abs() < 0.02,
        "{predicted} samples/s against 7.75"
    );
}

#[test]
fn measurements_that_cannot_describe_the_run_are_refused_with_the_reason() {
    let p = problem("llama-2-7b", "H100-80GB", 1, 1, 4096, 8);
    let s = plain_strategy(Precision::Bf16Mixed, 1, 8);
    let default = evaluate(&at_split(&p, &s), &s).time.tokens_per_s;
    // Faster than the model's non-compute work alone.
    let e = calibrate(&p, &measurement(s, default * 10.0, None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("shorter than"), "{e}");
    // Compute in 0.3 of the default model's time: the saturated efficiency / 0.3 of the peak
    // (0.3729 / 0.3 = 124 % on an H100 in bf16).
    let t = evaluate(&at_split(&p, &s), &s).time;
    let needed = headroom_plan::cost::efficiency::saturated(&p, Precision::Bf16Mixed) / 0.3;
    let tokens = (8 * 4096) as f64;
    let fast = tokens / (t.step_s - 0.7 * t.compute_s);
    let e = calibrate(&p, &measurement(s, fast, None))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("{:.0} % of the GPUs' dense peak", 100.0 * needed)),
        "{e}"
    );
    // A peak below the model states the strategy holds anyway.
    let e = calibrate(&p, &measurement(s, default, Some(1 << 30)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("model states"), "{e}");
    let e = calibrate(&p, &measurement(s, -1.0, None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("positive"), "{e}");
    // Unknown keys are named.
    let e = Measurement::from_json(r#"{"strategy": {}, "tokens_per_s": 1, "tokens": 2}"#)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("calibration file:"), "{e}");
    let text = r#"{"strategy": {"precision": "bf16-mixed", "optimizer": "adamw", "zero_stage": 0,
        "offload_optimizer": "none", "offload_params": "none", "checkpoint": "none",
        "attention": "naive", "micro_batch": 1, "accumulation": 8}, "tokens_per_s": 1000,
        "typo": 1}"#;
    let e = Measurement::from_json(text).unwrap_err().to_string();
    assert!(e.contains("typo"), "{e}");
    let ok = Measurement::from_json(&text.replace(",\n        \"typo\": 1", "")).unwrap();
    assert_eq!(ok.strategy, s);
}

#[test]
fn a_peak_in_the_optimizer_step_leaves_memory_as_predicted() {
    // Micro-batch 1 with every block checkpointed: on one H100 the foreach AdamW step's copy
    // of the weights outweighs the activations, so the peak is the step's.
    let p = problem("llama-2-7b", "H100-80GB", 1, 1, 512, 8);
    let mut s = plain_strategy(Precision::Bf16, 1, 8);
    s.checkpoint = Checkpoint::ALL_BLOCKS;
    s.attention = Attention::MemoryEfficient;
    let measured = at_split(&p, &s);
    let plan = evaluate(&measured, &s);
    assert_eq!(
        plan.memory.peak_phase,
        headroom_plan::cost::memory::Phase::OptimizerStep
    );
    let (cost, c) = calibrate(
        &p,
        &measurement(s, plan.time.tokens_per_s, Some(allocated(&measured, &s))),
    )
    .unwrap();
    assert_eq!(cost.activation_scale, 1.0);
    assert!(c.memory_note.unwrap().contains("optimizer step"));
}
