//! `--offload-activations cpu` in the engine: the checkpointed blocks' inputs wait in host
//! memory between forward and backward. The run is bitwise the run without it (the bytes are
//! copied, not converted), the device's activation peak drops and the host holds every
//! checkpointed input at once (both derived by hand from the block input's size), the dry run
//! predicts it exactly, and a policy that checkpoints no block is refused with the reason.

use crate::common;

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
fn a_step_counts_every_input_copied_out_and_back() {
    let corpus = headroom_train::data::Corpus::bundled();
    let copied = |offload| {
        let dry = headroom_train::predict::dry_run_counted(&run(Precision::Fp32, offload), &corpus)
            .unwrap();
        dry.step_work.host_transfer_bytes
    };
    // Each of the four blocks' inputs goes to the host in forward and comes back in backward.
    let input = (MICRO * SEQ * WIDTH * 4) as f64;
    assert_eq!(copied(Offload::Cpu), 2.0 * LAYERS as f64 * input);
    assert_eq!(copied(Offload::None), 0.0);
}

#[test]
fn auto_offloads_the_inputs_where_only_that_fits() {
    let corpus = headroom_train::data::Corpus::bundled();
    // On the planned arena reserved is the live peak, so the budget is exactly the offloaded
    // run's peak, which the run that keeps its inputs exceeds.
    let on_arena = |offload| RunConfig {
        allocator: headroom_memory::AllocatorKind::Planned,
        ..run(Precision::Fp32, offload)
    };
    let reserved = |c: &RunConfig| {
        headroom_train::predict::predict(c, &corpus)
            .unwrap()
            .memory
            .peak_reserved_bytes
    };
    let mut c = on_arena(Offload::None);
    let budget = reserved(&on_arena(Offload::Cpu));
    assert!(budget < reserved(&c));
    c.device_memory = budget;
    let s = c.strategy;
    let pins = headroom_train::strategy::Pins {
        precision: Some(s.precision),
        optimizer: Some(s.optimizer),
        checkpoint: Some(s.checkpoint),
        attention: Some(s.attention),
        loss: Some(s.loss),
        optimizer_in_backward: Some(false),
        offload_optimizer: Some(Offload::None),
        micro_batch: Some(MICRO as u64),
        accumulation: Some(1),
        allocator: Some(c.allocator),
        ..Default::default()
    };
    let found = headroom_train::auto::plan(&c, &corpus, &pins).unwrap();
    let best = found.recommended().expect("the offloaded run fits");
    assert_eq!(best.strategy.placement.offload_activations, Offload::Cpu);
    // Its predicted step pays for the copies: 2 × 4 inputs at the measured host-copy rate.
    let copied = 2.0 * (LAYERS * MICRO * SEQ * WIDTH * 4) as f64;
    let expected = copied / found.speed.host_copy_bytes_per_s;
    assert!((best.time.offload_s - expected).abs() <= 1e-9 * expected.max(1.0));
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
