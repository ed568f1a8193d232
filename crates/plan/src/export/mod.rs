//! Exports of a plan into the configuration formats that run it: a DeepSpeed `ds_config.json`,
//! an Accelerate config YAML (FSDP settings), and a TOML for `headroom train`. Files are written
//! atomically: to a temporary file in the same directory, then renamed over the target.
//!
//! Not for: choosing the plan.

pub mod accelerate;
pub mod deepspeed;
pub mod headroom;

use crate::error::{PlanError, Result};
use std::path::Path;

/// Writes an exported file through `headroom_memory::output` (atomic for regular files,
/// written through for FIFOs and devices).
pub fn write_export(path: &Path, contents: &str) -> Result<()> {
    headroom_memory::output::write_output(path, contents.as_bytes()).map_err(|source| {
        PlanError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}
