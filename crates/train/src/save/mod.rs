//! Saved runs: model and optimizer tensors in safetensors files plus a JSON manifest (step,
//! loss scaler, RNG state, data position, configuration). A save is written into a
//! temporary directory, every file fsynced, then renamed into place and recorded in `latest`
//! (itself replaced atomically), so a crash never leaves a half-written save where a
//! resume would read it. Every file's CRC-32 is recorded in the manifest, and the manifest's
//! own in `manifest.crc32`; a read verifies each before using a byte, so a flipped bit is an
//! error naming the file, never different weights.
//!
//! Not for: deciding what goes into a save (the trainer collects its tensors).
//! ("Checkpoint" in headroom means activation checkpointing; these are saves.)

use crate::data::DataPosition;
use crate::scaler::LossScaler;
use headroom_memory::output::write_output;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub mod room;
mod root;

use root::remove_stale_temporaries;
pub use root::{StepFolder, check_destination, locate, root_of, step_folders};

/// Version of the manifest layout; bumped on incompatible changes (2: checksums).
pub const FORMAT_VERSION: u32 = 2;

/// Element type of a stored tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoredDtype {
    F32,
    Bf16,
    F16,
    I64,
    /// Bytes (8-bit optimizer-state codes).
    U8,
}

impl StoredDtype {
    fn safetensors(self) -> Dtype {
        match self {
            StoredDtype::F32 => Dtype::F32,
            StoredDtype::Bf16 => Dtype::BF16,
            StoredDtype::F16 => Dtype::F16,
            StoredDtype::I64 => Dtype::I64,
            StoredDtype::U8 => Dtype::U8,
        }
    }

    fn from_safetensors(d: Dtype) -> Option<StoredDtype> {
        Some(match d {
            Dtype::F32 => StoredDtype::F32,
            Dtype::BF16 => StoredDtype::Bf16,
            Dtype::F16 => StoredDtype::F16,
            Dtype::I64 => StoredDtype::I64,
            Dtype::U8 => StoredDtype::U8,
            _ => return None,
        })
    }

    pub fn size_bytes(self) -> usize {
        match self {
            StoredDtype::F32 => 4,
            StoredDtype::Bf16 | StoredDtype::F16 => 2,
            StoredDtype::I64 => 8,
            StoredDtype::U8 => 1,
        }
    }
}

/// One tensor's bytes (little-endian, row-major) with its dtype and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTensor {
    pub dtype: StoredDtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Little-endian float bytes of `dtype` as f32 values (16-bit values are exact in f32).
pub fn widen(bytes: &[u8], dtype: StoredDtype) -> Vec<f32> {
    match dtype {
        StoredDtype::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        StoredDtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

/// Everything beside the tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    /// Optimizer steps completed.
    pub step: u64,
    /// Safetensors files of this save, by group (`model`, `master`, `optimizer`).
    pub files: BTreeMap<String, String>,
    /// CRC-32 (IEEE) of each file, as 8 hex digits, by file name.
    #[serde(default)]
    pub checksums: BTreeMap<String, String>,
    pub scaler: Option<LossScaler>,
    pub data_position: DataPosition,
    /// State of the run's random generators (dropout counters, init seed).
    pub rng: BTreeMap<String, u64>,
    /// Training losses so far, one per optimizer step.
    pub losses: Vec<f64>,
    /// Validation losses so far.
    #[serde(default)]
    pub val_losses: Vec<crate::report::ValLoss>,
    /// The resolved run configuration.
    pub config: serde_json::Value,
}

/// A save that cannot be written or read; names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("cannot write saved run {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "no saved run at {path}: {reason}; pass the directory given to --save-dir (or one of its step-NNNNNN folders) to --resume"
    )]
    Missing { path: PathBuf, reason: String },
    #[error(
        "corrupt saved run {path}: {reason}; resume from an earlier step-NNNNNN folder with a new --save-dir (the corrupt save is kept)"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error("damaged saved run {path}: {reason}; {fix}")]
    Damaged {
        path: PathBuf,
        reason: String,
        fix: String,
    },
    #[error("--save-dir {root} already holds saves this run would replace ({holds}); {fix}")]
    WouldReplace {
        root: PathBuf,
        holds: String,
        fix: String,
    },
    #[error(
        "saved run {path} has format version {found}, this headroom reads version {FORMAT_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
    #[error(
        "saved run {path} was written with {key} = {saved}, this run has {key} = {now}; give --resume alone to continue the saved run as it was"
    )]
    Mismatch {
        path: PathBuf,
        key: &'static str,
        saved: String,
        now: String,
    },
}

