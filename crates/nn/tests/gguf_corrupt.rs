//! Broken GGUF files give the documented errors, naming the file and the key or tensor at
//! fault, never a panic. Each case mutates a copy of a fixture at a place found from the
//! format (ggml-org/ggml docs/gguf.md): a tensor info is the name (u64 length + bytes), n_dims
//! (u32), the dims (u64 each), the type (u32) and the offset (u64); a metadata pair is the key
//! (u64 length + bytes), the value type (u32) and the value.

use crate::gguf_common;

use gguf_common::{find, fixture, scratch};
use headroom_nn::checkpoint::gguf::{GgufError, GgufFile};

fn with(bytes: &[u8], name: &str) -> Result<GgufFile, GgufError> {
    let path = scratch(name);
    std::fs::write(&path, bytes).unwrap();
    let file = GgufFile::open(&path);
    // The map (if any) keeps the bytes alive after the name is gone.
    std::fs::remove_file(&path).unwrap();
    file
}

fn tiny_bytes() -> Vec<u8> {
    std::fs::read(fixture("tiny-llama.gguf")).unwrap()
}

/// Where the tensor info of `name` (2 dimensions) keeps its type and its offset.
fn info_fields(bytes: &[u8], name: &str) -> (usize, usize) {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = find(bytes, &key) + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let type_at = at + 4 + 8 * n_dims;
    (type_at, type_at + 4)
}

#[test]
fn a_wrong_magic_is_not_a_gguf_file() {
    let mut b = tiny_bytes();
    b[..4].copy_from_slice(b"GGML");
    let err = with(&b, "magic.gguf").unwrap_err();
    assert!(matches!(err, GgufError::BadMagic { found, .. } if &found == b"GGML"));
    assert!(err.to_string().contains("magic.gguf"));
}

#[test]
fn version_2_reads_and_version_1_is_refused() {
    let mut b = tiny_bytes();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    let file = with(&b, "v2.gguf").unwrap();
    assert_eq!(file.version(), 2);
    assert_eq!(file.llama_config().unwrap().layers, 2);
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    let err = with(&b, "v1.gguf").unwrap_err();
    assert!(matches!(
        err,
        GgufError::UnsupportedVersion { version: 1, .. }
    ));
}

#[test]
fn a_file_cut_inside_the_metadata_names_the_key_being_read() {
    let b = tiny_bytes();
    // Cut in the middle of the token list's strings.
    let cut = find(&b, b"tokenizer.ggml.tokens") + 100;
    let err = with(&b[..cut], "cut.gguf").unwrap_err();
    match &err {
        GgufError::Truncated { what, len, .. } => {
            assert!(what.contains("'tokenizer.ggml.tokens'"), "{what}");
            assert_eq!(*len, cut as u64);
        }
        other => panic!("expected Truncated, got {other}"),
    }
    assert!(err.to_string().contains("download it again"));
    let err = with(&[], "empty.gguf").unwrap_err();
    assert!(matches!(err, GgufError::Truncated { len: 0, .. }));
}

#[test]
fn a_file_cut_inside_the_data_names_the_last_tensor() {
    let b = tiny_bytes();
    let whole = GgufFile::open(fixture("tiny-llama.gguf")).unwrap();
    let last = whole.tensors().iter().max_by_key(|t| t.start).unwrap();
    let cut = (last.start + last.bytes - 1) as usize;
    let err = with(&b[..cut], "cut-data.gguf").unwrap_err();
    assert!(
        matches!(&err, GgufError::TensorPastEnd { tensor, len, .. } if *tensor == last.name && *len == cut as u64),
        "{err}"
    );
}

#[test]
fn a_tensor_offset_past_the_end_names_the_tensor() {
    let mut b = tiny_bytes();
    let (_, offset_at) = info_fields(&b, "blk.0.ffn_up.weight");
    b[offset_at..offset_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let err = with(&b, "offset.gguf").unwrap_err();
    assert!(
        matches!(&err, GgufError::TensorPastEnd { tensor, .. } if tensor == "blk.0.ffn_up.weight")
    );
    assert!(err.to_string().contains("'blk.0.ffn_up.weight'"));
    // An offset off the 32-byte alignment is corrupt too.
    b[offset_at..offset_at + 8].copy_from_slice(&4u64.to_le_bytes());
    let err = with(&b, "misaligned.gguf").unwrap_err();
    assert!(
        matches!(&err, GgufError::Corrupt { item, .. } if item.contains("blk.0.ffn_up.weight"))
    );
}

#[test]
fn an_unknown_tensor_type_names_the_tensor() {
    let mut b = tiny_bytes();
    let (type_at, _) = info_fields(&b, "blk.1.attn_v.weight");
    b[type_at..type_at + 4].copy_from_slice(&99u32.to_le_bytes());
    let err = with(&b, "type.gguf").unwrap_err();
    assert!(
        matches!(&err, GgufError::UnknownTensorType { tensor, type_id: 99, .. }
        if tensor == "blk.1.attn_v.weight")
    );
}

#[test]
fn an_unknown_value_type_names_the_key() {
    let mut b = std::fs::read(fixture("blocks.gguf")).unwrap();
    let at = find(&b, b"test.u8") + "test.u8".len();
    assert_eq!(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 0); // UINT8
    b[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    let err = with(&b, "value-type.gguf").unwrap_err();
    assert!(
        matches!(&err, GgufError::UnknownValueType { key, type_id: 13, .. } if key == "test.u8")
    );
    // A BOOL byte other than 0 or 1.
    let mut b = std::fs::read(fixture("blocks.gguf")).unwrap();
    let at = find(&b, b"test.bool") + "test.bool".len() + 4;
    b[at] = 7;
    let err = with(&b, "bool.gguf").unwrap_err();
    assert!(matches!(&err, GgufError::Corrupt { item, .. } if item.contains("'test.bool'")));
}

#[test]
fn a_huge_array_length_is_caught_before_it_is_allocated() {
    let mut b = tiny_bytes();
    // The token list: key, ARRAY (9), element type STRING (8), then the u64 count.
    let at = find(&b, b"tokenizer.ggml.tokens") + "tokenizer.ggml.tokens".len() + 8;
    b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = with(&b, "count.gguf").unwrap_err();
    assert!(
        matches!(&err, GgufError::Truncated { what, .. } if what.contains("tokenizer.ggml.tokens"))
    );
}

#[test]
fn a_missing_tensor_and_an_unsupported_architecture_are_named() {
    let file = GgufFile::open(fixture("blocks.gguf")).unwrap();
    let err = file.llama_config().unwrap_err();
    assert!(
        err.to_string()
            .contains("architecture 'test' is not supported"),
        "{err}"
    );
    let err = file.tensor_f32("blk.0.attn_q.weight").unwrap_err();
    assert!(
        matches!(&err, GgufError::MissingTensor { tensor, .. } if tensor == "blk.0.attn_q.weight")
    );
}
