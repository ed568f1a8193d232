//! Exports of a plan into the configuration formats that run it: a DeepSpeed `ds_config.json`,
//! an Accelerate config YAML (FSDP settings), and a TOML for `headroom train`. Files are written
//! atomically: to a temporary file in the same directory, then renamed over the target.
//!
//! Not for: choosing the plan.

pub mod accelerate;
pub mod deepspeed;
pub mod headroom;

use crate::error::{PlanError, Result};
use std::io::Write;
use std::path::Path;

/// Writes `contents` to `path` atomically (temp file in the same directory, fsync, rename).
pub fn write_atomic(path: &Path, contents: &str) -> Result<()> {
    let io = |source: std::io::Error| PlanError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a file name",
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}
