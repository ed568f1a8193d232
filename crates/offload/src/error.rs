//! Errors of the offload tiers. Each names the file, the operation, the offset and what to do;
//! none is ever answered with zeros.
//!
//! Not for: device out-of-memory errors (`headroom_memory::OutOfMemory`).

use headroom_memory::host_pool::OverBudget;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    #[error("offloaded states do not fit in host memory: {0}")]
    HostBudget(#[from] OverBudget),
    #[error("{op} {bytes} bytes at offset {offset} of {}: {source}; {hint}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        offset: u64,
        bytes: usize,
        source: std::io::Error,
        hint: String,
    },
    #[error(
        "region {region} of {} (offset {offset}) fails its checksum: crc32 {found:08x}, written as {expected:08x}; the disk or file was changed behind the run. Resume from the last save (--resume), or use --offload-optimizer cpu",
        path.display()
    )]
    Checksum {
        path: PathBuf,
        region: usize,
        offset: u64,
        expected: u32,
        found: u32,
    },
    #[error("cannot create the offload directory {}: {source}; pass --offload-dir a writable directory", path.display())]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the offload I/O workers stopped: {0}")]
    Workers(String),
}

/// What to do about an I/O error, by its kind.
pub(crate) fn hint(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
            "the disk is full: free space or point --offload-dir at a larger disk".into()
        }
        Some(libc::EIO) => "the disk reported an I/O error: check it, or use --offload-optimizer cpu".into(),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => {
            "the file cannot be written: point --offload-dir at a writable directory".into()
        }
        _ if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            "the file is shorter than the run wrote it: it was truncated or replaced behind the run; resume from the last save (--resume)".into()
        }
        _ => "check the disk under --offload-dir, or use --offload-optimizer cpu".into(),
    }
}
