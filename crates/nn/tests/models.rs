//! Model shapes and first losses against hand-derived values.

use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::models::{ModelSpec, build_model, preset};
use headroom_nn::{Model, Recompute};
use headroom_tensor::{DType, Tape, Tensor};

fn device() -> Device {
    Device::cpu(256 << 20, AllocatorConfig::default())
}

fn batch(device: &Device, b: usize, t: usize) -> (Tensor, Tensor) {
    let ids: Vec<i64> = (0..b * t).map(|i| (i * 7 % 256) as i64).collect();
    let tg: Vec<i64> = (0..b * t).map(|i| ((i * 7 + 1) % 256) as i64).collect();
    (
        Tensor::from_i64(
            device,
            &[b, t],
            &ids,
            DType::I64,
            Category::Input,
            Some("ids"),
        )
        .unwrap(),
        Tensor::from_i64(
            device,
            &[b, t],
            &tg,
            DType::I64,
            Category::Input,
            Some("targets"),
        )
        .unwrap(),
    )
}

#[test]
fn gpt_small_has_the_hand_counted_parameters() {
    // V = 256, S = 128, C = 128, F = 512, 4 layers, tied head:
    // embeddings 256·128 + 128·128 = 49,152; per block 4·128 (two norms) + 128·384 + 384
    // + 128·128 + 128 + 128·512 + 512 + 512·128 + 128 = 198,272; final norm 256.
    // Total 49,152 + 4·198,272 + 256 = 842,496.
    let spec = preset("gpt-small").unwrap();
    assert_eq!(spec.num_params(), 842_496);
    let d = device();
    let model = build_model("gpt-small", &spec, &d, DType::F32, 1).unwrap();
    assert_eq!(model.num_params(), 842_496);
    assert_eq!(
        d.stats().category_bytes[Category::Parameter.index()].current as usize,
        round_blocks(model.as_ref(), 4)
    );
}

/// Parameter bytes as the allocator holds them: each flat block rounded up to 512 bytes (every
/// block of gpt-small is below 1 MiB — the largest is 198,272 × 4 bytes — so no split slack).
fn round_blocks(model: &dyn Model, elem: usize) -> usize {
    model
        .blocks()
        .iter()
        .map(|b| (b.numel() * elem).div_ceil(512) * 512)
        .sum()
}

#[test]
fn resmlp_counts_and_depth() {
    // V = 256, C = 128, H = 512, N = 16: 256·128 + 16·(256 + 65,536 + 512 + 65,536 + 128)
    // + 256 + 128·256 = 32,768 + 16·131,968 + 256 + 32,768 = 2,177,280.
    let spec = preset("resmlp").unwrap();
    assert_eq!(spec.num_params(), 2_177_280);
    let deep = spec.with_overrides(Some(1000), None, None, None);
    assert_eq!(deep.num_params(), 32_768 + 1000 * 131_968 + 256 + 32_768);
}

#[test]
fn initial_loss_is_close_to_uniform_over_the_vocabulary() {
    // Weights of std 0.02 give logits near 0, so the first loss is ≈ ln 256 = 5.545.
    for name in ["gpt-tiny", "resmlp"] {
        let d = device();
        let spec = preset(name).unwrap();
        let model = build_model(name, &spec, &d, DType::F32, 3).unwrap();
        let (x, y) = batch(&d, 2, 16);
        let loss = model
            .loss(&x, &y, &Recompute::none())
            .unwrap()
            .to_scalar_f32()
            .unwrap();
        assert!((loss - 256f32.ln()).abs() < 0.05, "{name}: {loss}");
    }
}

#[test]
fn backward_fills_every_gradient_and_frees_activations() {
    let d = device();
    let spec = preset("gpt-tiny").unwrap();
    let model = build_model("gpt-tiny", &spec, &d, DType::F32, 3).unwrap();
    let mut grads = headroom_tensor::Gradients::new();
    for b in model.blocks() {
        b.bind_grads(&mut grads).unwrap();
    }
    let (x, y) = batch(&d, 2, 16);
    let tape = Tape::new();
    let loss = tape
        .record(|| model.loss(&x, &y, &Recompute::none()))
        .unwrap();
    assert!(d.stats().category_bytes[Category::Activation.index()].current > 0);
    tape.backward(&loss, &mut grads).unwrap();
    // Only the kept loss itself (one f32 in a 512-byte block) is left.
    assert_eq!(
        d.stats().category_bytes[Category::Activation.index()].current,
        512
    );
    drop(loss);
    assert_eq!(
        d.stats().category_bytes[Category::Activation.index()].current,
        0
    );
    for b in model.blocks() {
        let g = b.flat_grad().to_vec_f32().unwrap();
        assert!(
            g.iter().any(|v| *v != 0.0),
            "block {} got no gradient",
            b.name()
        );
    }
}

#[test]
fn checkpointed_blocks_give_bitwise_equal_gradients() {
    let run = |ckpt: &Recompute| {
        let d = device();
        let spec = preset("gpt-tiny").unwrap();
        let model = build_model("gpt-tiny", &spec, &d, DType::F32, 5).unwrap();
        let mut grads = headroom_tensor::Gradients::new();
        for b in model.blocks() {
            b.bind_grads(&mut grads).unwrap();
        }
        let (x, y) = batch(&d, 2, 16);
        let tape = Tape::new();
        let loss = tape.record(|| model.loss(&x, &y, ckpt)).unwrap();
        let l = loss.to_scalar_f32().unwrap();
        tape.backward(&loss, &mut grads).unwrap();
        let g: Vec<Vec<f32>> = model
            .blocks()
            .iter()
            .map(|b| b.flat_grad().to_vec_f32().unwrap())
            .collect();
        (l.to_bits(), g)
    };
    let plain = run(&Recompute::none());
    for recompute in [
        Recompute {
            segments: vec![0..1, 1..2],
            selective: false,
            ..Default::default()
        },
        Recompute {
            segments: std::iter::once(0..2).collect(),
            selective: false,
            ..Default::default()
        },
        Recompute {
            segments: std::iter::once(1..2).collect(),
            selective: false,
            ..Default::default()
        },
        Recompute {
            segments: Vec::new(),
            selective: true,
            ..Default::default()
        },
    ] {
        let ckpt = run(&recompute);
        assert_eq!(plain.0, ckpt.0, "{recompute:?}");
        let same = plain
            .1
            .iter()
            .flatten()
            .zip(ckpt.1.iter().flatten())
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "gradients differ under {recompute:?}");
    }
}

#[test]
fn unknown_models_name_the_presets() {
    let e = ModelSpec::resolve("gpt-huge").unwrap_err().to_string();
    assert!(e.contains("gpt-small") && e.contains("resmlp"), "{e}");
}
