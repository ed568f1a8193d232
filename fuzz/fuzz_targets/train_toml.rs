//! `headroom train --config` files: parsed and resolved, or refused naming the key.
#![no_main]

use headroom_train::config::TrainConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(keys) = TrainConfig::from_toml(text, std::path::Path::new("fuzz.toml")) {
        let _ = keys.resolve();
    }
});
