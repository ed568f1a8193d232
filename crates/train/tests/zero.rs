//! ZeRO-2 and ZeRO-3 on the in-process thread group: bitwise the DDP run (itself bitwise the
//! single-process run, see `data_parallel.rs`) with a parameter count that does not divide by
//! the ranks, LAMB at every stage too (its per-weight sums completed over ranks); each rank's bytes per category at every phase of the first four steps against the
//! ZeRO paper's accounting (Rajbhandari et al. 2020, §3: 2 + 2 + 12 bytes per parameter in
//! mixed precision, sharded per stage) derived here by hand; the collectives each stage issues
//! per step; the dry run's prediction of a rank; sharded saves resumed at other rank counts.

use crate::common;

use common::{RankOutcome, config, owned, rounded, run_ranks, run_saving, zero};
use headroom_memory::Category;
use headroom_train::data::Corpus;
use headroom_train::report::Phase;
use headroom_train::strategy::{Checkpoint, Optimizer, Precision};

#[test]
fn zero2_and_zero3_are_bitwise_ddp() {
    // gpt-tiny's blocks (8,192 + 1,024 + 12,704 × 2 + 64 elements) are not multiples of 3.
    let cases = [
        (Optimizer::AdamW, Precision::Fp32, &[2, 3, 4][..]),
        (Optimizer::SgdMomentum, Precision::Fp32, &[2, 3][..]),
        (Optimizer::AdamW, Precision::Bf16Mixed, &[2, 3][..]),
        (Optimizer::AdamW, Precision::Fp32, &[8][..]),
    ];
    for (optimizer, precision, all_ranks) in cases {
        for &ranks in all_ranks {
            let mut ddp = config(optimizer, 2, 1, ranks);
            ddp.strategy.precision = precision;
            let expected = run_ranks(&ddp, ranks);
            for stage in [2, 3] {
                let got = run_ranks(&zero(ddp.clone(), stage), ranks);
                for (rank, (g, w)) in got.iter().zip(&expected).enumerate() {
                    let label =
                        format!("ZeRO-{stage} {optimizer} {precision}, rank {rank}/{ranks}");
                    assert_eq!(g.bits.0, w.bits.0, "losses: {label}");
                    assert!(g.bits.1 == w.bits.1, "weights differ: {label}");
                }
            }
        }
    }
}

/// LAMB's trust ratio ‖w‖ / ‖u‖ is per weight, and a rank's shard cuts some weights: each
/// rank sums its piece, and the pieces' sums are all-reduced. By hand, per step and block, on
/// top of what AdamW communicates at the same stage: one all-reduce when the shard boundaries
/// (multiples of P = ⌈Ψ_b / N⌉) fall inside some weight, of 2 × 41 elements per such weight
/// (‖w‖² and ‖u‖², each an exact 640-bit integer as 40 digits of 16 bits, whose sums over up
/// to 256 ranks stay exact f32 integers, and one non-finite flag); nothing at DDP.
fn lamb_extra_all_reduce(
    weights: &[Vec<std::ops::Range<usize>>],
    blocks: &[usize],
    n: usize,
) -> (u64, u64) {
    let (mut calls, mut elements) = (0, 0);
    for (ranges, &numel) in weights.iter().zip(blocks) {
        let p = numel.div_ceil(n);
        let cut = ranges
            .iter()
            .filter(|r| (1..n).any(|k| r.start < k * p && k * p < r.end))
            .count() as u64;
        if cut > 0 {
            calls += 1;
            elements += 2 * 41 * cut;
        }
    }
    (calls, elements)
}

#[test]
fn lamb_under_zero1_2_and_3_is_bitwise_ddp() {
    let steps = 20;
    for ranks in [2, 3] {
        let ddp = config(Optimizer::Lamb, 2, 1, ranks);
        let expected = run_ranks(&ddp, ranks);
        for stage in [1, 2, 3] {
            let got = run_ranks(&zero(ddp.clone(), stage), ranks);
            let adamw = run_ranks(&zero(config(Optimizer::AdamW, 2, 1, ranks), stage), ranks);
            for (rank, (g, w)) in got.iter().zip(&expected).enumerate() {
                let label = format!("LAMB ZeRO-{stage}, rank {rank}/{ranks}");
                assert_eq!(g.bits.0, w.bits.0, "losses: {label}");
                assert!(g.bits.1 == w.bits.1, "weights differ: {label}");
                let (calls, elements) = lamb_extra_all_reduce(&g.weights, &g.blocks, ranks);
                // gpt-tiny's blocks are cut inside a weight at 2 and 3 ranks: the sums travel.
                assert!(calls > 0, "{label}");
                let base = adamw[rank].counts;
                assert_eq!(
                    g.counts.all_reduce,
                    (
                        base.all_reduce.0 + steps * calls,
                        base.all_reduce.1 + steps * elements
                    ),
                    "{label}"
                );
                assert_eq!(g.counts.reduce_scatter, base.reduce_scatter, "{label}");
                assert_eq!(g.counts.all_gather, base.all_gather, "{label}");
            }
        }
        // DDP itself communicates what AdamW's DDP does.
        let adamw = run_ranks(&config(Optimizer::AdamW, 2, 1, ranks), ranks);
        let (a, b) = (expected[0].counts, adamw[0].counts);
        assert_eq!(
            (a.all_reduce, a.reduce_scatter, a.all_gather, a.broadcast),
            (b.all_reduce, b.reduce_scatter, b.all_gather, b.broadcast),
            "DDP at {ranks} ranks"
        );
    }
}

