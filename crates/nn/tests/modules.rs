//! The module layer against hand-derived values and properties: slots and their layout, a
//! linear layer with and without its LoRA adapter, SwiGLU from the definition of SiLU,
//! attention over one position (its softmax is 1, so it is the value and output projections)
//! and fused against separate projections, and a missing weight named with its block.

use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::modules::{
    Attention, AttentionShape, Linear, LinearWeight, LoraAdapter, QkvProjection, RmsNorm,
    RotaryEmbedding, Slot, SwiGlu, Weights, slot_pairs,
};
use headroom_strategy::Attention as AttentionKind;
use headroom_tensor::{DType, ParamBlock, Tensor};

fn device() -> Device {
    Device::cpu(64 << 20, AllocatorConfig::default())
}

fn tensor(d: &Device, shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_f32(d, shape, v, DType::F32, Category::Input, None).unwrap()
}

fn close(got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: {g} vs {w}"
        );
    }
}

/// A block laid out from `slots` holding `values` back to back.
fn block(d: &Device, slots: &[Slot], values: &[f32]) -> ParamBlock {
    let b = ParamBlock::new(d, "layer", &slot_pairs(slots), DType::F32).unwrap();
    b.set_values(values).unwrap();
    b
}

/// Deterministic values with no structure a bug could hide behind.
fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 * 0.7 + seed).sin() * 0.5)
        .collect()
}

#[test]
fn slots_are_named_and_shaped_as_the_modules_say() {
    let s = Linear::slots("mlp.fc", 3, 5, true);
    assert_eq!(
        s,
        [Slot::new("mlp.fc.w", &[3, 5]), Slot::new("mlp.fc.b", &[5])]
    );
    assert_eq!(Linear::slots("o", 4, 4, false), [Slot::new("o.w", &[4, 4])]);
    let shape = AttentionShape {
        width: 8,
        heads: 2,
        kv_heads: 2,
        bias: true,
    };
    let names: Vec<(String, Vec<usize>)> = shape
        .fused_slots("attn", "qkv", "proj")
        .into_iter()
        .map(|s| (s.name, s.shape))
        .collect();
    assert_eq!(
        names,
        [
            ("attn.qkv.w".to_string(), vec![8, 24]),
            ("attn.qkv.b".to_string(), vec![24]),
            ("attn.proj.w".to_string(), vec![8, 8]),
            ("attn.proj.b".to_string(), vec![8]),
        ]
    );
    // SwiGLU: gate and up 4·6 + 6 each, down 6·4 + 4.
    let sw = SwiGlu::slots("mlp", 4, 6, true);
    assert_eq!(sw.iter().map(Slot::numel).sum::<usize>(), 2 * 30 + 28);
    assert_eq!(sw[4].name, "mlp.down.w");
}

#[test]
fn a_linear_layer_and_its_adapter_give_the_hand_derived_values() {
    let d = device();
    let slots = Linear::slots("fc", 2, 3, true);
    // W = [[1, 0, 2], [0, 1, -1]], b = [0.5, -0.5, 1].
    let b = block(&d, &slots, &[1., 0., 2., 0., 1., -1., 0.5, -0.5, 1.]);
    let no_nf4 = [];
    let w = Weights::new(&b, &no_nf4);
    let x = tensor(&d, &[1, 2], &[1., 2.]);
    let plain = Linear::load(&w, "fc", true, None).unwrap();
    assert!(matches!(plain.weight, LinearWeight::Dense(_)));
    // x·W = [1, 2, 0]; + b.
    close(
        &plain.forward(&x).unwrap().to_vec_f32().unwrap(),
        &[1.5, 1.5, 1.0],
        0.0,
    );
    // A = [[1], [1]] (2 × 1), B = [[1, 2, 3]] (1 × 3), scale 0.5: x·A = 3, update [1.5, 3, 4.5].
    let adapter = LoraAdapter {
        a: tensor(&d, &[2, 1], &[1., 1.]),
        b: tensor(&d, &[1, 3], &[1., 2., 3.]),
        scale: 0.5,
    };
    let adapted = Linear::load(&w, "fc", true, Some(adapter)).unwrap();
    close(
        &adapted.forward(&x).unwrap().to_vec_f32().unwrap(),
        &[3.0, 4.5, 5.5],
        0.0,
    );
    // Without a bias the layer is x·W alone.
    let slots = Linear::slots("fc", 2, 3, false);
    let b = block(&d, &slots, &[1., 0., 2., 0., 1., -1.]);
    let w = Weights::new(&b, &no_nf4);
    let bare = Linear::load(&w, "fc", false, None).unwrap();
    close(
        &bare.forward(&x).unwrap().to_vec_f32().unwrap(),
        &[1.0, 2.0, 0.0],
        0.0,
    );
}

