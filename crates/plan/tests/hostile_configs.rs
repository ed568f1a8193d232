//! Fuzzing in `cargo test`: mutated, truncated and random Hugging Face `config.json` texts are
//! parsed and, when they parse, counted and planned, without a panic, an abort or an unbounded
//! allocation (sizes have stated limits). Seeds are the shapes of real models.

use headroom_plan::cost::{CostModel, Problem};
use headroom_plan::hardware;
use headroom_plan::model::ParamInventory;
use headroom_plan::model::config_json::parse_config;
use headroom_plan::search::search;
use headroom_plan::strategy::Pins;
use headroom_plan::workload::{BatchSpec, Workload};
use proptest::prelude::*;

const SEEDS: [&str; 3] = [
    r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 128256, "tie_word_embeddings": false}"#,
    r#"{"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
        "n_positions": 1024}"#,
    r#"{"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}"#,
];

fn mutate(seed: &str, edits: &[(usize, u8, bool)], cut: usize) -> String {
    let mut bytes = seed.as_bytes().to_vec();
    for &(at, byte, insert) in edits {
        let at = at % (bytes.len() + 1);
        // Digits and JSON punctuation make more interesting numbers and structures.
        let byte = b"0123456789{}[]\":,-e."[usize::from(byte) % 20];
        if insert || at == bytes.len() {
            bytes.insert(at, byte);
        } else {
            bytes[at] = byte;
        }
    }
    bytes.truncate(cut % (bytes.len() + 1) + bytes.len() / 2);
    String::from_utf8_lossy(&bytes).into_owned()
}

fn parse_and_plan(text: &str) {
    let Ok(spec) = parse_config("fuzz", text) else {
        return;
    };
    let _ = ParamInventory::of(&spec).total();
    let hw = hardware::preset("A100-80GB").unwrap();
    if let Ok(w) = Workload::new(&spec, 512, BatchSpec::Samples(8), None, None, 1) {
        let problem = Problem::new(spec, hw, w, CostModel::default());
        let _ = search(&problem, &Pins::default(), None);
    }
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
    fn mutated_configs_never_panic(
        seed in 0usize..SEEDS.len(),
        edits in prop::collection::vec((0usize..400, any::<u8>(), any::<bool>()), 0..6),
        cut in 0usize..400,
    ) {
        parse_and_plan(&mutate(SEEDS[seed], &edits, cut));
    }

    #[test]
    fn huge_numbers_never_panic(
        layers in any::<u64>(), hidden in any::<u64>(), heads in any::<u64>(),
        vocab in any::<u64>(), ffn in any::<u64>(),
    ) {
        let text = format!(
            r#"{{"model_type": "llama", "hidden_size": {hidden}, "num_hidden_layers": {layers},
            "num_attention_heads": {heads}, "intermediate_size": {ffn}, "vocab_size": {vocab}}}"#
        );
        parse_and_plan(&text);
    }
}

#[test]
fn the_seeds_are_valid() {
    for seed in SEEDS {
        parse_config("seed", seed).unwrap();
    }
}
