//! Built-in models: real Hugging Face `config.json` files stored under `crates/plan/presets/`
//! (values as published on the Hub), embedded in the binary, and the lookup that resolves a
//! `--model` argument to a preset or a file.
//!
//! Not for: parsing (see `config_json`).

use super::{Architecture, parse_config};
use crate::error::{PlanError, Result};
use std::path::Path;

/// `(preset name, config.json text)`. Names follow the Hub repositories they come from
/// (`gpt2`, `bert-base-cased`, `meta-llama/Llama-2-7b-hf` → `llama-2-7b`, …).
const PRESETS: &[(&str, &str)] = &[
    ("gpt2", include_str!("../../presets/gpt2.json")),
    (
        "gpt2-medium",
        include_str!("../../presets/gpt2-medium.json"),
    ),
    ("gpt2-large", include_str!("../../presets/gpt2-large.json")),
    ("gpt2-xl", include_str!("../../presets/gpt2-xl.json")),
    (
        "bert-base-cased",
        include_str!("../../presets/bert-base-cased.json"),
    ),
    (
        "bert-base-uncased",
        include_str!("../../presets/bert-base-uncased.json"),
    ),
    (
        "bert-large-uncased",
        include_str!("../../presets/bert-large-uncased.json"),
    ),
    ("t5-large", include_str!("../../presets/t5-large.json")),
    ("t5-3b", include_str!("../../presets/t5-3b.json")),
    (
        "pythia-160m",
        include_str!("../../presets/pythia-160m.json"),
    ),
    ("pythia-1b", include_str!("../../presets/pythia-1b.json")),
    ("llama-2-7b", include_str!("../../presets/llama-2-7b.json")),
    (
        "llama-2-13b",
        include_str!("../../presets/llama-2-13b.json"),
    ),
    (
        "llama-2-70b",
        include_str!("../../presets/llama-2-70b.json"),
    ),
    ("llama-3-8b", include_str!("../../presets/llama-3-8b.json")),
    (
        "llama-3-70b",
        include_str!("../../presets/llama-3-70b.json"),
    ),
    (
        "llama-3.1-8b",
        include_str!("../../presets/llama-3.1-8b.json"),
    ),
    (
        "llama-3.1-70b",
        include_str!("../../presets/llama-3.1-70b.json"),
    ),
    (
        "llama-3.1-405b",
        include_str!("../../presets/llama-3.1-405b.json"),
    ),
    (
        "llama-3.2-1b",
        include_str!("../../presets/llama-3.2-1b.json"),
    ),
    (
        "llama-3.2-3b",
        include_str!("../../presets/llama-3.2-3b.json"),
    ),
    ("mistral-7b", include_str!("../../presets/mistral-7b.json")),
    (
        "mixtral-8x7b",
        include_str!("../../presets/mixtral-8x7b.json"),
    ),
    ("qwen2.5-7b", include_str!("../../presets/qwen2.5-7b.json")),
    (
        "qwen1.5-moe-a2.7b",
        include_str!("../../presets/qwen1.5-moe-a2.7b.json"),
    ),
];

/// Names of every built-in model, in listing order.
pub const PRESET_NAMES: [&str; 25] = {
    let mut names = [""; 25];
    let mut i = 0;
    while i < PRESETS.len() {
        names[i] = PRESETS[i].0;
        i += 1;
    }
    names
};

/// Hugging Face Hub ids of the built-in models: the repositories their `config.json` files come
/// from, and the chat and instruct siblings whose `config.json` describes the same network.
const HUB_IDS: &[(&str, &str)] = &[
    ("openai-community/gpt2", "gpt2"),
    ("openai-community/gpt2-medium", "gpt2-medium"),
    ("openai-community/gpt2-large", "gpt2-large"),
    ("openai-community/gpt2-xl", "gpt2-xl"),
    ("google-bert/bert-base-cased", "bert-base-cased"),
    ("google-bert/bert-base-uncased", "bert-base-uncased"),
    ("google-bert/bert-large-uncased", "bert-large-uncased"),
    ("google-t5/t5-large", "t5-large"),
    ("google-t5/t5-3b", "t5-3b"),
    ("EleutherAI/pythia-160m", "pythia-160m"),
    ("EleutherAI/pythia-1b", "pythia-1b"),
    ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
    ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"),
    ("meta-llama/Llama-2-13b-hf", "llama-2-13b"),
    ("meta-llama/Llama-2-13b-chat-hf", "llama-2-13b"),
    ("meta-llama/Llama-2-70b-hf", "llama-2-70b"),
    ("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b"),
    ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("meta-llama/Meta-Llama-3-70B", "llama-3-70b"),
    ("meta-llama/Meta-Llama-3-70B-Instruct", "llama-3-70b"),
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("meta-llama/Llama-3.1-70B", "llama-3.1-70b"),
    ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
    ("meta-llama/Llama-3.1-405B", "llama-3.1-405b"),
    ("meta-llama/Llama-3.1-405B-Instruct", "llama-3.1-405b"),
    ("meta-llama/Llama-3.2-1B", "llama-3.2-1b"),
    ("meta-llama/Llama-3.2-3B", "llama-3.2-3b"),
    ("meta-llama/Llama-3.2-3B-Instruct", "llama-3.2-3b"),
    ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
    ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("Qwen/Qwen2.5-7B", "qwen2.5-7b"),
    ("Qwen/Qwen1.5-MoE-A2.7B", "qwen1.5-moe-a2.7b"),
];