/// At 9, 17 and 20 ranks gpt-tiny's 64-element block leaves the last ranks an empty shard
/// (⌈64 / 9⌉ = 8, so rank 8 starts at 8 × 8 = 64; ⌈64 / 17⌉ = 4, rank 16 starts at 64): their
/// optimizer state for it has no bytes, and the update must still run (it once panicked viewing
/// those bytes as f32). AdamW and LAMB at ZeRO-1 to 3 are then bitwise the DDP run, and the
/// shards, empty ones included, add up to each block.
#[test]
fn ranks_with_an_empty_shard_train_as_ddp_does() {
    for (ranks, optimizer) in [
        (9, Optimizer::AdamW),
        (9, Optimizer::Lamb),
        (17, Optimizer::AdamW),
    ] {
        let mut ddp = config(optimizer, 1, 1, ranks);
        ddp.steps = 3;
        let expected = run_ranks(&ddp, ranks);
        let blocks = expected[0].blocks.clone();
        assert_eq!(blocks.last(), Some(&64), "gpt-tiny's last block");
        assert_eq!(
            owned(64, ranks - 1, ranks),
            0,
            "rank {} of {ranks}",
            ranks - 1
        );
        for &p in &blocks {
            let shards: usize = (0..ranks).map(|r| owned(p, r, ranks)).sum();
            assert_eq!(shards, p, "a block of {p} over {ranks} ranks");
        }
        for stage in [1, 2, 3] {
            let got = run_ranks(&zero(ddp.clone(), stage), ranks);
            for (rank, (g, w)) in got.iter().zip(&expected).enumerate() {
                let label = format!("{optimizer} ZeRO-{stage}, rank {rank}/{ranks}");
                assert_eq!(g.bits.0.len(), 3, "{label}");
                assert_eq!(g.bits.0, w.bits.0, "losses: {label}");
                assert!(g.bits.1 == w.bits.1, "weights differ: {label}");
            }
        }
    }
}

/// The other levers under sharding. Accumulation: ZeRO-1 reduces the accumulated gradient
/// once, as DDP does, so it is bitwise DDP; ZeRO-2/3 reduce-scatter every micro-batch into the
/// shard (the full gradient is not kept between micro-batches: that is their saving), so each
/// element is Σ_micro Σ_rank instead of Σ_rank Σ_micro — the same terms in another order, equal
/// to a few f32 roundings (losses within 1e-6 relative over 20 steps). fp16-mixed with dynamic
/// loss scaling: every rank sees the same overflow verdict (the shards' finiteness is
/// gathered), bitwise DDP at every stage.
#[test]
fn accumulation_and_fp16_loss_scaling_shard_as_ddp_does() {
    for (precision, accumulation) in [(Precision::Fp32, 3), (Precision::Fp16Mixed, 1)] {
        let mut ddp = config(Optimizer::AdamW, 2, accumulation, 3);
        ddp.strategy.precision = precision;
        let expected = run_ranks(&ddp, 3);
        for stage in [1, 2, 3] {
            let got = run_ranks(&zero(ddp.clone(), stage), 3);
            for (rank, (g, w)) in got.iter().zip(&expected).enumerate() {
                let label = format!("ZeRO-{stage} {precision} × {accumulation}, rank {rank}");
                assert_eq!(g.report.skipped_steps, w.report.skipped_steps, "{label}");
                if stage == 1 || accumulation == 1 {
                    assert_eq!(g.bits.0, w.bits.0, "losses: {label}");
                    assert!(g.bits.1 == w.bits.1, "weights differ: {label}");
                } else {
                    for (a, b) in g.report.losses.iter().zip(&w.report.losses) {
                        assert!((a - b).abs() <= 1e-6 * b.abs(), "{label}: {a} vs {b}");
                    }
                    assert_ne!(g.bits.0, w.bits.0, "{label}: the order of the sums shows");
                }
            }
        }
    }
}

