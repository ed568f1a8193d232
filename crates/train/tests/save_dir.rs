//! A run never writes over saves that are not its own to replace: a new run pointed at another
//! run's save directory is refused before any work (by `prepare`); a resumed run is refused
//! when its saves would replace later ones (branching from an older step into the same
//! directory) or a damaged newest save; a damaged newest save is an error naming the newest
//! whole one, never a silent step back. Each refusal leaves every saved byte where it was.

use headroom_memory::size::format_bytes;
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

/// A save's bytes as predicted before the run: by hand, gpt-tiny's 34,688 parameters take 4
/// bytes each in fp32 plus AdamW's two f32 states (12 B per parameter: 416,256 B); bf16-mixed
/// keeps 2-byte weights, 4-byte masters and two f32 states (14 B: 485,632 B). The tensors of a
/// real save hold exactly that many bytes.
#[test]
fn the_predicted_save_size_is_the_bytes_of_a_real_saves_tensors() {
    use headroom_train::save::{self, room};
    let dir = tempfile::tempdir().unwrap();
    for (precision, by_hand) in [("fp32", 416_256u64), ("bf16-mixed", 485_632)] {
        let root = dir.path().join(precision);
        let mut k = keys(2, &root);
        k.precision = Some(precision.parse().unwrap());
        let c = k.resolve().unwrap();
        assert_eq!(room::save_bytes(&c).unwrap(), by_hand, "{precision}");
        train(c);
        let (_, groups) = save::read(&root).unwrap();
        let stored: usize = groups.values().flatten().map(|(_, t)| t.data.len()).sum();
        assert_eq!(stored as u64, by_hand, "{precision}");
    }
    // Saves written: every 2 of 5 steps, at 2, 4 and the end; every 2 of 4 at 2 and 4.
    let mut c = keys(5, dir.path()).resolve().unwrap();
    c.save_every = 2;
    assert_eq!(room::saves_written(&c), 3);
    c.steps = 4;
    assert_eq!(room::saves_written(&c), 2);
    c.save_every = 0;
    assert_eq!(room::saves_written(&c), 1);
}

/// The free space comes from a function the test gives: no disk is filled.
#[test]
fn outputs_beyond_the_free_space_are_refused_with_the_numbers() {
    use headroom_train::save::room::{Need, Volume, check_room};
    let need = |what: &str, path: &str, bytes, flag| Need {
        what: what.into(),
        path: path.into(),
        bytes,
        flag,
    };
    // /data and /data/runs are one file system (device 1) with 1,000,000 B free; /scratch is
    // another (device 2) with 10 B.
    let volume = |p: &Path| -> std::io::Result<Volume> {
        Ok(match p.starts_with("/scratch") {
            true => Volume {
                device: 2,
                free: 10,
            },
            false => Volume {
                device: 1,
                free: 1_000_000,
            },
        })
    };
    let saves = need("3 save(s)", "/data/runs", 600_000, "--save-dir");
    let offload = need("the offload files", "/data/tmp", 300_000, "--offload-dir");
    check_room(&[saves.clone(), offload.clone()], &volume).unwrap();
    // 600,000 + 500,000 > 1,000,000 on the same file system: refused, both named.
    let more = need("the offload files", "/data/tmp", 500_000, "--offload-dir");
    let e = check_room(&[saves.clone(), more], &volume)
        .unwrap_err()
        .to_string();
    let (needed, free) = (format_bytes(1_100_000), format_bytes(1_000_000));
    assert!(
        e.contains(&needed)
            && e.contains(&free)
            && e.contains("3 save(s) and the offload files")
            && e.contains("--save-dir or --offload-dir"),
        "{e}"
    );
    // 11 B on a file system with 10 free; nothing needed there is never refused.
    let e = check_room(
        &[need("a report", "/scratch/r.json", 11, "--json-report")],
        &volume,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("/scratch/r.json") && e.contains("--json-report"),
        "{e}"
    );
    check_room(&[need("nothing", "/scratch/x", 0, "--x"), offload], &volume).unwrap();
}

