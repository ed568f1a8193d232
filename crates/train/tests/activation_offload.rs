//! `--offload-activations cpu` in the engine: the checkpointed blocks' inputs wait in host
//! memory between forward and backward. The run is bitwise the run without it (the bytes are
//! copied, not converted), the device's activation peak drops and the host holds every
//! checkpointed input at once (both derived by hand from the block input's size), the dry run
//! predicts it exactly, and a policy that checkpoints no block is refused with the reason.

mod common;

use common::{assert_dry_run_exact, config, run_alone};
use headroom_memory::Category;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::strategy::{Checkpoint, Offload, Optimizer, Precision};

const LAYERS: usize = 4;
const WIDTH: usize = 32;
const SEQ: usize = 32;
const MICRO: usize = 4;

/// gpt-tiny at 4 layers, every block checkpointed, the inputs offloaded or not.
fn run(precision: Precision, offload: Offload) -> RunConfig {
    let mut c = config(Optimizer::AdamW, MICRO, 1, 1);
    c.layers = Some(LAYERS);
    c.steps = 6;
    c.strategy.precision = precision;
    c.strategy.checkpoint = Checkpoint::ALL_BLOCKS;
    c.strategy.placement.offload_activations = offload;
    c
}

#[test]
fn the_run_is_bitwise_the_run_that_keeps_its_checkpoints() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        let (kept, _) = run_alone(&run(precision, Offload::None));
        let (offloaded, _) = run_alone(&run(precision, Offload::Cpu));
        assert!(kept == offloaded, "{precision}");
    }
}

#[test]
fn the_inputs_move_from_the_device_to_the_host() {
    let (_, kept) = run_alone(&run(Precision::Fp32, Offload::None));
    let (_, offloaded) = run_alone(&run(Precision::Fp32, Offload::Cpu));
    let act = |t: &headroom_train::Trainer| {
        t.report().memory.peak_bytes_by_category[Category::Activation]
    };
    // One block's input: micro-batch × sequence × width in f32 (a multiple of the allocator's
    // 512-byte rounding).
    let input = (MICRO * SEQ * WIDTH * 4) as u64;
    // All four inputs wait on the host at the end of forward.
    assert_eq!(
        offloaded.report().offloaded_activations_peak_bytes,
        Some(LAYERS as u64 * input)
    );
    assert_eq!(kept.report().offloaded_activations_peak_bytes, None);
    // The activation peak is in backward, while a block recomputes: its own input is back on
    // the device, the other three stay on the host (the planner's count − 1).
    assert_eq!(act(&kept) - act(&offloaded), (LAYERS as u64 - 1) * input);
    // Nothing else changes on the device.
    for c in [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
    ] {
        assert_eq!(
            kept.report().memory.peak_bytes_by_category[c],
            offloaded.report().memory.peak_bytes_by_category[c],
            "{c}"
        );
    }
}

#[test]
fn the_dry_run_predicts_it_exactly() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        assert_dry_run_exact(&run(precision, Offload::Cpu), &precision.to_string());
    }
}

#[test]
fn a_policy_without_block_checkpoints_is_refused() {
    for (checkpoint, tier, why) in [
        (Checkpoint::None, Offload::Cpu, "checkpoints no block"),
        (Checkpoint::Selective, Offload::Cpu, "checkpoints no block"),
        (Checkpoint::ALL_BLOCKS, Offload::Nvme, "cpu or none"),
    ] {
        let e = TrainConfig {
            checkpoint: Some(checkpoint),
            offload_activations: Some(tier),
            ..Default::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains(why), "{checkpoint}: {e}");
    }
}
