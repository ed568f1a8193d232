//! `Tensor`: a view (layout) of a storage from the device allocator, plus an optional autodiff
//! variable id. Cloning is cheap (the storage is shared); the bytes return to the allocator when
//! the last view drops.
//!
//! Why only an id and no graph: the tape owns what backward needs (docs/sources.md §12), so a
//! tensor kept after backward — a loss held for logging — retains nothing but its own bytes.
//!
//! Not for: ops (see `ops/`), which are further `impl Tensor` blocks, one file per family.

use crate::backend::{Backend, Dst, Src, backend_for};
use crate::context;
use crate::dtype::{DType, Elem};
use crate::error::{Result, TensorError};
use crate::shape::{Layout, numel};
use crate::storage::Storage;
use crate::tape::VarId;
use headroom_memory::{Category, Device};
use std::fmt;
use std::sync::Arc;

#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
    /// The autodiff variable this tensor is, if it is tracked: a leaf made with `track`, or the
    /// output of an op recorded on a tape.
    var: Option<VarId>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape())
            .field("dtype", &self.dtype())
            .field("category", &self.category())
            .field("var", &self.var)
            .finish()
    }
}

impl Tensor {
    // ----------------------------------------------------------------------------------------
    // Construction.

    /// Allocates an uninitialised contiguous tensor (kernels overwrite every element).
    pub(crate) fn empty_in(
        device: &Device,
        shape: &[usize],
        dtype: DType,
        category: Category,
        name: Option<&str>,
    ) -> Result<Tensor> {
        let storage = Storage::alloc(device, numel(shape), dtype, category, name)?;
        Ok(Tensor {
            storage: Arc::new(storage),
            layout: Layout::contiguous(shape),
            var: None,
        })
    }

    /// An op output: tagged with the current output category (`activation` in forward).
    pub(crate) fn empty(
        device: &Device,
        shape: &[usize],
        dtype: DType,
        name: &str,
    ) -> Result<Tensor> {
        Tensor::empty_in(device, shape, dtype, context::output_category(), Some(name))
    }

    /// A tensor filled with `value`.
    pub fn full(
        device: &Device,
        shape: &[usize],
        value: f32,
        dtype: DType,
        category: Category,
        name: Option<&str>,
    ) -> Result<Tensor> {
        let t = Tensor::empty_in(device, shape, dtype, category, name)?;
        backend_for(device).fill(&mut t.dst(), value)?;
        Ok(t)
    }

    pub fn zeros(
        device: &Device,
        shape: &[usize],
        dtype: DType,
        category: Category,
        name: Option<&str>,
    ) -> Result<Tensor> {
        Tensor::full(device, shape, 0.0, dtype, category, name)
    }

    /// A float tensor of `dtype` holding `data` (row-major, rounded to `dtype`).
    pub fn from_f32(
        device: &Device,
        shape: &[usize],
        data: &[f32],
        dtype: DType,
        category: Category,
        name: Option<&str>,
    ) -> Result<Tensor> {
        if data.len() != numel(shape) {
            return Err(TensorError::invalid(
                "from_f32",
                format!("{} values for shape {shape:?}", data.len()),
            ));
        }
        if !dtype.is_float() {
            return Err(TensorError::UnsupportedDType {
                op: "from_f32",
                dtype,
            });
        }
        let t = Tensor::empty_in(device, shape, dtype, category, name)?;
        backend_for(device).upload_f32(data, &mut t.dst())?;
        Ok(t)
    }

    /// An integer tensor (`I32` or `I64`) holding `data`, e.g. token ids or targets.
    pub fn from_i64(
        device: &Device,
        shape: &[usize],
        data: &[i64],
        dtype: DType,
        category: Category,
        name: Option<&str>,
    ) -> Result<Tensor> {
        if data.len() != numel(shape) {
            return Err(TensorError::invalid(
                "from_i64",
                format!("{} values for shape {shape:?}", data.len()),
            ));
        }
        if dtype.is_float() {
            return Err(TensorError::UnsupportedDType {
                op: "from_i64",
                dtype,
            });
        }
        let t = Tensor::empty_in(device, shape, dtype, category, name)?;
        backend_for(device).upload_i64(data, &mut t.dst())?;
        Ok(t)
    }

    // ----------------------------------------------------------------------------------------
    // Reading back.

