//! A save directory (`--save-dir`): its `step-NNNNNN` folders and `latest`; which save a resume
//! reads ([`locate`]); whether a run may write its saves there without replacing another run's
//! or a damaged one ([`check_destination`]); and the leftovers of saves that never finished.
//!
//! A save is finished when its folder is renamed into place (the rename is atomic and comes
//! after every file, the manifest last, was written and fsynced); `latest` is written after
//! that. So a step folder without a manifest, or a `latest` that names a folder which is not
//! there, never comes from a crash: it is damage, and a resume refuses it, naming the newest
//! whole save and how to continue from it without writing over the damaged one.
//!
//! Not for: the files inside a save (`mod.rs`).

use super::SaveError;
use std::path::{Path, PathBuf};

/// One `step-NNNNNN` folder of a save directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFolder {
    pub step: u64,
    pub path: PathBuf,
    /// It holds a manifest (a regular file), as every finished save does.
    pub complete: bool,
}

/// The step of a folder named `step-NNNNNN`, or `None` for any other name.
fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `path` is a regular file (through a symlink); never opens it.
pub(super) fn is_regular(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// The step folders under `root`, oldest first (none when `root` cannot be read).
pub fn step_folders(root: &Path) -> Vec<StepFolder> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut folders: Vec<StepFolder> = entries
        .flatten()
        .filter_map(|e| {
            let step = step_of(&e.file_name().to_string_lossy())?;
            let path = e.path();
            path.is_dir().then(|| StepFolder {
                step,
                complete: is_regular(&path.join("manifest.json")),
                path,
            })
        })
        .collect();
    folders.sort_by_key(|f| f.step);
    folders
}

