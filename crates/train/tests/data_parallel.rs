//! Data parallelism (DDP over the in-process thread group): N ranks, each with its own device
//! and its share of every global batch, gradients summed over ranks in rank order, give losses
//! and weights bitwise equal to one process accumulating the same N micro-batches in
//! deterministic mode (each micro-batch's gradient summed whole, in order) — SGD-momentum at
//! N ∈ {2, 3, 4}, AdamW at N ∈ {1, 2, 3, 4, 8}, LAMB at N ∈ {2, 3} — and each rank
//! communicates what the method says; ZeRO-1 is bitwise DDP and holds only its shards; saves
//! resume; the planner's model of a rank agrees but for the framework buckets.

use crate::common;

use common::{config, outcome, run_ranks, run_saving, zero};
use headroom_comm::{Communicator, ThreadGroup};
use headroom_memory::{AllocatorConfig, Device};
use headroom_train::Trainer;
use headroom_train::config::RunConfig;
use headroom_train::data::Corpus;
use headroom_train::strategy::Optimizer;
use std::time::Duration;

#[test]
fn ddp_is_bitwise_the_single_process_run_accumulating_the_same_micro_batches() {
    let corpus = Corpus::bundled();
    for (optimizer, all_ranks) in [
        (Optimizer::SgdMomentum, &[2, 3, 4][..]),
        (Optimizer::AdamW, &[1, 2, 3, 4, 8][..]),
        (Optimizer::Lamb, &[2, 3][..]),
    ] {
        for &ranks in all_ranks {
            let mut single = Trainer::new(config(optimizer, 2, ranks, 1), &corpus).unwrap();
            single.train(&mut |_| {}).unwrap();
            let expected = outcome(&mut single);
            let params = single.model().num_params() as u64;
            let results = ThreadGroup::run(ranks, Duration::from_secs(60), |comm| {
                let c = config(optimizer, 2, 1, ranks);
                let device = Device::cpu(c.device_memory, AllocatorConfig::default());
                let mut t = Trainer::on_rank(c, &corpus, device, Box::new(comm)).unwrap();
                t.train(&mut |_| {}).unwrap();
                (outcome(&mut t), t.collective_counts().unwrap())
            });
            for (rank, r) in results.into_iter().enumerate() {
                let (got, counts) = r.unwrap();
                let label = format!("{optimizer}, {ranks} ranks, rank {rank}");
                assert_eq!(got.0, expected.0, "losses: {label}");
                assert!(got.1 == expected.1, "weights differ: {label}");
                // Per step: the gradients (Ψ elements, one all-reduce per block), one element
                // agreeing on whether to stop, and each rank's loss gathered.
                let blocks = single.model().blocks().len() as u64;
                assert_eq!(
                    counts.all_reduce,
                    (20 * (blocks + 1), 20 * (params + 1)),
                    "{label}"
                );
                assert_eq!(counts.all_gather, (20, 20), "{label}");
            }
        }
    }
}

#[test]
fn a_rank_that_fails_mid_run_ends_every_rank_with_an_error_naming_it() {
    let corpus = Corpus::bundled();
    let started = std::time::Instant::now();
    let results = ThreadGroup::run(3, Duration::from_secs(60), |mut comm| {
        let rank = comm.rank();
        if rank == 1 {
            // Rank 1 dies before its first step.
            comm.fail("out of host memory at step 0");
            return None;
        }
        let c = config(Optimizer::AdamW, 2, 1, 3);
        let device = Device::cpu(c.device_memory, AllocatorConfig::default());
        let mut t = Trainer::on_rank(c, &corpus, device, Box::new(comm)).unwrap();
        Some(t.train(&mut |_| {}).map(|_| ()).unwrap_err().to_string())
    });
    assert!(started.elapsed() < Duration::from_secs(10));
    for r in results.into_iter().flat_map(|r| r.unwrap()) {
        assert!(
            r.contains("rank 1 failed") && r.contains("out of host memory"),
            "{r}"
        );
    }
}

