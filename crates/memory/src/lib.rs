//! headroom's device memory: every byte a run puts on a device goes through the caching
//! allocator in this crate, tagged with a [`Category`]. It reproduces PyTorch's CUDA caching
//! allocator (pools, rounding, splitting, retries, statistics, summary, snapshots) on pluggable
//! segment sources, and adds what PyTorch lacks: per-category accounting, fragmentation
//! figures, and expandable segments that search again after every reclaim step.
//!
//! This crate also holds the vocabulary shared with the planner (`Category`,
//! `MemoryBreakdown`, sizes); the planner depends on those types only.

pub mod breakdown;
pub mod category;
pub mod size;

pub use breakdown::{CategoryBytes, MemoryBreakdown};
pub use category::Category;
pub use size::{ByteSize, format_bytes, parse_size};
