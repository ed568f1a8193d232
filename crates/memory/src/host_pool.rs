//! The host pool: staging buffers in host RAM for data on its way to the device, with their own
//! accounting (bytes held, peak, count) under an optional budget. Buffers are page-locked with
//! `mlock` when the OS permits, the role CUDA's pinned memory plays for DMA: a locked page
//! cannot be swapped out or moved, so a copy to the device never waits on a page fault. When
//! locking is refused (`RLIMIT_MEMLOCK`, no `CAP_IPC_LOCK`) the buffer is still handed out,
//! pageable, and the pool says why.
//!
//! Not for: device memory (the caching allocator) or what the buffers hold (the data loader).

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

/// Stack reserved for each data-loader worker thread (set when the thread is spawned).
pub const LOADER_WORKER_STACK_BYTES: u64 = 256 << 10;

/// Staging buffers of a loader with `workers` threads and a queue of `prefetch` batches: one
/// per queued batch and the one the trainer is copying from; one in all without workers.
pub fn staging_buffers(workers: usize, prefetch: usize) -> usize {
    if workers == 0 { 1 } else { prefetch + 1 }
}

/// Host bytes of a data loader: its staging buffers of `batch_bytes` each, plus each worker's
/// stack and `worker_scratch_bytes`. The trainer's loader states its own buffers with this, and
/// the planner counts it in a run's host memory.
pub fn loader_host_bytes(
    workers: usize,
    prefetch: usize,
    batch_bytes: u64,
    worker_scratch_bytes: u64,
) -> u64 {
    staging_buffers(workers, prefetch) as u64 * batch_bytes
        + workers as u64 * (LOADER_WORKER_STACK_BYTES + worker_scratch_bytes)
}

/// A buffer the pool cannot hand out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the host pool would hold {} with this buffer of {}, over its budget of {}; raise --host-memory or lower --prefetch or --micro-batch",
    crate::format_bytes(held + requested),
    crate::format_bytes(*requested),
    crate::format_bytes(*budget)
)]
pub struct OverBudget {
    pub requested: u64,
    pub held: u64,
    pub budget: u64,
}

/// What the pool holds and has held.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct HostPoolStats {
    pub budget_bytes: Option<u64>,
    pub held_bytes: u64,
    pub peak_bytes: u64,
    pub buffers: usize,
    pub peak_buffers: usize,
    /// Bytes of the buffers held now that are page-locked.
    pub pinned_bytes: u64,
    /// Whether buffers are page-locked (asked for and granted for every buffer so far).
    pub pinned: bool,
    /// Why a buffer could not be page-locked, when one could not.
    pub pin_error: Option<String>,
}

#[derive(Debug)]
struct PoolState {
    stats: HostPoolStats,
    lock_pages: bool,
}

/// A budgeted source of staging buffers; clones share one account.
#[derive(Debug, Clone)]
pub struct HostPool {
    state: Arc<Mutex<PoolState>>,
}

