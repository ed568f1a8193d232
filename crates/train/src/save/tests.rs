//! The save format: round trips, checksums, crashes and failures mid-save.

use super::*;

fn sample() -> (Manifest, TensorGroups) {
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        step: 42,
        files: BTreeMap::new(),
        checksums: BTreeMap::new(),
        scaler: None,
        data_position: DataPosition {
            epoch: 1,
            cursor: 7,
        },
        rng: BTreeMap::from([("dropout".to_string(), 99)]),
        losses: vec![5.5, 4.25],
        val_losses: Vec::new(),
        config: serde_json::json!({"precision": "fp32"}),
    };
    let w: Vec<u8> = [1.5f32, -2.0, 0.25, 8.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let groups = TensorGroups::from([(
        "model".to_string(),
        BTreeMap::from([(
            "block0.weight".to_string(),
            StoredTensor {
                dtype: StoredDtype::F32,
                shape: vec![2, 2],
                data: w,
            },
        )]),
    )]);
    (manifest, groups)
}

/// The id of a process that has exited (a child waited for).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    child.id()
}

#[test]
fn round_trips_and_latest_points_at_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, g) = sample();
    write(dir.path(), &m, &g).unwrap();
    m.step = 43;
    let written = write(dir.path(), &m, &g).unwrap();
    assert_eq!(written, dir.path().join("step-000043"));
    let (back, groups) = read(dir.path()).unwrap();
    assert_eq!(back.step, 43);
    assert_eq!(back.losses, vec![5.5, 4.25]);
    assert_eq!(back.files["model"], "model.safetensors");
    assert_eq!(groups, g);
    // An older step can be named directly.
    assert_eq!(read(&dir.path().join("step-000042")).unwrap().0.step, 42);
    // No temporary directories are left behind.
    let leftovers = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')
        })
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn corrupt_or_missing_saves_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = read(&dir.path().join("nope")).unwrap_err().to_string();
    assert!(e.contains("--resume"), "{e}");
    let (m, g) = sample();
    let at = write(dir.path(), &m, &g).unwrap();
    // Truncate the tensor file: the safetensors header no longer matches the data.
    let file = at.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
    let e = read(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("corrupt saved run") && e.contains("model.safetensors"),
        "{e}"
    );
    std::fs::write(at.join("manifest.json"), b"{ not json").unwrap();
    let e = read(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("corrupt saved run") && e.contains("manifest.json"),
        "{e}"
    );
}

#[test]
fn a_flipped_byte_anywhere_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (m, g) = sample();
    let at = write(dir.path(), &m, &g).unwrap();
    // One bit of the last tensor byte: the safetensors header still parses, the weights
    // would silently differ without the checksum.
    let file = at.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    let e = read(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("checksum mismatch") && e.contains("model.safetensors"),
        "{e}"
    );
    bytes[last] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    assert!(read(dir.path()).is_ok());
    // A digit of the manifest (the step 42 becomes 43): still valid JSON, still caught.
    let manifest = at.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"step\": 42", "\"step\": 43")).unwrap();
    let e = read(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("checksum mismatch") && e.contains("manifest.json"),
        "{e}"
    );
}

#[test]
fn a_crash_mid_save_leaves_the_newest_complete_step_and_its_leftovers_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, g) = sample();
    write(dir.path(), &m, &g).unwrap();
    // A save of step 43 that died before its rename (its process is gone).
    let stale = dir.path().join(format!(".step-000043.tmp-{}", dead_pid()));
    std::fs::create_dir(&stale).unwrap();
    assert_eq!(read(dir.path()).unwrap().0.step, 42);
    // Without `latest` at all (the very first save crashed after its rename).
    std::fs::remove_file(dir.path().join("latest")).unwrap();
    assert_eq!(read(dir.path()).unwrap().0.step, 42);
    m.step = 44;
    write(dir.path(), &m, &g).unwrap();
    assert!(!stale.exists(), "the next save removes the leftover");
    assert_eq!(read(dir.path()).unwrap().0.step, 44);
}