/// A rank that runs out of memory mid-step does not retry alone (the others would wait for it in
/// a collective): it fails, the others are released at once with its reason, and every rank's
/// error says what to do. The budget holds the model states but not the step's activations.
#[test]
fn out_of_memory_in_a_group_ends_every_rank_instead_of_retrying_alone() {
    let corpus = Corpus::bundled();
    let mut c = config(Optimizer::AdamW, 64, 1, 3);
    c.device_memory = 2 << 20;
    c.oom_recovery = true; // on, as in `headroom train`: the group must not use it
    let started = std::time::Instant::now();
    let results = ThreadGroup::run(3, Duration::from_secs(60), |comm| {
        let device = Device::cpu(c.device_memory, AllocatorConfig::default());
        let mut t = Trainer::on_rank(c.clone(), &corpus, device, Box::new(comm)).unwrap();
        let e = t.train(&mut |_| {}).map(|_| ()).unwrap_err();
        (e.to_string(), t.report().warnings.clone())
    });
    assert!(started.elapsed() < Duration::from_secs(10));
    let mut ran_out = 0;
    for r in results {
        let (e, warnings) = r.unwrap();
        assert!(
            warnings.iter().all(|w| !w.contains("retrying")),
            "{warnings:?}"
        );
        assert!(e.contains("out of memory"), "{e}");
        assert!(e.contains("cannot be retried on one rank"), "{e}");
        ran_out += usize::from(e.starts_with("rank "));
    }
    assert!(ran_out >= 1);
}

fn zero1(c: RunConfig) -> RunConfig {
    zero(c, 1)
}

#[test]
fn zero1_is_bitwise_ddp_and_holds_only_its_shard_of_the_optimizer_state() {
    use headroom_memory::Category;
    use headroom_train::strategy::Precision;
    for (optimizer, precision) in [
        (Optimizer::AdamW, Precision::Fp32),
        (Optimizer::SgdMomentum, Precision::Fp32),
        (Optimizer::AdamW, Precision::Bf16Mixed),
    ] {
        for ranks in [2, 3] {
            let mut ddp = config(optimizer, 2, 1, ranks);
            ddp.strategy.precision = precision;
            let expected = run_ranks(&ddp, ranks);
            let sharded = run_ranks(&zero1(ddp.clone()), ranks);
            for (rank, (got, want)) in sharded.iter().zip(&expected).enumerate() {
                let label = format!("{optimizer} {precision}, {ranks} ranks, rank {rank}");
                assert_eq!(got.bits.0, want.bits.0, "losses: {label}");
                assert!(got.bits.1 == want.bits.1, "weights differ: {label}");
                // Optimizer state: rank r's shard of every block, ⌈P_b / N⌉ elements (fewer
                // on the last rank), at 4 bytes per state (AdamW 2 states, SGD-momentum 1),
                // each buffer rounded up to the allocator's 512 bytes; DDP holds every element.
                let states = if optimizer == Optimizer::AdamW { 2 } else { 1 };
                let shard = |p: usize| {
                    let len = p.div_ceil(ranks);
                    (len * (rank + 1)).min(p) - (len * rank).min(p)
                };
                let bytes = |elements: usize| (4 * elements).div_ceil(512) * 512;
                let held: usize = got.blocks.iter().map(|&p| bytes(shard(p))).sum();
                let full: usize = got.blocks.iter().map(|&p| bytes(p)).sum();
                let state = |m: &headroom_memory::MemoryPeaks| {
                    m.peak_bytes_by_category[Category::OptimizerState] as usize
                };
                assert_eq!(state(&got.memory), states * held, "{label}");
                assert_eq!(state(&want.memory), states * full, "{label}");
                // Master weights (bf16-mixed) shard the same way.
                let master = got.memory.peak_bytes_by_category[Category::MasterWeight] as usize;
                let expected_master = if precision == Precision::Bf16Mixed {
                    held
                } else {
                    0
                };
                assert_eq!(master, expected_master, "{label}");
                // Communication buffers come from the allocator, one collective at a time:
                // DDP's all-reduce bucket of the largest block; ZeRO-1's reduce-scatter of the
                // widest padded block, N shards in and one out (both live), its gather of N
                // shards being smaller.
                let comm = |m: &headroom_memory::MemoryPeaks| {
                    m.peak_bytes_by_category[Category::Communication] as usize
                };
                let largest = got.blocks.iter().copied().max().unwrap();
                let widest = got.blocks.iter().map(|&p| p.div_ceil(ranks)).max().unwrap();
                assert_eq!(comm(&want.memory), bytes(largest), "{label}");
                assert_eq!(
                    comm(&got.memory),
                    bytes(widest * ranks) + bytes(widest),
                    "{label}"
                );
                // Per step, against DDP's all-reduce of every block (Ψ elements): one
                // reduce-scatter of every block's N padded shards in, one all-gather of every
                // block's padded shard; the bookkeeping all-reduce (1 element, the stop vote)
                // stays.
                let blocks = got.blocks.len() as u64;
                let psi: u64 = got.blocks.iter().map(|&p| p as u64).sum();
                let padded: u64 = got.blocks.iter().map(|&p| p.div_ceil(ranks) as u64).sum();
                let n = ranks as u64;
                assert_eq!(want.counts.all_reduce, (20 * (blocks + 1), 20 * (psi + 1)));
                assert_eq!(got.counts.all_reduce, (20, 20), "{label}");
                assert_eq!(
                    got.counts.reduce_scatter,
                    (20 * blocks, 20 * n * padded),
                    "{label}"
                );
                // The gradient norm's partial sums (3 elements) are gathered too.
                assert_eq!(
                    got.counts.all_gather.1,
                    want.counts.all_gather.1 + 20 * (padded + 3),
                    "{label}"
                );
            }
        }
    }
}

