//! The offload section of a run report: each offload store's bytes per category on the host
//! and disk tiers, its swap buffers and transfers, the host gradient buffers, and how much of
//! the transfer time was hidden behind the update.
//!
//! Not for: filling it (the trainer's `offload`) or drawing it (the CLI).

use headroom_memory::CategoryBytes;
use headroom_offload::TierStats;
use serde::{Deserialize, Serialize};

/// What the report shows of offload: each store, the gradient staging buffers, and the
/// host and disk bytes per category of the rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OffloadReport {
    pub stores: Vec<TierStats>,
    /// Host gradient buffers: count and bytes each.
    pub gradient_buffers: usize,
    pub gradient_buffer_bytes: u64,
    /// Seconds copying gradients to the host, and the part the update waited for.
    pub gradient_copy_seconds: f64,
    pub gradient_copy_waited_seconds: f64,
    /// Host bytes per category (resident regions and gradient buffers; swap buffers apart).
    pub host: CategoryBytes,
    /// Bytes of swap buffers in host memory.
    pub swap_bytes: u64,
    pub disk: CategoryBytes,
}

impl OffloadReport {
    /// The share of the gradient copies' time the update did not wait for.
    pub fn gradient_hidden_fraction(&self) -> f64 {
        match self.gradient_copy_seconds {
            t if t > 0.0 => (1.0 - self.gradient_copy_waited_seconds / t).clamp(0.0, 1.0),
            _ => 1.0,
        }
    }

    /// All host bytes of the offload tiers.
    pub fn host_total(&self) -> u64 {
        self.host.total() + self.swap_bytes
    }
}
