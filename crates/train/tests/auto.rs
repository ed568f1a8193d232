//! `--auto`: the search returns the best plan an exhaustive dry-run search finds, keeps pinned
//! levers and the effective batch, and the plan it recommends really runs inside the budget.

use headroom_memory::{AllocatorKind, Device};
use headroom_plan::cost::Plan;
use headroom_train::auto::{SpeedModel, evaluate, plan};
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::strategy::{
    Attention, Checkpoint, Loss, Offload, Optimizer, Pins, Precision, Strategy,
};
use headroom_train::{TrainEvent, Trainer};

fn config(model: &str, budget: &str) -> RunConfig {
    TrainConfig {
        model: Some(model.into()),
        seq_len: Some(32),
        micro_batch: Some(8),
        accumulation: Some(1),
        steps: Some(3),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some(budget.parse().unwrap()),
        seed: Some(5),
        ..Default::default()
    }
    .resolve()
    .unwrap()
}

/// Every strategy of the engine for `c`'s effective batch, dry-run one by one: on gpt-tiny
/// (2 blocks) checkpoint none, selective and all with both attention kinds; on the 16-block
/// residual MLP none, every:4, every:2, sqrt and all.
fn exhaustive(c: &RunConfig, corpus: &Corpus, speed: &SpeedModel) -> Vec<Plan> {
    let effective = c.effective_batch();
    let (checkpoints, attentions): (Vec<Checkpoint>, Vec<Attention>) = if c.model == "resmlp" {
        (
            vec![
                Checkpoint::None,
                Checkpoint::EveryNth(4),
                Checkpoint::EveryNth(2),
                Checkpoint::Sqrt,
                Checkpoint::EveryNth(1),
            ],
            vec![Attention::Naive],
        )
    } else {
        (
            vec![
                Checkpoint::None,
                Checkpoint::Selective,
                Checkpoint::EveryNth(1),
            ],
            vec![Attention::Naive, Attention::MemoryEfficient],
        )
    };
    let mut out = Vec::new();
    for precision in [Precision::Fp32, Precision::Bf16Mixed, Precision::Bf16] {
        for optimizer in [
            Optimizer::AdamW,
            Optimizer::AdamWBf16,
            Optimizer::AdamW8bit,
            Optimizer::PagedAdamW8bit,
            Optimizer::Adafactor,
        ] {
            for &checkpoint in &checkpoints {
                for &attention in &attentions {
                    for m in (1..=effective).filter(|m| effective.is_multiple_of(*m)) {
                        let cand = Strategy {
                            precision,
                            optimizer,
                            checkpoint,
                            attention,
                            micro_batch: m as u64,
                            accumulation: (effective / m) as u64,
                            ..Strategy::default()
                        };
                        out.push(evaluate(c, corpus, &cand, speed).unwrap().0);
                    }
                }
            }
        }
    }
    out
}

#[test]
fn the_search_finds_the_exhaustive_optimum_and_keeps_the_effective_batch() {
    let corpus = Corpus::bundled();
    let cases = [
        ("gpt-tiny", "2MiB"),
        ("gpt-tiny", "3MiB"),
        ("gpt-tiny", "6MiB"),
        ("gpt-tiny", "64MiB"),
        ("resmlp", "20MiB"),
        ("resmlp", "30MiB"),
    ];
    // The loss and the step's place are pinned to the configuration's (their own tests hold
    // them), so the exhaustive reference stays small enough to run every strategy.
    let pins = Pins {
        loss: Some(Loss::Plain),
        optimizer_in_backward: Some(false),
        offload_optimizer: Some(Offload::None),
        offload_activations: Some(Offload::None),
        allocator: Some(AllocatorKind::Caching),
        ..Pins::default()
    };
    for (model, budget) in cases {
        let c = config(model, budget);
        let found = plan(&c, &corpus, &pins).unwrap();
        for p in found.search.fitting.iter().chain(&found.search.rejected) {
            assert_eq!(
                p.strategy.micro_batch * p.strategy.accumulation,
                8,
                "{budget}"
            );
            // A plan that fits reports the peak it reaches under the budget; one whose peak
            // with no limit is within the budget fits.
            if p.fits {
                assert!(
                    p.memory.per_device_peak_bytes <= c.device_memory,
                    "{budget}"
                );
            }
            if p.memory.per_device_peak_bytes <= c.device_memory {
                assert!(p.fits, "{budget}: {:?}", p.strategy);
            }
        }
        let all = exhaustive(&c, &corpus, &found.speed);
        for p in all.iter().filter(|p| p.fits) {
            assert!(
                p.memory.per_device_peak_bytes <= c.device_memory,
                "{budget}"
            );
        }
        // The reference rule, applied to every strategy: the lowest fidelity tier; within it,
        // every plan predicted within 5 % of the fastest is as fast, and among those the fewest
        // levers changed from the configuration (fp32, adamw, none, naive, 8 × 1) wins, then the
        // faster, the lower peak, the larger micro-batch.
        let fitting: Vec<&Plan> = all.iter().filter(|p| p.fits).collect();
        let tier = fitting.iter().map(|p| p.fidelity_tier).min();
        let fastest = fitting
            .iter()
            .filter(|p| Some(p.fidelity_tier) == tier)
            .map(|p| p.time.step_s)
            .fold(f64::INFINITY, f64::min);
        let changes = |s: &Strategy| {
            usize::from(s.precision != Precision::Fp32)
                + usize::from(s.optimizer != Optimizer::AdamW)
                + usize::from(s.checkpoint != Checkpoint::None)
                + usize::from(s.attention != Attention::Naive)
                + usize::from(s.micro_batch != 8)
        };
        let best = fitting
            .into_iter()
            .filter(|p| Some(p.fidelity_tier) == tier && p.time.step_s <= fastest * 1.05)
            .min_by(|a, b| {
                changes(&a.strategy)
                    .cmp(&changes(&b.strategy))
                    .then(a.time.step_s.total_cmp(&b.time.step_s))
                    .then(
                        a.memory
                            .per_device_peak_bytes
                            .cmp(&b.memory.per_device_peak_bytes),
                    )
                    .then(b.strategy.micro_batch.cmp(&a.strategy.micro_batch))
            });
        match (found.recommended(), best) {
            (Some(r), Some(b)) => assert_eq!(r.strategy, b.strategy, "{model} {budget}"),
            (None, None) => {}
            (r, b) => panic!(
                "{budget}: search {:?} vs exhaustive {:?}",
                r.map(|p| p.strategy),
                b.map(|p| p.strategy)
            ),
        }
        assert!(
            found.evaluated() < all.len(),
            "{budget}: the search should prune ({} of {})",
            found.evaluated(),
            all.len()
        );
    }
}