/// The file beside `manifest.json` that holds the manifest's own CRC-32.
const MANIFEST_CRC: &str = "manifest.crc32";

/// The bytes of the regular file `path`. Anything else (a FIFO, a device, a directory) is
/// refused before a byte is read: it is opened without blocking and its type checked on the
/// open descriptor, so a FIFO in a save never hangs a resume.
pub(crate) fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(std::io::Error::other(format!(
            "not a regular file (a {})",
            describe(kind)
        )));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// What a file that is not a regular file is.
fn describe(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    match kind {
        k if k.is_dir() => "directory",
        k if k.is_fifo() => "FIFO",
        k if k.is_socket() => "socket",
        k if k.is_char_device() || k.is_block_device() => "device",
        _ => "special file",
    }
}

/// CRC-32 (IEEE) of `bytes` as 8 hex digits.
fn crc32(bytes: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(bytes))
}

/// Checks `bytes` read from `path` against the recorded checksum.
fn verify(path: &Path, bytes: &[u8], recorded: &str) -> Result<(), SaveError> {
    let actual = crc32(bytes);
    if actual == recorded {
        return Ok(());
    }
    Err(SaveError::Corrupt {
        path: path.to_path_buf(),
        reason: format!(
            "checksum mismatch (CRC-32 {actual}, recorded {recorded}): the file changed after it was written"
        ),
    })
}

/// Tensors of one save, by group then by name.
pub type TensorGroups = BTreeMap<String, BTreeMap<String, StoredTensor>>;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SaveError + '_ {
    move |source| SaveError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a save under `root/step-NNNNNN` and points `root/latest` at it. Returns the save's
/// directory.
pub fn write(
    root: &Path,
    manifest: &Manifest,
    groups: &TensorGroups,
) -> Result<PathBuf, SaveError> {
    write_with_faults(root, manifest, groups, &crash_before)
}

/// The crash-trial hook: with `HEADROOM_CRASH_BEFORE=<operation>` in the environment (one of
/// `create`, a file name such as `manifest.json`, `rename`, `latest`), the process aborts just
/// before that operation of a save, as a power cut would stop it. `scripts/crash-trials.sh`
/// uses it; nothing else sets it.
fn crash_before(operation: &str) -> std::io::Result<()> {
    if std::env::var_os("HEADROOM_CRASH_BEFORE").is_some_and(|v| v == operation) {
        std::process::abort();
    }
    Ok(())
}

