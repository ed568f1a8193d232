//! Dry runs for recomputation planning: the model is built on a shape-only device (addresses but
//! no bytes, the real allocator) and one micro-batch runs forward — and, for a plan's peak,
//! backward — with the same ops, saved tensors and frees as a real step, in milliseconds. The
//! `activation` category's bytes then calibrate the chain model exactly.
//!
//! Not for: predicting a whole run (the planner's dry-run planning builds on this later).

use super::chain::Chain;
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::models::{ModelSpec, build_model};
use headroom_nn::{Model, Recompute};
use headroom_tensor::{DType, Gradients, Result, Tape, Tensor};

/// Capacity of the dry-run device: large enough never to bind.
const DRY_CAPACITY: u64 = 1 << 46;

fn setup(
    spec: &ModelSpec,
    dtype: DType,
    micro_batch: usize,
    seq_len: usize,
) -> Result<(Device, Box<dyn Model>, Tensor, Tensor)> {
    let device = Device::shape_only(DRY_CAPACITY, AllocatorConfig::default());
    let model = build_model("dry-run", spec, &device, dtype, 0)?;
    let shape = [micro_batch, seq_len];
    let zeros = vec![0i64; micro_batch * seq_len];
    let x = Tensor::from_i64(
        &device,
        &shape,
        &zeros,
        DType::I64,
        Category::Input,
        Some("tokens"),
    )?;
    let y = Tensor::from_i64(
        &device,
        &shape,
        &zeros,
        DType::I64,
        Category::Input,
        Some("targets"),
    )?;
    Ok((device, model, x, y))
}

fn activation(device: &Device) -> (u64, u64) {
    let s = device.stats();
    let a = &s.category_bytes[Category::Activation.index()];
    (a.current as u64, a.peak as u64)
}

/// Activation bytes held at the end of forward under `recompute`.
pub fn after_forward(
    spec: &ModelSpec,
    dtype: DType,
    micro_batch: usize,
    seq_len: usize,
    recompute: &Recompute,
) -> Result<u64> {
    let (device, model, x, y) = setup(spec, dtype, micro_batch, seq_len)?;
    let tape = Tape::new();
    let _loss = tape.record(|| model.loss(&x, &y, recompute))?;
    Ok(activation(&device).0)
}

/// The peak of the `activation` category over one forward and backward under `recompute`.
pub fn activation_peak(
    spec: &ModelSpec,
    dtype: DType,
    micro_batch: usize,
    seq_len: usize,
    recompute: &Recompute,
) -> Result<u64> {
    Ok(peaks(spec, dtype, micro_batch, seq_len, recompute)?.0)
}

/// Peaks over one forward and backward under `recompute`: the `activation` category's and all
/// allocated bytes' (parameters and gradients included; no optimizer state).
pub fn peaks(
    spec: &ModelSpec,
    dtype: DType,
    micro_batch: usize,
    seq_len: usize,
    recompute: &Recompute,
) -> Result<(u64, u64)> {
    let (device, model, x, y) = setup(spec, dtype, micro_batch, seq_len)?;
    let mut grads = Gradients::new();
    for b in model.blocks() {
        b.bind_grads(&mut grads)?;
    }
    let tape = Tape::new();
    let loss = tape.record(|| model.loss(&x, &y, recompute))?;
    tape.backward(&loss, &mut grads)?;
    Ok((
        activation(&device).1,
        device.stats().allocated_bytes.all.peak as u64,
    ))
}

/// The chain model of a model whose repeated blocks are identical, from three dry forwards:
/// no recomputation (A₀ = n·(in + inner) + head), one segment over all blocks (A₁ = in + head)
/// and one segment per block (Aₙ = n·in + head): in = (Aₙ − A₁)/(n − 1), head = A₁ − in,
/// in + inner = (A₀ − head)/n. Costs are one per block.
pub fn measure_chain(
    spec: &ModelSpec,
    dtype: DType,
    micro_batch: usize,
    seq_len: usize,
) -> Result<Chain> {
    let n = spec.depth();
    let plain = after_forward(spec, dtype, micro_batch, seq_len, &Recompute::none())?;
    let one = after_forward(
        spec,
        dtype,
        micro_batch,
        seq_len,
        &Recompute {
            segments: std::iter::once(0..n).collect(),
            selective: false,
            ..Default::default()
        },
    )?;
    let per_block = after_forward(
        spec,
        dtype,
        micro_batch,
        seq_len,
        &Recompute {
            segments: (0..n).map(|i| i..i + 1).collect(),
            selective: false,
            ..Default::default()
        },
    )?;
    let input = if n > 1 {
        per_block.saturating_sub(one) / (n as u64 - 1)
    } else {
        0
    };
    let head = one.saturating_sub(input);
    let full = plain.saturating_sub(head) / n.max(1) as u64;
    let mut chain = Chain::uniform(n, input, full.saturating_sub(input), 0);
    chain.head = head;
    Ok(chain)
}
