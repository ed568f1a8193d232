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
    fn matmul(&self, _: &Src, _: &Src, _: &mut Dst) -> Result<()> {
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
    fn attention(
        &self,
        _: &Src,
        _: &Src,
        _: &Src,
        _: &AttentionSpec,
        _: &mut Dst,
        _: &mut Dst,
    ) -> Result<()> {
        Ok(())
    }
    fn attention_backward(
        &self,
        _: [&Src; 5],
        _: &Src,
        _: &AttentionSpec,
        _: Option<&mut Dst>,
        _: Option<&mut Dst>,
        _: Option<&mut Dst>,
    ) -> Result<()> {
        Ok(())
    }
}
