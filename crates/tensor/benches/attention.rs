//! Forward + backward time of the fused memory-efficient attention (`Tensor::attention`)
//! against the naive composition `softmax(causal_mask(q kᵀ·scale)) v`, causal, f32,
//! B = 4, H = 4, D = 32 (a GPT-small-like head shape) at T = 128 and 512.
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
    bencher.bench_local(|| {
        let tape = Tape::new();
        let loss = tape
            .record(|| {
                let out = if fused {
                    Tensor::attention(&q, &k, &v, true, scale, 0.0)?
                } else {
                    q.matmul(&k.transpose(-1, -2)?)?
                        .scale(scale)?
                        .causal_mask()?
                        .softmax()?
                        .matmul(&v)?
                };
                out.sum_all()
            })
            .unwrap();
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
