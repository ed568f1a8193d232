//! LoRA on the GPT against independent references: the adapters' gradients against central
//! finite differences of the loss, the start against the base model (B = 0), the merged
//! weights against the adapted model, and the trainable counts against hand-derived ones.

use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::init::normal;
use headroom_nn::models::lora::{adapter_shapes, merge_block};
use headroom_nn::models::{ModelSpec, build_model, preset};
use headroom_nn::{Model, Recompute};
use headroom_strategy::{BaseWeights, Lora};
use headroom_tensor::{DType, Gradients, Tape, Tensor};

fn device() -> Device {
    Device::cpu(256 << 20, AllocatorConfig::default())
}

fn tiny(lora: Option<Lora>) -> ModelSpec {
    let Some(ModelSpec::Gpt(mut c)) = preset("gpt-tiny") else {
        panic!("gpt-tiny is a GPT preset")
    };
    c.lora = lora;
    ModelSpec::Gpt(c)
}

fn lora(rank: usize, alpha: f32, targets: &str) -> Lora {
    Lora::new(rank, alpha, targets.parse().unwrap(), BaseWeights::Plain).unwrap()
}

fn batch(device: &Device, b: usize, t: usize) -> (Tensor, Tensor) {
    let ids: Vec<i64> = (0..b * t).map(|i| (i * 7 % 256) as i64).collect();
    let tg: Vec<i64> = (0..b * t).map(|i| ((i * 5 + 3) % 256) as i64).collect();
    let make = |v: &[i64]| {
        Tensor::from_i64(device, &[b, t], v, DType::I64, Category::Input, None).unwrap()
    };
    (make(&ids), make(&tg))
}

fn loss_of(model: &dyn Model, device: &Device) -> f32 {
    let (x, y) = batch(device, 2, 16);
    model
        .loss(&x, &y, &Recompute::none())
        .unwrap()
        .to_scalar_f32()
        .unwrap()
}

/// Gives every adapter weight (B included) a non-zero value, so every gradient is non-zero.
fn perturb_adapters(model: &dyn Model) {
    for (i, block) in model.blocks().iter().enumerate() {
        block
            .set_values(&normal(block.numel(), 0.3, 11, i as u64))
            .unwrap();
    }
}

#[test]
fn trainable_counts_match_hand_derived_ones() {
    // gpt-tiny: C = 32, F = 128, 2 layers. Rank 4 on q and v: each adapter 4·(32 + 32) = 256,
    // so 512 per block and 1,024 in all.
    let ModelSpec::Gpt(c) = tiny(Some(lora(4, 8.0, "q,v"))) else {
        unreachable!()
    };
    assert_eq!(c.trainable_params().unwrap(), 1_024);
    // qkv (fused, 32 → 96): 4·128 = 512; o: 256; up (32 → 128) and down: 640 each. Per block
    // 2,048, in all 4,096.
    let ModelSpec::Gpt(c) = tiny(Some(lora(4, 8.0, "qkv,o,up,down"))) else {
        unreachable!()
    };
    assert_eq!(c.trainable_params().unwrap(), 4_096);
    let d = device();
    let model = build_model("t", &tiny(Some(lora(4, 8.0, "q,v"))), &d, DType::F32, 1).unwrap();
    assert_eq!(model.num_params(), 1_024);
    assert_eq!(model.num_frozen_params(), c.num_params());
    // The gradient buffers are the adapters' only: 1,024 f32 in two blocks of 512 (2 KiB each).
    assert_eq!(
        d.stats().category_bytes[Category::Gradient.index()].current,
        2 * 2048
    );
}

#[test]
fn targets_the_gpt_cannot_adapt_are_refused_with_the_fix() {
    let ModelSpec::Gpt(c) = tiny(None) else {
        unreachable!()
    };
    for (targets, hint) in [("gate", "adapt up and down"), ("q,qkv", "either qkv")] {
        let e = adapter_shapes(&c, &lora(2, 2.0, targets))
            .unwrap_err()
            .to_string();
        assert!(e.contains(hint), "{e}");
    }
}

