//! A run never writes over saves that are not its own to replace: a new run pointed at another
//! run's save directory is refused before any work (by `prepare`); a resumed run is refused
//! when its saves would replace later ones (branching from an older step into the same
//! directory) or a damaged newest save; a damaged newest save is an error naming the newest
//! whole one, never a silent step back. Each refusal leaves every saved byte where it was.

use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::prepare::{PrepareOptions, prepare};
use headroom_train::strategy::Pins;
use headroom_train::{TrainError, Trainer};
use std::path::Path;

fn keys(steps: u64, save_dir: &Path) -> TrainConfig {
    TrainConfig {
        model: Some("gpt-tiny".into()),
        micro_batch: Some(2),
        seq_len: Some(32),
        steps: Some(steps),
        save_every: Some(1),
        save_dir: Some(save_dir.to_path_buf()),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some("256MiB".parse().unwrap()),
        seed: Some(5),
        ..Default::default()
    }
}

fn prepared(c: RunConfig) -> Result<RunConfig, String> {
    prepare(
        c,
        &Corpus::bundled(),
        &Pins::default(),
        PrepareOptions::default(),
    )
    .map(|p| p.config)
    .map_err(|e| e.to_string())
}

/// Every file under `root` with its bytes, sorted by path.
fn contents(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Trains `c` from scratch to its end (saving every step into its save directory).
fn train(c: RunConfig) {
    let mut t = Trainer::new(c, &Corpus::bundled()).unwrap();
    t.train(&mut |_| {}).unwrap();
}

#[test]
fn a_new_run_is_refused_another_runs_save_directory_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("runs");
    let first = keys(2, &root).resolve().unwrap();
    prepared(first.clone()).unwrap();
    train(first.clone());
    let before = contents(&root);
    let e = prepared(keys(3, &root).resolve().unwrap()).unwrap_err();
    assert!(
        e.contains("already holds saves")
            && e.contains("step-000002")
            && e.contains(&format!("--resume {}", root.display())),
        "{e}"
    );
    // Continuing that run is what the directory is for.
    let (resumed, _) = first.resumed_with(&TrainConfig::default()).unwrap();
    prepared(resumed).unwrap();
    assert!(contents(&root) == before, "a refusal changes no saved byte");
}

#[test]
fn a_resumed_run_refuses_to_replace_later_or_damaged_saves() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("runs");
    let first = keys(3, &root).resolve().unwrap();
    train(first.clone());
    let resume = |from: &Path| -> Result<(), TrainError> {
        let mut t = Trainer::new(first.clone(), &Corpus::bundled())?;
        t.resume(from)
    };
    // From the newest save: allowed.
    resume(&root).unwrap();
    // From step 1 into the same directory: steps 2 and 3 would be replaced.
    let before = contents(&root);
    let e = resume(&root.join("step-000001")).unwrap_err().to_string();
    assert!(
        e.contains("step-000002 to step-000003") && e.contains("new --save-dir"),
        "{e}"
    );
    // The newest save damaged (its manifest gone): an error naming step 2 as the newest whole
    // save, not a resume from it.
    std::fs::remove_file(root.join("step-000003/manifest.json")).unwrap();
    let e = resume(&root).unwrap_err().to_string();
    let whole = root.join("step-000002").display().to_string();
    assert!(
        e.contains("damaged") && e.contains("step-000003") && e.contains(&whole),
        "{e}"
    );
    // Following the advice: step 2 into a new directory trains on, and the damaged folder is
    // untouched.
    let mut elsewhere = first.clone();
    elsewhere.save_dir = Some(dir.path().join("branch"));
    let mut t = Trainer::new(elsewhere, &Corpus::bundled()).unwrap();
    t.resume(&root.join("step-000002")).unwrap();
    t.train(&mut |_| {}).unwrap();
    assert!(
        dir.path()
            .join("branch/step-000003/manifest.json")
            .is_file()
    );
    let after: Vec<_> = contents(&root);
    let unchanged: Vec<_> = before
        .into_iter()
        .filter(|(p, _)| !p.ends_with("step-000003/manifest.json"))
        .collect();
    assert!(
        after == unchanged,
        "the damaged save's files stay as they were"
    );
}
