//! LoRA in the engine: the frozen base is bitwise unchanged by training while the adapters
//! learn; the gradient, optimizer-state and master-weight bytes are the adapters' counts derived
//! by hand; the dry run predicts a LoRA run exactly; a save resumes bitwise and carries the
//! base and the merged model; ZeRO-2 and ZeRO-3 over two ranks give the single process's bits.
//! QLoRA: the parameter bytes are the NF4 layout's and the 16-bit rest's by hand, the NF4 base
//! is bitwise unchanged by training, predicted exactly, and resumed bitwise.

use crate::common;

use common::{assert_dry_run_exact, config, rounded, run_alone, run_ranks, zero};
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::models::{build_model, preset};
use headroom_train::config::RunConfig;
use headroom_train::strategy::{BaseWeights, Checkpoint, Lora, Optimizer, Precision};
use headroom_train::trainer::compute_dtype;

/// gpt-tiny (C = 32, F = 128, 2 layers, vocabulary 256, context 32), 8 steps of micro-batch 4
/// with LoRA rank 4 on `targets`.
fn tiny(precision: Precision, targets: &str) -> RunConfig {
    let mut c = config(Optimizer::AdamW, 4, 1, 1);
    c.steps = 8;
    c.strategy.precision = precision;
    c.lora = Some(Lora::new(4, 8.0, targets.parse().unwrap(), BaseWeights::Plain).unwrap());
    c
}

fn bits(values: Vec<f32>) -> Vec<u32> {
    values.into_iter().map(f32::to_bits).collect()
}

#[test]
fn the_frozen_base_is_bitwise_unchanged_while_the_adapters_learn() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        let c = tiny(precision, "qkv,o,up,down");
        let (_, t) = run_alone(&c);
        // The base as built from the seed, without LoRA.
        let device = Device::cpu(64 << 20, AllocatorConfig::default());
        let base = build_model(
            "base",
            &preset("gpt-tiny").unwrap(),
            &device,
            compute_dtype(precision),
            c.seed,
        )
        .unwrap();
        let frozen = t.model().frozen_blocks();
        assert_eq!(frozen.len(), base.blocks().len());
        for (after, before) in frozen.iter().zip(base.blocks()) {
            assert!(
                bits(after.flat().to_vec_f32().unwrap())
                    == bits(before.flat().to_vec_f32().unwrap()),
                "{precision}: base block {} changed",
                after.name()
            );
        }
        // Every B started at zero; training moved them, and the loss went down.
        for block in t.model().blocks() {
            let b = block.param("qkv.lora_b").unwrap().to_vec_f32().unwrap();
            assert!(b.iter().any(|v| *v != 0.0), "{precision}: {}", block.name());
        }
        let losses = &t.report().losses;
        assert!(
            losses.last().unwrap() < &losses[0],
            "{precision}: {losses:?}"
        );
    }
}

fn peak(t: &headroom_train::Trainer, c: Category) -> u64 {
    t.report().memory.peak_bytes_by_category[c]
}

#[test]
fn gradient_state_and_master_bytes_are_the_adapters_counted_by_hand() {
    // Rank 4 on q and v of gpt-tiny: each adapter 4·(32 + 32) = 256 elements, a block of
    // 512 per layer, two layers.
    let per_block = 512;
    for (precision, grad_size, master) in [
        (Precision::Fp32, 4, 0),
        (Precision::Bf16Mixed, 2, 2 * rounded(4 * per_block)),
    ] {
        let (_, t) = run_alone(&tiny(precision, "q,v"));
        assert_eq!(t.model().num_params(), 2 * per_block);
        let label = precision.to_string();
        assert_eq!(
            peak(&t, Category::Gradient),
            2 * rounded(grad_size * per_block) as u64,
            "{label}"
        );
        // AdamW: two f32 moments per adapter element, one buffer per moment and block.
        assert_eq!(
            peak(&t, Category::OptimizerState),
            2 * 2 * rounded(4 * per_block) as u64,
            "{label}"
        );
        assert_eq!(peak(&t, Category::MasterWeight), master as u64, "{label}");
        // Parameters: the base in the compute dtype (embed 256·32 + 32·32 = 9,216; each block
        // 4·32 + 32·96 + 96 + 32·32 + 32 + 32·128 + 128 + 128·32 + 32 = 12,704; the head's norm
        // 64) and the adapters.
        let p = grad_size;
        let base = rounded(p * 9_216) + 2 * rounded(p * 12_704) + rounded(p * 64);
        assert_eq!(
            peak(&t, Category::Parameter),
            (base + 2 * rounded(p * per_block)) as u64,
            "{label}"
        );
    }
}

