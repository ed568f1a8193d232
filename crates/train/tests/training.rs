//! The trainer's promises on a tiny GPT: loss goes down in every precision mode, accumulation
//! equals the large batch, mixed precision halves activation bytes and adds master weights,
//! the loss scaler skips overflowing steps, resumed runs are bit-exact, a forgotten zero_grad
//! is reported, and a budget too small ends in an out-of-memory error.

use headroom_memory::Category;
use headroom_train::config::TrainConfig;
use headroom_train::data::Corpus;
use headroom_train::{TrainError, Trainer, TrainerHooks};

fn config(precision: &str, steps: u64) -> TrainConfig {
    TrainConfig {
        model: Some("gpt-tiny".into()),
        precision: Some(precision.parse().unwrap()),
        micro_batch: Some(8),
        steps: Some(steps),
        eval_every: Some(0),
        eval_batches: Some(2),
        warmup_steps: Some(2),
        device_memory: Some("256MiB".parse().unwrap()),
        seed: Some(11),
        ..Default::default()
    }
}

fn trainer(c: TrainConfig) -> Trainer {
    Trainer::new(c.resolve().unwrap(), &Corpus::bundled()).unwrap()
}

fn flat_params(t: &Trainer) -> Vec<f32> {
    t.model()
        .blocks()
        .iter()
        .flat_map(|b| b.flat().to_vec_f32().unwrap())
        .collect()
}

#[test]
fn loss_decreases_in_every_precision_mode() {
    for precision in ["fp32", "bf16-mixed", "fp16-mixed", "bf16"] {
        let mut t = trainer(config(precision, 40));
        let report = t.train(&mut |_| {}).unwrap();
        let first = report.losses[..3].iter().sum::<f64>() / 3.0;
        let last = report.losses[report.losses.len() - 3..].iter().sum::<f64>() / 3.0;
        // ln 256 = 5.55 at the start; byte frequencies alone bring it near 3.3.
        assert!(last < first - 1.0, "{precision}: {first:.3} → {last:.3}");
        assert!(report.val_losses.last().unwrap().loss < 4.5, "{precision}");
    }
}

#[test]
fn accumulation_gives_the_weights_of_the_whole_batch() {
    // One optimizer step on 8 sequences, as 1 × 8 and as 4 micro-batches of 2: the sampler
    // yields the same 8 windows in the same order, each micro-batch loss is scaled by 1/4, so
    // the summed gradient is the gradient of the mean loss over all 8. Plain SGD makes the
    // weights a linear function of that gradient (Adam's g/√v would amplify rounding noise in
    // near-zero gradients, which says nothing about accumulation).
    let mut whole = config("fp32", 1);
    whole.grad_clip = Some(0.0);
    whole.optimizer = Some(headroom_train::strategy::Optimizer::Sgd);
    let mut split = whole.clone();
    split.micro_batch = Some(2);
    split.accumulation = Some(4);
    let mut a = trainer(whole);
    let mut b = trainer(split);
    a.train(&mut |_| {}).unwrap();
    b.train(&mut |_| {}).unwrap();
    let (pa, pb) = (flat_params(&a), flat_params(&b));
    let max_rel = pa
        .iter()
        .zip(&pb)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1e-3))
        .fold(0.0f32, f32::max);
    assert!(max_rel < 1e-5, "max relative difference {max_rel}");
    assert!((a.report().losses[0] - b.report().losses[0]).abs() < 1e-5);
}

#[test]
fn mixed_precision_halves_activations_and_adds_master_weights() {
    // gpt-small (not gpt-tiny, whose vocabulary of 256 dwarfs its width of 32, so the f32
    // logits of the loss would dominate): one step at micro-batch 4.
    let small = |precision: &str| {
        let mut c = config(precision, 1);
        c.model = Some("gpt-small".into());
        c.micro_batch = Some(4);
        trainer(c)
    };
    let (mut fp32, mut bf16) = (small("fp32"), small("bf16-mixed"));
    let r32 = fp32.train(&mut |_| {}).unwrap().clone();
    let r16 = bf16.train(&mut |_| {}).unwrap().clone();
    let (a32, a16) = (
        r32.memory.peak_bytes_by_category[Category::Activation],
        r16.memory.peak_bytes_by_category[Category::Activation],
    );
    let ratio = a16 as f64 / a32 as f64;
    // Activations are stored in 16 bits; the f32 pieces left are the logits cast for the loss,
    // norm statistics and the loss itself, so the ratio sits a little above 1/2.
    assert!(
        (0.45..0.6).contains(&ratio),
        "bf16-mixed / fp32 activation bytes = {ratio:.3} ({a16} / {a32})"
    );
    assert_eq!(r32.memory.peak_bytes_by_category[Category::MasterWeight], 0);
    // Master weights: one fp32 copy of every parameter (each block rounded to 512 bytes).
    let params = r16.parameters;
    let master = r16.memory.peak_bytes_by_category[Category::MasterWeight];
    // Six blocks (embed, 4 layers, head), each rounded up to 512 bytes.
    assert!(
        master >= 4 * params && master < 4 * params + 512 * 6,
        "{master} vs 4 × {params}"
    );
    // Pure bf16 keeps no master copy.
    let mut pure = trainer(config("bf16", 1));
    assert_eq!(
        pure.train(&mut |_| {})
            .unwrap()
            .memory
            .peak_bytes_by_category[Category::MasterWeight],
        0
    );
}