#[test]
fn zero3_regathers_for_recomputation_and_prefetches_without_changing_a_bit() {
    let mut ddp = config(Optimizer::AdamW, 2, 1, 3);
    ddp.strategy.checkpoint = Checkpoint::ALL_BLOCKS;
    let expected = run_ranks(&ddp, 3);
    for prefetch in [0, 1, 2] {
        let mut c = zero(ddp.clone(), 3);
        c.zero_prefetch = prefetch;
        for (rank, (g, w)) in run_ranks(&c, 3).iter().zip(&expected).enumerate() {
            assert_eq!(g.bits, w.bits, "prefetch {prefetch}, rank {rank}");
        }
    }
}

/// Per step, besides the bookkeeping every stage shares (one all-reduce of 1 element to agree
/// on stopping, one all-gather of 1 loss), by hand: DDP all-reduces every block (Ψ elements);
/// ZeRO-1 and ZeRO-2 reduce-scatter every block (N·P elements in, P = Σ ⌈Ψ_b / N⌉) instead of
/// the all-reduce, gather the gradient norm's partial sums (3 elements) and all-gather every
/// block's padded shard after the update; ZeRO-3 does not gather after the step but before
/// every block computes, forward and backward: 2B + 1 gathers on a tied GPT of B blocks, whose
/// embedding block is read again by the output head in forward; its final validation pass
/// gathers the B + 1 of a forward once more.
#[test]
fn each_stage_communicates_what_the_zero_paper_says() {
    let ranks = 3;
    let steps = 20u64;
    for stage in 0..=3u8 {
        let c = zero(config(Optimizer::AdamW, 2, 1, ranks), stage);
        let r = run_ranks(&c, ranks).remove(0);
        let blocks = r.blocks.len() as u64;
        let psi: u64 = r.blocks.iter().map(|&p| p as u64).sum();
        let padded: u64 = r.blocks.iter().map(|&p| p.div_ceil(ranks) as u64).sum();
        let embed = r.blocks[0].div_ceil(ranks) as u64;
        let n = ranks as u64;
        let (all_reduce, reduce_scatter, all_gather) = match stage {
            0 => ((blocks + 1, psi + 1), (0, 0), (1, 1)),
            1 => ((1, 1), (blocks, n * padded), (blocks + 2, padded + 4)),
            2 => ((1, 1), (blocks, n * padded), (blocks + 2, padded + 4)),
            _ => (
                (1, 1),
                (blocks, n * padded),
                (2 * blocks + 3, 2 * padded + embed + 4),
            ),
        };
        let per_step = |(calls, elements): (u64, u64)| (calls * steps, elements * steps);
        let validation = match stage {
            3 => (blocks + 1, padded + embed),
            _ => (0, 0),
        };
        let label = format!("ZeRO-{stage}");
        assert_eq!(
            r.counts.all_reduce,
            per_step(all_reduce),
            "{label} all-reduce"
        );
        assert_eq!(
            r.counts.reduce_scatter,
            per_step(reduce_scatter),
            "{label} reduce-scatter"
        );
        let gathers = per_step(all_gather);
        assert_eq!(
            r.counts.all_gather,
            (gathers.0 + validation.0, gathers.1 + validation.1),
            "{label} all-gather"
        );
        // On a ring each rank sends 2(N−1)/N·Ψ for an all-reduce, (N−1)/N of a reduce-scatter's
        // input and (N−1) times an all-gather's input: 2Ψ, 2Ψ, 2Ψ and 3Ψ (plus the tied
        // embedding's second gather) up to padding and bookkeeping.
        let sent = (r.counts.ring_elements(ranks) - ((n - 1) * validation.1) as f64) / steps as f64;
        let expected = match stage {
            0 => 2.0 * psi as f64 * (n - 1) as f64 / n as f64,
            1 | 2 => 2.0 * ((n - 1) * padded) as f64,
            _ => 3.0 * ((n - 1) * padded) as f64 + ((n - 1) * embed) as f64,
        };
        assert!(
            (sent - expected).abs() < 8.0 * n as f64,
            "{label}: {sent} sent per step, theory {expected}"
        );
        // The dry run counts the same collectives into a step's work, which the speed model
        // times: a steady step's ring elements are the real run's per step.
        let dry = headroom_train::predict::dry_run_counted(&c, &Corpus::bundled()).unwrap();
        let counted = dry.step_work.collective_elements;
        assert!(
            (counted - sent).abs() <= 1e-9 * sent,
            "{label}: dry run {counted}, measured {sent}"
        );
        assert_eq!(
            dry.step_work.collectives * steps,
            r.counts.calls() - validation.0,
            "{label}"
        );
    }
}

