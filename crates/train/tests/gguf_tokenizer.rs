//! The tokenizer.json document the GGUF reader writes (headroom_nn::checkpoint::gguf) loads in
//! Hugging Face's `tokenizers` and encodes as the tokenizer it describes. Needs the
//! `hf-tokenizer` feature: `cargo test -p headroom-train --features hf-tokenizer --test
//! gguf_tokenizer`.

#![cfg(feature = "hf-tokenizer")]

use headroom_nn::checkpoint::gguf::GgufFile;
use std::path::PathBuf;
use std::str::FromStr;

fn load(path: impl Into<PathBuf>) -> tokenizers::Tokenizer {
    let file = GgufFile::open(path.into()).unwrap();
    tokenizers::Tokenizer::from_str(&file.tokenizer_json().unwrap()).unwrap()
}

#[test]
fn the_tiny_tokenizer_encodes_by_its_merges_and_splits_digits() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/data/gguf/tiny-llama.gguf");
    let t = load(path);
    // scripts/gguf-fixtures.py's vocabulary: 3 specials, byte b at 3 + b, then the merges'
    // results from 259: he, ll, hell, hello (262), Ġw, or, Ġwor, Ġworl, Ġworld (267).
    // SmolLM2's pre-tokenizer splits the digits one by one, then GPT-2's regex splits
    // "hello world " into "hello", " world", " ": hello = 262, Ġworld = 267, ' ' = 3 + 32,
    // '4' = 3 + 52, '2' = 3 + 50.
    let ids = t
        .encode("hello world 42", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids, [262, 267, 35, 55, 53]);
    assert_eq!(t.decode(&ids, false).unwrap(), "hello world 42");
    // A control token is matched whole: <|im_start|> is id 1.
    let ids = t
        .encode("<|im_start|>hello", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids, [1, 262]);
}

#[test]
fn llama_cpps_default_pre_tokenizer_splits_numbers_in_threes() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../nn/tests/data/gguf/tokenizer-default.gguf");
    let t = load(path);
    // llama.cpp's default regexes in turn: the second splits "hello", " world", " 1234"; the
    // third isolates "1234" from its space; the fourth splits "123" from "4". With the extra
    // merge "1 2" (id 268): hello 262, Ġworld 267, ' ' 35, "12" 268, '3' = 3 + 51, '4' = 3 + 52.
    let ids = t
        .encode("hello world 1234", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids, [262, 267, 35, 268, 54, 55]);
    assert_eq!(t.decode(&ids, false).unwrap(), "hello world 1234");
}

#[test]
fn smollm2_tokenizer_round_trips_text() {
    let Some(path) = std::env::var_os("HEADROOM_SMOLLM2_GGUF") else {
        eprintln!("HEADROOM_SMOLLM2_GGUF is not set; skipped");
        return;
    };
    let t = load(path);
    assert_eq!(t.get_vocab_size(true), 49152);
    let text = "<|im_start|>user\nWhat is 12 + 30? Ünïcödé…<|im_end|>";
    let ids = t.encode(text, false).unwrap().get_ids().to_vec();
    // SmolLM2's specials: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2.
    assert_eq!((ids[0], *ids.last().unwrap()), (1, 2));
    assert_eq!(t.decode(&ids, false).unwrap(), text);
}
