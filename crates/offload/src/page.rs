//! Page-aligned byte buffers from the host pool. Direct I/O (`O_DIRECT`) needs the buffer's
//! address, the transfer's length and its file offset to be multiples of the disk's logical
//! block size; one page (4 KiB) is a multiple of every common block size (512 B, 4 KiB), so
//! every buffer and every region on disk is a whole number of pages.
//!
//! Not for: the pool's budget and page locking (`headroom_memory::host_pool`).

use headroom_memory::host_pool::{HostBuffer, HostPool, OverBudget};

/// Alignment and granularity of swap buffers and of regions on disk.
pub const PAGE: usize = 4096;

/// `bytes` rounded up to whole pages.
pub fn page_rounded(bytes: usize) -> usize {
    bytes.div_ceil(PAGE) * PAGE
}

/// One page, aligned to its size.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
pub struct Page([u8; PAGE]);

impl Default for Page {
    fn default() -> Self {
        Page([0; PAGE])
    }
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Page")
    }
}

/// A zeroed, page-aligned buffer of whole pages from a host pool (counted against its budget).
#[derive(Debug)]
pub struct AlignedBytes {
    pages: HostBuffer<Page>,
}

impl AlignedBytes {
    /// Room for at least `bytes` bytes: `page_rounded(bytes)` from `pool`.
    pub fn new(pool: &HostPool, bytes: usize) -> Result<AlignedBytes, OverBudget> {
        Ok(AlignedBytes {
            pages: pool.alloc::<Page>(bytes.div_ceil(PAGE))?,
        })
    }

    /// Capacity in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.pages.len() * PAGE
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Whether its pages are locked in RAM.
    pub fn is_pinned(&self) -> bool {
        self.pages.is_pinned()
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `Page` is a plain byte array with no padding (size = alignment = PAGE), so the
        // pool's `[Page]` allocation is `len()` initialised bytes, borrowed for `&self`.
        unsafe { std::slice::from_raw_parts(self.pages.as_ptr().cast::<u8>(), self.len()) }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len();
        // SAFETY: as in `as_bytes`; the exclusive borrow makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.pages.as_mut_ptr().cast::<u8>(), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_whole_aligned_pages_counted_by_the_pool() {
        let pool = HostPool::new(None, false);
        let mut b = AlignedBytes::new(&pool, 5000).unwrap();
        assert_eq!(b.len(), 2 * PAGE);
        assert_eq!(b.as_bytes().as_ptr() as usize % PAGE, 0);
        assert!(b.as_bytes().iter().all(|&x| x == 0));
        b.as_bytes_mut()[4999] = 7;
        assert_eq!(b.as_bytes()[4999], 7);
        assert_eq!(pool.stats().held_bytes, 2 * PAGE as u64);
        drop(b);
        assert_eq!(pool.stats().held_bytes, 0);
        assert_eq!(page_rounded(0), 0);
        assert_eq!(page_rounded(1), PAGE);
        assert_eq!(page_rounded(PAGE), PAGE);
    }
}
