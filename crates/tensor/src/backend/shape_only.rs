//! The backend of a shape-only device: buffers have addresses but no bytes, so every kernel is
//! a no-op. Running a step on it exercises the real allocator with the real sizes and order of
//! allocations, which is what a dry run measures. Reading data back is an error.
//!
//! Not for: anything that needs values.

use super::{AttentionSpec, Backend, BinaryOp, Dst, ReduceOp, Src, UnaryOp};
use crate::error::{Result, TensorError};

#[derive(Debug)]
pub struct ShapeOnlyBackend;

impl Backend for ShapeOnlyBackend {
    fn name(&self) -> &'static str {
        "shape-only"
    }
    fn fill(&self, _: &mut Dst, _: f32) -> Result<()> {
        Ok(())
    }
    fn copy(&self, _: &Src, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn add_assign(&self, _: &mut Dst, _: &Src) -> Result<()> {
        Ok(())
    }
    fn upload_f32(&self, _: &[f32], _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn upload_i64(&self, _: &[i64], _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn download_f32(&self, _: &Src) -> Result<Vec<f32>> {
        Err(TensorError::ShapeOnly { op: "download" })
    }
    fn download_i64(&self, _: &Src) -> Result<Vec<i64>> {
        Err(TensorError::ShapeOnly { op: "download" })
    }
    fn unary(&self, _: UnaryOp, _: &Src, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn binary(&self, _: BinaryOp, _: &Src, _: &Src, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn reduce(&self, _: ReduceOp, _: &Src, _: &[usize], _: &mut Dst) -> Result<()> {
        Ok(())
    }
    /// No arithmetic, but the same `temporary` scratch as the CPU kernel (bf16 widening).
    fn matmul(&self, a: &Src, _: &Src, dst: &mut Dst) -> Result<()> {
        let s = dst.layout.shape();
        let r = s.len();
        let d = super::cpu::matmul::Dims {
            batch: crate::shape::numel(&s[..r - 2]),
            m: s[r - 2],
            n: s[r - 1],
            k: a.layout.shape()[r - 1],
        };
        if a.dtype == crate::dtype::DType::BF16 && d.m * d.n > 0 && d.k > 0 {
            drop(super::cpu::matmul::bf16_scratch(dst.buf.device(), d)?);
        }
        Ok(())
    }
    fn softmax(&self, _: &Src, _: bool, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn softmax_backward(&self, _: &Src, _: &Src, _: bool, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn layer_norm(
        &self,
        _: &Src,
        _: &Src,
        _: &Src,
        _: f32,
        _: &mut Dst,
        _: &mut Dst,
        _: &mut Dst,
    ) -> Result<()> {
        Ok(())
    }
    fn layer_norm_backward(
        &self,
        _: &Src,
        _: &Src,
        _: &Src,
        _: &Src,
        _: &Src,
        _: &mut Dst,
        _: &mut Dst,
        _: &mut Dst,
    ) -> Result<()> {
        Ok(())
    }
    fn rms_norm(&self, _: &Src, _: &Src, _: f32, _: &mut Dst, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn rms_norm_backward(
        &self,
        _: &Src,
        _: &Src,
        _: &Src,
        _: &Src,
        _: &mut Dst,
        _: &mut Dst,
    ) -> Result<()> {
        Ok(())
    }
    fn embedding(&self, _: &Src, _: &Src, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn embedding_backward(&self, _: &Src, _: &Src, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn gather_last(&self, _: &Src, _: &Src, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn scatter_last(&self, _: &Src, _: &Src, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn dropout(&self, _: &Src, _: f32, _: u64, _: u64, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    fn causal_mask(&self, _: &Src, _: f32, _: &mut Dst) -> Result<()> {
        Ok(())
    }
    /// No arithmetic, but the same `temporary` tile scratch as the CPU kernel.
    fn attention(
        &self,
        q: &Src,
        _: &Src,
        _: &Src,
        _: &AttentionSpec,
        o: &mut Dst,
        _: &mut Dst,
    ) -> Result<()> {
        let s = q.layout.shape(); // (B, H, T, D)
        super::cpu::attention::reserve_workspace(o.buf.device(), s[0] * s[1], s[2], s[3], None)
    }
    fn attention_backward(
        &self,
        saved: [&Src; 5],
        _: &Src,
        _: &AttentionSpec,
        dq: Option<&mut Dst>,
        dk: Option<&mut Dst>,
        dv: Option<&mut Dst>,
    ) -> Result<()> {
        let s = saved[0].layout.shape(); // (B, H, T, D)
        let device = saved[0].buf.device();
        let want = (dk.is_some() || dv.is_some(), dq.is_some());
        super::cpu::attention::reserve_workspace(device, s[0] * s[1], s[2], s[3], Some(want))
    }
}
