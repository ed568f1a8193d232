//! What a sequence of kernels would cost to compute, counted without computing: the shape-only
//! backend records, for every kernel it stands in for, the matmul FLOPs and the bytes
//! element-wise kernels read and write (both by storage width), the fused-attention FLOPs, and
//! the number of kernel calls. A dry run wrapped in [`count_work`] therefore yields the work of a real step,
//! recomputation included, which a speed model turns into time.
//!
//! Counting is per thread (a dry run runs its kernels on the calling thread) and only while a
//! [`count_work`] scope is open; outside one the shape-only kernels count nothing.
//!
//! Not for: timing real kernels (see the benches) or memory (the allocator counts that).

use super::{Dst, Src};
use crate::dtype::DType;
use std::cell::{Cell, RefCell};

/// A quantity per storage width: the CPU kernels run f32 natively and widen bf16 and f16 on
/// load (f16 the slowest), so each width has its own speed. Integer tensors count as f32.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerWidth {
    pub f32: f64,
    pub bf16: f64,
    pub f16: f64,
}

impl PerWidth {
    fn add(&mut self, dtype: DType, v: f64) {
        match dtype {
            DType::BF16 => self.bf16 += v,
            DType::F16 => self.f16 += v,
            DType::F32 | DType::I32 | DType::I64 => self.f32 += v,
        }
    }

    pub fn total(&self) -> f64 {
        self.f32 + self.bf16 + self.f16
    }

    /// `Σ self[w] / rate[w]`.
    pub fn over(&self, rate: &PerWidth) -> f64 {
        self.f32 / rate.f32 + self.bf16 / rate.bf16 + self.f16 / rate.f16
    }

    fn plus(self, o: PerWidth, sign: f64) -> PerWidth {
        PerWidth {
            f32: self.f32 + sign * o.f32,
            bf16: self.bf16 + sign * o.bf16,
            f16: self.f16 + sign * o.f16,
        }
    }
}

/// Work of the kernels run inside a [`count_work`] scope.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// `2·m·n·k` per matmul, by the width of its inputs.
    pub matmul_flops: PerWidth,
    /// Fused attention: forward `4·T²·D` per head (QKᵀ and PV), backward `10·T²·D` (scores
    /// recomputed, then dV, dP, dQ, dK); halved under a causal mask, whose masked tiles are
    /// skipped.
    pub attention_flops: f64,
    /// Bytes read and written by every other kernel (element-wise, reductions, norms, copies),
    /// by the width of each operand.
    pub elementwise_bytes: PerWidth,
    /// Kernel calls of any kind (a fixed cost each: dispatch, threads, small-tensor overhead).
    pub kernels: u64,
    /// The part of the matmul and attention FLOPs spent re-running checkpointed forwards
    /// (already included in the fields above).
    pub recompute_flops: f64,
    /// Collectives joined (a data-parallel rank of a dry run: see [`collective`]).
    pub collectives: u64,
    /// Elements those collectives send from this rank on a ring.
    pub collective_elements: f64,
    /// Bytes copied between the device and the host tier (offloaded activations, paged
    /// optimizer states, offloaded gradients and weights), both directions: see
    /// [`host_transfer`]. Not a kernel.
    pub host_transfer_bytes: f64,
}

impl Work {
    /// All matmul and attention FLOPs.
    pub fn flops(&self) -> f64 {
        self.matmul_flops.total() + self.attention_flops
    }

    fn plus(self, o: Work, sign: f64) -> Work {
        Work {
            matmul_flops: self.matmul_flops.plus(o.matmul_flops, sign),
            attention_flops: self.attention_flops + sign * o.attention_flops,
            elementwise_bytes: self.elementwise_bytes.plus(o.elementwise_bytes, sign),
            kernels: if sign > 0.0 {
                self.kernels + o.kernels
            } else {
                self.kernels.saturating_sub(o.kernels)
            },
            recompute_flops: self.recompute_flops + sign * o.recompute_flops,
            collectives: if sign > 0.0 {
                self.collectives + o.collectives
            } else {
                self.collectives.saturating_sub(o.collectives)
            },
            collective_elements: self.collective_elements + sign * o.collective_elements,
            host_transfer_bytes: self.host_transfer_bytes + sign * o.host_transfer_bytes,
        }
    }
}

