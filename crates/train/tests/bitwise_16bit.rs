//! Data parallelism in 16 bits, bit for bit: gradients accumulate over micro-batches in f32 and
//! are rounded to 16 bits once, so one process accumulating N micro-batches and N ranks of one
//! micro-batch each (whose reduction sums the 16-bit gradients in f32 in rank order) round the
//! same f32 sum. Losses, weights and the fp16 loss scaler's skipped steps are bitwise equal in
//! bf16-mixed and fp16-mixed at 3 and 4 ranks and at every ZeRO stage (with one rank's
//! rounding of the running 16-bit sum they differ from the third micro-batch on), and with LoRA
//! adapters; the `--deterministic` flag no longer changes a 16-bit run; offloaded ZeRO-2
//! gradients accumulate as on the device. The f32 sums' bytes are derived by hand (4 bytes per
//! parameter, or per element of the rank's shard under ZeRO-2/3, only with accumulation > 1),
//! predicted exactly by the dry run and counted the same by the planner.

use crate::common;

use common::{assert_dry_run_exact, config, rounded, run_alone, run_ranks, zero};
use headroom_memory::Category;
use headroom_train::config::RunConfig;
use headroom_train::strategy::{BaseWeights, Lora, Offload, Optimizer, Precision};

/// Enough optimizer steps for a rounding difference to reach the losses.
const STEPS: u64 = 5;

/// gpt-tiny in `precision`, `STEPS` steps of micro-batch 2 × `accumulation` on each of `ranks`.
fn sixteen(precision: Precision, accumulation: usize, ranks: usize) -> RunConfig {
    let mut c = config(Optimizer::AdamW, 2, accumulation, ranks);
    c.strategy.precision = precision;
    c.steps = STEPS;
    c
}

/// `ranks` ranks of one micro-batch each, at every ZeRO stage, against one process
/// accumulating `ranks` micro-batches: losses, weights and skipped steps bitwise.
fn assert_ranks_are_one_process(single: &RunConfig, group: &RunConfig, ranks: usize, what: &str) {
    let (want, t) = run_alone(single);
    let skipped = t.report().skipped_steps;
    for stage in 0..=3u8 {
        let got = run_ranks(&zero(group.clone(), stage), ranks);
        for (rank, g) in got.iter().enumerate() {
            let label = format!("{what}, {ranks} ranks, ZeRO-{stage}, rank {rank}");
            assert_eq!(g.bits.0, want.0, "losses: {label}");
            assert!(g.bits.1 == want.1, "weights differ: {label}");
            assert_eq!(g.report.skipped_steps, skipped, "skipped steps: {label}");
        }
    }
}

#[test]
fn bf16_mixed_ranks_are_bitwise_one_process_accumulating_their_micro_batches() {
    for ranks in [3, 4] {
        let p = Precision::Bf16Mixed;
        let (single, group) = (sixteen(p, ranks, 1), sixteen(p, 1, ranks));
        assert_ranks_are_one_process(&single, &group, ranks, "bf16-mixed");
    }
}

/// fp16-mixed with dynamic loss scaling (at 2¹⁶ throughout: no step of these overflows): the
/// scaler's verdict reads the gradient after the one rounding, in the single process and in
/// every rank alike (an overflowing sum is the unit test's in `trainer/accumulate.rs`).
#[test]
fn fp16_mixed_ranks_are_bitwise_one_process_accumulating_their_micro_batches() {
    for ranks in [3, 4] {
        let p = Precision::Fp16Mixed;
        let (single, group) = (sixteen(p, ranks, 1), sixteen(p, 1, ranks));
        assert_ranks_are_one_process(&single, &group, ranks, "fp16-mixed");
    }
}

#[test]
fn lora_adapters_accumulate_in_f32_as_the_ranks_reduce() {
    let lora = |mut c: RunConfig| {
        c.lora = Some(Lora::new(4, 8.0, "qkv,down".parse().unwrap(), BaseWeights::Plain).unwrap());
        c
    };
    let p = Precision::Bf16Mixed;
    let (single, group) = (lora(sixteen(p, 3, 1)), lora(sixteen(p, 1, 3)));
    assert_ranks_are_one_process(&single, &group, 3, "LoRA bf16-mixed");
}

/// Each micro-batch's gradient is summed whole into the f32 sum whether or not the run asks
/// for deterministic accumulation (a 16-bit running sum would add a tied embedding's two
/// contributions one at a time without it).
#[test]
fn the_deterministic_flag_does_not_change_a_16_bit_run() {
    for p in [Precision::Bf16Mixed, Precision::Fp16Mixed] {
        let deterministic = sixteen(p, 3, 1);
        let mut plain = deterministic.clone();
        plain.deterministic = false;
        assert_eq!(run_alone(&plain).0, run_alone(&deterministic).0, "{p}");
    }
}

