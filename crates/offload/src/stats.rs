//! What an offload store holds on each tier and what its transfers cost: bytes per category in
//! host memory and on disk, the swap buffers (count × size), bytes moved, the workers' busy time
//! and the time the caller waited for them (the rest was hidden behind its work).
//!
//! Not for: device memory (the allocator's statistics).

use headroom_memory::CategoryBytes;
use serde::{Deserialize, Serialize};

/// Where a store keeps its regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierKind {
    /// Host memory, one buffer per region.
    #[default]
    Host,
    /// A file, regions read into swap buffers when used.
    Disk,
}

impl std::fmt::Display for TierKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TierKind::Host => "host",
            TierKind::Disk => "disk",
        })
    }
}

/// A store's bytes and transfers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TierStats {
    /// What the store holds (`optimizer`, `parameters`).
    pub name: String,
    pub tier: TierKind,
    /// Regions resident in host memory, per category (whole pages).
    pub host: CategoryBytes,
    /// Regions in the file, per category (whole pages).
    pub disk: CategoryBytes,
    /// Swap buffers in host memory (disk tier): how many and the bytes of each.
    pub swap_buffers: usize,
    pub swap_buffer_bytes: u64,
    /// Bytes read from and written to the file.
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Seconds the I/O workers spent in transfers, summed over workers.
    pub io_seconds: f64,
    /// Seconds the caller waited for a transfer to finish.
    pub waited_seconds: f64,
    /// The file, for the disk tier.
    pub path: Option<String>,
    /// Whether the file bypasses the page cache (`O_DIRECT`), and why not when it does not.
    pub direct_io: bool,
    pub buffered_reason: Option<String>,
    /// Whether every host buffer is page-locked, and why not when one is not.
    pub pinned: bool,
    pub pin_error: Option<String>,
}

impl TierStats {
    /// Host bytes: resident regions plus swap buffers.
    pub fn host_bytes(&self) -> u64 {
        self.host.total() + self.swap_buffers as u64 * self.swap_buffer_bytes
    }

    /// The share of transfer time the caller did not wait for (1 when nothing was moved).
    pub fn hidden_fraction(&self) -> f64 {
        match self.io_seconds {
            s if s > 0.0 => (1.0 - self.waited_seconds / s).clamp(0.0, 1.0),
            _ => 1.0,
        }
    }
}
