//! Segment sources: where the allocator gets device memory from (PyTorch's `cudaMalloc` and the
//! `cuMemAddressReserve`/`cuMemMap` pair for expandable segments). The CPU backend's device
//! memory is aligned host memory; the virtual source hands out addresses only, for trace replay
//! and shape-only dry runs. A CUDA source plugs in behind the same trait.
//!
//! Not for: caching or splitting, which the allocator does above any source.

use std::fmt;

/// A source could not provide memory (the host itself is out of memory, or address space ran
/// out).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("segment source '{source_name}' failed: {reason}")]
pub struct SourceError {
    pub source_name: &'static str,
    pub reason: String,
}

/// Provider of device segments.
pub trait SegmentSource: Send + fmt::Debug {
    /// Short name for messages (`host`, `virtual`, `cuda`).
    fn name(&self) -> &'static str;
    /// Whether returned addresses point at real, writable memory.
    fn is_backed(&self) -> bool;
    /// Allocates a segment of `size` bytes (a multiple of 2 MiB or 512 B); returns its address.
    fn allocate(&mut self, size: u64) -> Result<u64, SourceError>;
    /// Returns a segment obtained from [`SegmentSource::allocate`].
    fn free(&mut self, addr: u64, size: u64);
    /// Reserves `size` bytes of address space without memory behind it.
    fn reserve(&mut self, size: u64) -> Result<u64, SourceError>;
    /// Puts memory behind `[addr, addr + size)` of a reservation.
    fn map(&mut self, addr: u64, size: u64) -> Result<(), SourceError>;
    /// Takes memory away from `[addr, addr + size)` of a reservation.
    fn unmap(&mut self, addr: u64, size: u64);
    /// Gives back a whole reservation.
    fn release(&mut self, addr: u64, size: u64);
}

/// Addresses without memory: for replaying traces and dry runs. Addresses start where CUDA
/// device pointers typically do, so snapshots look familiar, and are never reused.
#[derive(Debug)]
pub struct VirtualSource {
    next: u64,
}

impl Default for VirtualSource {
    fn default() -> Self {
        VirtualSource {
            next: 0x7f00_0000_0000,
        }
    }
}

impl VirtualSource {
    fn take(&mut self, size: u64) -> Result<u64, SourceError> {
        let addr = self.next;
        // Keep every range 2 MiB aligned, like the CUDA driver's allocations.
        let span = size.div_ceil(2 << 20).max(1) * (2 << 20);
        self.next = self.next.checked_add(span).ok_or_else(|| SourceError {
            source_name: "virtual",
            reason: "address space exhausted".into(),
        })?;
        Ok(addr)
    }
}

impl SegmentSource for VirtualSource {
    fn name(&self) -> &'static str {
        "virtual"
    }
    fn is_backed(&self) -> bool {
        false
    }
    fn allocate(&mut self, size: u64) -> Result<u64, SourceError> {
        self.take(size)
    }
    fn free(&mut self, _addr: u64, _size: u64) {}
    fn reserve(&mut self, size: u64) -> Result<u64, SourceError> {
        self.take(size)
    }
    fn map(&mut self, _addr: u64, _size: u64) -> Result<(), SourceError> {
        Ok(())
    }
    fn unmap(&mut self, _addr: u64, _size: u64) {}
    fn release(&mut self, _addr: u64, _size: u64) {}
}

/// Host memory as device memory (the CPU backend): anonymous `mmap` for segments; for
/// expandable segments an address-space reservation (`PROT_NONE`, no swap reserved) whose pages
/// are committed with `mprotect` and given back with `madvise(MADV_DONTNEED)`.
#[derive(Debug, Default)]
pub struct HostSource;

impl HostSource {
    fn error(reason: String) -> SourceError {
        SourceError {
            source_name: "host",
            reason,
        }
    }

    fn mmap(size: u64, prot: libc::c_int, extra_flags: libc::c_int) -> Result<u64, SourceError> {
        let len = usize::try_from(size)
            .map_err(|_| Self::error(format!("{size} bytes exceed the address space")))?;
        // SAFETY: an anonymous private mapping at an address chosen by the kernel touches no
        // existing memory; the result is checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Self::error(format!(
                "mmap of {size} bytes failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(ptr as u64)
    }

    fn munmap(addr: u64, size: u64) {
        // SAFETY: (addr, size) is a mapping this source created and the allocator no longer
        // hands out any block inside it.
        unsafe {
            libc::munmap(addr as *mut libc::c_void, size as usize);
        }
    }
}

impl SegmentSource for HostSource {
    fn name(&self) -> &'static str {
        "host"
    }
    fn is_backed(&self) -> bool {
        true
    }
    fn allocate(&mut self, size: u64) -> Result<u64, SourceError> {
        Self::mmap(size, libc::PROT_READ | libc::PROT_WRITE, 0)
    }
    fn free(&mut self, addr: u64, size: u64) {
        Self::munmap(addr, size);
    }
    fn reserve(&mut self, size: u64) -> Result<u64, SourceError> {
        Self::mmap(size, libc::PROT_NONE, libc::MAP_NORESERVE)
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<(), SourceError> {
        // SAFETY: the range lies inside a reservation made by `reserve`.
        let rc = unsafe {
            libc::mprotect(
                addr as *mut libc::c_void,
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            return Err(Self::error(format!(
                "mprotect failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        // SAFETY: the range lies inside a reservation and holds no live block; dropping its
        // pages and revoking access cannot affect memory in use.
        unsafe {
            libc::madvise(
                addr as *mut libc::c_void,
                size as usize,
                libc::MADV_DONTNEED,
            );
            libc::mprotect(addr as *mut libc::c_void, size as usize, libc::PROT_NONE);
        }
    }
    fn release(&mut self, addr: u64, size: u64) {
        Self::munmap(addr, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_segments_are_writable_and_expandable_pages_map_and_unmap() {
        let mut s = HostSource;
        let addr = s.allocate(2 << 20).unwrap();
        // SAFETY: the segment is 2 MiB of read-write memory owned by this test.
        unsafe {
            let p = addr as *mut u8;
            p.write(7);
            p.add((2 << 20) - 1).write(9);
            assert_eq!(p.read(), 7);
        }
        s.free(addr, 2 << 20);

        let base = s.reserve(64 << 20).unwrap();
        s.map(base + (20 << 20), 20 << 20).unwrap();
        // SAFETY: the page range was just mapped read-write.
        unsafe {
            let p = (base + (20 << 20)) as *mut u32;
            p.write(42);
            assert_eq!(p.read(), 42);
        }
        s.unmap(base + (20 << 20), 20 << 20);
        s.map(base + (20 << 20), 20 << 20).unwrap();
        // SAFETY: mapped again; MADV_DONTNEED on a private anonymous mapping yields zero pages.
        unsafe {
            assert_eq!(((base + (20 << 20)) as *const u32).read(), 0);
        }
        s.release(base, 64 << 20);
    }

    #[test]
    fn virtual_addresses_never_overlap() {
        let mut s = VirtualSource::default();
        let a = s.allocate(3 << 20).unwrap();
        let b = s.allocate(512).unwrap();
        assert!(b >= a + (3 << 20));
    }
}