#[test]
fn the_dry_run_predicts_a_lora_run_exactly() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        for checkpoint in [Checkpoint::None, Checkpoint::ALL_BLOCKS] {
            let mut c = tiny(precision, "q,k,v,o,up,down");
            c.strategy.checkpoint = checkpoint;
            assert_dry_run_exact(&c, &format!("{precision} {checkpoint}"));
        }
    }
    let mut c = tiny(Precision::Fp32, "qkv");
    c.grad_clip = None;
    c.strategy.optimizer_in_backward = true;
    assert_dry_run_exact(&c, "optimizer in backward");
}

#[test]
fn a_lora_save_resumes_bitwise_and_holds_the_base_and_the_merged_model() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny(Precision::Fp32, "qkv,down");
    let (straight, _) = run_alone(&c);
    let mut half = c.clone();
    half.steps = 4;
    let (_, mut first) = run_alone(&half);
    let saved = first.save(dir.path()).unwrap();
    let corpus = headroom_train::data::Corpus::bundled();
    let mut resumed = headroom_train::Trainer::new(c.clone(), &corpus).unwrap();
    resumed.resume(&saved).unwrap();
    resumed.train(&mut |_| {}).unwrap();
    let (losses, weights) = common::outcome(&mut resumed);
    assert_eq!(losses[4..], straight.0[4..]);
    assert!(weights == straight.1);

    let (_, groups) = headroom_train::save::read(&saved).unwrap();
    let (base, merged) = (&groups["base"], &groups["merged"]);
    assert_eq!(
        base.keys().collect::<Vec<_>>(),
        ["block.0", "block.1", "embed", "head"]
    );
    assert_eq!(
        base.keys().collect::<Vec<_>>(),
        merged.keys().collect::<Vec<_>>()
    );
    // The embedding has no adapter: merged equals base. Each layer's does: they differ.
    assert_eq!(merged["embed"].data, base["embed"].data);
    assert_ne!(merged["block.0"].data, base["block.0"].data);
    // A save whose base is gone is refused by name, not resumed from the seed.
    let mut groups = groups;
    groups.remove("base");
    let (manifest, _) = headroom_train::save::read_manifest(&saved).unwrap();
    let broken = dir.path().join("broken");
    let written = headroom_train::save::write(&broken, &manifest, &groups).unwrap();
    let mut t = headroom_train::Trainer::new(c, &corpus).unwrap();
    let e = t.resume(&written).unwrap_err().to_string();
    assert!(e.contains("no base weights"), "{e}");
}

#[test]
fn zero_2_and_3_over_two_ranks_give_the_single_processs_bits() {
    let single = |c: &RunConfig| {
        let mut c = c.clone();
        c.strategy.accumulation = 2;
        run_alone(&c).0
    };
    let mut c = config(Optimizer::AdamW, 4, 1, 2);
    c.steps = 6;
    c.lora = Some(Lora::new(2, 4.0, "q,v,down".parse().unwrap(), BaseWeights::Plain).unwrap());
    let mut alone = c.clone();
    alone.data_parallel = 1;
    let expected = single(&alone);
    for stage in [2, 3] {
        for r in run_ranks(&zero(c.clone(), stage), 2) {
            assert_eq!(r.bits.0, expected.0, "ZeRO-{stage} losses");
            assert!(r.bits.1 == expected.1, "ZeRO-{stage} weights");
        }
    }
}

fn qlora(precision: Precision, targets: &str) -> RunConfig {
    let mut c = tiny(precision, targets);
    c.lora = Some(Lora::new(4, 8.0, targets.parse().unwrap(), BaseWeights::Nf4).unwrap());
    c
}

