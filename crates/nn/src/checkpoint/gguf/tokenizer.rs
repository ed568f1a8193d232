//! The tokenizer in a GGUF file's metadata (`tokenizer.ggml.*`, ggml-org/ggml `docs/gguf.md`)
//! as a Hugging Face `tokenizer.json` document (the format of huggingface/tokenizers), for the
//! byte-level BPE models (`tokenizer.ggml.model = gpt2`): the vocabulary and merges, control
//! and user-defined tokens as added tokens, and the pre-tokenizer `tokenizer.ggml.pre` names
//! (llama.cpp `src/llama-vocab.cpp`): `smollm` (SmolLM2's own tokenizer.json: digits split one
//! by one, then GPT-2's byte-level regex), `gpt2` (GPT-2's byte-level regex), `llama-bpe`
//! (Llama 3's split regex, then byte-level without its own regex) and `default` (llama.cpp's
//! fallback: its four regexes applied in turn, each splitting the pieces of the one before and
//! keeping what it does not match, as `Split` pre-tokenizers in `Isolated` mode).
//!
//! Not for: SentencePiece models (`tokenizer.ggml.model = llama`), or tokenising text (the
//! train crate's `hf-tokenizer` feature loads the document with the `tokenizers` crate).

use super::error::{GgufError, Result};
use super::file::GgufFile;
use super::value::Value;
use serde_json::{Map, Value as Json, json};

/// The `tokenizer.ggml.pre` values headroom writes a pre-tokenizer for.
pub const PRE_TOKENIZERS: [&str; 4] = ["smollm", "gpt2", "llama-bpe", "default"];

/// llama.cpp's token types (`llama_token_type`; gguf-py `TokenType`).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Llama 3's pre-tokenizer regex (meta-llama/llama3 `llama/tokenizer.py`, `pat_str`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's default BPE pre-tokenizer regexes (`llama-vocab.cpp`, `llm_tokenizer_bpe`,
/// the `default:` case), applied in this order.
const LLAMA_CPP_DEFAULT: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

fn split(regex: &str) -> Json {
    json!({
        "type": "Split",
        "pattern": {"Regex": regex},
        "behavior": "Isolated",
        "invert": false,
    })
}

fn byte_level(use_regex: bool, add_prefix_space: bool, trim_offsets: bool) -> Json {
    json!({
        "type": "ByteLevel",
        "add_prefix_space": add_prefix_space,
        "trim_offsets": trim_offsets,
        "use_regex": use_regex,
    })
}

fn pre_tokenizer(pre: &str) -> Option<Json> {
    Some(match pre {
        "smollm" => json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true, false, true),
            ],
        }),
        "gpt2" => byte_level(true, false, true),
        "llama-bpe" => json!({
            "type": "Sequence",
            "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false, false, true)],
        }),
        "default" => {
            let mut steps: Vec<Json> = LLAMA_CPP_DEFAULT.iter().map(|r| split(r)).collect();
            steps.push(byte_level(false, false, true));
            json!({"type": "Sequence", "pretokenizers": steps})
        }
        _ => return None,
    })
}

impl GgufFile {
    fn string_list(&self, key: &str, hint: &'static str) -> Result<Vec<&str>> {
        let v = self.require(key, hint)?;
        let items = self.typed(key, v, "an array of strings", Value::as_array)?;
        items
            .iter()
            .map(|s| self.typed(key, s, "an array of strings", Value::as_str))
            .collect()
    }

    fn token_id(&self, which: &str) -> Option<u64> {
        self.get(&format!("tokenizer.ggml.{which}_token_id"))
            .and_then(Value::as_u64)
    }

    fn flag(&self, key: &str) -> bool {
        self.get(key).and_then(Value::as_bool).unwrap_or(false)
    }