#[test]
fn a_write_that_fails_anywhere_leaves_the_previous_save_intact() {
    let (mut m, g) = sample();
    for point in [
        "create",
        "model.safetensors",
        "manifest.json",
        "manifest.crc32",
        "rename",
        "latest",
    ] {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &m, &g).unwrap();
        m.step = 43;
        let full = |p: &str| {
            if p == point {
                Err(std::io::Error::other("No space left on device (injected)"))
            } else {
                Ok(())
            }
        };
        let e = write_with_faults(dir.path(), &m, &g, &full)
            .unwrap_err()
            .to_string();
        assert!(e.contains("No space left"), "{point}: {e}");
        // The newest finished save reads back whole: step 42, or, when only `latest` failed,
        // step 43, whose folder was renamed into place (the rename finishes a save; `latest`
        // still names 42).
        let (back, groups) = read(dir.path()).unwrap();
        let finished = if point == "latest" { 43 } else { 42 };
        assert_eq!(back.step, finished, "{point}");
        assert_eq!(groups, g, "{point}");
        m.step = 42;
    }
}

/// Saves of steps `steps` under `root`, in order.
fn saves(root: &Path, steps: &[u64]) {
    let (mut m, g) = sample();
    for &step in steps {
        m.step = step;
        write(root, &m, &g).unwrap();
    }
}

#[test]
fn a_new_run_refuses_a_directory_that_holds_saves() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("runs");
    // Missing, empty, or holding only a leftover of a crashed save: nothing to replace.
    check_destination(&root, None).unwrap();
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(root.join(format!(".step-000001.tmp-{}", dead_pid()))).unwrap();
    check_destination(&root, None).unwrap();
    saves(&root, &[42]);
    let e = check_destination(&root, None).unwrap_err().to_string();
    assert!(
        e.contains("step-000042") && e.contains(&format!("--resume {}", root.display())),
        "{e}"
    );
    assert!(e.contains("new --save-dir"), "{e}");
    // A `latest` alone (its folder moved away) still marks another run's directory.
    std::fs::rename(root.join("step-000042"), dir.path().join("moved")).unwrap();
    let e = check_destination(&root, None).unwrap_err().to_string();
    assert!(e.contains("`latest`"), "{e}");
}

