//! The out-of-memory error: PyTorch's message shape (tried to allocate, total capacity, free,
//! allocated by tensors, reserved but unallocated) followed by advice that fits the numbers.
//!
//! Not for: recovering from OOM (the trainer halves the micro-batch; see the train crate).

use crate::breakdown::CategoryBytes;
use crate::size::{MIB, format_size_pytorch};
use std::fmt;

/// A device allocation that could not be served.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfMemory {
    /// The caller's request in bytes.
    pub requested: u64,
    /// The segment size the allocator tried to reserve (PyTorch reports this one).
    pub alloc_size: u64,
    pub capacity: u64,
    /// Capacity minus reserved bytes.
    pub free: u64,
    /// Bytes handed out to tensors.
    pub allocated: u64,
    /// Bytes held from the segment source.
    pub reserved: u64,
    pub expandable_segments: bool,
    /// Allocated bytes per category at the moment of the failure.
    pub by_category: Box<CategoryBytes>,
    /// Name given to the failed allocation, if any.
    pub name: Option<String>,
    /// The device's name in messages (`cpu:0`).
    pub device: String,
}

impl OutOfMemory {
    /// Reserved but unallocated bytes: cached memory that could not serve this request.
    pub fn reserved_unallocated(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }

    /// Advice chosen from the numbers: fragmentation first when it could explain the failure,
    /// otherwise fewer bytes per micro-batch, naming the largest category.
    pub fn advice(&self) -> String {
        let cached = self.reserved_unallocated();
        let fragmentation =
            cached >= self.alloc_size.min(self.requested.max(1)) && cached >= self.capacity / 20;
        if fragmentation && !self.expandable_segments {
            return format!(
                "{} is reserved but unallocated: the cache is fragmented. Try expandable segments (--allocator expandable, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in PyTorch) so that freed space serves requests of any size.",
                format_size_pytorch(cached)
            );
        }
        let (top, top_bytes) = self
            .by_category
            .iter()
            .max_by_key(|&(_, b)| b)
            .unwrap_or((crate::Category::Other, 0));
        let mut advice = format!(
            "The largest category in use is {top} ({}). Use fewer bytes per micro-batch: halve the micro-batch and double gradient accumulation (same effective batch), checkpoint activations, or use memory-efficient attention",
            format_size_pytorch(top_bytes)
        );
        if top_bytes > 0
            && matches!(
                top,
                crate::Category::Parameter
                    | crate::Category::OptimizerState
                    | crate::Category::MasterWeight
                    | crate::Category::Gradient
            )
        {
            advice.push_str(
                "; model states dominate, so shard them (ZeRO) or offload the optimizer states",
            );
        }
        advice.push('.');
        advice
    }
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.requested >= crate::rounding::MAX_REQUEST {
            return write!(
                f,
                "Device out of memory. Tried to allocate more than 1EB memory."
            );
        }
        write!(
            f,
            "Device out of memory. Tried to allocate {}{}. Device {} has a total capacity of {} of which {} is free. Of the allocated memory {} is allocated by tensors, and {} is reserved but unallocated. {}",
            format_size_pytorch(self.alloc_size),
            match &self.name {
                Some(n) => format!(
                    " (for '{n}', {} requested)",
                    format_size_pytorch(self.requested)
                ),
                None if self.alloc_size != self.requested && self.requested > MIB => {
                    format!(" ({} requested)", format_size_pytorch(self.requested))
                }
                None => String::new(),
            },
            self.device,
            format_size_pytorch(self.capacity),
            format_size_pytorch(self.free),
            format_size_pytorch(self.allocated),
            format_size_pytorch(self.reserved_unallocated()),
            self.advice()
        )
    }
}

impl std::error::Error for OutOfMemory {}
