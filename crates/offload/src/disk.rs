//! One file of offloaded regions on disk. It is opened with `O_DIRECT` where the file system
//! accepts it (the page cache would otherwise hold a second copy of every state in host memory
//! and hide the disk's real speed); where it refuses (tmpfs, some overlay file systems: `EINVAL`
//! at open or on the first aligned transfer) the file is used buffered and says why. Reads and
//! writes are positional (`pread`/`pwrite`), so several may be in flight on one descriptor.
//!
//! Not for: which region sits where or the checksums (the store), threads (`io`).

use crate::error::{OffloadError, hint};
use crate::page::PAGE;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// An open offload file.
#[derive(Debug)]
pub struct DiskFile {
    path: PathBuf,
    file: File,
    /// Why the file is not opened with `O_DIRECT`, when it is not.
    buffered: Option<String>,
}

impl DiskFile {
    /// Creates (or truncates) `path`, with direct I/O when the file system accepts it.
    pub fn create(path: &Path) -> Result<DiskFile, OffloadError> {
        let io = |op, source: std::io::Error| OffloadError::Io {
            op,
            path: path.to_path_buf(),
            offset: 0,
            bytes: 0,
            hint: hint(&source),
            source,
        };
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(flags)
                .open(path)
        };
        // Every file is probed with one aligned page: some file systems accept O_DIRECT at
        // open and refuse the first transfer, and a full or read-only disk shows here, before
        // any state is written.
        let probe = |file: &File| -> std::io::Result<()> {
            let page = crate::page::Page::default();
            // SAFETY: a `Page` is PAGE initialised bytes, aligned to PAGE.
            let bytes = unsafe {
                std::slice::from_raw_parts((&page as *const crate::page::Page).cast(), PAGE)
            };
            file.write_all_at(bytes, 0)?;
            file.set_len(0)
        };
        let direct_refused = match open(libc::O_DIRECT) {
            Ok(file) => match probe(&file) {
                Ok(()) => {
                    return Ok(DiskFile {
                        path: path.to_path_buf(),
                        file,
                        buffered: None,
                    });
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    format!("O_DIRECT transfers refused ({e}): buffered I/O")
                }
                Err(e) => return Err(io("writing", e)),
            },
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                format!("O_DIRECT refused by the file system ({e}): buffered I/O")
            }
            Err(e) => return Err(io("creating", e)),
        };
        let file = open(0).map_err(|e| io("creating", e))?;
        probe(&file).map_err(|e| io("writing", e))?;
        Ok(DiskFile {
            path: path.to_path_buf(),
            file,
            buffered: Some(direct_refused),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether transfers bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.buffered.is_none()
    }

    /// Why transfers go through the page cache, when they do.
    pub fn buffered_reason(&self) -> Option<&str> {
        self.buffered.as_deref()
    }

    /// Writes `bytes` (whole aligned pages) at `offset` (a multiple of a page).
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> Result<(), OffloadError> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| self.error("writing", offset, bytes.len(), e))
    }

    /// Fills `bytes` (whole aligned pages) from `offset`; a short file is an error, never zeros.
    pub fn read_at(&self, bytes: &mut [u8], offset: u64) -> Result<(), OffloadError> {
        let len = bytes.len();
        self.file
            .read_exact_at(bytes, offset)
            .map_err(|e| self.error("reading", offset, len, e))
    }

    /// Makes the written bytes durable.
    pub fn sync(&self) -> Result<(), OffloadError> {
        self.file
            .sync_data()
            .map_err(|e| self.error("syncing", 0, 0, e))
    }

    fn error(
        &self,
        op: &'static str,
        offset: u64,
        bytes: usize,
        e: std::io::Error,
    ) -> OffloadError {
        OffloadError::Io {
            op,
            path: self.path.clone(),
            offset,
            bytes,
            hint: hint(&e),
            source: e,
        }
    }
}

impl Drop for DiskFile {
    /// The file is scratch (saves are written elsewhere): it goes with its store.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::AlignedBytes;
    use headroom_memory::host_pool::HostPool;

    #[test]
    fn pages_written_read_back_and_a_short_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = DiskFile::create(&dir.path().join("states.bin")).unwrap();
        assert!(file.is_direct() || file.buffered_reason().unwrap().contains("O_DIRECT"));
        let pool = HostPool::new(None, false);
        let mut out = AlignedBytes::new(&pool, 2 * PAGE).unwrap();
        for (i, b) in out.as_bytes_mut().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        file.write_at(out.as_bytes(), PAGE as u64).unwrap();
        let mut back = AlignedBytes::new(&pool, 2 * PAGE).unwrap();
        file.read_at(back.as_bytes_mut(), PAGE as u64).unwrap();
        assert_eq!(back.as_bytes(), out.as_bytes());
        // Past the end: an error naming the file, not zeros.
        let e = file
            .read_at(back.as_bytes_mut(), 2 * PAGE as u64)
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("states.bin") && text.contains("truncated"),
            "{text}"
        );
    }

    #[test]
    fn a_full_disk_is_named_when_the_file_is_created() {
        // A file that is a link to /dev/full answers every write with ENOSPC; dropping the
        // store removes the link, never the device.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("states.bin");
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let text = DiskFile::create(&path).unwrap_err().to_string();
        assert!(
            text.contains("disk is full") && text.contains("states.bin"),
            "{text}"
        );
    }
}
