//! Predicted equals measured: over a matrix of configurations of the GPT and the residual MLP
//! (precision × micro-batch × accumulation × checkpoint policy × attention), the dry run's peak
//! equals the real run's within 1 %, and each category's peak within 1 % or 64 KiB.

use headroom_memory::Category;
use headroom_train::Trainer;
use headroom_train::config::TrainConfig;
use headroom_train::data::Corpus;
use headroom_train::policy::recompute_for;
use headroom_train::predict::predict;

fn matrix() -> Vec<TrainConfig> {
    let mut out = Vec::new();
    let precisions = ["fp32", "bf16-mixed", "fp16-mixed", "bf16"];
    let mut i = 0usize;
    for model in ["gpt-tiny", "resmlp"] {
        for precision in precisions {
            for (micro, accumulation) in [(2, 1), (4, 2)] {
                for checkpoint in ["none", "all", "sqrt"] {
                    i += 1;
                    // Two of every three combinations (32 of 48) keep the test short; the
                    // attention kind alternates on the GPT.
                    if i.is_multiple_of(3) {
                        continue;
                    }
                    let attention = if model == "gpt-tiny" && i % 4 < 2 {
                        "memory-efficient"
                    } else {
                        "naive"
                    };
                    out.push(TrainConfig {
                        model: Some(model.into()),
                        precision: Some(precision.into()),
                        micro_batch: Some(micro),
                        accumulation: Some(accumulation),
                        checkpoint: Some(checkpoint.into()),
                        attention: Some(attention.into()),
                        seq_len: Some(32),
                        steps: Some(3),
                        eval_every: Some(0),
                        eval_batches: Some(1),
                        device_memory: Some("256MiB".parse().unwrap()),
                        seed: Some(3),
                        ..Default::default()
                    });
                }
            }
        }
    }
    out
}

#[test]
fn dry_run_peaks_equal_measured_peaks_across_the_matrix() {
    let configs = matrix();
    assert!(configs.len() >= 30, "{} configurations", configs.len());
    let corpus = Corpus::bundled();
    let mut checked = 0;
    for c in configs {
        let label = format!(
            "{:?}",
            (
                &c.model,
                &c.precision,
                c.micro_batch,
                c.accumulation,
                &c.checkpoint,
                &c.attention
            )
        );
        let run = c.resolve().unwrap();
        let mut t = Trainer::new(run.clone(), &corpus).unwrap();
        let (recompute, _) = recompute_for(
            run.checkpoint_policy(),
            t.model_spec(),
            t.precision().compute,
            run.micro_batch,
            t.seq_len(),
        )
        .unwrap();
        let predicted = predict(&run, &corpus, &recompute).unwrap();
        assert!(predicted.fits, "{label}");
        t.set_recompute(recompute);
        let measured = t.train(&mut |_| {}).unwrap().clone();
        let (p, m) = (
            predicted.peak_allocated_bytes as f64,
            measured.peak_allocated_bytes as f64,
        );
        assert!(
            (p - m).abs() <= 0.01 * m,
            "{label}: predicted peak {p} vs measured {m}"
        );
        for cat in Category::ALL {
            let (p, m) = (
                predicted.peak_bytes_by_category[cat],
                measured.peak_bytes_by_category[cat],
            );
            let diff = p.abs_diff(m);
            assert!(
                diff <= (m / 100).max(64 << 10),
                "{label}: {cat} predicted {p} vs measured {m}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 30);
}

#[test]
fn the_largest_micro_batch_fits_and_one_more_does_not() {
    let corpus = Corpus::bundled();
    let run = TrainConfig {
        model: Some("gpt-tiny".into()),
        seq_len: Some(32),
        steps: Some(1),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some("3MiB".parse().unwrap()),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    let none = |_| Ok(headroom_nn::Recompute::none());
    let m = headroom_train::predict::largest_micro_batch(&run, &corpus, 4096, &none)
        .unwrap()
        .unwrap();
    assert!(m >= 1);
    // Property, checked with independent real runs: m fits, m + 1 runs out of memory.
    let real = |micro: usize| {
        let mut c = run.clone();
        c.micro_batch = micro;
        c.oom_recovery = false;
        let mut t = Trainer::new(c, &corpus).unwrap();
        t.train(&mut |_| {}).map(|_| ())
    };
    assert!(real(m).is_ok(), "micro-batch {m} should fit");
    assert!(
        matches!(real(m + 1), Err(headroom_train::TrainError::OutOfMemory(_))),
        "micro-batch {} should not fit",
        m + 1
    );
}