#[test]
fn forced_overflow_skips_the_step_and_halves_the_scale() {
    let mut t = trainer(config("fp16-mixed", 1));
    t.set_hooks(TrainerHooks {
        force_overflow_at: Some(0),
        ..Default::default()
    });
    let before = flat_params(&t);
    t.train(&mut |_| {}).unwrap();
    assert_eq!(
        flat_params(&t),
        before,
        "a skipped step leaves the weights untouched"
    );
    let s = t.scaler().unwrap();
    assert_eq!(s.scale(), 32768.0);
    assert_eq!(s.skipped_steps, 1);
}

#[test]
fn resumed_run_is_bitwise_identical() {
    let dir = tempfile::tempdir().unwrap();
    let mut straight = trainer(config("fp32", 6));
    straight.train(&mut |_| {}).unwrap();

    let mut first = config("fp32", 3);
    first.save_dir = Some(dir.path().to_path_buf());
    trainer(first).train(&mut |_| {}).unwrap();
    let mut second = trainer(config("fp32", 6));
    second.resume(dir.path()).unwrap();
    assert_eq!(second.step(), 3);
    second.train(&mut |_| {}).unwrap();

    let (a, b) = (flat_params(&straight), flat_params(&second));
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "weights differ after resume"
    );
    let la: Vec<u64> = straight
        .report()
        .losses
        .iter()
        .map(|l| l.to_bits())
        .collect();
    let lb: Vec<u64> = second.report().losses.iter().map(|l| l.to_bits()).collect();
    assert_eq!(la, lb);
}

#[test]
fn forgotten_zero_grad_is_reported_once() {
    let mut t = trainer(config("fp32", 3));
    t.set_hooks(TrainerHooks {
        skip_zero_grad: true,
        ..Default::default()
    });
    let mut warnings = Vec::new();
    t.train(&mut |e| {
        if let headroom_train::TrainEvent::Warning(w) = e {
            warnings.push(w);
        }
    })
    .unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("zero_grad"), "{}", warnings[0]);
}

#[test]
fn too_small_a_budget_is_an_out_of_memory_error() {
    let mut c = config("fp32", 1);
    c.device_memory = Some("2MiB".parse().unwrap());
    c.model = Some("gpt-small".into());
    let result = Trainer::new(c.resolve().unwrap(), &Corpus::bundled())
        .and_then(|mut t| t.train(&mut |_| {}).map(|_| ()));
    match result {
        Err(TrainError::OutOfMemory(oom)) => assert!(oom.to_string().contains("Tried to allocate")),
        other => panic!("expected an OOM, got {other:?}"),
    }
}

#[test]
fn empty_cache_after_validation_reports_reserved_bytes_before_and_after() {
    // Micro-batch 32 (1,024 tokens: 1 MiB of f32 logits): the steps and validation need
    // segments beyond the 2 MiB one the model states split (8 MiB reserved), which are wholly
    // free once validation ends. At micro-batch 8 everything can fit that one split segment,
    // and then nothing is releasable.
    let mut c = config("fp32", 2);
    c.micro_batch = Some(32);
    c.eval_every = Some(1);
    c.empty_cache_after_eval = Some(true);
    let mut t = trainer(c);
    let report = t.train(&mut |_| {}).unwrap().clone();
    assert_eq!(report.cache_releases.len(), 2, "one release per validation");
    for r in &report.cache_releases {
        // Validation freed its activations, so unsplit cached segments exist and are released;
        // what stays reserved is what the model states and split segments still hold.
        assert!(r.reserved_after < r.reserved_before, "{r:?}");
        assert!(r.reserved_after >= report.memory.peak_bytes_by_category[Category::Parameter]);
    }
}

