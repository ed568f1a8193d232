//! headroom's device memory: every byte a run puts on a device goes through the caching
//! allocator in this crate, tagged with a [`Category`]. It reproduces PyTorch's CUDA caching
//! allocator (pools, rounding, splitting, retries, statistics, summary, snapshots) on pluggable
//! segment sources, and adds what PyTorch lacks: per-category accounting, fragmentation
//! figures, and expandable segments that search again after every reclaim step.
//!
//! It also defines the memory side of the shared vocabulary (`Category`, `CategoryBytes`,
//! `MemoryBreakdown`, `MemoryPeaks`, sizes), which `headroom-strategy` re-exports beside the
//! strategy types.

pub mod allocator;
pub mod arena;
pub mod breakdown;
pub mod category;
pub mod config;
pub mod device;
pub mod doctor;
pub mod fragmentation;
pub mod host;
pub mod host_pool;
pub mod oom;
pub mod output;
mod pickle_depth;
pub mod quote;
pub mod replay;
mod replay_json;
pub mod replay_labels;
pub mod replay_snapshot;
pub mod rounding;
pub mod size;
pub mod snapshot;
pub mod source;
pub mod stats;
pub mod summary;
pub mod synthetic;
pub mod timeline;
pub mod trace;

pub use allocator::{Allocation, ArenaError, ArenaReport, CachingAllocator, InvalidFree};
pub use arena::ArenaLayout;
pub use breakdown::{CategoryBytes, MemoryBreakdown, MemoryPeaks};
pub use category::Category;
pub use config::{AllocatorConfig, AllocatorKind};
pub use device::{Device, DeviceBuffer};
pub use fragmentation::Fragmentation;
pub use oom::OutOfMemory;
pub use size::{ByteSize, format_bytes, parse_size};
pub use snapshot::Snapshot;
pub use source::{HostSource, SegmentSource, VirtualSource};
pub use stats::DeviceStats;
pub use summary::memory_summary;
