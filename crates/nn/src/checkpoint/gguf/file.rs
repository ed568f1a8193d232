//! An open GGUF file: memory-mapped, its header parsed and bounds-checked once, its metadata
//! looked up by key with typed errors, its tensors dequantised to f32 on request.
//!
//! Not for: what the names mean to a model (`llama.rs`) or the tokenizer (`tokenizer.rs`).

use super::error::{GgufError, Result};
use super::ggml_type::GgmlType;
use super::reader::{Header, TensorInfo, parse};
use super::value::Value;
use memmap2::Mmap;
use rayon::prelude::*;
use std::fs::File;
use std::path::{Path, PathBuf};

/// A GGUF file, memory-mapped.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    header: Header,
}

/// Values per parallel work item when dequantising (a multiple of every block size).
const CHUNK: usize = 1 << 16;

impl GgufFile {
    /// Maps `path` and parses its header; a file that is not GGUF, truncated or corrupt is an
    /// error naming what is wrong.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        if file.metadata().map_err(io)?.len() == 0 {
            return Err(GgufError::Truncated {
                path,
                what: "the header".into(),
                start: 0,
                end: 4,
                len: 0,
            });
        }
        // SAFETY: the map is read-only; a file changed under it by another process is outside
        // what this reader guards against (as for any memory-mapped reader).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = parse(&map, &path)?;
        Ok(GgufFile { path, map, header })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The data section's alignment (`general.alignment`, 32 by default).
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Every metadata pair, in the file's order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.header.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.header
            .metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// The value of `key`, or an error naming it (with `hint` for its absence).
    pub fn require(&self, key: &str, hint: &'static str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            path: self.path.clone(),
            key: key.into(),
            hint,
        })
    }

    /// `key` read with `read`, or an error saying it is not `expected`.
    pub fn typed<'a, T>(
        &'a self,
        key: &str,
        value: &'a Value,
        expected: &'static str,
        read: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<T> {
        read(value).ok_or_else(|| GgufError::WrongKeyType {
            path: self.path.clone(),
            key: key.into(),
            expected,
            found: value.type_name(),
        })
    }

    /// A required non-negative integer.
    pub fn require_usize(&self, key: &str, hint: &'static str) -> Result<usize> {
        let v = self.require(key, hint)?;
        self.typed(key, v, "a non-negative integer", |v| {
            v.as_u64().and_then(|n| usize::try_from(n).ok())
        })
    }

    /// Every tensor's description, in the file's order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor (bounds-checked when the file was opened).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.map[info.start as usize..(info.start + info.bytes) as usize]
    }

    /// Tensor `name` dequantised to f32, in the file's order (row-major in
    /// [`TensorInfo::shape`]); an unknown name or a type headroom does not decode is an error
    /// naming the tensor.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor {
                path: self.path.clone(),
                tensor: name.into(),
                hint: "GgufFile::tensors lists the file's tensors".into(),
            })?;
        self.dequantize(info)
    }

    /// A tensor dequantised to f32, in the file's order.
    pub fn dequantize(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        let t = info.ggml_type;
        let decode = t.dequantizer().ok_or_else(|| GgufError::UnsupportedType {
            path: self.path.clone(),
            tensor: info.name.clone(),
            type_name: t.name,
            supported: GgmlType::supported(),
        })?;
        let bytes = self.tensor_bytes(info);
        let mut out = vec![0f32; info.numel()];
        let chunk_bytes = CHUNK / t.block_values * t.block_bytes;
        out.par_chunks_mut(CHUNK)
            .zip(bytes.par_chunks(chunk_bytes))
            .for_each(|(o, b)| decode(b, o));
        Ok(out)
    }
}