#[test]
fn a_budget_30_percent_short_recovers_with_the_same_effective_batch_and_loss() {
    // Reference: micro-batch 8 with room to spare.
    let mut reference = trainer(config("fp32", 4));
    let r = reference.train(&mut |_| {}).unwrap().clone();
    assert!(
        r.warnings.is_empty(),
        "a healthy run warns about nothing: {:?}",
        r.warnings
    );
    // The same run in 70 % of the bytes it reserved at its peak.
    let mut short = config("fp32", 4);
    short.device_memory = Some(headroom_memory::ByteSize(
        r.memory.peak_reserved_bytes * 7 / 10,
    ));
    let mut t = trainer(short);
    let mut recoveries = Vec::new();
    let s = t
        .train(&mut |e| {
            if let headroom_train::TrainEvent::OomRecovered {
                micro_batch,
                accumulation,
                ..
            } = e
            {
                recoveries.push((micro_batch, accumulation));
            }
        })
        .unwrap()
        .clone();
    assert!(
        !recoveries.is_empty(),
        "the short budget must have run out of memory"
    );
    let &(micro, accumulation) = recoveries.last().unwrap();
    assert_eq!(micro * accumulation, 8, "same effective batch");
    assert_eq!(s.losses.len(), 4);
    let (a, b) = (r.losses.last().unwrap(), s.losses.last().unwrap());
    assert!(
        ((a - b) / a).abs() < 1e-5,
        "final loss {b} vs {a} without OOM"
    );
    assert!(s.memory.peak_reserved_bytes <= r.memory.peak_reserved_bytes * 7 / 10);
}

#[test]
fn a_step_peak_that_grows_is_caught_without_any_growth_between_steps() {
    let mut t = trainer(config("fp32", 6));
    t.set_hooks(TrainerHooks {
        grow_step_buffer: true,
        ..Default::default()
    });
    let report = t.train(&mut |_| {}).unwrap().clone();
    // The buffer is freed at every step's end: bytes between steps stay constant, so the one
    // warning is the step-peak one. It grows by one 16 KiB row (4,096 f32) per step: 2 rows
    // in the step that ends the warm-up (step 2); the guard speaks at the second new maximum,
    // 4 rows at step 4.
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    let w = &report.warnings[0];
    assert!(
        w.contains("step's peak grew") && w.contains("at step 4"),
        "{w}"
    );
    assert!(w.contains("`activation`"), "{w}");
    assert!(
        w.contains("hook.history (activation: 32.00 KiB → 64.00 KiB)"),
        "{w}"
    );
    // Without the hook the same run warns of nothing.
    let clean = trainer(config("fp32", 6))
        .train(&mut |_| {})
        .unwrap()
        .clone();
    assert!(clean.warnings.is_empty(), "{:?}", clean.warnings);
}

#[test]
fn a_leaking_run_is_caught_with_the_category_named() {
    let mut t = trainer(config("fp32", 5));
    t.set_hooks(TrainerHooks {
        keep_losses: true,
        ..Default::default()
    });
    let report = t.train(&mut |_| {}).unwrap().clone();
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    assert!(
        report.warnings[0].contains("`activation`"),
        "{}",
        report.warnings[0]
    );
    assert!(
        report.warnings[0].contains("×"),
        "names the allocations that multiplied: {}",
        report.warnings[0]
    );
}

#[test]
fn a_save_without_its_optimizer_state_is_refused() {
    // AdamW has stepped: a manifest that lost its optimizer entry (checksums made to match)
    // would silently restart the optimizer; it is an error naming the missing state instead.
    let dir = tempfile::tempdir().unwrap();
    let mut first = config("fp32", 2);
    first.save_dir = Some(dir.path().to_path_buf());
    trainer(first).train(&mut |_| {}).unwrap();
    let save = dir.path().join("step-000002");
    let manifest = save.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    m["files"].as_object_mut().unwrap().remove("optimizer");
    let text = serde_json::to_vec_pretty(&m).unwrap();
    std::fs::write(&manifest, &text).unwrap();
    let crc = format!("{:08x}", crc32fast::hash(&text));
    std::fs::write(save.join("manifest.crc32"), crc).unwrap();
    let e = trainer(config("fp32", 4))
        .resume(dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("optimizer's state is missing"), "{e}");
}
