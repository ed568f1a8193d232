//! Optimizer updates against values derived by hand from each rule's definition.

use super::*;
use headroom_memory::AllocatorConfig;
use std::ops::Range;

fn device() -> Device {
    Device::cpu(64 << 20, AllocatorConfig::default())
}

fn run(
    config: OptimizerConfig,
    params: &mut [f32],
    grads: &[f32],
    steps: usize,
    lr: f32,
) -> Optimizer {
    let mut opt = Optimizer::new(config, device());
    let whole: Range<usize> = 0..params.len();
    let ranges = std::slice::from_ref(&whole);
    for _ in 0..steps {
        let mut groups = [FlatParams {
            params: &mut *params,
            grads: Grads::F32(grads),
            tensors: ranges,
        }];
        opt.step(&mut groups, 1.0, lr).unwrap();
    }
    opt
}

#[test]
fn sgd_momentum_matches_the_recurrence() {
    // w0 = 1, g = 0.5 each step, lr = 0.1, μ = 0.9, no decay.
    // step 1: buf = 0.5, w = 1 − 0.05 = 0.95; step 2: buf = 0.9·0.5 + 0.5 = 0.95, w = 0.95 − 0.095 = 0.855.
    let mut w = [1.0f32];
    run(
        OptimizerConfig::new(UpdateRule::Sgd),
        &mut w,
        &[0.5],
        2,
        0.1,
    );
    assert!((w[0] - 0.855).abs() < 1e-6, "{}", w[0]);
}

#[test]
fn adamw_first_step_moves_each_weight_by_lr_against_the_gradient_sign() {
    // Step 1: m̂ = g, v̂ = g², so the Adam step is lr·g/(|g| + ε) ≈ lr·sign(g); decoupled decay
    // first multiplies w by (1 − lr·wd). w = 2, g = −3, lr = 0.01, wd = 0.01:
    // w = 2·(1 − 1e-4) + 0.01·3/(3 + 1e-8) = 1.9998 + 0.01 = 2.0098.
    let mut w = [2.0f32, -1.0];
    let mut c = OptimizerConfig::new(UpdateRule::AdamW);
    c.weight_decay = 0.01;
    let opt = run(c, &mut w, &[-3.0, 0.25], 1, 0.01);
    assert!((w[0] - 2.0098).abs() < 1e-6, "{}", w[0]);
    // w = −1·(1 − 1e-4) − 0.01 = −1.0099.
    assert!((w[1] + 1.0099).abs() < 1e-6, "{}", w[1]);
    assert_eq!(opt.state_bytes_per_param(), 8);
    let stats = opt.device.stats();
    // Two f32 states of 2 elements: 8 bytes each, rounded to 512-byte blocks.
    assert_eq!(
        stats.category_bytes[Category::OptimizerState.index()].current,
        1024
    );
}

#[test]
fn adamw_second_step_uses_bias_corrected_moments() {
    // g = 1 both steps, no decay: m2 = 0.1·0.9 + 0.1 = 0.19, m̂ = 0.19/0.19 = 1;
    // v2 = 0.001·0.999 + 0.001 = 0.001999, v̂ = 0.001999/0.001999 = 1: each step moves lr.
    let mut w = [0.0f32];
    let mut c = OptimizerConfig::new(UpdateRule::AdamW);
    c.weight_decay = 0.0;
    run(c, &mut w, &[1.0], 2, 0.5);
    assert!((w[0] + 1.0).abs() < 1e-5, "{}", w[0]);
}

#[test]
fn lamb_scales_the_adam_update_by_the_trust_ratio() {
    // w = (3, 4) (‖w‖ = 5), g = (1, 1), no decay: step 1 update u = g/(|g| + ε) ≈ (1, 1),
    // ‖u‖ = √2, trust = 5/√2, w ← w − lr·trust·u = (3, 4) − 0.1·5/√2·(1, 1).
    let mut w = [3.0f32, 4.0];
    let mut c = OptimizerConfig::new(UpdateRule::Lamb);
    c.weight_decay = 0.0;
    run(c, &mut w, &[1.0, 1.0], 1, 0.1);
    let d = 0.1 * 5.0 / 2f32.sqrt();
    assert!(
        (w[0] - (3.0 - d)).abs() < 1e-5 && (w[1] - (4.0 - d)).abs() < 1e-5,
        "{w:?}"
    );
}

#[test]
fn lamb_on_two_pieces_with_completed_sums_is_bitwise_lamb_on_the_whole() {
    // Two tensors (0..700, 700..1000) updated whole by one optimizer, and cut at 450 (inside
    // the first tensor) into two "shards" by two optimizers whose pieces' sums are added.
    let grads: Vec<f32> = (0..1000)
        .map(|i| ((i as f32) * 0.37).sin() * 1e-3)
        .collect();
    let init: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.01).cos()).collect();
    let config = OptimizerConfig::new(UpdateRule::Lamb);
    let mut whole = init.clone();
    let mut one = Optimizer::new(config, device());
    let tensors = [0..700, 700..1000];
    let (mut left, mut right) = (init[..450].to_vec(), init[450..].to_vec());
    let mut two = [
        Optimizer::new(config, device()),
        Optimizer::new(config, device()),
    ];
    let left_piece = 0..450;
    let pieces: [&[Range<usize>]; 2] = [std::slice::from_ref(&left_piece), &[0..250, 250..550]];
    for _ in 0..3 {
        one.step(
            &mut [FlatParams {
                params: &mut whole,
                grads: Grads::F32(&grads),
                tensors: &tensors,
            }],
            1.0,
            1e-2,
        )
        .unwrap();
        let mut groups = [
            FlatParams {
                params: &mut left,
                grads: Grads::F32(&grads[..450]),
                tensors: pieces[0],
            },
            FlatParams {
                params: &mut right,
                grads: Grads::F32(&grads[450..]),
                tensors: pieces[1],
            },
        ];
        let mut sums = Vec::new();
        for (opt, group) in two.iter_mut().zip(&groups) {
            opt.begin_step();
            sums.push(opt.tensor_sums(0, group, 1.0, 1e-2).unwrap());
        }
        // The first tensor's total: the left piece plus the right's first piece.
        let mut first = sums[0][0];
        first.add(&sums[1][0]);
        let completed = [vec![first], vec![first, sums[1][1]]];
        for ((opt, group), sums) in two.iter_mut().zip(&mut groups).zip(&completed) {
            opt.update_group_with(0, group, 1.0, 1e-2, Some(sums))
                .unwrap();
        }
    }
    let pieced: Vec<u32> = left.iter().chain(&right).map(|w| w.to_bits()).collect();
    let expected: Vec<u32> = whole.iter().map(|w| w.to_bits()).collect();
    assert!(pieced == expected);
    assert!(whole != init);
}

