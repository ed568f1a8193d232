//! Room on disk for what a run writes — its saves (`--save-dir`), the offload tier's files
//! (`--offload-dir`), the reports the binary writes — checked before any work: each output's
//! bytes, summed per file system, against the space free to unprivileged users there
//! (`statvfs`'s `f_bavail` blocks of `f_frsize` bytes, POSIX). A full disk found after training
//! loses the work since the last save, and the report with it.
//!
//! The bytes are lower bounds (a save's tensors without their headers and manifest), so a run
//! that fits is never refused; the check cannot keep the space free while the run goes on.
//!
//! Not for: writing (the save format in `mod.rs`, the offload store, `headroom_memory::output`).

use crate::config::RunConfig;
use crate::predict::Prediction;
use crate::trainer::{TrainError, model_spec};
use headroom_memory::size::format_bytes;
use headroom_nn::optim::OptimizerConfig;
use std::path::{Path, PathBuf};

/// One output and the bytes it will take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// What it is, as the user names it (`3 saves of 1.2 MiB (--save-dir)`).
    pub what: String,
    /// Where it goes: a directory or a file (the nearest existing ancestor is probed).
    pub path: PathBuf,
    pub bytes: u64,
    /// The flag that moves it elsewhere.
    pub flag: &'static str,
}

/// A file system: its device id and the bytes free to an unprivileged user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Volume {
    pub device: u64,
    pub free: u64,
}

/// Outputs that do not fit the free space of their file system.
#[derive(Debug, thiserror::Error)]
#[error(
    "not enough free disk space under {path}: {what} need at least {needed}, and its file system has {free} free; free space there, or give {flags} a directory on a larger disk",
    path = path.display(),
    needed = format_bytes(*needed),
    free = format_bytes(*free)
)]
pub struct RoomError {
    pub path: PathBuf,
    pub what: String,
    pub needed: u64,
    pub free: u64,
    pub flags: String,
}

/// The file system holding `path` (or its nearest existing ancestor), by `statvfs`.
pub fn statvfs_volume(path: &Path) -> std::io::Result<Volume> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let at = existing_ancestor(path);
    let device = std::fs::metadata(&at)?.dev();
    let c = std::ffi::CString::new(at.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: `statvfs` is plain data, for which all-zero bytes are a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a writable statvfs for the call to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let free = (s.f_bavail as u64).saturating_mul(s.f_frsize as u64);
    Ok(Volume { device, free })
}

/// `path` itself when it exists, else its nearest existing ancestor (`.` for a relative path
/// none of whose ancestors exists).
fn existing_ancestor(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|p| !p.as_os_str().is_empty() && p.exists())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Refuses `needs` whose sum on some file system exceeds its free space, as `volume` tells it.
/// A path whose file system cannot be probed is not refused (the write names its error).
pub fn check_room(
    needs: &[Need],
    volume: &dyn Fn(&Path) -> std::io::Result<Volume>,
) -> Result<(), RoomError> {
    let mut volumes: Vec<(Volume, Vec<&Need>)> = Vec::new();
    for need in needs.iter().filter(|n| n.bytes > 0) {
        let Ok(v) = volume(&need.path) else {
            continue;
        };
        match volumes.iter_mut().find(|(w, _)| w.device == v.device) {
            Some((_, list)) => list.push(need),
            None => volumes.push((v, vec![need])),
        }
    }
    for (v, list) in volumes {
        let needed: u64 = list.iter().map(|n| n.bytes).sum();
        if needed > v.free {
            let mut flags: Vec<&str> = list.iter().map(|n| n.flag).collect();
            flags.dedup();
            return Err(RoomError {
                path: list[0].path.clone(),
                what: list
                    .iter()
                    .map(|n| n.what.as_str())
                    .collect::<Vec<_>>()
                    .join(" and "),
                needed,
                free: v.free,
                flags: flags.join(" or "),
            });
        }
    }
    Ok(())
}

/// Bytes of one save of `config`: the trained weights in their compute format, fp32 master
/// weights where the precision keeps them, the optimizer's full-size states, and under LoRA the
/// merged weights (the base's own bytes, which NF4 shrinks, are left out: a lower bound).
pub fn save_bytes(config: &RunConfig) -> Result<u64, TrainError> {
    let spec = model_spec(config)?;
    let total = spec.num_params() as u64;
    let trained = spec.trainable_params()? as u64;
    let precision = config.strategy.precision;
    let optimizer = OptimizerConfig::for_strategy(config.strategy.optimizer, precision);
    let states = optimizer.kind.states_per_param(optimizer.momentum) as u64
        * optimizer.state_dtype.size_bytes();
    let per_trained = precision.param_bytes() + precision.master_bytes() + states;
    let merged = match config.lora {
        Some(_) => total * precision.param_bytes(),
        None => 0,
    };
    Ok(trained * per_trained + merged)
}

/// Saves a run of `config` writes from step 0: one every `save_every` steps and one at the end.
pub fn saves_written(config: &RunConfig) -> u64 {
    let steps = config.steps;
    match config.save_every {
        0 => 1,
        every => steps / every + u64::from(!steps.is_multiple_of(every)),
    }
}

/// What a run of `config` (predicted as `prediction`) writes besides the reports: its saves (all
/// of them for a new run; at least the next for a resumed one, whose step is not known here)
/// and every rank's offload file.
pub fn run_needs(config: &RunConfig, prediction: &Prediction) -> Result<Vec<Need>, TrainError> {
    let mut needs = Vec::new();
    if let Some(dir) = &config.save_dir {
        let one = save_bytes(config)?;
        let count = match config.resumed {
            true => 1,
            false => saves_written(config),
        };
        needs.push(Need {
            what: format!("{count} save(s) of {} each", format_bytes(one)),
            path: dir.clone(),
            bytes: one * count,
            flag: "--save-dir",
        });
    }
    if let Some(offload) = &prediction.offload {
        let per_rank = offload.disk.total();
        if per_rank > 0 {
            let ranks = config.data_parallel.max(1) as u64;
            needs.push(Need {
                what: format!(
                    "the offload files of {ranks} rank(s), {} each",
                    format_bytes(per_rank)
                ),
                path: config
                    .offload_dir
                    .clone()
                    .unwrap_or_else(std::env::temp_dir),
                bytes: per_rank * ranks,
                flag: "--offload-dir",
            });
        }
    }
    Ok(needs)
}
