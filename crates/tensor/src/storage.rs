//! Storage: one allocation from the device allocator plus its element type. Every view of a
//! tensor shares one `Arc<Storage>`; the bytes return to the allocator when the last view (or
//! the last saved copy on a tape) drops.
//!
//! Why a lock: views are shared and mostly read, but gradient accumulation and optimizer updates
//! write into existing buffers (flat gradient and parameter buffers). An `RwLock` keeps those
//! writes safe without copying; kernels take read guards on inputs and a write guard on the
//! output, which is always a different storage.
//!
//! Not for: shapes (see `shape::Layout`) or the graph (see `tape`).

use crate::dtype::DType;
use crate::error::Result;
use headroom_memory::{Category, Device, DeviceBuffer};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[derive(Debug)]
pub struct Storage {
    buffer: RwLock<DeviceBuffer>,
    /// Kept beside the buffer so that asking for it never takes the lock.
    device: Device,
    category: Category,
    dtype: DType,
    /// Number of elements the buffer holds.
    len: usize,
}

impl Storage {
    /// Allocates room for `len` elements of `dtype` tagged with `category`.
    pub fn alloc(
        device: &Device,
        len: usize,
        dtype: DType,
        category: Category,
        name: Option<&str>,
    ) -> Result<Storage> {
        let buffer = device.alloc((len * dtype.size_in_bytes()) as u64, category, name)?;
        Ok(Storage {
            buffer: RwLock::new(buffer),
            device: device.clone(),
            category,
            dtype,
            len,
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn read(&self) -> RwLockReadGuard<'_, DeviceBuffer> {
        self.buffer.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, DeviceBuffer> {
        self.buffer.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn category(&self) -> Category {
        self.category
    }

    pub fn device(&self) -> &Device {
        &self.device
    }
}