#[test]
fn swiglu_is_silu_of_the_gate_times_the_up_projection_then_down() {
    let d = device();
    let (c, h) = (2, 3);
    let slots = SwiGlu::slots("mlp", c, h, false);
    let n: usize = slots.iter().map(Slot::numel).sum();
    let v = values(n, 0.3);
    let b = block(&d, &slots, &v);
    let no_nf4 = [];
    let w = Weights::new(&b, &no_nf4).pp("mlp");
    let m = SwiGlu {
        gate: Linear::load(&w, "gate", false, None).unwrap(),
        up: Linear::load(&w, "up", false, None).unwrap(),
        down: Linear::load(&w, "down", false, None).unwrap(),
    };
    let x = [0.8f32, -1.3];
    let got = m
        .forward(&tensor(&d, &[1, c], &x))
        .unwrap()
        .to_vec_f32()
        .unwrap();
    // By hand in f64: gate = x·G, up = x·U, y = (silu(gate) ⊙ up)·D, silu(z) = z/(1 + e^−z).
    let (g, rest) = v.split_at(c * h);
    let (u, dn) = rest.split_at(c * h);
    let proj = |m: &[f32], j: usize| (0..c).map(|i| x[i] as f64 * m[i * h + j] as f64).sum();
    let hidden: Vec<f64> = (0..h)
        .map(|j| {
            let z: f64 = proj(g, j);
            z / (1.0 + (-z).exp()) * proj(u, j)
        })
        .collect();
    let want: Vec<f64> = (0..c)
        .map(|k| (0..h).map(|j| hidden[j] * dn[j * c + k] as f64).sum())
        .collect();
    close(&got, &want, 1e-6);
}

#[test]
fn rms_norm_module_is_the_definition() {
    let d = device();
    let slots = RmsNorm::slots("norm", 4);
    let b = block(&d, &slots, &[1.0, 2.0, 0.5, -1.0]);
    let no_nf4 = [];
    let n = RmsNorm::load(&Weights::new(&b, &no_nf4), "norm", 1e-6).unwrap();
    let x = [1.0f32, -2.0, 3.0, 4.0];
    let got = n
        .forward(&tensor(&d, &[1, 4], &x))
        .unwrap()
        .to_vec_f32()
        .unwrap();
    // mean(x²) = (1 + 4 + 9 + 16)/4 = 7.5.
    let r = 1.0 / (7.5f64 + 1e-6).sqrt();
    close(&got, &[r, -4.0 * r, 1.5 * r, -4.0 * r], 1e-6);
}

fn attention(w: &Weights, fused: bool, shape: AttentionShape, kind: AttentionKind) -> Attention {
    let qkv = match fused {
        true => QkvProjection::Fused {
            qkv: Linear::load(w, "qkv", true, None).unwrap(),
            parts: [None, None, None],
        },
        false => QkvProjection::Separate {
            q: Linear::load(w, "q", true, None).unwrap(),
            k: Linear::load(w, "k", true, None).unwrap(),
            v: Linear::load(w, "v", true, None).unwrap(),
        },
    };
    Attention {
        shape,
        qkv,
        out: Linear::load(w, if fused { "proj" } else { "o" }, true, None).unwrap(),
        kind,
        dropout: 0.0,
        selective: false,
        rotary: None,
        window: None,
        parallel: None,
    }
}