/// [`write`], with `fault` called before each file operation (named by the file it writes, or
/// `create`, `rename`, `latest`): an error it returns stands for a full disk or a failed
/// device at that point. Tests use it to show that the previous save survives every one.
fn write_with_faults(
    root: &Path,
    manifest: &Manifest,
    groups: &TensorGroups,
    fault: &dyn Fn(&str) -> std::io::Result<()>,
) -> Result<PathBuf, SaveError> {
    std::fs::create_dir_all(root).map_err(io_err(root))?;
    remove_stale_temporaries(root);
    let name = format!("step-{:06}", manifest.step);
    let final_dir = root.join(&name);
    let tmp_dir = root.join(format!(".{name}.tmp-{}", std::process::id()));
    fault("create")
        .and_then(|()| std::fs::create_dir(&tmp_dir))
        .map_err(io_err(&tmp_dir))?;
    let mut manifest = manifest.clone();
    manifest.format_version = FORMAT_VERSION;
    manifest.files.clear();
    manifest.checksums.clear();
    for (group, tensors) in groups {
        let file = format!("{group}.safetensors");
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, t)| {
                TensorView::new(t.dtype.safetensors(), t.shape.clone(), &t.data)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| SaveError::Corrupt {
                        path: tmp_dir.join(&file),
                        reason: format!("tensor {n}: {e}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        let bytes =
            safetensors::tensor::serialize(views, None).map_err(|e| SaveError::Corrupt {
                path: tmp_dir.join(&file),
                reason: e.to_string(),
            })?;
        fault(&file)
            .and_then(|()| write_output(&tmp_dir.join(&file), &bytes))
            .map_err(io_err(&tmp_dir.join(&file)))?;
        manifest.checksums.insert(file.clone(), crc32(&bytes));
        manifest.files.insert(group.clone(), file);
    }
    let json = serde_json::to_vec_pretty(&manifest).expect("manifest serialises");
    for (file, bytes) in [
        ("manifest.json", json.clone()),
        (MANIFEST_CRC, crc32(&json).into_bytes()),
    ] {
        fault(file)
            .and_then(|()| write_output(&tmp_dir.join(file), &bytes))
            .map_err(io_err(&tmp_dir.join(file)))?;
    }
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(io_err(&final_dir))?;
    }
    fault("rename")
        .and_then(|()| std::fs::rename(&tmp_dir, &final_dir))
        .map_err(io_err(&final_dir))?;
    if let Ok(d) = std::fs::File::open(root) {
        let _ = d.sync_all();
    }
    fault("latest")
        .and_then(|()| write_output(&root.join("latest"), name.as_bytes()))
        .map_err(io_err(&root.join("latest")))?;
    Ok(final_dir)
}

/// Reads and verifies the manifest of the save `path` names (see [`locate`]); returns it with
/// the save's directory.
pub fn read_manifest(path: &Path) -> Result<(Manifest, PathBuf), SaveError> {
    let dir = locate(path)?;
    let manifest_path = dir.join("manifest.json");
    let corrupt = |p: &Path, reason: String| SaveError::Corrupt {
        path: p.to_path_buf(),
        reason,
    };
    let text = read_regular(&manifest_path)
        .map_err(|e| corrupt(&manifest_path, format!("cannot read: {e}")))?;
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| corrupt(&manifest_path, e.to_string()))?;
    if manifest.format_version != FORMAT_VERSION {
        return Err(SaveError::Version {
            path: manifest_path,
            found: manifest.format_version,
        });
    }
    let recorded = read_regular(&dir.join(MANIFEST_CRC))
        .map_err(|e| corrupt(&dir.join(MANIFEST_CRC), format!("cannot read: {e}")))?;
    verify(
        &manifest_path,
        &text,
        String::from_utf8_lossy(&recorded).trim(),
    )?;
    Ok((manifest, dir))
}

/// Reads the save `path` names (see [`locate`]): its manifest and tensors, every file verified.
pub fn read(path: &Path) -> Result<(Manifest, TensorGroups), SaveError> {
    let (manifest, dir) = read_manifest(path)?;
    let manifest_path = dir.join("manifest.json");
    let corrupt = |p: &Path, reason: String| SaveError::Corrupt {
        path: p.to_path_buf(),
        reason,
    };
    let mut groups = TensorGroups::new();
    for (group, file) in &manifest.files {
        let file_path = dir.join(file);
        let bytes = read_regular(&file_path)
            .map_err(|e| corrupt(&file_path, format!("cannot read: {e}")))?;
        let recorded = manifest
            .checksums
            .get(file)
            .ok_or_else(|| corrupt(&manifest_path, format!("no checksum recorded for {file}")))?;
        verify(&file_path, &bytes, recorded)?;
        let st =
            SafeTensors::deserialize(&bytes).map_err(|e| corrupt(&file_path, e.to_string()))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let dtype = StoredDtype::from_safetensors(view.dtype()).ok_or_else(|| {
                corrupt(
                    &file_path,
                    format!("tensor {name} has unsupported dtype {:?}", view.dtype()),
                )
            })?;
            tensors.insert(
                name,
                StoredTensor {
                    dtype,
                    shape: view.shape().to_vec(),
                    data: view.data().to_vec(),
                },
            );
        }
        groups.insert(group.clone(), tensors);
    }
    Ok((manifest, groups))
}

#[cfg(test)]
mod tests;
