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
    // A save of step 43 that died before its rename, and a `latest` that names a folder
    // that was never completed.
    let stale = dir.path().join(".step-000043.tmp-999999");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(dir.path().join("latest"), "step-000043").unwrap();
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
        // The save `latest` names reads back whole: step 42 (when only `latest` failed,
        // step 43's folder is complete too, but `latest` still names 42).
        let (back, groups) = read(dir.path()).unwrap();
        assert_eq!(back.step, 42, "{point}");
        assert_eq!(groups, g, "{point}");
        m.step = 42;
    }
}