impl Work {
    /// `self` repeated `n` times.
    pub fn times(self, n: f64) -> Work {
        Work {
            matmul_flops: PerWidth::default().plus(self.matmul_flops, n),
            attention_flops: self.attention_flops * n,
            elementwise_bytes: PerWidth::default().plus(self.elementwise_bytes, n),
            kernels: (self.kernels as f64 * n).round() as u64,
            recompute_flops: self.recompute_flops * n,
            collectives: (self.collectives as f64 * n).round() as u64,
            collective_elements: self.collective_elements * n,
            host_transfer_bytes: self.host_transfer_bytes * n,
        }
    }
}

impl std::ops::Add for Work {
    type Output = Work;
    fn add(self, o: Work) -> Work {
        self.plus(o, 1.0)
    }
}

impl std::ops::Sub for Work {
    type Output = Work;
    fn sub(self, o: Work) -> Work {
        self.plus(o, -1.0)
    }
}

thread_local! {
    static METER: RefCell<Option<Work>> = const { RefCell::new(None) };
    static RECOMPUTING: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f`, a checkpoint scope's recomputation: the FLOPs it counts are also recompute FLOPs.
pub(crate) fn recomputing<R>(f: impl FnOnce() -> R) -> R {
    RECOMPUTING.with(|r| r.set(r.get() + 1));
    let out = f();
    RECOMPUTING.with(|r| r.set(r.get() - 1));
    out
}

/// The work counted so far in the innermost open [`count_work`] scope of this thread.
pub fn work_so_far() -> Option<Work> {
    METER.with(|m| *m.borrow())
}

fn add_flops(w: &mut Work, flops: f64) {
    if RECOMPUTING.with(Cell::get) > 0 {
        w.recompute_flops += flops;
    }
}

/// Runs `f` and returns the work of the shape-only kernels it ran on this thread. Scopes nest:
/// an inner scope's work is also counted by the outer one.
pub fn count_work<R>(f: impl FnOnce() -> R) -> (R, Work) {
    let outer = METER.with(|m| m.borrow_mut().replace(Work::default()));
    let result = f();
    let inner = METER.with(|m| m.borrow_mut().take()).unwrap_or_default();
    if let Some(outer) = outer {
        METER.with(|m| *m.borrow_mut() = Some(outer.plus(inner, 1.0)));
    }
    (result, inner)
}

/// Runs `f` with counting suspended on this thread: work it does is counted by no open scope
/// (a dry run's set-up — building the model, recording an arena layout — is not a step's work).
pub fn uncounted<R>(f: impl FnOnce() -> R) -> R {
    struct Resume(Option<Work>);
    impl Drop for Resume {
        fn drop(&mut self) {
            METER.with(|m| *m.borrow_mut() = self.0.take());
        }
    }
    let _resume = Resume(METER.with(|m| m.borrow_mut().take()));
    f()
}

fn record(f: impl FnOnce(&mut Work)) {
    METER.with(|m| {
        if let Some(w) = m.borrow_mut().as_mut() {
            w.kernels += 1;
            f(w);
        }
    });
}

/// A collective that sends `sent_elements` from this rank (on a ring), joined inside a
/// [`count_work`] scope; called by the shape-only communicator of a dry run. Not a kernel.
pub fn collective(sent_elements: f64) {
    METER.with(|m| {
        if let Some(w) = m.borrow_mut().as_mut() {
            w.collectives += 1;
            w.collective_elements += sent_elements;
        }
    });
}

/// `bytes` copied between the device and the host tier inside a [`count_work`] scope (a stash
/// or fetch of an offloaded activation, a page of optimizer state, an offloaded gradient or
/// weight shard). Real and dry runs both call it; outside a scope it counts nothing.
pub fn host_transfer(bytes: u64) {
    METER.with(|m| {
        if let Some(w) = m.borrow_mut().as_mut() {
            w.host_transfer_bytes += bytes as f64;
        }
    });
}

fn bytes(dtype: DType, numel: usize) -> f64 {
    (dtype.size_in_bytes() * numel) as f64
}

/// An element-wise kernel reading `srcs` and writing `dsts`.
pub(crate) fn elementwise(srcs: &[&Src], dsts: &[&Dst]) {
    record(|w| {
        for s in srcs {
            w.elementwise_bytes
                .add(s.dtype, bytes(s.dtype, s.layout.numel()));
        }
        for d in dsts {
            w.elementwise_bytes
                .add(d.dtype, bytes(d.dtype, d.layout.numel()));
        }
    });
}

/// A kernel that only writes `dst` (fill, upload).
pub(crate) fn write_only(dst: &Dst) {
    elementwise(&[], &[dst]);
}

/// A batched `(m, k) @ (k, n)` matmul with inputs of `dtype`. With 16-bit inputs the GEMM runs
/// in f32 on widened copies: every element of both operands and of the output is converted once
/// (read in 16 bits, written in 32, or back), which is element-wise traffic of its own — small
/// products such as attention's per-head ones are dominated by it.
pub(crate) fn matmul(dtype: DType, batch: usize, m: usize, n: usize, k: usize) {
    record(|w| {
        let flops = 2.0 * (batch * m * n * k) as f64;
        w.matmul_flops.add(dtype, flops);
        add_flops(w, flops);
        if matches!(dtype, DType::BF16 | DType::F16) {
            let converted = (batch * (m * k + k * n + m * n)) as f64;
            w.elementwise_bytes.add(dtype, 6.0 * converted);
        }
    });
}

/// A fused attention over `heads` (batch × heads) of `t` positions and head width `d`.
pub(crate) fn attention(heads: usize, t: usize, d: usize, causal: bool, backward: bool) {
    record(|w| {
        let per_head = if backward { 10.0 } else { 4.0 } * (t * t * d) as f64;
        let visible = if causal { 0.5 } else { 1.0 };
        let flops = heads as f64 * per_head * visible;
        w.attention_flops += flops;
        add_flops(w, flops);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncounted_work_reaches_no_scope() {
        let ((), w) = count_work(|| {
            matmul(DType::F32, 1, 2, 3, 4);
            uncounted(|| {
                matmul(DType::F32, 1, 8, 8, 8);
                host_transfer(100);
            });
            host_transfer(7);
        });
        assert_eq!(w.matmul_flops.f32, 2.0 * 24.0);
        assert_eq!(w.kernels, 1);
        assert_eq!(w.host_transfer_bytes, 7.0);
    }

    #[test]
    fn nothing_is_counted_outside_a_scope_and_scopes_nest() {
        matmul(DType::F32, 1, 2, 3, 4); // no scope: ignored
        let ((), outer) = count_work(|| {
            matmul(DType::F32, 1, 2, 3, 4);
            let ((), inner) = count_work(|| matmul(DType::BF16, 2, 8, 8, 8));
            assert_eq!(inner.matmul_flops.bf16, 2.0 * 2.0 * 512.0);
            // Both operands and the output of each of the 2 products, 2 + 4 bytes each.
            assert_eq!(inner.elementwise_bytes.bf16, 2.0 * 3.0 * 64.0 * 6.0);
            assert_eq!(inner.kernels, 1);
        });
        assert_eq!(outer.matmul_flops.f32, 48.0);
        assert_eq!(outer.matmul_flops.bf16, 2048.0);
        assert_eq!(outer.kernels, 2);
        attention(4, 16, 8, true, false);
        let ((), a) = count_work(|| attention(4, 16, 8, true, true));
        assert_eq!(a.attention_flops, 4.0 * 10.0 * 16.0 * 16.0 * 8.0 * 0.5);
        assert_eq!(a.recompute_flops, 0.0);
        let ((), r) = count_work(|| {
            matmul(DType::F32, 1, 2, 2, 2);
            recomputing(|| matmul(DType::F32, 1, 4, 4, 4));
        });
        assert_eq!((r.matmul_flops.f32, r.recompute_flops), (144.0, 128.0));
        let ((), c) = count_work(|| {
            collective(1.5);
            collective(2.5);
        });
        assert_eq!(
            (c.collectives, c.collective_elements, c.kernels),
            (2, 4.0, 0)
        );
        assert_eq!(c.times(3.0).collectives, 6);
        assert_eq!((c - c.times(0.5)).collective_elements, 2.0);
    }
}