#[test]
fn qlora_parameters_are_nf4_projections_plus_a_16_bit_rest_by_hand() {
    // NF4 of n elements: n/2 codes + n/64 absmax codes + 4 bytes per 256 absmax + 4 offset bytes.
    let nf4 = |n: usize| n / 2 + n.div_ceil(64) + 4 * n.div_ceil(64).div_ceil(256) + 4;
    // The planner's formula is the engine's layout.
    for n in [1, 63, 64, 65, 4096 * 4096, 11_008 * 4096] {
        assert_eq!(
            headroom_plan::model::lora::nf4_bytes(n as u64),
            headroom_tensor::nf4::nf4_bytes(n) as u64
        );
    }
    let (_, t) = run_alone(&qlora(Precision::Bf16Mixed, "q,v"));
    // gpt-tiny's projections per layer: qkv 32 × 96, proj 32 × 32, fc 32 × 128, mlp.proj
    // 128 × 32 (even sizes: the codes are exactly n/2).
    let per_layer = [3072, 1024, 4096, 4096]
        .map(|n| rounded(nf4(n)))
        .iter()
        .sum::<usize>();
    // Kept in bf16: the embedding (9,216), each layer's norms and biases (2·32 + 96 + 32 +
    // 2·32 + 128 + 32 = 416), the head's norm (64), and the adapters (2 × 512).
    let plain = rounded(2 * 9_216) + 2 * rounded(2 * 416) + rounded(2 * 64) + 2 * rounded(2 * 512);
    assert_eq!(
        peak(&t, Category::Parameter),
        (2 * per_layer + plain) as u64
    );
    // Gradients and states are the adapters', as in plain LoRA.
    assert_eq!(peak(&t, Category::Gradient), 2 * rounded(2 * 512) as u64);
    assert_eq!(
        t.model().num_frozen_params() + t.model().num_params(),
        preset("gpt-tiny").unwrap().num_params() + 1_024
    );
}

#[test]
fn qlora_keeps_its_nf4_base_bitwise_predicts_exactly_and_resumes_bitwise() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        let mut c = qlora(precision, "qkv,o,up,down");
        c.strategy.checkpoint = Checkpoint::ALL_BLOCKS;
        assert_dry_run_exact(&c, &format!("QLoRA {precision}"));
        let built = build_model(
            "fresh",
            &headroom_train::trainer::model_spec(&c).unwrap(),
            &Device::cpu(64 << 20, AllocatorConfig::default()),
            compute_dtype(precision),
            c.seed,
        )
        .unwrap();
        let (straight, t) = run_alone(&c);
        let before: Vec<Vec<u8>> = built
            .quantized()
            .iter()
            .map(|w| w.bytes().unwrap().to_vec())
            .collect();
        let after: Vec<Vec<u8>> = t
            .model()
            .quantized()
            .iter()
            .map(|w| w.bytes().unwrap().to_vec())
            .collect();
        assert_eq!(before.len(), 8);
        assert!(before == after, "{precision}: an NF4 weight changed");
        let losses = &t.report().losses;
        assert!(
            losses.last().unwrap() < &losses[0],
            "{precision}: {losses:?}"
        );

        let dir = tempfile::tempdir().unwrap();
        let mut half = c.clone();
        half.steps = 4;
        let (_, mut first) = run_alone(&half);
        let saved = first.save(dir.path()).unwrap();
        let corpus = headroom_train::data::Corpus::bundled();
        let mut resumed = headroom_train::Trainer::new(c.clone(), &corpus).unwrap();
        resumed.resume(&saved).unwrap();
        resumed.train(&mut |_| {}).unwrap();
        let (losses, weights) = common::outcome(&mut resumed);
        assert_eq!(losses[4..], straight.0[4..], "{precision}");
        assert!(weights == straight.1, "{precision}");
        // The merged model is the plain layout: the plain model's block sizes, in f32.
        let (_, groups) = headroom_train::save::read(&saved).unwrap();
        let plain = build_model(
            "plain",
            &preset("gpt-tiny").unwrap(),
            &Device::cpu(64 << 20, AllocatorConfig::default()),
            headroom_tensor::DType::F32,
            1,
        )
        .unwrap();
        for block in plain.blocks() {
            assert_eq!(groups["merged"][block.name()].data.len(), 4 * block.numel());
        }
        assert_eq!(groups["base"]["block.0.attn.qkv.w.nf4"].data, before[0]);
    }
}

