//! `--auto`: the search returns the best plan an exhaustive dry-run search finds, keeps pinned
//! levers and the effective batch, and the plan it recommends really runs inside the budget.

use headroom_memory::{AllocatorConfig, Device};
use headroom_plan::strategy::{Attention, Precision};
use headroom_train::auto::{Candidate, OwnPlan, Pins, SpeedModel, evaluate, plan};
use headroom_train::config::{OptimizerChoice, RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::policy::{CheckpointPolicy, recompute_for};
use headroom_train::{TrainEvent, Trainer, model_spec};

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

/// Every strategy of the engine for `c`'s effective batch, dry-run one by one.
fn exhaustive(c: &RunConfig, corpus: &Corpus, speed: &SpeedModel) -> Vec<OwnPlan> {
    let effective = c.effective_batch();
    let mut out = Vec::new();
    for precision in [Precision::Fp32, Precision::Bf16Mixed, Precision::Bf16] {
        for optimizer in [OptimizerChoice::Adamw, OptimizerChoice::AdamwBf16] {
            for checkpoint in [
                CheckpointPolicy::None,
                CheckpointPolicy::Selective,
                CheckpointPolicy::EveryNth(1),
            ] {
                for attention in [Attention::Naive, Attention::MemoryEfficient] {
                    for m in (1..=effective).filter(|m| effective.is_multiple_of(*m)) {
                        let cand = Candidate {
                            precision,
                            optimizer,
                            checkpoint,
                            attention,
                            micro_batch: m,
                            accumulation: effective / m,
                        };
                        out.push(evaluate(c, corpus, &cand, speed).unwrap());
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
    // gpt-tiny (2 blocks): checkpoint policies none, selective and all are the whole space.
    for budget in ["2MiB", "3MiB", "6MiB", "64MiB"] {
        let c = config("gpt-tiny", budget);
        let found = plan(&c, &corpus, &Pins::default()).unwrap();
        for p in found.fitting.iter().chain(&found.rejected) {
            assert_eq!(
                p.strategy.micro_batch * p.strategy.accumulation,
                8,
                "{budget}"
            );
            // Within the budget unlimited means within it under the budget too.
            if p.memory.per_device_peak_bytes <= c.device_memory {
                assert!(p.fits, "{budget}: {:?}", p.strategy);
            }
        }
        let all = exhaustive(&c, &corpus, &found.speed);
        // The reference rule, applied to every strategy: the lowest fidelity tier; within it,
        // every plan predicted within 5 % of the fastest is as fast, and among those the fewest
        // levers changed from the configuration (fp32, adamw, none, naive, 8 × 1) wins, then the
        // faster, the lower peak, the larger micro-batch.
        let fitting: Vec<&OwnPlan> = all.iter().filter(|p| p.fits).collect();
        let tier = fitting.iter().map(|p| p.fidelity_tier).min();
        let fastest = fitting
            .iter()
            .filter(|p| Some(p.fidelity_tier) == tier)
            .map(|p| p.time.step_s)
            .fold(f64::INFINITY, f64::min);
        let changes = |s: &Candidate| {
            usize::from(s.precision != Precision::Fp32)
                + usize::from(s.optimizer != OptimizerChoice::Adamw)
                + usize::from(s.checkpoint != CheckpointPolicy::None)
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
            (Some(r), Some(b)) => assert_eq!(r.strategy, b.strategy, "{budget}"),
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
fn pinned_levers_are_kept() {
    let corpus = Corpus::bundled();
    // As `headroom train --accumulation 4` configures it: micro-batch 8 × accumulation 4.
    let c = RunConfig {
        accumulation: 4,
        ..config("resmlp", "16MiB")
    };
    let pins = Pins {
        precision: Some(Precision::Bf16Mixed),
        checkpoint: Some(CheckpointPolicy::Sqrt),
        accumulation: Some(4),
        ..Default::default()
    };
    let found = plan(&c, &corpus, &pins).unwrap();
    assert!(found.evaluated() > 0);
    for p in found.fitting.iter().chain(&found.rejected) {
        assert_eq!(p.strategy.precision, Precision::Bf16Mixed);
        assert_eq!(p.strategy.checkpoint, CheckpointPolicy::Sqrt);
        assert_eq!(p.strategy.accumulation, 4);
        // The effective batch is kept: 32 / 4.
        assert_eq!(p.strategy.micro_batch, 8);
    }
}

#[test]
fn the_recommended_plan_runs_inside_the_budget_where_the_configured_one_does_not() {
    let corpus = Corpus::bundled();
    let c = config("gpt-tiny", "3MiB");
    let configured = Candidate::of(&c);
    let found = plan(&c, &corpus, &Pins::default()).unwrap();
    let best = found.recommended().expect("a plan fits 3 MiB").strategy;
    assert_ne!(best, configured, "the configured run is meant not to fit");
    let mut recovered = 0;
    let run = |cand: &Candidate, recovered: &mut usize| {
        let rc = cand.apply(&c);
        let spec = model_spec(&rc).unwrap();
        let dtype = headroom_train::trainer::PrecisionPlan::of(cand.precision).compute;
        let (recompute, _) =
            recompute_for(cand.checkpoint, &spec, dtype, cand.micro_batch, 32).unwrap();
        let device = Device::cpu(rc.device_memory, AllocatorConfig::default());
        let mut t = Trainer::on_device(rc, &corpus, device).unwrap();
        t.set_recompute(recompute);
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
