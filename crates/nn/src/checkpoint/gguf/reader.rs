//! Parses a GGUF container from its bytes (ggml-org/ggml `docs/gguf.md`): the header (magic
//! "GGUF", version, tensor count, metadata count), the metadata key/value pairs, the tensor
//! infos (name, dimensions fastest-varying first, ggml type, offset), and where the data
//! section starts (after the infos, rounded up to `general.alignment`, 32 by default).
//!
//! Every read is bounds-checked against the file's length and every size computed with
//! overflow checks, so a truncated or corrupt file is a [`GgufError`] naming the key or tensor,
//! never a panic or an allocation the file's length does not justify.
//!
//! Not for: decoding tensor data (`blocks.rs`, `kquants.rs`) or mapping names (`llama.rs`).

use super::error::{GgufError, Result};
use super::ggml_type::GgmlType;
use super::value::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The first four bytes of every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are refused (the format allows nesting; files use one level).
const MAX_NESTING: usize = 8;

/// One tensor's description.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` varies fastest (a Hugging Face [out, in] weight is `[in, out]`).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the tensor's data in the file.
    pub start: u64,
    /// Length of its data in bytes.
    pub bytes: u64,
}

impl TensorInfo {
    /// The shape in row-major order (slowest first): `dims` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }
}

/// A parsed header.
#[derive(Debug)]
pub struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let len = self.bytes.len() as u64;
        let end = (self.pos as u64).checked_add(n).filter(|&e| e <= len);
        let Some(end) = end else {
            return Err(GgufError::Truncated {
                path: self.path.into(),
                what: what(),
                start: self.pos as u64,
                end: (self.pos as u64).saturating_add(n),
                len,
            });
        };
        let out = &self.bytes[self.pos..end as usize];
        self.pos = end as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.u64(what)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| self.corrupt(what(), format!("{e}")))
    }

    fn corrupt(&self, item: String, what: String) -> GgufError {
        GgufError::Corrupt {
            path: self.path.into(),
            item,
            what,
        }
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn value(&mut self, type_id: u32, key: &str, depth: usize) -> Result<Value> {
        let what = || format!("the value of metadata key '{key}'");
        let what: &dyn Fn() -> String = &what;
        Ok(match type_id {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.corrupt(what(), format!("a BOOL byte of {b}, not 0 or 1"))),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_NESTING {
                    let msg = format!("arrays nested deeper than {MAX_NESTING}");
                    return Err(self.corrupt(what(), msg));
                }
                let elem = self.u32(what)?;
                let count = self.u64(what)?;
                // Every element takes at least one byte: a count beyond the bytes left is a
                // corrupt length, caught before looping over it.
                if count > self.remaining() {
                    let start = self.pos as u64;
                    return Err(GgufError::Truncated {
                        path: self.path.into(),
                        what: format!("{} ({count} elements)", what()),
                        start,
                        end: start.saturating_add(count),
                        len: self.bytes.len() as u64,
                    });
                }
                let mut items = Vec::new();
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            _ => {
                return Err(GgufError::UnknownValueType {
                    path: self.path.into(),
                    key: key.to_string(),
                    type_id,
                });
            }
        })
    }
}

/// Parses the header of the GGUF file `path`, whose bytes are `bytes`.
pub fn parse(bytes: &[u8], path: &Path) -> Result<Header> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        path,
    };
    let header = || "the header".to_string();
    let magic: [u8; 4] = c.array(&header)?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            path: path.into(),
            found: magic,
        });
    }
    let version = c.u32(&header)?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion {
            path: path.into(),
            version,
        });
    }
    let tensor_count = c.u64(&header)?;
    let kv_count = c.u64(&header)?;
    let mut metadata = Vec::new();
    for i in 0..kv_count {
        let key = c.string(&|| format!("the key of metadata pair {i} of {kv_count}"))?;
        let type_id = c.u32(&|| format!("the value type of metadata key '{key}'"))?;
        let value = c.value(type_id, &key, 0)?;
        metadata.push((key, value));
    }
    let alignment = alignment(&metadata, path)?;
    let mut infos = Vec::new();
    let mut names = HashSet::new();
    for i in 0..tensor_count {
        let name = c.string(&|| format!("the name of tensor {i} of {tensor_count}"))?;
        let info = tensor_info(&mut c, &name)?;
        if !names.insert(name.clone()) {
            return Err(c.corrupt(format!("tensor '{name}'"), "the name appears twice".into()));
        }
        infos.push((name, info));
    }
    let len = bytes.len() as u64;
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let mut tensors = Vec::new();
    for (name, (dims, ggml_type, offset, size)) in infos {
        if offset % alignment != 0 {
            let msg = format!("its offset {offset} is not a multiple of the alignment {alignment}");
            return Err(c.corrupt(format!("tensor '{name}'"), msg));
        }
        let start = data_start.checked_add(offset);
        let end = start
            .and_then(|s| s.checked_add(size))
            .filter(|&e| e <= len);
        let (Some(start), Some(_)) = (start, end) else {
            return Err(GgufError::TensorPastEnd {
                path: path.into(),
                tensor: name,
                start: data_start.saturating_add(offset),
                end: data_start.saturating_add(offset).saturating_add(size),
                len,
            });
        };
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            start,
            bytes: size,
        });
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
    })
}

fn alignment(metadata: &[(String, Value)], path: &Path) -> Result<u64> {
    let key = "general.alignment";
    let Some((_, value)) = metadata.iter().find(|(k, _)| k == key) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value.as_u64() {
        Some(a) if a.is_power_of_two() => Ok(a),
        _ => Err(GgufError::Corrupt {
            path: PathBuf::from(path),
            item: format!("metadata key '{key}'"),
            what: format!("{value:?} is not a power of two"),
        }),
    }
}

/// Dimensions, type, offset within the data section and byte length of tensor `name`.
fn tensor_info(c: &mut Cursor, name: &str) -> Result<(Vec<u64>, GgmlType, u64, u64)> {
    let what = || format!("the description of tensor '{name}'");
    let what: &dyn Fn() -> String = &what;
    let n_dims = c.u32(what)?;
    if n_dims > MAX_DIMS {
        let msg = format!("{n_dims} dimensions, more than ggml's {MAX_DIMS}");
        return Err(c.corrupt(format!("tensor '{name}'"), msg));
    }
    let mut dims = Vec::new();
    for _ in 0..n_dims {
        dims.push(c.u64(what)?);
    }
    let type_id = c.u32(what)?;
    let offset = c.u64(what)?;
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            path: c.path.into(),
            tensor: name.to_string(),
            type_id,
        });
    };
    let numel = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    let block = ggml_type.block_values as u64;
    let row = dims.first().copied().unwrap_or(1);
    let size = numel
        .filter(|_| row % block == 0)
        .and_then(|n| (n / block).checked_mul(ggml_type.block_bytes as u64));
    let Some(size) = size else {
        let msg = format!(
            "dimensions {dims:?} do not make whole {} blocks of {block} values along the first",
            ggml_type.name
        );
        return Err(c.corrupt(format!("tensor '{name}'"), msg));
    };
    Ok((dims, ggml_type, offset, size))
}
