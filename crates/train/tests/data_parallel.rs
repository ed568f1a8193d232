//! Data parallelism (DDP over the in-process thread group): N ranks, each with its own device
//! and its share of every global batch, gradients summed over ranks in rank order, give losses
//! and weights bitwise equal to one process accumulating the same N micro-batches in
//! deterministic mode (each micro-batch's gradient summed whole, in order) — for SGD-momentum
//! and AdamW, N ∈ {2, 3, 4} — and each rank communicates what the method says.

use headroom_dist::{Communicator, ThreadGroup};
use headroom_train::Trainer;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::strategy::Optimizer;
use std::time::Duration;

fn config(optimizer: Optimizer, micro: usize, accumulation: usize, ranks: usize) -> RunConfig {
    TrainConfig {
        deterministic: Some(true),
        model: Some("gpt-tiny".into()),
        seq_len: Some(32),
        dropout: Some(0.0),
        optimizer: Some(optimizer),
        micro_batch: Some(micro),
        accumulation: Some(accumulation),
        data_parallel: Some(ranks),
        steps: Some(20),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some("256MiB".parse().unwrap()),
        seed: Some(11),
        ..Default::default()
    }
    .resolve()
    .unwrap()
}

/// Losses and every weight of a finished run, as bits.
fn outcome(t: &Trainer) -> (Vec<u64>, Vec<u32>) {
    let losses = t.report().losses.iter().map(|l| l.to_bits()).collect();
    let weights = t
        .model()
        .blocks()
        .iter()
        .flat_map(|b| b.flat().to_vec_f32().unwrap())
        .map(f32::to_bits)
        .collect();
    (losses, weights)
}

#[test]
fn ddp_is_bitwise_the_single_process_run_accumulating_the_same_micro_batches() {
    let corpus = Corpus::bundled();
    for optimizer in [Optimizer::SgdMomentum, Optimizer::AdamW] {
        for ranks in [2, 3, 4] {
            let mut single = Trainer::new(config(optimizer, 2, ranks, 1), &corpus).unwrap();
            single.train(&mut |_| {}).unwrap();
            let expected = outcome(&single);
            let params = single.model().num_params() as u64;
            let results = ThreadGroup::run(ranks, Duration::from_secs(60), |comm| {
                let mut t = Trainer::new(config(optimizer, 2, 1, ranks), &corpus).unwrap();
                t.set_communicator(Box::new(comm));
                t.train(&mut |_| {}).unwrap();
                (outcome(&t), t.collective_counts().unwrap())
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
        let mut t = Trainer::new(config(Optimizer::AdamW, 2, 1, 3), &corpus).unwrap();
        t.set_communicator(Box::new(comm));
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