#[test]
fn an_adapted_model_starts_as_its_base_bitwise() {
    let d = device();
    let plain = build_model("t", &tiny(None), &d, DType::F32, 5).unwrap();
    let adapted = build_model(
        "t",
        &tiny(Some(lora(4, 16.0, "qkv,o,up,down"))),
        &d,
        DType::F32,
        5,
    )
    .unwrap();
    for (a, b) in plain.blocks().iter().zip(adapted.frozen_blocks()) {
        assert_eq!(
            a.flat().to_vec_f32().unwrap(),
            b.flat().to_vec_f32().unwrap()
        );
    }
    // B = 0: every update is zero, so the loss is the base model's to the bit.
    assert_eq!(
        loss_of(&*plain, &d).to_bits(),
        loss_of(&*adapted, &d).to_bits()
    );
}

fn gradients_match_finite_differences(targets: &str) {
    let d = device();
    let model = build_model("t", &tiny(Some(lora(2, 4.0, targets))), &d, DType::F32, 9).unwrap();
    perturb_adapters(&*model);
    let mut grads = Gradients::new();
    for b in model.blocks() {
        b.bind_grads(&mut grads).unwrap();
    }
    let (x, y) = batch(&d, 2, 16);
    let tape = Tape::new();
    let loss = tape
        .record(|| model.loss(&x, &y, &Recompute::none()))
        .unwrap();
    tape.backward(&loss, &mut grads).unwrap();
    // The base is frozen: its gradient buffers never took bytes.
    assert!(
        model
            .frozen_blocks()
            .iter()
            .all(|b| !b.flat_grad().is_resident())
    );
    for block in model.blocks() {
        let grad = block.flat_grad().to_vec_f32().unwrap();
        let values = block.flat().to_vec_f32().unwrap();
        // The 12 largest gradients of each block (small ones drown in f32 rounding).
        let mut order: Vec<usize> = (0..grad.len()).collect();
        order.sort_by(|&i, &j| grad[j].abs().total_cmp(&grad[i].abs()));
        for &i in &order[..12] {
            let eps = 1e-2f32;
            let at = |delta: f32| {
                let mut v = values.clone();
                v[i] += delta;
                block.set_values(&v).unwrap();
                loss_of(&*model, &d) as f64
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps as f64);
            block.set_values(&values).unwrap();
            let analytic = grad[i] as f64;
            assert!(
                (numeric - analytic).abs() <= 0.02 * analytic.abs() + 2e-4,
                "{targets}: {} element {i}: finite difference {numeric}, backward {analytic}",
                block.name()
            );
        }
    }
}

#[test]
fn adapter_gradients_match_finite_differences_on_separate_q_k_v_and_the_mlp() {
    gradients_match_finite_differences("q,k,v,o,up,down");
}

#[test]
fn adapter_gradients_match_finite_differences_on_the_fused_qkv() {
    gradients_match_finite_differences("qkv");
}

fn merged_weights_give_the_adapted_models_loss(targets: &str) {
    let d = device();
    let l = lora(4, 8.0, targets);
    let adapted = build_model("t", &tiny(Some(l.clone())), &d, DType::F32, 3).unwrap();
    perturb_adapters(&*adapted);
    let plain = build_model("t", &tiny(None), &d, DType::F32, 3).unwrap();
    let ModelSpec::Gpt(config) = tiny(None) else {
        unreachable!()
    };
    for (layer, adapters) in adapted.blocks().iter().enumerate() {
        let base = &plain.blocks()[1 + layer];
        let mut values = base.flat().to_vec_f32().unwrap();
        let a = adapters.flat().to_vec_f32().unwrap();
        merge_block(&config, &l, base.specs(), &mut values, &a).unwrap();
        base.set_values(&values).unwrap();
    }
    let (a, p) = (loss_of(&*adapted, &d), loss_of(&*plain, &d));
    assert!(
        (a - p).abs() <= 1e-5 * a.abs(),
        "{targets}: adapted {a}, merged {p}"
    );
    // The adapters moved the loss, so the comparison is not between two base models.
    let base = build_model("t", &tiny(None), &d, DType::F32, 3).unwrap();
    assert!((loss_of(&*base, &d) - a).abs() > 1e-3, "{targets}");
}

#[test]
fn merged_weights_give_the_adapted_models_loss_with_the_fused_qkv() {
    merged_weights_give_the_adapted_models_loss("qkv,o,up,down");
}

#[test]
fn merged_weights_give_the_adapted_models_loss_with_separate_q_k_v() {
    merged_weights_give_the_adapted_models_loss("q,k,v");
}