/// The built-in model a Hub id names (case-insensitive), if any.
pub fn preset_for_hub_id(id: &str) -> Option<&'static str> {
    HUB_IDS
        .iter()
        .find(|(hub, _)| hub.eq_ignore_ascii_case(id))
        .map(|(_, preset)| *preset)
}

/// The Hub repository a built-in model's `config.json` comes from (the base model's, not a chat
/// or instruct sibling's), if it is one.
pub fn hub_id_of_preset(name: &str) -> Option<&'static str> {
    HUB_IDS
        .iter()
        .find(|(_, preset)| preset.eq_ignore_ascii_case(name))
        .map(|(hub, _)| *hub)
}

/// The stored `config.json` text of a preset (case-insensitive name).
pub fn preset_config(name: &str) -> Option<&'static str> {
    PRESETS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, text)| *text)
}

/// Resolves `--model`: a preset name first, then a built-in model's Hub id, then a path to a
/// `config.json` (or to a directory holding one); another `org/name` gets the instructions to
/// download its `config.json`.
pub fn load_model(name_or_path: &str) -> Result<Architecture> {
    if let Some(text) = preset_config(name_or_path) {
        return parse_config(&name_or_path.to_ascii_lowercase(), text);
    }
    if let Some(preset) = preset_for_hub_id(name_or_path)
        && let Some(text) = preset_config(preset)
    {
        return parse_config(preset, text);
    }
    let mut path = Path::new(name_or_path).to_path_buf();
    if path.is_dir() {
        path = path.join("config.json");
    }
    if path.is_file() {
        let text = std::fs::read_to_string(&path).map_err(|source| PlanError::Io {
            path: path.clone(),
            source,
        })?;
        return parse_config(name_or_path, &text);
    }
    let hub_like = name_or_path.split('/').count() == 2
        && !name_or_path.starts_with(['.', '/'])
        && name_or_path.split('/').all(|p| !p.is_empty());
    if hub_like {
        let ids: Vec<&str> = HUB_IDS.iter().map(|(id, _)| *id).collect();
        return Err(PlanError::UnknownHubModel {
            id: name_or_path.to_string(),
            accepted: ids.join(", "),
        });
    }
    Err(PlanError::UnknownModel {
        name: name_or_path.to_string(),
        accepted: PRESET_NAMES.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_name_their_presets_and_others_get_the_download_instructions() {
        for (id, preset) in HUB_IDS {
            assert_eq!(load_model(id).unwrap().name, *preset, "{id}");
        }
        assert_eq!(
            load_model("META-LLAMA/llama-2-7b-hf").unwrap().name,
            "llama-2-7b"
        );
        let e = load_model("google/gemma-7b").unwrap_err().to_string();
        assert!(
            e.contains("google/gemma-7b")
                && e.contains("https://huggingface.co/google/gemma-7b/resolve/main/config.json")
                && e.contains("meta-llama/Llama-2-7b-hf"),
            "{e}"
        );
        // A relative path with one slash that does not exist is still a path, not a Hub id.
        let e = load_model("./missing.json").unwrap_err().to_string();
        assert!(e.contains("unknown model preset"), "{e}");
    }

    #[test]
    fn every_preset_parses() {
        for name in PRESET_NAMES {
            let spec = load_model(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(spec.name, name);
        }
    }

    #[test]
    fn unknown_preset_lists_the_accepted_names() {
        let e = load_model("llama-9-1t").unwrap_err().to_string();
        assert!(
            e.contains("'llama-9-1t'") && e.contains("llama-3-70b") && e.contains("config.json"),
            "{e}"
        );
    }
}
