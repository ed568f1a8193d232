//! Every block format headroom reads, held to llama.cpp's own decoder: blocks.gguf and
//! blocks.safetensors were written by scripts/gguf-fixtures.py with gguf-py (GGUFWriter,
//! gguf.quants.quantize / dequantize). The decoders use the reference's f32 operations in its
//! order, so the tolerance is zero: every value is bit-identical.

use crate::gguf_common;

use gguf_common::{assert_bitwise, fixture, reference};
use headroom_nn::checkpoint::gguf::{GgufError, GgufFile, Value};

#[test]
fn every_supported_block_format_matches_gguf_py_bit_for_bit() {
    let file = GgufFile::open(fixture("blocks.gguf")).unwrap();
    let expected = reference("blocks.safetensors");
    // 13 formats (F32 … Q6_K) plus the 3-dimensional F32 `cube`.
    assert_eq!(expected.len(), 14);
    for (name, shape, want) in &expected {
        let info = file.tensor_info(name).unwrap();
        assert_eq!(&info.shape(), shape, "{name}");
        let got = file.tensor_f32(name).unwrap();
        assert_bitwise(&got, want, name);
    }
}

#[test]
fn tensor_types_and_shapes_are_read_from_the_infos() {
    let file = GgufFile::open(fixture("blocks.gguf")).unwrap();
    let info = file.tensor_info("q4_k").unwrap();
    // gguf-py writes a (2, 256) array's dims fastest first: [256, 2]; Q4_K is ggml type 12 and
    // 2 rows of one 144-byte super-block each take 288 bytes.
    assert_eq!(info.dims, vec![256, 2]);
    assert_eq!((info.ggml_type.id, info.ggml_type.name), (12, "Q4_K"));
    assert_eq!(info.bytes, 288);
    let cube = file.tensor_info("cube").unwrap();
    assert_eq!(cube.dims, vec![4, 3, 2]);
    assert_eq!(cube.shape(), vec![2, 3, 4]);
}

#[test]
fn the_custom_alignment_places_every_tensor_on_a_64_byte_boundary() {
    let file = GgufFile::open(fixture("blocks.gguf")).unwrap();
    assert_eq!((file.version(), file.alignment()), (3, 64));
    for t in file.tensors() {
        assert_eq!(t.start % 64, 0, "{}", t.name);
    }
}

#[test]
fn metadata_of_every_value_type_reads_back_as_written() {
    let file = GgufFile::open(fixture("blocks.gguf")).unwrap();
    // The values scripts/gguf-fixtures.py writes under test.*.
    let s = |x: &str| Value::String(x.to_string());
    let expected = [
        ("test.u8", Value::U8(200)),
        ("test.i8", Value::I8(-100)),
        ("test.u16", Value::U16(60000)),
        ("test.i16", Value::I16(-30000)),
        ("test.u32", Value::U32(4_000_000_000)),
        ("test.i32", Value::I32(-2_000_000_000)),
        ("test.f32", Value::F32(0.25)),
        ("test.bool", Value::Bool(true)),
        ("test.string", s("héllo")),
        ("test.u64", Value::U64((1 << 63) + 5)),
        ("test.i64", Value::I64(-(1 << 62))),
        ("test.f64", Value::F64(-1.5)),
        (
            "test.array_i32",
            Value::Array(vec![Value::I32(1), Value::I32(-2), Value::I32(3)]),
        ),
        (
            "test.array_nested",
            Value::Array(vec![
                Value::Array(vec![s("a"), s("b")]),
                Value::Array(vec![s("c")]),
            ]),
        ),
        ("general.alignment", Value::U32(64)),
        ("general.architecture", s("test")),
    ];
    for (key, want) in expected {
        assert_eq!(file.get(key), Some(&want), "{key}");
    }
}

#[test]
fn an_unsupported_type_names_the_tensor_its_type_and_the_supported_ones() {
    let file = GgufFile::open(fixture("blocks.gguf")).unwrap();
    let err = file.tensor_f32("iq4_nl").unwrap_err();
    assert!(matches!(
        &err,
        GgufError::UnsupportedType { tensor, type_name: "IQ4_NL", .. } if tensor == "iq4_nl"
    ));
    let msg = err.to_string();
    for part in [
        "blocks.gguf",
        "'iq4_nl'",
        "IQ4_NL",
        "Q4_1",
        "Q8_0",
        "Q6_K",
        "llama-quantize",
    ] {
        assert!(msg.contains(part), "{part} missing from: {msg}");
    }
}
