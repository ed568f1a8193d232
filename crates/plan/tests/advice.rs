//! The advice says what the levers do at the peak the plan actually has, and speaks of one GPU
//! as one GPU.

use crate::support;

use headroom_plan::advice::explain;
use headroom_plan::cost::memory::Phase;
use headroom_plan::cost::{Problem, evaluate};
use headroom_plan::strategy::{
    Attention, Checkpoint, Loss, Optimizer, Placement, Precision, Strategy, ZeroStage,
};
use support::problem;

fn one_gpu(model: &str, gpu: &str, seq: u64, batch: u64) -> Problem {
    problem(model, gpu, 1, 1, seq, batch)
}

fn strategy(zero: u8, attention: Attention, micro_batch: u64, accumulation: u64) -> Strategy {
    Strategy {
        precision: Precision::Bf16Mixed,
        optimizer: Optimizer::AdamW,
        placement: Placement {
            zero_stage: ZeroStage::new(zero).unwrap(),
            ..Placement::default()
        },
        checkpoint: Checkpoint::None,
        attention,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch,
        accumulation,
    }
}

#[test]
fn no_activation_savings_are_claimed_at_an_optimizer_step_peak() {
    // gpt2-medium (354,823,168 parameters) at micro-batch 1, seq 512: the optimizer step holds
    // one fp32 copy of the parameters (4 × 354.8 M = 1.42 GB) as foreach AdamW's temporary,
    // more than the backward's activations and loss tensors (24 blocks × 34·s·h bytes =
    // 0.43 GB, the bf16 logits and fp32 log-probabilities 6·s·v = 0.15 GB, the loss's two fp32
    // gradients 8·s·v = 0.21 GB), so the peak is in the step and no activation is live there.
    let p = one_gpu("gpt2-medium", "RTX-4090", 512, 32);
    let plan = evaluate(&p, &strategy(0, Attention::MemoryEfficient, 1, 32));
    assert_eq!(plan.memory.peak_phase, Phase::OptimizerStep);
    let advice = explain(&p, &plan).join("\n");
    assert!(!advice.contains("them to 0 B"), "{advice}");
    assert!(advice.contains("do not lower the peak"), "{advice}");
}

#[test]
fn zero_3_on_one_gpu_says_it_shards_nothing() {
    let p = one_gpu("gpt2", "RTX-4090", 1024, 8);
    let plan = evaluate(&p, &strategy(3, Attention::MemoryEfficient, 1, 8));
    let advice = explain(&p, &plan).join("\n");
    assert!(
        advice.contains("ZeRO-3 on one GPU shards nothing"),
        "{advice}"
    );
    assert!(!advice.contains("1 GPUs"), "{advice}");
}

#[test]
fn a_plan_short_of_nvme_says_so_rather_than_zero_bytes_per_gpu() {
    // A 1T GPT on one 16-GPU V100 node with the default 3.84 TB of NVMe: the NVMe plan fits the
    // GPUs (about 20 GiB each) but its 16 bytes per parameter of states, 16 TB, do not fit the
    // disks; the closest plan must say what is short.
    use headroom_plan::advice::shortfall;
    use headroom_plan::model::load_model;
    use headroom_plan::search::search;
    use headroom_plan::strategy::{Offload, Pins};
    use headroom_plan::workload::{BatchSpec, Workload};
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/published/gpt-1t.json"
    );
    let spec = load_model(model).unwrap();
    let mut hw = headroom_plan::hardware::preset("V100-32GB").unwrap();
    hw.gpus_per_node = 16;
    hw.host_memory_bytes = 1_500_000_000_000;
    let w = Workload::new(&spec, 1024, BatchSpec::Samples(16), None, None, 16).unwrap();
    let p = Problem::new(spec, hw, w, Default::default());
    let pins = Pins {
        precision: Some(Precision::Fp16Mixed),
        offload_optimizer: Some(Offload::Nvme),
        offload_params: Some(Offload::Nvme),
        ..Pins::default()
    };
    let out = search(&p, &pins, None).unwrap();
    assert!(out.fitting.is_empty());
    let closest = out.closest.as_ref().unwrap();
    let short = shortfall(&p, &pins, closest);
    assert_eq!(short.missing_bytes_per_device, 0);
    // States: 4 (fp32 master) + 8 (AdamW) + 4 (fp32 gradients) bytes per parameter, plus the
    // 2-byte parameters: 18 B × 1.008e12 ≈ 18.1 TB against 3.84 TB.
    let need = 18.0 * p.facts.params as f64;
    let missing = short.missing_nvme_bytes_per_node as f64;
    assert!(
        (missing - (need - 3.84e12)).abs() < 1e-3 * need,
        "{missing}"
    );
    assert!(
        short.missing_text().contains("more NVMe per node"),
        "{}",
        short.missing_text()
    );
    assert!(
        !short.missing_text().contains("per GPU"),
        "{}",
        short.missing_text()
    );
}
