//! The backend of a shape-only device: buffers have addresses but no bytes, so every kernel is
//! a no-op. Running a step on it exercises the real allocator with the real sizes and order of
//! allocations, which is what a dry run measures. Inside a `work::count_work` scope every kernel
//! also records the work it stands for. Reading data back is an error.
//!
//! Not for: anything that needs values.

use super::work::{self, elementwise, write_only};
use super::{AttentionSpec, Backend, BinaryOp, CausalProduct, Dst, ReduceOp, Src, UnaryOp};
use crate::error::{Result, TensorError};

#[derive(Debug)]
pub struct ShapeOnlyBackend;

impl Backend for ShapeOnlyBackend {
    fn name(&self) -> &'static str {
        "shape-only"
    }
    fn fill(&self, dst: &mut Dst, _: f32) -> Result<()> {
        write_only(dst);
        Ok(())
    }
    fn copy(&self, src: &Src, dst: &mut Dst) -> Result<()> {
        elementwise(&[src], &[dst]);
        Ok(())
    }
    fn add_assign(&self, dst: &mut Dst, src: &Src) -> Result<()> {
        elementwise(&[src, src], &[dst]);
        Ok(())
    }
    fn upload_f32(&self, _: &[f32], dst: &mut Dst) -> Result<()> {
        write_only(dst);
        Ok(())
    }
    fn upload_i64(&self, _: &[i64], dst: &mut Dst) -> Result<()> {
        write_only(dst);
        Ok(())
    }
    fn download_f32(&self, _: &Src) -> Result<Vec<f32>> {
        Err(TensorError::ShapeOnly { op: "download" })
    }
    fn download_i64(&self, _: &Src) -> Result<Vec<i64>> {
        Err(TensorError::ShapeOnly { op: "download" })
    }
    fn unary(&self, _: UnaryOp, x: &Src, dst: &mut Dst) -> Result<()> {
        elementwise(&[x], &[dst]);
        Ok(())
    }
    fn binary(&self, _: BinaryOp, a: &Src, b: &Src, dst: &mut Dst) -> Result<()> {
        elementwise(&[a, b], &[dst]);
        Ok(())
    }
    fn reduce(&self, _: ReduceOp, x: &Src, _: &[usize], dst: &mut Dst) -> Result<()> {
        elementwise(&[x], &[dst]);
        Ok(())
    }
    /// No arithmetic, but the same `temporary` scratch as the CPU kernel in use.
    fn matmul(&self, a: &Src, _: &Src, dst: &mut Dst) -> Result<()> {
        let s = dst.layout.shape();
        let r = s.len();
        let d = super::cpu::matmul::Dims {
            batch: crate::shape::numel(&s[..r - 2]),
            m: s[r - 2],
            n: s[r - 1],
            k: a.layout.shape()[r - 1],
        };
        work::matmul(a.dtype, d.batch, d.m, d.n, d.k);
        if d.m * d.n > 0 && d.k > 0 {
            match a.dtype {
                crate::dtype::DType::BF16 => {
                    drop(super::cpu::matmul::bf16_scratch(dst.buf.device(), d)?)
                }
                crate::dtype::DType::F16 => {
                    drop(super::cpu::matmul::widening_scratch(dst.buf.device(), d)?)
                }
                _ => {}
            }
        }
        Ok(())
    }
    /// The work the CPU does: its panels in f32, else the full product and its scratch.
    fn matmul_causal(&self, a: &Src, b: &Src, dst: &mut Dst, kind: CausalProduct) -> Result<()> {
        use super::cpu::matmul_causal::{Panel, causal_fits, panels};
        let d = super::cpu::matmul::Dims::of(a, dst);
        if !causal_fits(a.dtype, &d, kind) {
            return self.matmul(a, b, dst);
        }
        for Panel { rows, n, k } in panels(&d, kind) {
            work::matmul(a.dtype, d.batch, rows.len(), n, k);
        }
        Ok(())
    }
    /// The matmul's scratch and work; the bias adds neither.
    fn matmul_bias(&self, a: &Src, b: &Src, _: &Src, dst: &mut Dst) -> Result<()> {
        self.matmul(a, b, dst)
    }
    fn softmax(&self, x: &Src, _: bool, dst: &mut Dst) -> Result<()> {
        elementwise(&[x], &[dst]);
        Ok(())
    }
    fn softmax_backward(&self, y: &Src, dy: &Src, _: bool, dst: &mut Dst) -> Result<()> {
        elementwise(&[y, dy], &[dst]);
        Ok(())
    }
    fn layer_norm(
        &self,
        x: &Src,
        _: &Src,
        _: &Src,
        _: f32,
        y: &mut Dst,
        mean: &mut Dst,
        rstd: &mut Dst,
    ) -> Result<()> {
        elementwise(&[x, x], &[y, mean, rstd]);
        Ok(())
    }
    fn layer_norm_backward(
        &self,
        x: &Src,
        _: &Src,
        mean: &Src,
        rstd: &Src,
        dy: &Src,
        dx: &mut Dst,
        dw: &mut Dst,
        db: &mut Dst,
    ) -> Result<()> {
        // The CPU kernel's f32 accumulators of dw and db, allocated and freed around it.
        let c = *x.layout.shape().last().unwrap_or(&1);
        drop(super::cpu::scratch_f32(
            dx.buf.device(),
            2 * c,
            "layer_norm.dw_db",
        )?);
        elementwise(&[x, mean, rstd, dy], &[dx, dw, db]);
        Ok(())
    }
    fn rms_norm(&self, x: &Src, _: &Src, _: f32, y: &mut Dst, rstd: &mut Dst) -> Result<()> {
        elementwise(&[x, x], &[y, rstd]);
        Ok(())
    }
    fn rms_norm_backward(
        &self,
        x: &Src,
        _: &Src,
        rstd: &Src,
        dy: &Src,
        dx: &mut Dst,
        dw: &mut Dst,
    ) -> Result<()> {
        let c = *x.layout.shape().last().unwrap_or(&1);
        drop(super::cpu::scratch_f32(dx.buf.device(), c, "rms_norm.dw")?);
        elementwise(&[x, rstd, dy], &[dx, dw]);
        Ok(())
    }
    fn rope(&self, x: &Src, cos: &Src, sin: &Src, _: bool, dst: &mut Dst) -> Result<()> {
        elementwise(&[x, cos, sin], &[dst]);
        Ok(())
    }
    fn embedding(&self, _: &Src, ids: &Src, dst: &mut Dst) -> Result<()> {
        elementwise(&[ids], &[dst, dst]);
        Ok(())
    }
    fn embedding_backward(&self, ids: &Src, dy: &Src, dtable: &mut Dst) -> Result<()> {
        let n = dtable.layout.numel();
        drop(super::cpu::scratch_f32(
            dtable.buf.device(),
            n,
            "embedding.scatter_add",
        )?);
        elementwise(&[ids, dy, dy], &[dtable]);
        Ok(())
    }
    fn gather_last(&self, _: &Src, idx: &Src, dst: &mut Dst) -> Result<()> {
        elementwise(&[idx], &[dst, dst]);
        Ok(())
    }
    fn scatter_last(&self, idx: &Src, dy: &Src, dst: &mut Dst) -> Result<()> {
        elementwise(&[idx, dy], &[dst]);
        Ok(())
    }
    fn dropout(&self, x: &Src, _: f32, _: u64, _: u64, dst: &mut Dst) -> Result<()> {
        elementwise(&[x], &[dst]);
        Ok(())
    }
    /// `grad` is read and written: counted twice.
    fn gelu_backward_with_output(&self, x: &Src, grad: &mut Dst, y: &mut Dst) -> Result<()> {
        elementwise(&[x], &[grad, grad, y]);
        Ok(())
    }
    fn causal_softmax(&self, x: &Src, _: f32, _: Option<usize>, dst: &mut Dst) -> Result<()> {
        elementwise(&[x], &[dst]);
        Ok(())
    }
    fn causal_softmax_backward(
        &self,
        y: &Src,
        dy: &Src,
        _: f32,
        _: Option<usize>,
        dst: &mut Dst,
    ) -> Result<()> {
        elementwise(&[y, dy], &[dst]);
        Ok(())
    }
    fn causal_mask(&self, x: &Src, _: f32, dst: &mut Dst) -> Result<()> {
        elementwise(&[x], &[dst]);
        Ok(())
    }
    /// No arithmetic, but the same `temporary` tile scratch as the CPU kernel.
    fn attention(
        &self,
        q: &Src,
        k: &Src,
        _: &Src,
        spec: &AttentionSpec,
        o: &mut Dst,
        _: &mut Dst,
    ) -> Result<()> {
        let s = q.layout.shape(); // (B, H, T, D)
        let heads = (s[0] * s[1], s[0] * k.layout.shape()[1]);
        work::attention(s[0] * s[1], s[2], s[3], spec.causal, false);
        super::cpu::attention::reserve_workspace(o.buf.device(), heads, s[2], s[3], None)
    }
    fn attention_backward(
        &self,
        saved: [&Src; 5],
        _: &Src,
        spec: &AttentionSpec,
        dq: Option<&mut Dst>,
        dk: Option<&mut Dst>,
        dv: Option<&mut Dst>,
    ) -> Result<()> {
        let s = saved[0].layout.shape(); // (B, H, T, D)
        let heads = (s[0] * s[1], s[0] * saved[1].layout.shape()[1]);
        work::attention(s[0] * s[1], s[2], s[3], spec.causal, true);
        let device = saved[0].buf.device();
        let want = (dk.is_some() || dv.is_some(), dq.is_some());
        super::cpu::attention::reserve_workspace(device, heads, s[2], s[3], Some(want))
    }
}