#[test]
fn bf16_state_halves_the_bytes_and_tracks_f32_closely() {
    let grads: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.37).sin()).collect();
    let mut a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.01).cos()).collect();
    let mut b = a.clone();
    let f32_opt = run(
        OptimizerConfig::new(UpdateRule::AdamW),
        &mut a,
        &grads,
        5,
        1e-3,
    );
    let mut c = OptimizerConfig::new(UpdateRule::AdamW);
    c.state_dtype = StateDtype::Bf16;
    let bf16_opt = run(c, &mut b, &grads, 5, 1e-3);
    assert_eq!(
        bf16_opt.state_bytes_per_param() * 2,
        f32_opt.state_bytes_per_param()
    );
    // bf16 keeps 8 mantissa bits (relative error ≤ 2^-9 per stored moment); over 5 steps of
    // size ≤ 1e-3 the weights differ by far less than one step.
    let max_diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(max_diff < 2e-4, "{max_diff}");
}

#[test]
fn grad_multiplier_unscales_inside_the_update() {
    // SGD without momentum: w ← w − lr·(g·k). With g = 1024 and k = 1/1024 the step is lr.
    let mut w = [1.0f32];
    let mut c = OptimizerConfig::new(UpdateRule::Sgd);
    c.momentum = 0.0;
    let mut opt = Optimizer::new(c, device());
    let whole: Range<usize> = 0..1;
    let ranges = std::slice::from_ref(&whole);
    let mut groups = [FlatParams {
        params: &mut w,
        grads: Grads::F32(&[1024.0]),
        tensors: ranges,
    }];
    opt.step(&mut groups, 1.0 / 1024.0, 0.25).unwrap();
    assert_eq!(w[0], 0.75);
    assert!(opt.state_bytes().is_empty(), "plain SGD keeps no state");
}

#[test]
fn eight_bit_adamw_keeps_a_byte_per_state_element_and_an_absmax_per_block() {
    // 1,000 parameters: codes 1,000 B per moment (rounded to 1,024), ⌈1000/256⌉ = 4 absmax
    // of 4 B per moment (16 B, rounded to 512): 2·1,024 + 2·512 = 3,072 bytes.
    let mut w = vec![0.5f32; 1000];
    let g: Vec<f32> = (0..1000).map(|i| ((i % 13) as f32 - 6.0) * 1e-2).collect();
    let mut c = OptimizerConfig::new(UpdateRule::AdamW);
    c.state_dtype = StateDtype::Int8;
    let opt = run(c, &mut w, &g, 1, 0.01);
    let stats = opt.device.stats();
    assert_eq!(
        stats.category_bytes[Category::OptimizerState.index()].current,
        3072
    );
    let names: Vec<String> = opt.state_bytes().into_iter().map(|(n, ..)| n).collect();
    assert_eq!(
        names,
        [
            "group0.exp_avg.codes",
            "group0.exp_avg_sq.codes",
            "group0.exp_avg.absmax",
            "group0.exp_avg_sq.absmax"
        ]
    );
}

#[test]
fn eight_bit_adamw_follows_f32_adamw_within_the_codes_precision() {
    // The first step is exact in direction: m̂ = g and v̂ = g² come from the f32 moments, so
    // each weight moves by lr·g/(|g| + ε) as f32 AdamW's; later steps read moments that were
    // quantized to 8 bits, so the weights drift apart by a small fraction of the distance they
    // moved.
    let n = 4096;
    let g: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 101) as f32 - 50.0) * 1e-3)
        .collect();
    let mut c8 = OptimizerConfig::new(UpdateRule::AdamW);
    c8.state_dtype = StateDtype::Int8;
    let c32 = OptimizerConfig::new(UpdateRule::AdamW);
    let (mut w8, mut w32) = (vec![1.0f32; n], vec![1.0f32; n]);
    run(c8, &mut w8, &g, 1, 1e-2);
    run(c32, &mut w32, &g, 1, 1e-2);
    assert_eq!(w8, w32, "step 1 reads no quantized state");
    let (mut w8, mut w32) = (vec![1.0f32; n], vec![1.0f32; n]);
    run(c8, &mut w8, &g, 20, 1e-2);
    run(c32, &mut w32, &g, 20, 1e-2);
    let moved: f32 = w32.iter().map(|w| (w - 1.0).abs()).sum();
    let apart: f32 = w8.iter().zip(&w32).map(|(a, b)| (a - b).abs()).sum();
    assert!(
        moved > 1.0 && apart < 0.02 * moved,
        "apart {apart} of {moved}"
    );
}