/// Bytes a rank holds in `category` at `phase` of a bf16-mixed AdamW run of stage `stage`,
/// derived from the ZeRO paper's 2 + 2 + 12 bytes per parameter: bf16 parameters (2), whole or
/// the rank's padded shard (ZeRO-3); bf16 gradients (2), whole or the padded shard (ZeRO-2/3);
/// fp32 master weights (4) and AdamW's two fp32 moments (8), whole or the rank's own elements
/// (ZeRO-1/2/3), the moments from the first step on. Every buffer is rounded to 512 bytes.
fn expected_bytes(
    blocks: &[usize],
    ranks: usize,
    rank: usize,
    stage: u8,
    category: Category,
    step: u64,
    phase: Phase,
) -> usize {
    let per_block = |f: &dyn Fn(usize) -> usize| -> usize { blocks.iter().map(|&p| f(p)).sum() };
    let padded = |p: usize| p.div_ceil(ranks);
    let own = |p: usize| owned(p, rank, ranks);
    match category {
        Category::Parameter if stage >= 3 => per_block(&|p| rounded(2 * padded(p))),
        Category::Parameter => per_block(&|p| rounded(2 * p)),
        Category::Gradient if stage >= 2 => per_block(&|p| rounded(2 * padded(p))),
        Category::Gradient => per_block(&|p| rounded(2 * p)),
        Category::MasterWeight if stage >= 1 => per_block(&|p| rounded(4 * own(p))),
        Category::MasterWeight => per_block(&|p| rounded(4 * p)),
        Category::OptimizerState if step == 0 && phase != Phase::Step => 0,
        Category::OptimizerState if stage >= 1 => 2 * per_block(&|p| rounded(4 * own(p))),
        Category::OptimizerState => 2 * per_block(&|p| rounded(4 * p)),
        _ => 0,
    }
}

#[test]
fn each_rank_holds_what_its_stage_shards_at_every_phase() {
    let ranks = 4;
    let mut runs: Vec<Vec<RankOutcome>> = Vec::new();
    for stage in 0..=3u8 {
        let mut c = zero(config(Optimizer::AdamW, 2, 1, ranks), stage);
        c.strategy.precision = Precision::Bf16Mixed;
        c.steps = 5;
        runs.push(run_ranks(&c, ranks));
    }
    for (stage, run) in runs.iter().enumerate() {
        for (rank, r) in run.iter().enumerate() {
            let phases = &r.report.phases;
            // Four steps of start, forward, backward, step.
            assert_eq!(phases.len(), 16, "ZeRO-{stage} rank {rank}");
            for (i, p) in phases.iter().enumerate() {
                let label = format!("ZeRO-{stage} rank {rank} step {} {:?}", p.step, p.phase);
                for category in [
                    Category::Parameter,
                    Category::Gradient,
                    Category::MasterWeight,
                    Category::OptimizerState,
                    Category::Communication,
                ] {
                    let want = expected_bytes(
                        &r.blocks,
                        ranks,
                        rank,
                        stage as u8,
                        category,
                        p.step,
                        p.phase,
                    );
                    assert_eq!(p.allocated[category] as usize, want, "{label} {category}");
                }
                // Activations do not depend on the stage: the same as DDP's at the same phase.
                let ddp = &runs[0][rank].report.phases[i];
                assert_eq!(
                    p.allocated[Category::Activation],
                    ddp.allocated[Category::Activation],
                    "{label}"
                );
                if p.phase == Phase::Forward {
                    assert!(p.allocated[Category::Activation] > 0, "{label}");
                }
            }
        }
    }
}

#[test]
fn the_dry_run_predicts_a_zero2_and_a_zero3_rank_exactly() {
    // LAMB's sums of cut weights are a few host floats: its prediction is exact too.
    for (optimizer, stage) in [
        (Optimizer::AdamW, 2),
        (Optimizer::AdamW, 3),
        (Optimizer::Lamb, 2),
        (Optimizer::Lamb, 3),
    ] {
        let mut c = zero(config(optimizer, 2, 1, 3), stage);
        c.steps = 3;
        let predicted = headroom_train::predict::predict(&c, &Corpus::bundled()).unwrap();
        let measured = run_ranks(&c, 3).remove(0).memory;
        assert_eq!(
            predicted.memory.peak_bytes_by_category, measured.peak_bytes_by_category,
            "{optimizer} ZeRO-{stage}"
        );
        assert_eq!(
            predicted.memory.peak_allocated_bytes, measured.peak_allocated_bytes,
            "{optimizer} ZeRO-{stage}"
        );
    }
}

