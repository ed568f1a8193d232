//! Unpacking the backend's buffers for the kernels: typed slices of sources and destinations,
//! index tensors, shape helpers, the dtype error, and f32 scratch from the device allocator.
//!
//! Not for: the dtype dispatch itself (see the parent `cpu`).

use super::index::Ids;
use crate::backend::{Dst, Src};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use headroom_memory::{Category, Device, DeviceBuffer};

/// An f32 scratch buffer from the device allocator, tagged `temporary`.
#[derive(Debug)]
pub struct Scratch(DeviceBuffer);

impl Scratch {
    pub fn slice_mut(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(self.0.as_bytes_mut().unwrap_or(&mut []))
    }
}

pub fn scratch_f32(device: &Device, n: usize, name: &str) -> Result<Scratch> {
    Ok(Scratch(device.alloc(
        (n * 4) as u64,
        Category::Temporary,
        Some(name),
    )?))
}

fn bytes(buf: &DeviceBuffer) -> Result<&[u8]> {
    buf.as_bytes()
        .ok_or(TensorError::ShapeOnly { op: "cpu kernel" })
}

pub(super) fn slice<'a, T: bytemuck::Pod>(s: &'a Src) -> Result<&'a [T]> {
    Ok(bytemuck::cast_slice(bytes(&s.buf)?))
}

pub(super) fn slice_mut<'a, T: bytemuck::Pod>(d: &'a mut Dst) -> Result<&'a mut [T]> {
    let b = d
        .buf
        .as_bytes_mut()
        .ok_or(TensorError::ShapeOnly { op: "cpu kernel" })?;
    Ok(bytemuck::cast_slice_mut(b))
}

/// The contiguous elements of a source (from its offset, `numel` long).
pub(super) fn rows_of<'a, T: bytemuck::Pod>(s: &'a Src) -> Result<&'a [T]> {
    let all = slice::<T>(s)?;
    Ok(&all[s.layout.offset()..s.layout.offset() + s.layout.numel()])
}

pub(super) fn ids<'a>(s: &'a Src) -> Result<Ids<'a>> {
    let all = |n: usize| s.layout.offset()..s.layout.offset() + n;
    match s.dtype {
        DType::I32 => Ok(Ids::I32(&slice::<i32>(s)?[all(s.layout.numel())])),
        DType::I64 => Ok(Ids::I64(&slice::<i64>(s)?[all(s.layout.numel())])),
        other => Err(TensorError::UnsupportedDType {
            op: "index",
            dtype: other,
        }),
    }
}

pub(super) fn unsupported(op: &'static str, dtype: DType) -> TensorError {
    TensorError::UnsupportedDType { op, dtype }
}

/// The last two axes (rows, columns) of a rank ≥ 2 source.
pub(super) fn last_two(s: &Src) -> (usize, usize) {
    let shape = s.layout.shape();
    (shape[shape.len() - 2], shape[shape.len() - 1])
}

pub(super) fn last_dim(s: &Src) -> usize {
    s.layout.shape().last().copied().unwrap_or(1)
}