#[test]
fn a_plan_that_fits_only_without_the_caching_pools_runs_on_the_planned_arena() {
    let corpus = Corpus::bundled();
    // Every strategy lever pinned: one plan, and a budget of exactly its live peak, which the
    // caching pools (cached and split blocks on top) cannot keep to.
    let mut c = config("gpt-tiny", "64MiB").with_split(4, 2);
    let pins = Pins {
        precision: Some(Precision::Fp32),
        optimizer: Some(Optimizer::AdamW),
        checkpoint: Some(Checkpoint::None),
        attention: Some(Attention::Naive),
        loss: Some(Loss::Plain),
        optimizer_in_backward: Some(false),
        zero_stage: Some(Default::default()),
        offload_optimizer: Some(Offload::None),
        offload_params: Some(Offload::None),
        offload_activations: Some(Offload::None),
        micro_batch: Some(4),
        accumulation: Some(2),
        ..Pins::default()
    };
    let live = headroom_train::predict::predict(&c, &corpus)
        .unwrap()
        .memory
        .peak_allocated_bytes;
    c.device_memory = live;
    let caching_only = Pins {
        allocator: Some(AllocatorKind::Caching),
        ..pins
    };
    let on_caching = plan(&c, &corpus, &caching_only).unwrap();
    assert!(
        on_caching.recommended().is_none(),
        "the pools fit the live peak"
    );
    assert_eq!(on_caching.allocator, AllocatorKind::Caching);
    let found = plan(&c, &corpus, &pins).unwrap();
    let best = found.recommended().expect("the arena fits the live peak");
    assert_eq!(found.allocator, AllocatorKind::Planned);
    assert!(best.memory.per_device_peak_bytes <= live);
    assert!(found.reason(live).contains("--allocator planned"));
    // The plan runs on a real device of that size without running out of memory.
    let mut run = c.with_strategy(best.strategy);
    run.allocator = found.allocator;
    let device = Device::cpu(live, run.allocator.config());
    // Prepared as `headroom train` prepares it: with the arena layout the trainer serves.
    let prepared = headroom_train::prepare::prepare(
        run,
        &corpus,
        &Pins::default(),
        headroom_train::prepare::PrepareOptions::default(),
    )
    .unwrap();
    let mut t = Trainer::prepared(&prepared, &corpus, device, None).unwrap();
    let mut recovered = 0;
    t.train(&mut |e| {
        if let TrainEvent::OomRecovered { .. } = e {
            recovered += 1;
        }
    })
    .unwrap();
    assert_eq!(recovered, 0);
    assert!(t.device().stats().reserved_bytes.all.peak as u64 <= live);
}

#[test]
fn pinned_levers_are_kept() {
    let corpus = Corpus::bundled();
    // As `headroom train --accumulation 4` configures it: micro-batch 8 × accumulation 4.
    let c = config("resmlp", "16MiB").with_split(8, 4);
    let pins = Pins {
        precision: Some(Precision::Bf16Mixed),
        checkpoint: Some(Checkpoint::Sqrt),
        accumulation: Some(4),
        ..Default::default()
    };
    let found = plan(&c, &corpus, &pins).unwrap();
    assert!(found.evaluated() > 0);
    for p in found.search.fitting.iter().chain(&found.search.rejected) {
        assert_eq!(p.strategy.precision, Precision::Bf16Mixed);
        assert_eq!(p.strategy.checkpoint, Checkpoint::Sqrt);
        assert_eq!(p.strategy.accumulation, 4);
        // The effective batch is kept: 32 / 4.
        assert_eq!(p.strategy.micro_batch, 8);
    }
}

