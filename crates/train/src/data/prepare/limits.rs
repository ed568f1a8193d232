//! What bounds a preparation (`PrepareLimits`): streams allowed or not, the most tokens, a stop
//! flag, and the free space of the output's filesystem, checked before writing.
//!
//! Not for: measuring the free space (see `space`) or reading the input (see `input`).

use super::PrepareError;
use crate::data::space::{FreeSpace, free_space};
use headroom_memory::format_bytes;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// What bounds a preparation, and what may stop it.
pub struct PrepareLimits<'a> {
    /// Read an input that is not a regular file (a FIFO, a character device).
    pub allow_stream: bool,
    /// Most tokens to write; a corpus that gives more is an error.
    pub max_tokens: Option<u64>,
    /// Set to stop at the next piece (a signal handler sets it).
    pub stop: Option<&'a AtomicBool>,
    /// The free space of the filesystem holding a directory (`space::free_space`; a test
    /// gives its own).
    pub free_space: &'a dyn Fn(&Path) -> std::io::Result<FreeSpace>,
}

impl Default for PrepareLimits<'_> {
    fn default() -> Self {
        PrepareLimits {
            allow_stream: false,
            max_tokens: None,
            stop: None,
            free_space: &free_space,
        }
    }
}

impl std::fmt::Debug for PrepareLimits<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrepareLimits")
            .field("allow_stream", &self.allow_stream)
            .field("max_tokens", &self.max_tokens)
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

impl PrepareLimits<'_> {
    pub(super) fn stopped(&self) -> bool {
        self.stop.is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// Refuses to write `needed` more bytes beside `out` where its filesystem cannot spare them.
    pub(super) fn check_space(&self, out: &Path, needed: u64) -> Result<(), PrepareError> {
        let dir = directory_of(out);
        let space = (self.free_space)(&dir).map_err(|source| PrepareError::Space {
            path: dir.clone(),
            source,
        })?;
        if needed <= space.usable() {
            return Ok(());
        }
        Err(PrepareError::NoSpace {
            out: out.into(),
            needed: format_bytes(needed),
            usable: format_bytes(space.usable()),
            available: format_bytes(space.available),
            reserve: format_bytes(space.reserve()),
        })
    }
}

/// The directory a file at `path` is written in.
fn directory_of(path: &Path) -> PathBuf {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}