impl HostPool {
    /// A pool of at most `budget` bytes (unbounded with `None`) whose buffers are page-locked
    /// when `lock_pages` and the OS permits.
    pub fn new(budget: Option<u64>, lock_pages: bool) -> HostPool {
        HostPool {
            state: Arc::new(Mutex::new(PoolState {
                stats: HostPoolStats {
                    budget_bytes: budget,
                    pinned: lock_pages,
                    ..HostPoolStats::default()
                },
                lock_pages,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // The state is plain counters: a panic elsewhere cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one buffer of `bytes` against the budget (or refuses it, the account unchanged);
    /// says whether its pages are to be locked.
    fn take(&self, bytes: u64) -> Result<bool, OverBudget> {
        let mut s = self.lock();
        if let Some(budget) = s.stats.budget_bytes
            && s.stats.held_bytes + bytes > budget
        {
            return Err(OverBudget {
                requested: bytes,
                held: s.stats.held_bytes,
                budget,
            });
        }
        s.stats.held_bytes += bytes;
        s.stats.peak_bytes = s.stats.peak_bytes.max(s.stats.held_bytes);
        s.stats.buffers += 1;
        s.stats.peak_buffers = s.stats.peak_buffers.max(s.stats.buffers);
        Ok(s.lock_pages)
    }

    /// A zeroed buffer of `len` elements, counted against the budget.
    pub fn alloc<T: Copy + Default>(&self, len: usize) -> Result<HostBuffer<T>, OverBudget> {
        let bytes = (len * std::mem::size_of::<T>()) as u64;
        let lock_pages = self.take(bytes)?;
        let data = vec![T::default(); len];
        let pinned = lock_pages && bytes > 0 && {
            let locked = page_lock(data.as_ptr().cast(), bytes as usize);
            let mut s = self.lock();
            match locked {
                Ok(()) => {
                    s.stats.pinned_bytes += bytes;
                    true
                }
                Err(why) => {
                    s.stats.pinned = false;
                    s.stats.pin_error.get_or_insert(why);
                    false
                }
            }
        };
        Ok(HostBuffer {
            data,
            bytes,
            pinned,
            pool: self.clone(),
        })
    }

    pub fn stats(&self) -> HostPoolStats {
        self.lock().stats.clone()
    }

    /// `bytes` counted against the budget as one buffer, with nothing allocated: what a
    /// buffer of that size would hold, for a dry run that predicts the pool without filling it.
    pub fn reserve(&self, bytes: u64) -> Result<HostReservation, OverBudget> {
        self.take(bytes)?;
        Ok(HostReservation {
            bytes,
            pool: self.clone(),
        })
    }
}

/// Bytes counted by a [`HostPool`] without memory behind them ([`HostPool::reserve`]); they go
/// back to the account when it drops.
#[derive(Debug)]
pub struct HostReservation {
    bytes: u64,
    pool: HostPool,
}

impl HostReservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for HostReservation {
    fn drop(&mut self) {
        let mut s = self.pool.lock();
        s.stats.held_bytes -= self.bytes;
        s.stats.buffers -= 1;
    }
}

/// A buffer from a [`HostPool`]; its bytes go back to the pool's account (and its pages are
/// unlocked) when it is dropped.
#[derive(Debug)]
pub struct HostBuffer<T: Copy + Default> {
    data: Vec<T>,
    bytes: u64,
    pinned: bool,
    pool: HostPool,
}

impl<T: Copy + Default> HostBuffer<T> {
    /// Whether its pages are locked in RAM.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }
}

impl<T: Copy + Default> Deref for HostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.data
    }
}

impl<T: Copy + Default> DerefMut for HostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.data
    }
}

impl<T: Copy + Default> Drop for HostBuffer<T> {
    fn drop(&mut self) {
        if self.pinned {
            // SAFETY: the range is this buffer's own allocation, locked by `page_lock`.
            unsafe { libc::munlock(self.data.as_ptr().cast(), self.bytes as usize) };
        }
        let mut s = self.pool.lock();
        s.stats.held_bytes -= self.bytes;
        s.stats.buffers -= 1;
        if self.pinned {
            s.stats.pinned_bytes -= self.bytes;
        }
    }
}

/// Locks `len` bytes at `ptr` in RAM, or says why the OS refused.
fn page_lock(ptr: *const libc::c_void, len: usize) -> Result<(), String> {
    // SAFETY: `ptr..ptr + len` is a live allocation owned by the caller.
    if unsafe { libc::mlock(ptr, len) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
    let limit = if !known {
        "unknown".to_string()
    } else if limit.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        crate::format_bytes(limit.rlim_cur)
    };
    Err(format!(
        "mlock of {} refused ({err}); RLIMIT_MEMLOCK is {limit} (`ulimit -l`): raise it, or run with CAP_IPC_LOCK, to page-lock staging buffers",
        crate::format_bytes(len as u64)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_follows_buffers_in_and_out() {
        let pool = HostPool::new(Some(10_000), false);
        let a = pool.alloc::<i64>(500).unwrap(); // 4,000 bytes
        let b = pool.alloc::<u32>(1000).unwrap(); // 4,000 bytes
        assert_eq!(pool.stats().held_bytes, 8_000);
        assert_eq!(pool.stats().buffers, 2);
        // 8,000 + 4,000 > 10,000: refused, and the account is unchanged.
        let e = pool.alloc::<i64>(500).unwrap_err();
        assert_eq!((e.requested, e.held, e.budget), (4_000, 8_000, 10_000));
        assert!(e.to_string().contains("--host-memory"), "{e}");
        drop(a);
        let c = pool.alloc::<i64>(500).unwrap();
        let s = pool.stats();
        assert_eq!(
            (s.held_bytes, s.peak_bytes, s.peak_buffers),
            (8_000, 8_000, 2)
        );
        assert!(c.iter().all(|&x| x == 0) && b.len() == 1000);
        drop((b, c));
        assert_eq!(pool.stats().held_bytes, 0);
        // A reservation counts like a buffer of its size, and is refused the same way.
        let r = pool.reserve(6_000).unwrap();
        assert_eq!((pool.stats().held_bytes, pool.stats().buffers), (6_000, 1));
        assert_eq!(pool.reserve(5_000).unwrap_err().held, 6_000);
        drop(r);
        assert_eq!(pool.stats().held_bytes, 0);
        assert!(!pool.stats().pinned, "not asked to lock pages");
    }

    #[test]
    fn page_locking_is_granted_or_explained() {
        let pool = HostPool::new(None, true);
        let buf = pool.alloc::<u8>(1 << 16).unwrap();
        let s = pool.stats();
        // Either every byte is locked, or the pool names the limit that refused it.
        match buf.is_pinned() {
            true => assert!(s.pinned && s.pinned_bytes == 1 << 16 && s.pin_error.is_none()),
            false => {
                let why = s.pin_error.unwrap();
                assert!(!s.pinned && why.contains("RLIMIT_MEMLOCK"), "{why}");
            }
        }
        drop(buf);
        assert_eq!(pool.stats().pinned_bytes, 0);
    }

    #[test]
    fn the_loader_footprint_counts_buffers_and_workers() {
        // No workers: one buffer, no stacks.
        assert_eq!(loader_host_bytes(0, 8, 1000, 50), 1000);
        // 2 workers, queue of 3: 4 buffers and 2 stacks with their scratch.
        assert_eq!(
            loader_host_bytes(2, 3, 1000, 50),
            4000 + 2 * (LOADER_WORKER_STACK_BYTES + 50)
        );
    }
}