#[test]
fn attention_over_one_position_is_the_value_then_the_output_projection() {
    let d = device();
    let shape = AttentionShape {
        width: 4,
        heads: 2,
        kv_heads: 2,
        bias: true,
    };
    let slots = shape.separate_slots("", ["q", "k", "v", "o"]);
    let n: usize = slots.iter().map(Slot::numel).sum();
    let v = values(n, 1.1);
    let b = block(&d, &slots, &v);
    let no_nf4 = [];
    let w = Weights::new(&b, &no_nf4);
    let x = [0.3f32, -0.7, 1.2, 0.1];
    // T = 1: each head's softmax over its one key is 1, so the output is (x·Wv + bv)·Wo + bo.
    let param = |name: &str| {
        let at: usize = slots
            .iter()
            .take_while(|s| s.name != name)
            .map(Slot::numel)
            .sum();
        let s = slots.iter().find(|s| s.name == name).unwrap();
        v[at..at + s.numel()]
            .iter()
            .map(|&x| x as f64)
            .collect::<Vec<_>>()
    };
    let affine = |x: &[f64], m: &[f64], bias: &[f64]| -> Vec<f64> {
        (0..4)
            .map(|j| bias[j] + (0..4).map(|i| x[i] * m[i * 4 + j]).sum::<f64>())
            .collect()
    };
    let xv: Vec<f64> = x.iter().map(|&x| x as f64).collect();
    let value = affine(&xv, &param("v.w"), &param("v.b"));
    let want = affine(&value, &param("o.w"), &param("o.b"));
    for kind in [AttentionKind::Naive, AttentionKind::MemoryEfficient] {
        let a = attention(&w, false, shape, kind);
        let got = a
            .forward(&tensor(&d, &[1, 1, 4], &x))
            .unwrap()
            .to_vec_f32()
            .unwrap();
        close(&got, &want, 1e-5);
    }
}

#[test]
fn fused_and_separate_projections_give_the_same_attention() {
    let d = device();
    let (c, t) = (4, 3);
    let shape = AttentionShape {
        width: c,
        heads: 2,
        kv_heads: 2,
        bias: true,
    };
    let sep_slots = shape.separate_slots("", ["q", "k", "v", "o"]);
    let n: usize = sep_slots.iter().map(Slot::numel).sum();
    let sv = values(n, 2.3);
    // The fused weight's columns are q's, then k's, then v's; its bias likewise.
    let (mut qkv_w, mut qkv_b) = (vec![0.0; c * 3 * c], vec![0.0; 3 * c]);
    for p in 0..3 {
        let at = p * (c * c + c);
        for i in 0..c {
            for j in 0..c {
                qkv_w[i * 3 * c + p * c + j] = sv[at + i * c + j];
            }
        }
        qkv_b[p * c..(p + 1) * c].copy_from_slice(&sv[at + c * c..at + c * c + c]);
    }
    let mut fv = qkv_w;
    fv.extend(&qkv_b);
    fv.extend(&sv[3 * (c * c + c)..]);
    let fused_slots = shape.fused_slots("", "qkv", "proj");
    let (bs, bf) = (block(&d, &sep_slots, &sv), block(&d, &fused_slots, &fv));
    let no_nf4 = [];
    let x = tensor(&d, &[1, t, c], &values(t * c, 0.9));
    let sep = attention(
        &Weights::new(&bs, &no_nf4),
        false,
        shape,
        AttentionKind::Naive,
    )
    .forward(&x)
    .unwrap()
    .to_vec_f32()
    .unwrap();
    let fused = attention(
        &Weights::new(&bf, &no_nf4),
        true,
        shape,
        AttentionKind::Naive,
    )
    .forward(&x)
    .unwrap()
    .to_vec_f32()
    .unwrap();
    let want: Vec<f64> = sep.iter().map(|&v| v as f64).collect();
    close(&fused, &want, 1e-6);
}