    /// The tokenizer as a Hugging Face `tokenizer.json` document.
    pub fn tokenizer_json(&self) -> Result<String> {
        let unsupported = |what: String| GgufError::Unsupported {
            path: self.path().into(),
            what,
        };
        let hint = "the file carries no tokenizer; use the model's own tokenizer.json";
        let model_key = "tokenizer.ggml.model";
        let model = self.require(model_key, hint)?;
        let model = self.typed(model_key, model, "a string", Value::as_str)?;
        if model != "gpt2" {
            return Err(unsupported(format!(
                "tokenizer model '{model}' is not supported; headroom converts byte-level BPE ('gpt2')"
            )));
        }
        let pre = match self.get("tokenizer.ggml.pre") {
            Some(v) => self.typed("tokenizer.ggml.pre", v, "a string", Value::as_str)?,
            None => "default",
        };
        let pre_tokenizer = pre_tokenizer(pre).ok_or_else(|| {
            unsupported(format!(
                "pre-tokenizer '{pre}' is not supported; headroom writes {}",
                PRE_TOKENIZERS.join(", ")
            ))
        })?;
        let tokens = self.string_list("tokenizer.ggml.tokens", hint)?;
        let merges =
            self.string_list("tokenizer.ggml.merges", "byte-level BPE needs its merges")?;
        let types: Vec<i64> = match self.get("tokenizer.ggml.token_type") {
            Some(v) => {
                let key = "tokenizer.ggml.token_type";
                let items = self.typed(key, v, "an array of integers", Value::as_array)?;
                let types: Result<Vec<i64>> = items
                    .iter()
                    .map(|t| self.typed(key, t, "an array of integers", Value::as_i64))
                    .collect();
                types?
            }
            None => Vec::new(),
        };
        if !types.is_empty() && types.len() != tokens.len() {
            return Err(GgufError::Corrupt {
                path: self.path().into(),
                item: "metadata key 'tokenizer.ggml.token_type'".into(),
                what: format!("{} types for {} tokens", types.len(), tokens.len()),
            });
        }
        let vocab: Map<String, Json> = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.to_string(), json!(id)))
            .collect();
        let added: Vec<Json> = types
            .iter()
            .enumerate()
            .filter(|&(_, &t)| t == CONTROL || t == USER_DEFINED)
            .map(|(id, &t)| {
                json!({
                    "id": id,
                    "content": tokens[id],
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": false,
                    "normalized": t != CONTROL,
                    "special": t == CONTROL,
                })
            })
            .collect();
        let token = |which: &str| {
            let id = self.token_id(which)?;
            Some((id, *tokens.get(usize::try_from(id).ok()?)?))
        };
        let unk = token("unknown").map(|(_, t)| t);
        let post_processor = post_processor(
            token("bos").filter(|_| self.flag("tokenizer.ggml.add_bos_token")),
            token("eos").filter(|_| self.flag("tokenizer.ggml.add_eos_token")),
        );
        let document = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": byte_level(true, true, true),
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": unk,
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": false,
                "byte_fallback": false,
                "ignore_merges": pre == "llama-bpe",
                "vocab": vocab,
                "merges": merges,
            },
        });
        Ok(serde_json::to_string(&document).expect("a JSON value serialises"))
    }
}

/// Byte-level offsets only, or a template adding the BOS and/or EOS tokens the metadata
/// asks for (`tokenizer.ggml.add_bos_token`, `add_eos_token`), each given as (id, token).
fn post_processor(bos: Option<(u64, &str)>, eos: Option<(u64, &str)>) -> Json {
    if bos.is_none() && eos.is_none() {
        return byte_level(true, true, false);
    }
    let special = |(_, t): (u64, &str)| json!({"SpecialToken": {"id": t, "type_id": 0}});
    let sequence = |s: &str, type_id: u32| json!({"Sequence": {"id": s, "type_id": type_id}});
    let wrap = |inner: Json| -> Vec<Json> {
        bos.map(special)
            .into_iter()
            .chain([inner])
            .chain(eos.map(special))
            .collect()
    };
    let single = wrap(sequence("A", 0));
    let mut pair = single.clone();
    pair.extend(wrap(sequence("B", 1)));
    let specials: Map<String, Json> = bos
        .into_iter()
        .chain(eos)
        .map(|(id, t)| (t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]})))
        .collect();
    json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": specials,
    })
}