/// ZeRO-2 with offloaded optimizer states keeps the reduced gradient shards on the host, in
/// f32, rounded once before the step: bitwise the device's f32 sums.
#[test]
fn offloaded_zero2_gradients_accumulate_as_on_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let device = zero(sixteen(Precision::Bf16Mixed, 2, 2), 2);
    let mut host = device.clone();
    host.strategy.placement.offload_optimizer = Offload::Cpu;
    host.offload_dir = Some(dir.path().to_path_buf());
    let (want, got) = (run_ranks(&device, 2), run_ranks(&host, 2));
    for (rank, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.bits, w.bits, "rank {rank}");
        // The host's gradient shards: 4 bytes per element of the padded shard, in pages.
        let shards: u64 = g
            .blocks
            .iter()
            .map(|&p| (4 * p.div_ceil(2) as u64).div_ceil(4096) * 4096)
            .sum();
        let off = g.report.offload.as_ref().unwrap();
        assert_eq!(off.host[Category::Gradient], shards, "rank {rank}");
    }
}

/// The sums' bytes by hand: accumulation > 1 adds one f32 buffer per block, each rounded up to
/// the allocator's 512 bytes, of the whole block alone and of the rank's padded shard under
/// ZeRO-2; fp32 and accumulation 1 add nothing. The dry run predicts each run exactly, and the
/// planner's analytical model adds the same 4 bytes per (sharded) parameter.
#[test]
fn the_f32_sums_cost_what_is_derived_by_hand_predicted_and_planned() {
    let gradient = |m: &headroom_memory::MemoryPeaks| m.peak_bytes_by_category[Category::Gradient];
    let planned = |c: &RunConfig| {
        let a = headroom_train::predict::analytical::analytical_memory(c).unwrap();
        a.memory.breakdown.at_peak[Category::Gradient]
    };
    // Alone.
    let (one, three) = (
        sixteen(Precision::Bf16Mixed, 1, 1),
        sixteen(Precision::Bf16Mixed, 3, 1),
    );
    let (_, t1) = run_alone(&one);
    let (_, t3) = run_alone(&three);
    let blocks: Vec<usize> = t1.model().blocks().iter().map(|b| b.numel()).collect();
    let sums: u64 = blocks.iter().map(|&p| rounded(4 * p) as u64).sum();
    let extra = gradient(&t3.report().memory) - gradient(&t1.report().memory);
    assert_eq!(extra, sums);
    let params: u64 = blocks.iter().map(|&p| p as u64).sum();
    assert_eq!(planned(&three) - planned(&one), 4 * params);
    assert_dry_run_exact(&three, "bf16-mixed × 3");
    // fp32 accumulates in its gradient: no sums, in the engine or the plan; in deterministic
    // mode it sums each micro-batch whole into the same f32 buffers.
    let fp32 = |a: usize, deterministic: bool| {
        let mut c = config(Optimizer::AdamW, 2, a, 1);
        c.steps = 2;
        c.deterministic = deterministic;
        c
    };
    for (deterministic, expected) in [(false, 0), (true, sums)] {
        let (_, f1) = run_alone(&fp32(1, deterministic));
        let (_, f3) = run_alone(&fp32(3, deterministic));
        let extra = gradient(&f3.report().memory) - gradient(&f1.report().memory);
        assert_eq!(extra, expected, "fp32, deterministic {deterministic}");
    }
    assert_eq!(planned(&fp32(3, false)), planned(&fp32(1, false)));
    // ZeRO-2 over two ranks: the sums of the rank's padded shards.
    let (one, two) = (
        zero(sixteen(Precision::Bf16Mixed, 1, 2), 2),
        zero(sixteen(Precision::Bf16Mixed, 2, 2), 2),
    );
    let (r1, r2) = (run_ranks(&one, 2), run_ranks(&two, 2));
    let shard_sums: u64 = blocks
        .iter()
        .map(|&p| rounded(4 * p.div_ceil(2)) as u64)
        .sum();
    for rank in 0..2 {
        let extra = gradient(&r2[rank].memory) - gradient(&r1[rank].memory);
        assert_eq!(extra, shard_sums, "ZeRO-2, rank {rank}");
    }
    assert_eq!(planned(&two) - planned(&one), 2 * params);
    let predicted =
        headroom_train::predict::predict(&two, &headroom_train::data::Corpus::bundled())
            .unwrap()
            .memory;
    assert_eq!(
        predicted.peak_bytes_by_category,
        r2[0].memory.peak_bytes_by_category
    );
}