#[test]
fn lora_settings_that_cannot_take_effect_are_refused_with_the_fix() {
    use headroom_train::config::TrainConfig;
    let e = TrainConfig {
        lora_alpha: Some(16.0),
        ..Default::default()
    }
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("lora_rank") && e.contains("--lora-rank 8"),
        "{e}"
    );
    let e = TrainConfig {
        lora_rank: Some(0),
        ..Default::default()
    }
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(e.contains("--lora-rank"), "{e}");
    let c = TrainConfig {
        model: Some("resmlp".into()),
        lora_rank: Some(8),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    let e = headroom_train::trainer::model_spec(&c)
        .unwrap_err()
        .to_string();
    assert!(e.contains("residual MLP") && e.contains("gpt-small"), "{e}");
    // The GPT has no gate projection.
    let c = TrainConfig {
        lora_rank: Some(8),
        lora_targets: Some("gate".parse().unwrap()),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    let e = headroom_train::trainer::model_spec(&c)
        .unwrap_err()
        .to_string();
    assert!(e.contains("adapt up and down"), "{e}");
}

#[test]
fn init_from_starts_a_lora_run_from_a_saved_base_and_a_plain_run_from_the_merged_model() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = headroom_train::data::Corpus::bundled();
    // A plain fp32 run, saved: the "pretrained" model.
    let mut plain = config(Optimizer::AdamW, 4, 1, 1);
    plain.steps = 4;
    let (_, mut pre) = run_alone(&plain);
    let pretrained = pre.save(&dir.path().join("pre")).unwrap();
    let saved: Vec<Vec<u32>> = pre
        .model()
        .blocks()
        .iter()
        .map(|b| bits(b.flat().to_vec_f32().unwrap()))
        .collect();
    // LoRA from it: the frozen base is the saved model, and the first loss (B = 0) is the
    // plain model's from the same weights, to the bit.
    let mut lora = tiny(Precision::Fp32, "qkv,down");
    lora.init_from = Some(pretrained.clone());
    let (lora_bits, mut t) = run_alone(&lora);
    for (block, before) in t.model().frozen_blocks().iter().zip(&saved) {
        assert!(
            bits(block.flat().to_vec_f32().unwrap()) == *before,
            "{}",
            block.name()
        );
    }
    let mut again = plain.clone();
    again.init_from = Some(pretrained.clone());
    again.steps = 1;
    let (plain_bits, _) = run_alone(&again);
    assert_eq!(lora_bits.0[0], plain_bits.0[0]);
    // A plain run from the LoRA save takes its merged model.
    let adapted = t.save(&dir.path().join("lora")).unwrap();
    let (_, groups) = headroom_train::save::read(&adapted).unwrap();
    let mut from_merged = plain.clone();
    from_merged.init_from = Some(adapted);
    from_merged.steps = 0;
    let t = headroom_train::Trainer::new(from_merged, &corpus).unwrap();
    for block in t.model().blocks() {
        let merged = &groups["merged"][block.name()].data;
        let loaded: Vec<u8> = block
            .flat()
            .to_vec_f32()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert!(loaded == *merged, "{}", block.name());
    }
    // QLoRA from the pretrained save: its projections are the saved values quantised.
    let mut q = qlora(Precision::Fp32, "q,v");
    q.init_from = Some(pretrained.clone());
    q.steps = 0;
    let t = headroom_train::Trainer::new(q, &corpus).unwrap();
    let block0 = &pre.model().blocks()[1];
    let spec = block0
        .specs()
        .iter()
        .find(|s| s.name == "attn.qkv.w")
        .unwrap();
    let values = block0.flat().to_vec_f32().unwrap();
    let expected = headroom_tensor::nf4::quantize_nf4(&values[spec.offset..spec.offset + 32 * 96]);
    assert_eq!(t.model().quantized()[0].bytes().unwrap(), &expected[..]);
    // Another model's save is refused, naming the shape field and both values.
    let mut wide = plain.clone();
    wide.width = Some(64);
    wide.init_from = Some(pretrained);
    let e = headroom_train::Trainer::new(wide, &corpus)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("--width 32") && e.contains("this run's has 64"),
        "{e}"
    );
}

#[test]
fn the_planners_lora_activations_track_the_engines_as_its_full_ones_do() {
    // gpt-medium, one sequence: the analytical model's activation bytes over the engine's
    // measured peak, with and without adapters. Charging LoRA runs the full fine-tune's
    // activations would put q,v at about 1.09 where the plain run is at 0.98.
    let ratio = |targets: Option<&str>| {
        let mut c = config(Optimizer::AdamW, 1, 1, 1);
        c.model = "gpt-medium".into();
        c.seq_len = None;
        c.steps = 1;
        c.strategy.precision = Precision::Bf16Mixed;
        c.lora =
            targets.map(|t| Lora::new(8, 8.0, t.parse().unwrap(), BaseWeights::Plain).unwrap());
        let a = headroom_train::predict::analytical::analytical_memory(&c).unwrap();
        let (_, t) = run_alone(&c);
        a.activation_bytes as f64 / peak(&t, Category::Activation) as f64
    };
    let plain = ratio(None);
    for targets in ["q,v", "qkv,o,up,down", "up,down"] {
        let r = ratio(Some(targets));
        assert!(
            (r - plain).abs() <= 0.08,
            "{targets}: {r:.3} against {plain:.3} without LoRA"
        );
    }
}