/// The folder `latest` under `root` names, when it is a regular file that names one.
fn latest_name(root: &Path) -> Option<String> {
    let path = root.join("latest");
    if !is_regular(&path) {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

/// A damaged save at `path` (`reason`), with the way to continue from the newest whole save
/// among `folders` without writing over it.
fn damaged(path: &Path, reason: &str, folders: &[StepFolder]) -> SaveError {
    let fix = match folders.iter().rev().find(|f| f.complete) {
        Some(whole) => format!(
            "the newest whole save is {p}: continue from it with --resume {p} and a new --save-dir (saves into this directory would replace the damaged folder, which is kept for inspection)",
            p = whole.path.display()
        ),
        None => "no whole save is left here: start the run again with a new --save-dir".into(),
    };
    SaveError::Damaged {
        path: path.to_path_buf(),
        reason: reason.to_string(),
        fix,
    }
}

/// The save directory `path` names: a save itself (a folder holding `manifest.json`), or a
/// directory of saves, whose newest step folder is read — also when `latest` still names the
/// one before (a crash between the rename and `latest`). A newest folder without a manifest, or
/// a `latest` naming a folder that is not there, is an error, never a silent step back.
pub fn locate(path: &Path) -> Result<PathBuf, SaveError> {
    let missing = |reason: String| SaveError::Missing {
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_dir() {
        return Err(missing("not a directory".into()));
    }
    let manifest = path.join("manifest.json");
    if std::fs::symlink_metadata(&manifest).is_ok() {
        if is_regular(&manifest) {
            return Ok(path.to_path_buf());
        }
        return Err(SaveError::Corrupt {
            path: manifest,
            reason: "not a regular file".into(),
        });
    }
    let folders = step_folders(path);
    if let Some(name) = latest_name(path)
        && !folders
            .iter()
            .any(|f| f.path.file_name() == Some(name.as_ref()))
    {
        let reason = "`latest` names this save, but it is not there (removed by hand or damaged)";
        return Err(damaged(&path.join(&name), reason, &folders));
    }
    let Some(newest) = folders.last() else {
        return Err(missing(
            "neither manifest.json nor a step-NNNNNN folder is there".into(),
        ));
    };
    if !newest.complete {
        let reason = match std::fs::symlink_metadata(newest.path.join("manifest.json")) {
            Ok(_) => "the newest save's manifest.json is not a regular file",
            Err(_) => {
                "the newest save has no manifest.json, which every finished save has (it is written before the folder is renamed into place)"
            }
        };
        return Err(damaged(&newest.path, reason, &folders));
    }
    Ok(newest.path.clone())
}

/// The directory saves of the run at `save` go to: its parent for a `step-NNNNNN` folder.
pub fn root_of(save: &Path) -> PathBuf {
    let is_step = save
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| step_of(n).is_some());
    match save.parent() {
        Some(parent) if is_step => parent.to_path_buf(),
        _ => save.to_path_buf(),
    }
}

/// Whether two paths name the same directory (both resolved; equal as given otherwise).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Refuses a save directory `root` into which this run would write over saves that are not its
/// own to replace. `resumed`: the save the run continues (its folder and step), `None` for a new
/// run. A new run needs a directory without saves (no step folder, no `latest`); a resumed run
/// writing into its save's own directory needs that no other folder there is at or beyond its
/// step (an older save branched from, or a damaged newest one, would be replaced); into another
/// directory, it needs one without saves, as a new run does.
pub fn check_destination(root: &Path, resumed: Option<(&Path, u64)>) -> Result<(), SaveError> {
    if !root.is_dir() {
        return Ok(());
    }
    let folders = step_folders(root);
    match resumed {
        Some((save, step)) if same_dir(&root_of(save), root) => {
            let later: Vec<&StepFolder> = folders
                .iter()
                .filter(|f| f.step >= step && f.path.file_name() != save.file_name())
                .collect();
            if later.is_empty() {
                return Ok(());
            }
            let fix = format!(
                "this run continues from step {step}: give a new --save-dir to keep them, or move them out of {}",
                root.display()
            );
            Err(would_replace(root, &later, fix))
        }
        _ => {
            let latest = std::fs::symlink_metadata(root.join("latest")).is_ok();
            if folders.is_empty() && !latest {
                return Ok(());
            }
            let fix = match resumed {
                Some(_) => "give --save-dir a new directory, or none: saves then go on beside the resumed one".to_string(),
                None => format!(
                    "continue that run with --resume {}, or give a new --save-dir",
                    root.display()
                ),
            };
            Err(would_replace(
                root,
                &folders.iter().collect::<Vec<_>>(),
                fix,
            ))
        }
    }
}

/// The error for a save directory whose `clashing` folders (or, with none, its `latest`) a run
/// would replace.
fn would_replace(root: &Path, clashing: &[&StepFolder], fix: String) -> SaveError {
    let holds = match clashing {
        [] => "a `latest` file".to_string(),
        [one] => display_name(&one.path),
        [first, .., last] => format!(
            "{} step folders, {} to {}",
            clashing.len(),
            display_name(&first.path),
            display_name(&last.path)
        ),
    };
    SaveError::WouldReplace {
        root: root.to_path_buf(),
        holds,
        fix,
    }
}

fn display_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    )
}

/// Whether process `pid` is alive on this machine (signal 0 checks without sending).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Removes what saves under `root` left when their process died mid-save (a crash, a kill, an
/// `mpirun` that ended a rank): hidden `.step-NNNNNN.tmp-PID` folders and `.latest.tmp-PID`
/// files of processes no longer alive, and this process's own from a save that failed. A live
/// process's temporaries are its save in progress and stay. Best effort: one that cannot be
/// removed stays.
pub(super) fn remove_stale_temporaries(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some((stem, pid)) = name.rsplit_once(".tmp-") else {
            continue;
        };
        let ours = stem
            .strip_prefix('.')
            .is_some_and(|s| s == "latest" || step_of(s).is_some());
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if !ours || (pid != me && alive(pid)) {
            continue;
        }
        let path = entry.path();
        let _ = match path.is_dir() {
            true => std::fs::remove_dir_all(&path),
            false => std::fs::remove_file(&path),
        };
    }
}
