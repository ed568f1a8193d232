//! The tiers below the device (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et
//! al. 2021): model states that leave the device live in host memory (buffers from a
//! [`HostPool`](headroom_memory::host_pool::HostPool), page-locked where the OS permits) or in
//! files on a disk (`--offload-dir`), read into and written from a bounded set of page-aligned
//! swap buffers by I/O workers, several requests in flight, every read checked against the
//! checksum of the last write. A store is a list of regions (one per block shard, each of
//! parts tagged with a memory [`Category`](headroom_memory::Category)); the trainer visits them
//! in order and the store reads the next region while the current one is worked on and writes
//! the previous one behind it.
//!
//! A store built for a dry run counts the same bytes per category and tier, swap buffers
//! included, and moves none.
//!
//! Not for: what the regions hold or the update rule (the trainer and the optimizer), device
//! memory (the caching allocator).

mod disk;
mod error;
mod io;
mod page;
mod stats;
mod store;

pub use disk::DiskFile;
pub use error::OffloadError;
pub use page::{AlignedBytes, PAGE, page_rounded};
pub use stats::{TierKind, TierStats};
pub use store::{OffloadStore, Part, RegionMut, StoreOptions};
