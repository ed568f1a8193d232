//! Storage: one allocation from the device allocator plus its element type. Every view of a
//! tensor shares one `Arc<Storage>`; the bytes return to the allocator when the last view (or
//! the last saved copy on a tape) drops.
//!
//! Why a lock: views are shared and mostly read, but gradient accumulation and optimizer updates
//! write into existing buffers (flat gradient and parameter buffers). An `RwLock` keeps those
//! writes safe without copying; kernels take read guards on inputs and a write guard on the
//! output, which is always a different storage.
//!
//! Residency: a storage can give its bytes back to the allocator and take them again later
//! while every view of it stays valid (FSDP's flat parameters do the same with
//! `storage().resize_(0)`): sharded parameters and gradients exist in full only while a block
//! computes. Reading or writing a released storage is an engine bug and panics naming it.
//!
//! Not for: shapes (see `shape::Layout`) or the graph (see `tape`).

use crate::dtype::DType;
use crate::error::Result;
use headroom_memory::{Category, Device, DeviceBuffer};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Whether the bytes are allocated (see [`Storage::release`]).
    resident: AtomicBool,
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
            resident: AtomicBool::new(true),
        })
    }

    /// Room for `len` elements that holds no bytes until [`Storage::materialize`].
    pub fn released(device: &Device, len: usize, dtype: DType, category: Category) -> Storage {
        let buffer = device
            .alloc(0, category, None)
            .expect("zero bytes take no block");
        Storage {
            buffer: RwLock::new(buffer),
            device: device.clone(),
            category,
            dtype,
            len,
            resident: AtomicBool::new(false),
        }
    }

    /// Whether the bytes are allocated.
    pub fn is_resident(&self) -> bool {
        self.resident.load(Ordering::Acquire)
    }

    /// Returns the bytes to the allocator; the values are lost. Views stay valid but must not
    /// be read until [`Storage::materialize`].
    pub fn release(&self) {
        let mut guard = self.buffer.write().unwrap_or_else(|p| p.into_inner());
        let empty = self
            .device
            .alloc(0, self.category, None)
            .expect("zero bytes take no block");
        drop(std::mem::replace(&mut *guard, empty));
        self.resident.store(false, Ordering::Release);
    }

    /// Allocates the bytes again (uninitialised) if released; `name` labels the allocation.
    pub fn materialize(&self, name: Option<&str>) -> Result<()> {
        if self.is_resident() {
            return Ok(());
        }
        let bytes = (self.len * self.dtype.size_in_bytes()) as u64;
        let buffer = self.device.alloc(bytes, self.category, name)?;
        *self.buffer.write().unwrap_or_else(|p| p.into_inner()) = buffer;
        self.resident.store(true, Ordering::Release);
        Ok(())
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
        self.check_resident();
        self.buffer.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, DeviceBuffer> {
        self.check_resident();
        self.buffer.write().unwrap_or_else(|p| p.into_inner())
    }

    fn check_resident(&self) {
        assert!(
            self.is_resident(),
            "engine bug: a released {} storage of {} elements was used before being gathered again",
            self.category,
            self.len
        );
    }

    pub fn category(&self) -> Category {
        self.category
    }

    pub fn device(&self) -> &Device {
        &self.device
    }
}
