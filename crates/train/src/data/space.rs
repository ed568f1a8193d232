//! The room a written file may take: the bytes free to unprivileged users on the filesystem
//! that will hold it (POSIX `statvfs`: `f_bavail` × `f_frsize`), less a reserve kept free so a
//! preparation that runs long never fills the disk other programs write to.
//!
//! Not for: writing the file (see `token_file`) or what is written (see `prepare`).

use std::io;
use std::path::Path;

/// A filesystem's size and the bytes an unprivileged writer may still take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeSpace {
    pub available: u64,
    pub total: u64,
}

/// The most bytes kept free: a twentieth of the filesystem, at most 1 GiB.
pub const MAX_RESERVE_BYTES: u64 = 1 << 30;

impl FreeSpace {
    /// Bytes left free for others: a twentieth of the filesystem, at most
    /// [`MAX_RESERVE_BYTES`].
    pub fn reserve(&self) -> u64 {
        (self.total / 20).min(MAX_RESERVE_BYTES)
    }

    /// Bytes a writer may still take without eating into the reserve.
    pub fn usable(&self) -> u64 {
        self.available.saturating_sub(self.reserve())
    }
}

/// The free space of the filesystem holding `path` (an existing file or directory).
pub fn free_space(path: &Path) -> io::Result<FreeSpace> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{} holds a NUL byte", path.display())))?;
    // SAFETY: an all-zero statvfs is a valid value for statvfs to overwrite.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is NUL-terminated and `stat` is a live, writable statvfs.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let block = stat.f_frsize as u64;
    Ok(FreeSpace {
        available: (stat.f_bavail as u64).saturating_mul(block),
        total: (stat.f_blocks as u64).saturating_mul(block),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_a_twentieth_up_to_1_gib() {
        let small = FreeSpace {
            available: 30 << 20,
            total: 100 << 20,
        };
        // 100 MiB / 20 = 5 MiB kept free: 25 MiB usable.
        assert_eq!((small.reserve(), small.usable()), (5 << 20, 25 << 20));
        let large = FreeSpace {
            available: 10 << 30,
            total: 1 << 40,
        };
        assert_eq!((large.reserve(), large.usable()), (1 << 30, 9 << 30));
        let full = FreeSpace {
            available: 1 << 20,
            total: 1 << 40,
        };
        assert_eq!(full.usable(), 0);
    }

    #[test]
    fn the_temporary_directory_has_a_size() {
        let dir = tempfile::tempdir().unwrap();
        let space = free_space(dir.path()).unwrap();
        assert!(
            space.total > 0 && space.available <= space.total,
            "{space:?}"
        );
        assert!(free_space(Path::new("/no/such/directory")).is_err());
    }
}