#[test]
fn a_missing_weight_is_named_with_its_block() {
    let d = device();
    let b = block(&d, &Linear::slots("fc", 2, 2, false), &[0.0; 4]);
    let no_nf4 = [];
    let e = Linear::load(&Weights::new(&b, &no_nf4), "fc", true, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer") && e.contains("fc.b"), "{e}");
}

/// Causal attention computed in f64 by its definition, the Llama way: q = x·Wq, k = x·Wk,
/// v = x·Wv (no biases); pairs (i, i + D/2) of q and k rotated by p·base^(−2i/D); query head j
/// reads key/value head j / (H / KV); softmax(q·kᵀ/√D) over positions ≤ its own; then ·Wo.
#[allow(clippy::too_many_arguments)]
fn reference_attention(
    x: &[f64],
    (wq, wk, wv, wo): (&[f64], &[f64], &[f64], &[f64]),
    t: usize,
    c: usize,
    heads: usize,
    kv_heads: usize,
    base: f64,
) -> Vec<f64> {
    let d = c / heads;
    let project = |w: &[f64], out: usize| -> Vec<f64> {
        (0..t * out)
            .map(|k| {
                let (p, j) = (k / out, k % out);
                (0..c).map(|i| x[p * c + i] * w[i * out + j]).sum()
            })
            .collect()
    };
    let rotate = |v: &mut [f64], n: usize| {
        for p in 0..t {
            for h in 0..n {
                let row = &mut v[(p * n + h) * d..(p * n + h + 1) * d];
                for i in 0..d / 2 {
                    let a = p as f64 * base.powf(-2.0 * i as f64 / d as f64);
                    let (x1, x2) = (row[i], row[i + d / 2]);
                    row[i] = x1 * a.cos() - x2 * a.sin();
                    row[i + d / 2] = x2 * a.cos() + x1 * a.sin();
                }
            }
        }
    };
    let (mut q, mut k) = (project(wq, c), project(wk, kv_heads * d));
    let v = project(wv, kv_heads * d);
    rotate(&mut q, heads);
    rotate(&mut k, kv_heads);
    let mut y = vec![0.0; t * c];
    for h in 0..heads {
        let g = h / (heads / kv_heads);
        for p in 0..t {
            let qv = &q[(p * heads + h) * d..(p * heads + h + 1) * d];
            let scores: Vec<f64> = (0..=p)
                .map(|s| {
                    let kv = &k[(s * kv_heads + g) * d..(s * kv_heads + g + 1) * d];
                    qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for j in 0..d {
                y[p * c + h * d + j] = (0..=p)
                    .map(|s| e[s] / z * v[(s * kv_heads + g) * d + j])
                    .sum();
            }
        }
    }
    (0..t * c)
        .map(|k| {
            let (p, j) = (k / c, k % c);
            (0..c).map(|i| y[p * c + i] * wo[i * c + j]).sum()
        })
        .collect()
}

#[test]
fn grouped_query_attention_with_rotary_positions_is_the_definition() {
    let d = device();
    let (t, c, base) = (5, 16, 100.0);
    for kv_heads in [1, 2, 4] {
        let shape = AttentionShape {
            width: c,
            heads: 4,
            kv_heads,
            bias: false,
        };
        let slots = shape.separate_slots("", ["q", "k", "v", "o"]);
        let n: usize = slots.iter().map(Slot::numel).sum();
        let v = values(n, 0.4 + kv_heads as f32);
        let b = block(&d, &slots, &v);
        let no_nf4 = [];
        let w = Weights::new(&b, &no_nf4);
        let rotary = RotaryEmbedding { head_dim: 4, base };
        let xv = values(t * c, 1.7);
        let v64: Vec<f64> = v.iter().map(|&x| x as f64).collect();
        let kvw = shape.kv_width();
        let (wq, rest) = v64.split_at(c * c);
        let (wk, rest) = rest.split_at(c * kvw);
        let (wv, wo) = rest.split_at(c * kvw);
        let x64: Vec<f64> = xv.iter().map(|&x| x as f64).collect();
        let want = reference_attention(&x64, (wq, wk, wv, wo), t, c, 4, kv_heads, base);
        for kind in [AttentionKind::Naive, AttentionKind::MemoryEfficient] {
            let a = Attention {
                shape,
                qkv: QkvProjection::Separate {
                    q: Linear::load(&w, "q", false, None).unwrap(),
                    k: Linear::load(&w, "k", false, None).unwrap(),
                    v: Linear::load(&w, "v", false, None).unwrap(),
                },
                out: Linear::load(&w, "o", false, None).unwrap(),
                kind,
                dropout: 0.0,
                selective: false,
                rotary: Some(rotary.tables(&d, t).unwrap()),
                window: None,
                parallel: None,
            };
            let got = a
                .forward(&tensor(&d, &[1, t, c], &xv))
                .unwrap()
                .to_vec_f32()
                .unwrap();
            close(&got, &want, 1e-5);
        }
    }
}

#[test]
fn key_value_heads_that_do_not_divide_the_heads_are_refused() {
    let shape = AttentionShape {
        width: 12,
        heads: 6,
        kv_heads: 4,
        bias: false,
    };
    let e = shape.validate().unwrap_err().to_string();
    assert!(e.contains("key/value heads 4"), "{e}");
}