#[test]
fn a_resumed_run_refuses_to_replace_saves_at_or_after_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("runs");
    saves(&root, &[42, 43, 44]);
    let at = |step: u64| root.join(format!("step-{step:06}"));
    // From the newest: its own folder is no clash.
    check_destination(&root, Some((&at(44), 44))).unwrap();
    // Branching from 42 into the same directory would replace 43 and 44.
    let e = check_destination(&root, Some((&at(42), 42)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("2 step folders, step-000043 to step-000044")
            && e.contains("continues from step 42")
            && e.contains("new --save-dir"),
        "{e}"
    );
    // Into another directory: allowed when it holds no saves, refused when it holds some.
    let other = dir.path().join("other");
    check_destination(&other, Some((&at(42), 42))).unwrap();
    saves(&other, &[7]);
    let e = check_destination(&other, Some((&at(42), 42)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("step-000007"), "{e}");
}

#[test]
fn a_damaged_newest_save_is_refused_never_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    saves(root, &[42, 43]);
    let newest = root.join("step-000043");
    // Its manifest gone: a finished save always has one, so this is damage, not a crash.
    std::fs::remove_file(newest.join("manifest.json")).unwrap();
    let e = read(root).unwrap_err().to_string();
    let older = root.join("step-000042").display().to_string();
    assert!(
        e.contains("damaged") && e.contains("step-000043") && e.contains(&older),
        "{e}"
    );
    assert!(e.contains("new --save-dir"), "{e}");
    // The older save, named, reads; continuing from it into this directory is refused, so the
    // damaged folder is never written over.
    assert_eq!(read(&root.join("step-000042")).unwrap().0.step, 42);
    let e = check_destination(root, Some((&root.join("step-000042"), 42)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("step-000043"), "{e}");
    assert!(newest.join("model.safetensors").is_file());
    // The newest folder removed by hand while `latest` still names it: refused as well.
    std::fs::remove_dir_all(&newest).unwrap();
    let e = read(root).unwrap_err().to_string();
    assert!(
        e.contains("`latest` names this save") && e.contains("step-000043"),
        "{e}"
    );
}

#[test]
fn a_finished_save_that_latest_does_not_name_yet_is_the_one_resumed() {
    // A crash between the rename of step 43 and `latest`: step 43 is whole and is read, so a
    // resumed run never writes a second step 43 over it.
    let dir = tempfile::tempdir().unwrap();
    saves(dir.path(), &[42, 43]);
    std::fs::write(dir.path().join("latest"), "step-000042").unwrap();
    assert_eq!(read(dir.path()).unwrap().0.step, 43);
}

#[test]
fn a_fifo_in_a_save_is_an_error_not_a_hang() {
    let mkfifo = |path: &Path| {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{path:?}");
    };
    for file in ["model.safetensors", "manifest.crc32", "manifest.json"] {
        let dir = tempfile::tempdir().unwrap();
        saves(dir.path(), &[42]);
        let path = dir.path().join("step-000042").join(file);
        std::fs::remove_file(&path).unwrap();
        mkfifo(&path);
        // Opening a FIFO for reading waits for a writer: a read that does not answer within
        // seconds is the bug.
        let (tx, rx) = std::sync::mpsc::channel();
        let root = dir.path().to_path_buf();
        std::thread::spawn(move || tx.send(read(&root).map(|_| ()).map_err(|e| e.to_string())));
        let answer = rx.recv_timeout(std::time::Duration::from_secs(20));
        let e = answer.expect("reading the save hangs").unwrap_err();
        assert!(
            e.contains(file) && e.contains("not a regular file"),
            "{file}: {e}"
        );
    }
    // A FIFO as `latest` is not read; the newest finished save is.
    let dir = tempfile::tempdir().unwrap();
    saves(dir.path(), &[42]);
    std::fs::remove_file(dir.path().join("latest")).unwrap();
    mkfifo(&dir.path().join("latest"));
    assert_eq!(read(dir.path()).unwrap().0.step, 42);
}

#[test]
fn stale_temporaries_of_dead_processes_are_removed_on_the_next_save() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    saves(root, &[42]);
    let dead = dead_pid();
    // What a process killed mid-save leaves: its `latest` temporary and its step folder.
    let stale_latest = root.join(format!(".latest.tmp-{dead}"));
    let stale_step = root.join(format!(".step-000043.tmp-{dead}"));
    std::fs::write(&stale_latest, "step-000043").unwrap();
    std::fs::create_dir(&stale_step).unwrap();
    // A live process's (pid 1 is always alive) is its save in progress: it stays; and a file
    // that only looks alike is not a save's.
    let live = root.join(".latest.tmp-1");
    let other = root.join(".notes.tmp-123");
    std::fs::write(&live, "step-000043").unwrap();
    std::fs::write(&other, "x").unwrap();
    saves(root, &[43]);
    assert!(!stale_latest.exists() && !stale_step.exists());
    assert!(live.exists() && other.exists());
}

/// Losses are f64 with up to 17 significant digits in the manifest; the default JSON parser
/// may read such a number 1 ulp off (a resumed run's loss history would then drift). Every one
/// of 20,000 awkward values (random bits of finite f64 in the losses' range and beyond, and
/// subnormals) reads back bit for bit.
#[test]
fn losses_read_back_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, g) = sample();
    // xorshift64: the values are the same on every run.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    m.losses = (0..20_000)
        .map(|i| match i % 4 {
            // A loss between 0 and 16: exponent of 2^-1 to 2^3, random mantissa.
            0 | 1 => f64::from_bits((0x3fe + next() % 5) << 52 | next() >> 12),
            // Any finite f64.
            2 => f64::from_bits(next() & !(0x7ff << 52) | (next() % 0x7ff) << 52),
            // A subnormal.
            _ => f64::from_bits(next() >> 12),
        })
        .collect();
    assert!(m.losses.iter().all(|l| l.is_finite()));
    write(dir.path(), &m, &g).unwrap();
    let (back, _) = read(dir.path()).unwrap();
    let differ = m
        .losses
        .iter()
        .zip(&back.losses)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(back.losses.len(), m.losses.len());
    assert_eq!(differ, 0, "losses that changed bits through the manifest");
}
