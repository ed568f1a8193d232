//! Forward + backward time of the fused memory-efficient attention (`Tensor::attention`)
//! against the naive composition `softmax(causal_mask(q kᵀ·scale)) v`, causal, f32,
//! B = 4, H = 4, D = 32 (a GPT-small-like head shape) at T = 128 and 512.
//!
//! The `gpt_*` benches time one attention layer of the issue-18 GPT (B = 16, H = 6, T = 256,
//! D = 64) as the model runs it: q, k and v are head views of one `(B, T, 3C)` projection and
//! the naive path uses the fused `causal_softmax`. `benches/pytorch/attention_peer.py` times
//! PyTorch's counterparts (materialised scores and `scaled_dot_product_attention`).
//!
//! Run: `cargo bench -p headroom-tensor --bench attention`

mod common;

use divan::Bencher;
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor};

const LENGTHS: [usize; 2] = [128, 512];
const SHAPE: [usize; 3] = [4, 4, 32]; // B, H, D

fn main() {
    divan::main();
}

fn fwd_bwd(bencher: Bencher, t: usize, fused: bool) {
    let device = Device::cpu(4 << 30, AllocatorConfig::default());
    let [b, h, d] = SHAPE;
    let shape = [b, h, t, d];
    let n = b * h * t * d;
    let mk = |seed| {
        Tensor::from_f32(
            &device,
            &shape,
            &common::values(n, seed),
            DType::F32,
            Category::Input,
            None,
        )
        .unwrap()
        .track()
    };
    let (q, k, v) = (mk(1), mk(2), mk(3));
    let scale = 1.0 / (d as f32).sqrt();
    time_fwd_bwd(bencher, || {
        Ok(if fused {
            Tensor::attention(&q, &k, &v, true, scale, 0.0)?
        } else {
            q.matmul(&k.transpose(-1, -2)?)?
                .scale(scale)?
                .causal_mask()?
                .softmax()?
                .matmul(&v)?
        })
    });
}

/// Times `attention()` forward, then backward from the sum of its output.
fn time_fwd_bwd(bencher: Bencher, attention: impl Fn() -> headroom_tensor::Result<Tensor>) {
    bencher.bench_local(|| {
        let tape = Tape::new();
        let loss = tape.record(|| attention()?.sum_all()).unwrap();
        let mut grads = Gradients::new();
        tape.backward(&loss, &mut grads).unwrap();
        grads
    });
}

#[divan::bench(args = LENGTHS)]
fn naive(bencher: Bencher, t: usize) {
    fwd_bwd(bencher, t, false);
}

#[divan::bench(args = LENGTHS)]
fn memory_efficient(bencher: Bencher, t: usize) {
    fwd_bwd(bencher, t, true);
}

/// One attention layer of the issue-18 GPT, forward and backward, inputs shaped as the model
/// shapes them (head views of one projection): the fused kernel, or the materialised core the
/// model's naive attention runs.
fn gpt_layer(bencher: Bencher, fused: bool) {
    let device = Device::cpu(4 << 30, AllocatorConfig::default());
    let (b, h, t, d) = (16, 6, 256, 64);
    let c = h * d;
    let qkv = Tensor::from_f32(
        &device,
        &[b, t, 3 * c],
        &common::values(b * t * 3 * c, 1),
        DType::F32,
        Category::Input,
        None,
    )
    .unwrap()
    .track();
    let scale = 1.0 / (d as f32).sqrt();
    let head = |i: usize| {
        qkv.narrow(2, i * c, c)?
            .reshape(&[b, t, h, d])?
            .permute(&[0, 2, 1, 3])
    };
    time_fwd_bwd(bencher, || {
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        if fused {
            Tensor::attention(&q, &k, &v, true, scale, 0.0)
        } else {
            Tensor::causal_attention_materialized(&q, &k, &v, None, scale, 0.0)
        }
    });
}

#[divan::bench(sample_count = 20)]
fn gpt_naive(bencher: Bencher) {
    gpt_layer(bencher, false);
}

#[divan::bench(sample_count = 20)]
fn gpt_memory_efficient(bencher: Bencher) {
    gpt_layer(bencher, true);
}
