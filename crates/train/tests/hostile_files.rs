//! Fuzzing in `cargo test`: mutated and truncated run configurations (TOML) and saved runs
//! (manifest, its checksum, safetensors files) are read without a panic, an abort or an
//! unbounded allocation: a configuration resolves or names its problem; a damaged save is an
//! error, never a resume with different bytes.

use headroom_train::config::TrainConfig;
use headroom_train::save::{self, FORMAT_VERSION, Manifest, StoredDtype, StoredTensor};
use proptest::prelude::*;
use std::collections::BTreeMap;

const TOML_SEED: &str = "model = \"gpt-tiny\"\nprecision = \"bf16-mixed\"\nmicro_batch = 4\n\
accumulation = 2\ncheckpoint = \"every:2\"\nattention = \"memory-efficient\"\n\
device_memory = \"256MiB\"\nsteps = 10\nlr = 0.003\n";

fn mutate(seed: &[u8], edits: &[(usize, u8, bool)], cut: usize) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for &(at, byte, insert) in edits {
        let at = at % (bytes.len() + 1);
        if insert || at == bytes.len() {
            bytes.insert(at, byte);
        } else {
            bytes[at] = byte;
        }
    }
    bytes.truncate(cut % (bytes.len() + 1) + bytes.len() / 2);
    bytes
}

/// A real save of a small tensor set, written once per case into `dir`.
fn write_seed(dir: &std::path::Path) -> std::path::PathBuf {
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        step: 3,
        files: BTreeMap::new(),
        checksums: BTreeMap::new(),
        scaler: None,
        data_position: Default::default(),
        rng: BTreeMap::new(),
        losses: vec![1.0, 0.5],
        val_losses: Vec::new(),
        config: serde_json::json!({"precision": "fp32"}),
    };
    let data: Vec<u8> = (0..64u8).collect();
    let tensor = StoredTensor {
        dtype: StoredDtype::F32,
        shape: vec![4, 4],
        data,
    };
    let groups = BTreeMap::from([(
        "model".to_string(),
        BTreeMap::from([("block0".to_string(), tensor)]),
    )]);
    save::write(dir, &manifest, &groups).unwrap()
}

/// Cases per property: `HEADROOM_FUZZ_CASES` for a long run, else a few seconds' worth.
fn cases(default: u32) -> u32 {
    std::env::var("HEADROOM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(200)))]

    #[test]
    fn mutated_run_configs_never_panic(
        edits in prop::collection::vec((0usize..300, any::<u8>(), any::<bool>()), 0..6),
        cut in 0usize..300,
    ) {
        let text = mutate(TOML_SEED.as_bytes(), &edits, cut);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(&path, &text).unwrap();
        if let Ok(keys) = TrainConfig::from_file(&path) {
            let _ = keys.resolve();
        }
    }

    #[test]
    fn damaged_saves_are_errors_never_other_bytes(
        file in 0usize..3,
        edits in prop::collection::vec((0usize..2000, any::<u8>(), any::<bool>()), 1..4),
        cut in 0usize..2000,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let at = write_seed(dir.path());
        let name = ["manifest.json", "manifest.crc32", "model.safetensors"][file];
        let original = std::fs::read(at.join(name)).unwrap();
        let damaged = mutate(&original, &edits, cut);
        std::fs::write(at.join(name), &damaged).unwrap();
        match save::read(dir.path()) {
            // What reads back (an edit that changed nothing that matters, such as whitespace
            // after the checksum) reads back exactly as written.
            Ok((m, groups)) => {
                let written: Vec<u8> = (0..64u8).collect();
                prop_assert_eq!(m.step, 3);
                prop_assert_eq!(&groups["model"]["block0"].data, &written);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