#[test]
fn the_dry_run_predicts_a_zero1_rank_exactly() {
    let c = zero1(config(Optimizer::AdamW, 2, 1, 3));
    let predicted = headroom_train::predict::predict(&c, &Corpus::bundled()).unwrap();
    let measured = run_ranks(&c, 3).remove(0).memory;
    assert_eq!(
        predicted.memory.peak_bytes_by_category,
        measured.peak_bytes_by_category
    );
    assert_eq!(
        predicted.memory.peak_allocated_bytes,
        measured.peak_allocated_bytes
    );
}

#[test]
fn a_zero1_save_resumes_bitwise_at_the_same_ranks_and_whole_at_fewer() {
    use headroom_train::save;
    use headroom_train::strategy::Precision;
    let dir = tempfile::tempdir().unwrap();
    let mut c = zero1(config(Optimizer::AdamW, 2, 1, 3));
    c.strategy.precision = Precision::Bf16Mixed;
    c.steps = 6;
    // Saves at steps 3 and 6; the run to 6 is the reference.
    let mut saving = c.clone();
    saving.save_dir = Some(dir.path().join("runs"));
    saving.save_every = 3;
    let straight = run_saving(&saving, 3, None, None);
    let at3 = dir.path().join("runs/step-000003");
    // Same ranks: resumed at step 3, trained to 6, bitwise the uninterrupted run.
    assert!(run_saving(&c, 3, Some(&at3), None) == straight);
    // Fewer ranks (2, and 1): the whole model, master weights and optimizer state load, each
    // rank taking its shards; saved again at once they are the same bytes.
    let (_, saved) = save::read(&at3).unwrap();
    for ranks in [2, 1] {
        let mut fewer = c.clone();
        fewer.data_parallel = ranks;
        fewer.steps = 3;
        let again = dir.path().join(format!("again-{ranks}"));
        run_saving(&fewer, ranks, Some(&at3), Some(&again));
        let (_, reloaded) = save::read(&again).unwrap();
        for group in ["model", "master", "optimizer"] {
            assert_eq!(reloaded[group], saved[group], "{group} at {ranks} ranks");
        }
    }
}

#[test]
fn auto_shards_only_as_far_as_the_budget_needs() {
    use headroom_train::strategy::{Attention, Checkpoint, Pins, Precision};
    let corpus = Corpus::bundled();
    // gpt-medium on short sequences, one per micro-batch: the model states dominate a rank's
    // memory, so each stage's sharding shows. (On gpt-small at 128 tokens ZeRO-3's gathered
    // blocks outweigh its parameter shard: the reserved peak is ZeRO-2's or higher.)
    let mut base = config(Optimizer::AdamW, 1, 1, 4);
    base.model = "gpt-medium".into();
    base.seq_len = Some(32);
    base.steps = 2;
    let peak = |zero: u8| {
        let mut c = base.clone();
        c.strategy.placement.zero_stage = headroom_train::strategy::ZeroStage::new(zero).unwrap();
        headroom_train::predict::predict(&c, &corpus)
            .unwrap()
            .memory
            .peak_reserved_bytes
    };
    // Each stage shards one more model state: a rank's peak falls stage by stage.
    let peaks: Vec<u64> = (0..=3).map(peak).collect();
    assert!(peaks.windows(2).all(|w| w[1] < w[0]), "{peaks:?}");
    // Everything pinned but the ZeRO stage (the host tier and the allocator too).
    let pins = Pins {
        precision: Some(Precision::Fp32),
        optimizer: Some(Optimizer::AdamW),
        checkpoint: Some(Checkpoint::None),
        attention: Some(Attention::Naive),
        micro_batch: Some(1),
        accumulation: Some(1),
        offload_optimizer: Some(headroom_train::strategy::Offload::None),
        offload_activations: Some(headroom_train::strategy::Offload::None),
        allocator: Some(headroom_memory::AllocatorKind::Caching),
        ..Pins::default()
    };
    let choose = |budget: u64| {
        let c = RunConfig {
            device_memory: budget,
            ..base.clone()
        };
        let found = headroom_train::auto::plan(&c, &corpus, &pins).unwrap();
        found
            .recommended()
            .map(|p| p.strategy.placement.zero_stage.number())
    };
    // Room for replication: DDP (the configured placement), or ZeRO-1, which sends as much (2Ψ)
    // and updates a quarter of the parameters, so the speed model may find it faster; never a
    // stage that shards more than it needs to go faster.
    let roomy = choose(peaks[0]);
    assert!(matches!(roomy, Some(0 | 1)), "{roomy:?}");
    // Room only from stage k on: a stage that fits, never a lower one (they do not).
    for k in 1..=3u8 {
        let chosen = choose(peaks[k as usize]).expect("stage k fits");
        assert!(chosen >= k, "budget of ZeRO-{k}: chose ZeRO-{chosen}");
    }
    // Not even ZeRO-3: nothing fits.
    assert_eq!(choose(peaks[3] - 1), None);
}

