//! Writing output files (reports, pictures, snapshots, exported configs, saved runs) without
//! losing data and without harming what the path names:
//!
//! - a regular file (new or existing, also through a symlink, whose target is the one
//!   replaced) is written to a temporary file beside it, fsynced and renamed over it, so a
//!   crash leaves the old contents or the new, never half of them;
//! - anything else — a FIFO, a terminal, `/dev/stdout`, `/dev/null`, any path under `/dev` or
//!   `/proc` — is written through, never replaced (as root, replacing `/dev/stdout` would turn
//!   it into a regular file).
//!
//! `check_writable` lets a command refuse an unwritable output before hours of training.
//!
//! Not for: what is written (the callers).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` (see the module header).
pub fn write_output(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let special = path.starts_with("/dev") || path.starts_with("/proc");
    match std::fs::metadata(path) {
        Ok(m) if special || !m.is_file() => {
            if m.is_dir() {
                return Err(is_a_directory(path));
            }
            let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
            f.write_all(bytes)?;
            f.flush()
        }
        Ok(_) => replace_atomically(&std::fs::canonicalize(path)?, bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            replace_atomically(&dangling_target(path), bytes)
        }
        Err(e) => Err(e),
    }
}

/// Checks, before any work, that `path` can be written: not a directory, in an existing
/// directory that accepts a new file (tried with a temporary file, removed at once).
pub fn check_writable(path: &Path) -> io::Result<()> {
    if path.starts_with("/dev") || path.starts_with("/proc") {
        return std::fs::OpenOptions::new().write(true).open(path).map(drop);
    }
    if path.is_dir() {
        return Err(is_a_directory(path));
    }
    let target = match std::fs::canonicalize(path) {
        Ok(t) => t,
        Err(_) => dangling_target(path),
    };
    let probe = temporary_beside(&target)?;
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

fn is_a_directory(path: &Path) -> io::Error {
    io::Error::other(format!(
        "{} is a directory; give a file path",
        path.display()
    ))
}

/// Where a path that does not exist yet will be written: its own place, or the target of a
/// dangling symlink (relative targets are relative to the link's directory).
fn dangling_target(path: &Path) -> PathBuf {
    match std::fs::read_link(path) {
        Ok(target) if target.is_relative() => parent_of(path).join(target),
        Ok(target) => target,
        Err(_) => path.to_path_buf(),
    }
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// A hidden temporary name beside `path`, unique to this process.
fn temporary_beside(path: &Path) -> io::Result<PathBuf> {
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} is not a file path", path.display())))?;
    Ok(parent_of(path).join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    )))
}

/// Temporary file, fsync, rename over `path`.
fn replace_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut out = AtomicFile::at(path.to_path_buf())?;
    out.file().write_all(bytes)?;
    out.commit()
}

/// A regular file written piece by piece (and, if need be, patched by seeking back) that
/// appears whole or not at all: it is written to a temporary beside its path, and `commit`
/// fsyncs it and renames it over the path. Dropped before `commit`, the temporary is removed
/// and the path is untouched. For outputs too large to hold in memory (prepared token files).
#[derive(Debug)]
pub struct AtomicFile {
    file: std::fs::File,
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl AtomicFile {
    /// Starts writing `path`, which must be a regular file or not exist yet (a symlink's
    /// target is the file replaced).
    pub fn create(path: &Path) -> io::Result<AtomicFile> {
        let target = match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => return Err(is_a_directory(path)),
            Ok(m) if !m.is_file() => {
                return Err(io::Error::other(format!(
                    "{} is not a regular file; give a file path",
                    path.display()
                )));
            }
            Ok(_) => std::fs::canonicalize(path)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => dangling_target(path),
            Err(e) => return Err(e),
        };
        AtomicFile::at(target)
    }

    fn at(target: PathBuf) -> io::Result<AtomicFile> {
        let tmp = temporary_beside(&target)?;
        let file = std::fs::File::create(&tmp)?;
        Ok(AtomicFile {
            file,
            tmp,
            target,
            committed: false,
        })
    }

    /// The temporary file being written.
    pub fn file(&mut self) -> &mut std::fs::File {
        &mut self.file
    }

    /// Flushes the contents to disk and puts them at the path.
    pub fn commit(mut self) -> io::Result<()> {
        self.file.sync_all()?;
        std::fs::rename(&self.tmp, &self.target)?;
        self.committed = true;
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl io::Seek for AtomicFile {
    fn seek(&mut self, pos: io::SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    #[test]
    fn regular_files_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        write_output(&path, b"first").unwrap();
        let inode = std::fs::metadata(&path).unwrap().ino();
        write_output(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        // A new inode: the old contents were never overwritten in place.
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), inode);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn a_symlink_stays_a_symlink_and_its_target_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.json");
        let link = dir.path().join("link.json");
        std::fs::write(&target, b"old").unwrap();
        std::os::unix::fs::symlink("target.json", &link).unwrap();
        write_output(&link, b"new").unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        // A dangling link creates its target.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink("made.json", &dangling).unwrap();
        write_output(&dangling, b"made").unwrap();
        assert!(
            std::fs::symlink_metadata(&dangling)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read(dir.path().join("made.json")).unwrap(),
            b"made"
        );
    }

    #[test]
    fn fifos_and_devices_are_written_through_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        write_output(&fifo, b"through the pipe").unwrap();
        assert_eq!(reader.join().unwrap(), b"through the pipe");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        write_output(Path::new("/dev/null"), b"gone").unwrap();
        assert!(
            std::fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
    }

    #[test]
    fn an_atomic_file_appears_only_when_committed() {
        use std::io::{Seek, SeekFrom};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.bin");
        let mut out = AtomicFile::create(&path).unwrap();
        out.file().write_all(b"....payload").unwrap();
        out.file().seek(SeekFrom::Start(0)).unwrap();
        out.file().write_all(b"HEAD").unwrap();
        assert!(!path.exists(), "nothing at the path before commit");
        out.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"HEADpayload");
        // Dropped uncommitted: the old contents stay and no temporary is left.
        let mut abandoned = AtomicFile::create(&path).unwrap();
        abandoned.file().write_all(b"half").unwrap();
        drop(abandoned);
        assert_eq!(std::fs::read(&path).unwrap(), b"HEADpayload");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(AtomicFile::create(dir.path()).is_err());
    }

    #[test]
    fn unwritable_outputs_are_found_before_any_work() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_writable(&dir.path().join("ok.json")).is_ok());
        let e = check_writable(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        assert!(check_writable(&dir.path().join("missing/r.json")).is_err());
        assert!(write_output(dir.path(), b"x").is_err());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the probe is removed"
        );
    }
}
