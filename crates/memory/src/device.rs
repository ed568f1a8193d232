//! A device handle shared by everything that puts bytes on it, and `DeviceBuffer`, the owning
//! handle of one allocation: its bytes return to the caching allocator when it drops. Tensors
//! in the engine hold their storage as a `DeviceBuffer`; no tensor data lives elsewhere.
//!
//! Not for: typed views or kernels (the tensor crate builds those on `as_bytes`).

use crate::allocator::CachingAllocator;
use crate::category::Category;
use crate::config::AllocatorConfig;
use crate::oom::OutOfMemory;
use crate::source::{HostSource, VirtualSource};
use crate::stats::DeviceStats;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// A capacity-limited device whose memory is managed by a [`CachingAllocator`]. Cloning the
/// handle shares the device.
#[derive(Clone)]
pub struct Device {
    allocator: Arc<Mutex<CachingAllocator>>,
    backed: bool,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self.lock();
        f.debug_struct("Device")
            .field("name", &a.device_name())
            .field("capacity", &a.capacity())
            .field("reserved", &a.reserved())
            .field("backed", &self.backed)
            .finish()
    }
}

impl Device {
    /// The CPU backend: `capacity` bytes of host memory managed as device memory.
    pub fn cpu(capacity: u64, config: AllocatorConfig) -> Device {
        Device::from_allocator(CachingAllocator::new(
            capacity,
            config,
            Box::new(HostSource),
        ))
    }

    /// A device with addresses but no memory: for shape-only dry runs and trace replay.
    pub fn shape_only(capacity: u64, config: AllocatorConfig) -> Device {
        let mut allocator =
            CachingAllocator::new(capacity, config, Box::new(VirtualSource::default()));
        allocator.set_device_name("dry-run:0");
        Device::from_allocator(allocator)
    }

    pub fn from_allocator(allocator: CachingAllocator) -> Device {
        let backed = allocator.is_backed();
        Device {
            allocator: Arc::new(Mutex::new(allocator)),
            backed,
        }
    }

    /// Whether buffers on this device have real bytes behind them.
    pub fn is_backed(&self) -> bool {
        self.backed
    }

    /// Locks the allocator for inspection or control (stats, summary, snapshot, empty_cache).
    pub fn lock(&self) -> MutexGuard<'_, CachingAllocator> {
        self.allocator
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Allocates `bytes` tagged with `category` and `name`. Zero bytes take no block, as in
    /// PyTorch.
    pub fn alloc(
        &self,
        bytes: u64,
        category: Category,
        name: Option<&str>,
    ) -> Result<DeviceBuffer, OutOfMemory> {
        let addr = if bytes == 0 {
            0
        } else {
            self.lock().malloc(bytes, category, name)?.addr
        };
        Ok(DeviceBuffer {
            device: self.clone(),
            addr,
            bytes,
            category,
        })
    }

    /// A copy of `memory_stats()`.
    pub fn stats(&self) -> DeviceStats {
        self.lock().stats().clone()
    }

    pub fn empty_cache(&self) {
        self.lock().empty_cache();
    }

    pub fn reset_peak_stats(&self) {
        self.lock().reset_peak_stats();
    }

    /// Whether two handles refer to the same device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.allocator, &other.allocator)
    }
}

/// One allocation on a device; frees itself on drop.
pub struct DeviceBuffer {
    device: Device,
    addr: u64,
    bytes: u64,
    category: Category,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("bytes", &self.bytes)
            .field("category", &self.category)
            .finish()
    }
}

impl DeviceBuffer {
    pub fn len_bytes(&self) -> u64 {
        self.bytes
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn category(&self) -> Category {
        self.category
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The bytes, or `None` on a shape-only device.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        if !self.device.backed {
            return None;
        }
        if self.bytes == 0 {
            return Some(empty_bytes());
        }
        // SAFETY: on a backed device `addr` is the start of a live block of at least `bytes`
        // bytes of read-write memory that only this buffer hands out; it stays valid until the
        // buffer drops, and the shared borrow of `self` prevents concurrent `as_bytes_mut`.
        Some(unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.bytes as usize) })
    }

    /// The bytes for writing, or `None` on a shape-only device.
    pub fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        if !self.device.backed {
            return None;
        }
        if self.bytes == 0 {
            return Some(empty_bytes());
        }
        // SAFETY: as in `as_bytes`; the exclusive borrow of `self` makes this the only view.
        Some(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.bytes as usize) })
    }
}

/// The bytes of an empty buffer: none, at an address aligned as a block's is (blocks start at
/// multiples of `MIN_BLOCK_SIZE`, 512 bytes), so that viewing them as wider elements (`f32`,
/// `u64`) succeeds as for any other buffer. A plain `&mut []` of bytes sits at address 1, which
/// a checked `u8 → f32` view rejects (a ZeRO shard of a small block can be empty).
fn empty_bytes<'a>() -> &'a mut [u8] {
    #[repr(align(512))]
    struct Block;
    let at = std::ptr::NonNull::<Block>::dangling().cast::<u8>();
    // SAFETY: a zero-length slice needs only a non-null pointer aligned for `u8`; `dangling`
    // gives one (aligned to 512 bytes), and no byte is ever read or written through it.
    unsafe { std::slice::from_raw_parts_mut(at.as_ptr(), 0) }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.bytes != 0 {
            // The address came from this device's allocator and is freed exactly once.
            let _ = self.device.lock().free(self.addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::MIB;

    #[test]
    fn buffers_return_their_bytes_on_drop() {
        let device = Device::cpu(64 * MIB, AllocatorConfig::default());
        {
            let mut a = device.alloc(1000, Category::Activation, Some("x")).unwrap();
            a.as_bytes_mut().unwrap().fill(3);
            assert_eq!(
                a.as_bytes().unwrap().iter().map(|&b| b as u32).sum::<u32>(),
                3000
            );
            let s = device.stats();
            assert_eq!(s.allocated_bytes.all.current, 1024);
            assert_eq!(s.category_bytes[Category::Activation.index()].current, 1024);
        }
        let s = device.stats();
        assert_eq!(s.allocated_bytes.all.current, 0);
        assert_eq!(s.reserved_bytes.all.current, 2 * MIB as i64);
    }

    #[test]
    fn empty_buffers_are_aligned_like_blocks() {
        let device = Device::cpu(64 * MIB, AllocatorConfig::default());
        let mut a = device.alloc(0, Category::OptimizerState, None).unwrap();
        let ptr = a.as_bytes_mut().unwrap().as_ptr() as usize;
        assert_eq!(ptr % 512, 0, "empty buffer's view at {ptr:#x}");
        let ptr = a.as_bytes().unwrap().as_ptr() as usize;
        assert_eq!(ptr % 512, 0, "empty buffer's view at {ptr:#x}");
        assert!(a.as_bytes().unwrap().is_empty());
        assert_eq!(device.stats().allocated_bytes.all.current, 0);
    }

    #[test]
    fn shape_only_buffers_have_no_bytes_but_count() {
        let device = Device::shape_only(64 * MIB, AllocatorConfig::default());
        let a = device.alloc(5 * MIB, Category::Parameter, None).unwrap();
        assert!(a.as_bytes().is_none());
        assert_eq!(device.stats().reserved_bytes.all.current, 20 * MIB as i64);
    }
}