#[test]
fn the_planners_zero_model_matches_a_rank_but_for_the_framework_buckets() {
    // The planner's analytical model of the same runs (headroom's GPT mapped to its GPT-2
    // family, one node of N devices). It is a different model of the same thing: it charges
    // the communication buckets of the frameworks it plans for (PyTorch DDP's two 25 MiB
    // buckets; DeepSpeed's reduce and all-gather buckets of min(2e8, Ψ) elements), where the
    // engine reduces one block at a time after backward, so no bucket is live at its peak.
    // Everything else is within 10 % per rank at every stage, and the model states agree
    // category by category up to the engine's working set.
    use headroom_memory::Category;
    for ranks in [2usize, 4] {
        for zero in [0u8, 1, 2, 3] {
            let mut c = config(Optimizer::AdamW, 4, 1, ranks);
            c.model = "gpt-small".into();
            c.seq_len = Some(128);
            c.steps = 2; // the optimizer state exists from the first step: the peak is reached
            c.strategy.placement.zero_stage =
                headroom_train::strategy::ZeroStage::new(zero).unwrap();
            let a = headroom_train::predict::analytical::analytical_memory(&c).unwrap();
            let mut planned = a.memory.breakdown.at_peak;
            planned[Category::Other] = 0; // the fragmentation reserve: no allocation
            planned[Category::Communication] = 0;
            let run = run_ranks(&c, ranks).remove(0);
            let measured = run.memory;
            let label = format!("{ranks} ranks, ZeRO-{zero}");
            let error = planned.total() as f64 / measured.peak_allocated_bytes as f64 - 1.0;
            eprintln!("{label}: {:+.1} %", 100.0 * error);
            assert!(error.abs() < 0.10, "{label}: {:+.1} %", 100.0 * error);
            // The model states agree to the shard (up to the allocator's 512-byte rounding),
            // but for the engine's working set at its peak, 4 bytes an element: under ZeRO-2/3
            // the full gradient of the block in backward (before its reduce-scatter) and of
            // the tied embedding (block 0, read again by the output head, so reduced last);
            // under ZeRO-3 also the gathered parameters of the block computing, the one
            // prefetched and the embedding. The planner charges them as DeepSpeed's buckets.
            let largest = 4 * run.blocks.iter().copied().max().unwrap() as u64;
            let embedding = 4 * run.blocks[0] as u64;
            for (cat, working) in [
                (
                    Category::Parameter,
                    if zero >= 3 {
                        2 * largest + embedding
                    } else {
                        0
                    },
                ),
                (
                    Category::Gradient,
                    if zero >= 2 { largest + embedding } else { 0 },
                ),
                (Category::OptimizerState, 0),
            ] {
                let (p, m) = (planned[cat], measured.breakdown.at_peak[cat]);
                assert!(
                    m + 512 * 64 >= p && m <= p + working + 512 * 64,
                    "{label} {cat}: planned {p}, measured {m} (working set up to {working})"
                );
            }
        }
    }
}

#[test]
fn a_process_rank_of_another_jobs_size_is_refused_before_training() {
    use headroom_train::launch::{LaunchError, LaunchOptions, launch};
    use headroom_train::prepare::{PrepareOptions, prepare};
    let corpus = headroom_train::data::Corpus::bundled();
    let c = config(Optimizer::AdamW, 2, 1, 2);
    let prepared = prepare(
        c,
        &corpus,
        &headroom_train::strategy::Pins::default(),
        PrepareOptions::default(),
    )
    .unwrap();
    let options = LaunchOptions {
        process_rank: Some(Box::new(headroom_comm::ShapeOnlyRank::new(0, 3))),
        ..LaunchOptions::default()
    };
    let e = launch(&prepared, std::sync::Arc::new(corpus), options).unwrap_err();
    assert!(
        matches!(
            e,
            LaunchError::JobSize {
                job: 3,
                prepared: 2
            }
        ),
        "{e}"
    );
}
