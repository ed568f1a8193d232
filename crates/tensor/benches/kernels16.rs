//! The non-GEMM kernels of a GPT step in f32 against bf16, on the shapes of the issue-18 GPT
//! (micro-batch 16 × 256 tokens, width 384, MLP width 1536, 6 heads): each op's forward plus
//! backward, so a 16-bit kernel that is slower per element than its f32 twin shows here.
//! 16-bit kernels read and write half the bytes; with f32 arithmetic in registers they should
//! run at least as fast as f32.
//!
//! Run: `cargo bench -p headroom-tensor --bench kernels16`

mod common;

use divan::Bencher;
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor};

const TOKENS: usize = 16 * 256;
const WIDTH: usize = 384;
const MLP: usize = 4 * WIDTH;
const HEADS: usize = 6;
const SEQ: usize = 256;

fn main() {
    divan::main();
}

fn dtype(bf16: bool) -> DType {
    if bf16 { DType::BF16 } else { DType::F32 }
}

fn tensor(device: &Device, shape: &[usize], seed: u32, dt: DType) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_f32(
        device,
        shape,
        &common::values(n, seed),
        dt,
        Category::Input,
        None,
    )
    .unwrap()
    .track()
}

/// Forward and backward of `op` on inputs of the given shapes. The loss sums the output's first
/// row only, so that its own cost (a serial sum) stays out of the figures; backward still runs
/// every kernel over the whole output.
fn fwd_bwd(bencher: Bencher, bf16: bool, shapes: &[&[usize]], op: fn(&[Tensor]) -> Tensor) {
    let device = Device::cpu(8 << 30, AllocatorConfig::default());
    let xs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| tensor(&device, s, i as u32 + 1, dtype(bf16)))
        .collect();
    bencher.bench_local(|| {
        let tape = Tape::new();
        let loss = tape.record(|| op(&xs).narrow(0, 0, 1)?.sum_all()).unwrap();
        let mut grads = Gradients::new();
        tape.backward(&loss, &mut grads).unwrap();
        grads
    });
}

#[divan::bench(args = [false, true])]
fn gelu(bencher: Bencher, bf16: bool) {
    fwd_bwd(bencher, bf16, &[&[TOKENS, MLP]], |x| x[0].gelu().unwrap());
}

#[divan::bench(args = [false, true])]
fn bias_add(bencher: Bencher, bf16: bool) {
    fwd_bwd(bencher, bf16, &[&[TOKENS, MLP], &[MLP]], |x| {
        x[0].add(&x[1]).unwrap()
    });
}

#[divan::bench(args = [false, true])]
fn residual_add(bencher: Bencher, bf16: bool) {
    fwd_bwd(bencher, bf16, &[&[TOKENS, WIDTH], &[TOKENS, WIDTH]], |x| {
        x[0].add(&x[1]).unwrap()
    });
}

#[divan::bench(args = [false, true])]
fn layer_norm(bencher: Bencher, bf16: bool) {
    fwd_bwd(
        bencher,
        bf16,
        &[&[TOKENS, WIDTH], &[WIDTH], &[WIDTH]],
        |x| x[0].layer_norm(&x[1], &x[2], 1e-5).unwrap(),
    );
}

#[divan::bench(args = [false, true])]
fn masked_softmax(bencher: Bencher, bf16: bool) {
    fwd_bwd(bencher, bf16, &[&[16, HEADS, SEQ, SEQ]], |x| {
        x[0].scale(0.125)
            .unwrap()
            .causal_mask()
            .unwrap()
            .softmax()
            .unwrap()
    });
}

/// The same probabilities as one op that computes only the kept (past) half.
#[divan::bench(args = [false, true])]
fn causal_softmax(bencher: Bencher, bf16: bool) {
    fwd_bwd(bencher, bf16, &[&[16, HEADS, SEQ, SEQ]], |x| {
        x[0].causal_softmax(0.125).unwrap()
    });
}

/// The MLP's GELU and output projection, GELU's output saved for the projection's backward.
#[divan::bench(args = [false, true])]
fn gelu_then_linear(bencher: Bencher, bf16: bool) {
    fwd_bwd(
        bencher,
        bf16,
        &[&[TOKENS, MLP], &[MLP, WIDTH], &[WIDTH]],
        |x| x[0].gelu().unwrap().linear(&x[1], &x[2]).unwrap(),
    );
}

/// The same as one op that recomputes GELU's output in backward instead of saving it.
#[divan::bench(args = [false, true])]
fn gelu_linear(bencher: Bencher, bf16: bool) {
    fwd_bwd(
        bencher,
        bf16,
        &[&[TOKENS, MLP], &[MLP, WIDTH], &[WIDTH]],
        |x| x[0].gelu_linear(&x[1], &x[2]).unwrap(),
    );
}

#[divan::bench(args = [false, true])]
fn head_split(bencher: Bencher, bf16: bool) {
    // The (B, T, 3C) → (B, H, T, D) views a GPT's attention makes contiguous.
    fwd_bwd(bencher, bf16, &[&[16, SEQ, 3 * WIDTH]], |x| {
        x[0].narrow(2, 0, WIDTH)
            .unwrap()
            .reshape(&[16, SEQ, HEADS, WIDTH / HEADS])
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap()
            .scale(1.0)
            .unwrap()
    });
}