    /// The elements in row-major order as f32 (any float dtype).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        self.backend().download_f32(&self.src())
    }

    pub fn to_vec_i64(&self) -> Result<Vec<i64>> {
        self.backend().download_i64(&self.src())
    }

    /// The single value of a one-element tensor.
    pub fn to_scalar_f32(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(TensorError::invalid(
                "to_scalar",
                format!("shape {:?} has {} elements", self.shape(), self.numel()),
            ));
        }
        Ok(self.to_vec_f32()?[0])
    }

    /// Overwrites this tensor's elements (through its view) with `data`.
    pub fn copy_from_f32(&self, data: &[f32]) -> Result<()> {
        if data.len() != self.numel() {
            return Err(TensorError::invalid(
                "copy_from_f32",
                format!("{} values for shape {:?}", data.len(), self.shape()),
            ));
        }
        self.backend().upload_f32(data, &mut self.dst())
    }

    /// Runs `f` on this contiguous view's elements in host memory, read-only. For host-side
    /// consumers of flat buffers (optimizers, gradient checks, checkpoint writers) on a backed
    /// device; `T` must be this tensor's element type.
    pub fn with_slice<T: Elem, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.check_host_view::<T>("with_slice")?;
        let guard = self.storage.read();
        let bytes = guard
            .as_bytes()
            .ok_or(TensorError::ShapeOnly { op: "with_slice" })?;
        let all: &[T] = bytemuck::cast_slice(bytes);
        Ok(f(
            &all[self.layout.offset()..self.layout.offset() + self.numel()]
        ))
    }

    /// As [`Tensor::with_slice`], writable (e.g. an optimizer updating a flat parameter buffer).
    pub fn with_slice_mut<T: Elem, R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.check_host_view::<T>("with_slice_mut")?;
        let mut guard = self.storage.write();
        let bytes = guard.as_bytes_mut().ok_or(TensorError::ShapeOnly {
            op: "with_slice_mut",
        })?;
        let all: &mut [T] = bytemuck::cast_slice_mut(bytes);
        Ok(f(
            &mut all[self.layout.offset()..self.layout.offset() + self.numel()]
        ))
    }

    fn check_host_view<T: Elem>(&self, op: &'static str) -> Result<()> {
        if T::DTYPE != self.dtype() {
            return Err(TensorError::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: T::DTYPE,
            });
        }
        if !self.is_contiguous() {
            return Err(TensorError::invalid(op, "the view is not contiguous"));
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // Properties.

    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    pub fn device(&self) -> Device {
        self.storage.device().clone()
    }

    /// The category of the allocation behind this tensor.
    pub fn category(&self) -> Category {
        self.storage.category()
    }

    /// The storage behind this view.
    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Bytes of the storage behind this view (as requested from the allocator).
    pub fn storage_bytes(&self) -> usize {
        self.storage.len() * self.dtype().size_in_bytes()
    }

    /// A contiguous tensor whose storage holds no bytes until [`Tensor::materialize_storage`]
    /// (a sharded block's full flat buffer).
    pub fn released(device: &Device, shape: &[usize], dtype: DType, category: Category) -> Tensor {
        Tensor {
            storage: Arc::new(Storage::released(device, numel(shape), dtype, category)),
            layout: Layout::contiguous(shape),
            var: None,
        }
    }

    /// Whether the storage behind this view holds its bytes.
    pub fn is_resident(&self) -> bool {
        self.storage.is_resident()
    }

    /// Gives the storage's bytes back to the allocator (every view of it; values are lost).
    pub fn release_storage(&self) {
        self.storage.release();
    }

    /// Allocates the storage's bytes again if released (uninitialised; every view sees them).
    pub fn materialize_storage(&self, name: Option<&str>) -> Result<()> {
        self.storage.materialize(name)
    }

    /// Whether two tensors are views of one storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    // ----------------------------------------------------------------------------------------
    // Autodiff identity.

    pub fn var(&self) -> Option<VarId> {
        self.var
    }

    /// Whether backward will compute a gradient for (or through) this tensor.
    pub fn requires_grad(&self) -> bool {
        self.var.is_some()
    }

    /// This tensor as a new autodiff leaf: backward accumulates its gradient into `Gradients`.
    pub fn track(&self) -> Tensor {
        Tensor {
            var: Some(VarId::fresh()),
            ..self.clone()
        }
    }

    /// The same view without autodiff identity: ops on it are not recorded.
    pub fn detach(&self) -> Tensor {
        Tensor {
            var: None,
            ..self.clone()
        }
    }

    pub(crate) fn with_var(mut self, var: VarId) -> Tensor {
        self.var = Some(var);
        self
    }

    // ----------------------------------------------------------------------------------------
    // Crate internals.

    pub(crate) fn backend(&self) -> &'static dyn Backend {
        backend_for(self.storage.device())
    }

    /// A view of the same storage under another layout (untracked).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
            var: None,
        }
    }

    pub(crate) fn src(&self) -> Src<'_> {
        Src {
            buf: self.storage.read(),
            dtype: self.dtype(),
            layout: &self.layout,
        }
    }

    pub(crate) fn dst(&self) -> Dst<'_> {
        Dst {
            buf: self.storage.write(),
            dtype: self.dtype(),
            layout: &self.layout,
        }
    }
}
