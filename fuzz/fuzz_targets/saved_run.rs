//! Saved runs: the input is split into a manifest, its checksum and a safetensors file, written
//! as a save folder and read back: an error, or a save whose checksums all held.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|parts: (Vec<u8>, Vec<u8>, Vec<u8>)| {
    let (manifest, crc, tensors) = parts;
    let dir = tempfile::tempdir().expect("a temporary folder");
    let save = dir.path().join("step-000001");
    std::fs::create_dir(&save).expect("a save folder");
    std::fs::write(save.join("manifest.json"), &manifest).expect("written");
    std::fs::write(save.join("manifest.crc32"), &crc).expect("written");
    std::fs::write(save.join("model.safetensors"), &tensors).expect("written");
    let _ = headroom_train::save::read(dir.path());
});