#[test]
fn the_recommended_plan_runs_inside_the_budget_where_the_configured_one_does_not() {
    let corpus = Corpus::bundled();
    let c = config("gpt-tiny", "3MiB");
    let configured = c.strategy;
    // On the caching allocator, which the configured run uses (the planned arena may fit the
    // configured strategy itself: that case has its own test).
    let pins = Pins {
        allocator: Some(AllocatorKind::Caching),
        ..Pins::default()
    };
    let found = plan(&c, &corpus, &pins).unwrap();
    let best = found.recommended().expect("a plan fits 3 MiB").strategy;
    assert_ne!(best, configured, "the configured run is meant not to fit");
    let mut recovered = 0;
    let run = |cand: &Strategy, recovered: &mut usize| {
        let mut rc = c.with_strategy(*cand);
        rc.allocator = found.allocator;
        let device = Device::cpu(rc.device_memory, rc.allocator.config());
        // The trainer plans the recomputation of the strategy's checkpoint policy itself.
        let mut t = Trainer::on_device(rc, &corpus, device).unwrap();
        let r = t.train(&mut |e| {
            if let TrainEvent::OomRecovered { .. } = e {
                *recovered += 1;
            }
        });
        (r.cloned(), t.device().stats())
    };
    let (report, stats) = run(&best, &mut recovered);
    let report = report.expect("the recommended plan trains");
    assert_eq!(recovered, 0, "no out-of-memory recovery was needed");
    assert!(stats.reserved_bytes.all.peak as u64 <= c.device_memory);
    assert_eq!(report.losses.len(), 3);
    // The configured strategy, run as is, does need the recovery (or fails).
    let mut recovered_configured = 0;
    let (configured_run, _) = run(&configured, &mut recovered_configured);
    assert!(configured_run.is_err() || recovered_configured > 0);
}

#[test]
fn a_dry_run_counts_the_work_of_a_step() {
    // The residual MLP (no attention): per token, forward 2 FLOPs per matmul weight (16 blocks
    // of fc1 128×512 and fc2 512×128, the 128×256 head; the embedding is a lookup), backward
    // twice that (input and weight gradients), so 6·W per token; `all` re-runs each block's
    // forward once more: 2·16·2·128·512 per token.
    let corpus = Corpus::bundled();
    let c = config("resmlp", "256MiB").with_split(2, 1);
    let tokens = 2.0 * 32.0;
    let weights = 16.0 * 2.0 * 128.0 * 512.0 + 128.0 * 256.0;
    let speed = SpeedModel {
        matmul_flops_per_s: headroom_train::auto::speed::Rates {
            f32: 1e9,
            bf16: 1e9,
            f16: 1e9,
        },
        attention_flops_per_s: 1e9,
        elementwise_bytes_per_s: headroom_train::auto::speed::Rates {
            f32: 1e9,
            bf16: 1e9,
            f16: 1e9,
        },
        kernel_overhead_s: 0.0,
        collective_elements_per_s: 0.0,
        collective_overhead_s: 0.0,
        optimizer_params_per_s: headroom_train::auto::speed::UpdateRates {
            f32: f64::INFINITY,
            bf16: f64::INFINITY,
            int8: f64::INFINITY,
            adafactor: f64::INFINITY,
        },
        host_copy_bytes_per_s: 1e9,
    };
    // Accumulating 4 micro-batches of 2 (the dry run runs 2 of them and extrapolates the rest)
    // does 4 times the work of one.
    for accumulation in [1, 4] {
        let c = c.with_split(2, accumulation);
        let tokens = tokens * accumulation as f64;
        for (policy, recompute) in [
            (Checkpoint::None, 0.0),
            (
                Checkpoint::ALL_BLOCKS,
                2.0 * 16.0 * 2.0 * 128.0 * 512.0 * tokens,
            ),
        ] {
            let cand = Strategy {
                checkpoint: policy,
                ..c.strategy
            };
            let t = evaluate(&c, &corpus, &cand, &speed).unwrap().0.time;
            let label = format!("{policy} × {accumulation}");
            assert_eq!(t.model_flops, 6.0 * weights * tokens, "{label}");
            assert_eq!(t.recompute_flops, recompute, "{label}");
        }
    }
}

#[test]
fn plans_that_fit_by_reclaiming_report_the_peak_under_the_budget() {
    // At 48 MiB several gpt-small plans fit only because the allocator frees its cache when
    // the budget is reached: their reported peak must be the one under the budget.
    let corpus = Corpus::bundled();
    let c = TrainConfig {
        model: Some("gpt-small".into()),
        steps: Some(3),
        device_memory: Some("48MiB".parse().unwrap()),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    let found = plan(&c, &corpus, &Pins::default()).unwrap();
    assert!(!found.search.fitting.is_empty());
    for p in &found.search.fitting {
        assert!(
            p.memory.per_device_peak_bytes <= c.device_memory,
            "{}: {}",
            p.strategy.describe(true),
            p.memory.per_device_peak_bytes
        );
    }
}