#[test]
fn a_zero3_save_resumes_bitwise_at_4_ranks_and_whole_at_2_and_1() {
    use headroom_train::save;
    let dir = tempfile::tempdir().unwrap();
    let mut c = zero(config(Optimizer::AdamW, 2, 1, 4), 3);
    c.strategy.precision = Precision::Bf16Mixed;
    c.steps = 4;
    let mut saving = c.clone();
    saving.save_dir = Some(dir.path().join("runs"));
    saving.save_every = 2;
    let straight = run_saving(&saving, 4, None, None);
    let at2 = dir.path().join("runs/step-000002");
    assert!(run_saving(&c, 4, Some(&at2), None) == straight);
    // 2 ranks and 1 (no sharding at all): every rank takes its shards of the whole state; saved
    // again at once it is the same bytes, and back at 4 ranks it trains on bitwise.
    let (_, saved) = save::read(&at2).unwrap();
    for ranks in [2, 1] {
        let mut fewer = c.clone();
        fewer.data_parallel = ranks;
        fewer.steps = 2;
        let again = dir.path().join(format!("again-{ranks}"));
        run_saving(&fewer, ranks, Some(&at2), Some(&again));
        let (_, reloaded) = save::read(&again).unwrap();
        for group in ["model", "master", "optimizer"] {
            assert_eq!(reloaded[group], saved[group], "{group} at {ranks} ranks");
        }
        assert!(run_saving(&c, 4, Some(&again.join("step-000002")), None) == straight);
    }
}

/// The report's communication section: the theory is the ZeRO paper's volume for the model's
/// Ψ, derived here; the measured volume is what the counts give on a ring; and rank 0's table of
/// every rank's peaks, gathered after training, holds each rank's own measured peaks.
#[test]
fn the_report_sets_communication_against_theory_and_lists_every_ranks_peaks() {
    use headroom_comm::ThreadGroup;
    use headroom_memory::{AllocatorConfig, Device};
    use headroom_train::Trainer;
    let ranks = 3;
    for stage in [1u8, 3] {
        let c = zero(config(Optimizer::AdamW, 2, 1, ranks), stage);
        let corpus = Corpus::bundled();
        let results = ThreadGroup::run(ranks, std::time::Duration::from_secs(60), |comm| {
            let device = Device::cpu(c.device_memory, AllocatorConfig::default());
            let mut t = Trainer::on_rank(c.clone(), &corpus, device, Box::new(comm)).unwrap();
            t.train(&mut |_| {}).unwrap();
            let counts = t.collective_counts().unwrap();
            let table = t.gather_rank_peaks().unwrap().to_vec();
            (t.report().clone(), counts, table)
        });
        let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
        for (rank, (report, counts, table)) in results.iter().enumerate() {
            let label = format!("ZeRO-{stage} rank {rank}");
            let comm = report
                .communication
                .as_ref()
                .expect("a data-parallel report");
            let psi = report.parameters as f64;
            let passes = if stage == 3 { 3.0 } else { 2.0 };
            assert_eq!(
                comm.theory_elements_per_step,
                passes * psi * 2.0 / 3.0,
                "{label}"
            );
            assert_eq!(comm.steps, 20);
            assert_eq!(comm.counts.calls(), counts.calls(), "{label}");
            assert_eq!(
                comm.sent_elements_per_step,
                counts.ring_elements(ranks) / 20.0,
                "{label}"
            );
            assert_eq!(comm.sent_bytes_per_step, 4.0 * comm.sent_elements_per_step);
            assert!(
                comm.collective_s > 0.0 && comm.collective_fraction < 1.0,
                "{label}"
            );
            // Every rank's table lists every rank's own measurement, in rank order.
            assert_eq!(table.len(), ranks, "{label}");
            for (r, row) in table.iter().enumerate() {
                let own = &results[r].0.memory;
                assert_eq!(row.rank, r);
                assert_eq!(
                    row.peak_allocated_bytes, own.peak_allocated_bytes,
                    "{label}"
                );
                assert_eq!(row.peak_reserved_bytes, own.peak_reserved_bytes, "{label}");
                assert_eq!(row.collective_ns, results[r].1.busy_ns, "{label}");
            }
        }
    }
}