/// What `prepare` probes for a run: its saves and its offload files, in the directories given.
#[test]
fn a_runs_needs_are_its_saves_and_offload_files() {
    use headroom_train::save::room::{run_needs, save_bytes};
    use headroom_train::strategy::Offload;
    let dir = tempfile::tempdir().unwrap();
    let mut c = keys(4, &dir.path().join("runs")).resolve().unwrap();
    c.save_every = 2;
    c.strategy.placement.zero_stage = headroom_train::strategy::ZeroStage::new(1).unwrap();
    c.strategy.placement.offload_optimizer = Offload::Nvme;
    c.offload_dir = Some(dir.path().join("scratch"));
    let prediction = headroom_train::predict::predict(&c, &Corpus::bundled()).unwrap();
    let needs = run_needs(&c, &prediction).unwrap();
    assert_eq!(needs.len(), 2);
    assert_eq!(needs[0].bytes, 2 * save_bytes(&c).unwrap());
    assert_eq!(needs[0].path, dir.path().join("runs"));
    let disk = prediction.offload.as_ref().unwrap().disk.total();
    // The optimizer's states and master weights: 12 B per parameter at least, in whole pages.
    assert!(disk >= 12 * 34_688, "{disk}");
    assert_eq!(needs[1].bytes, disk);
    assert_eq!(needs[1].path, dir.path().join("scratch"));
}

#[test]
fn statvfs_probes_the_nearest_existing_directory() {
    use headroom_train::save::room::statvfs_volume;
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let here = statvfs_volume(dir.path()).unwrap();
    assert_eq!(here.device, std::fs::metadata(dir.path()).unwrap().dev());
    assert!(here.free > 0);
    // A save directory not made yet is on its parent's file system.
    let later = statvfs_volume(&dir.path().join("runs/step-000001")).unwrap();
    assert_eq!(later.device, here.device);
}

/// `--init-from` a save of gpt-tiny (2 layers, 2 heads, width 32): a run of 1 layer would take
/// its first block and drop the second, one of 4 heads would split the same width otherwise
/// (every block the same size): both refused, naming both values. With the saved run's
/// configuration unreadable (its model named by a file that is gone), the blocks alone still
/// refuse a save with more of them.
#[test]
fn init_from_refuses_a_save_of_another_shape() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("base");
    train(keys(1, &root).resolve().unwrap());
    let save = root.join("step-000001");
    let start = |layers: Option<usize>, heads: Option<usize>| {
        let mut k = keys(1, &dir.path().join("new"));
        k.save_dir = None;
        k.layers = layers;
        k.heads = heads;
        k.init_from = Some(save.clone());
        Trainer::new(k.resolve().unwrap(), &Corpus::bundled()).map(|_| ())
    };
    start(None, None).unwrap();
    let e = start(Some(1), None).unwrap_err().to_string();
    assert!(
        e.contains("--layers 2") && e.contains("this run's has 1"),
        "{e}"
    );
    let e = start(None, Some(4)).unwrap_err().to_string();
    assert!(
        e.contains("--heads 2") && e.contains("this run's has 4"),
        "{e}"
    );
    // The manifest's model renamed to one that cannot be resolved, its checksum made to match.
    let manifest = save.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    m["config"]["model"] = "gone.toml".into();
    let text = serde_json::to_vec_pretty(&m).unwrap();
    std::fs::write(&manifest, &text).unwrap();
    let crc = format!("{:08x}", crc32fast::hash(&text));
    std::fs::write(save.join("manifest.crc32"), crc).unwrap();
    start(None, None).unwrap();
    let e = start(Some(1), None).unwrap_err().to_string();
    assert!(e.contains("which this model lacks"), "{e}");
}

/// `prepare` probes the real file system: a billion saves of gpt-tiny (416,256 B each, over
/// 400 TB) fit no disk, and the run is refused before it starts, naming the bytes.
#[test]
fn prepare_refuses_saves_that_no_disk_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = keys(1_000_000_000, &dir.path().join("runs"))
        .resolve()
        .unwrap();
    c.save_every = 1;
    let e = prepared(c).unwrap_err();
    let needed = format_bytes(416_256 * 1_000_000_000);
    assert!(
        e.contains("not enough free disk space")
            && e.contains("1000000000 save(s) of 406.50 KiB each")
            && e.contains(&needed)
            && e.contains("--save-dir"),
        "{e}"
    );
    assert!(!dir.path().join("runs").exists(), "nothing was written");
}
