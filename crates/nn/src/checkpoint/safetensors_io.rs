//! One safetensors file, memory-mapped: its header read once, each tensor widened to f32 on
//! request (F32, F16, BF16, F64); and f32 tensors written to a new file atomically.
//!
//! The format (huggingface/safetensors, `README.md`): 8 bytes of little-endian header length,
//! a JSON header mapping each name to its dtype, shape and byte range, then the data.
//!
//! Not for: which tensors a model needs (`hf_dir`).

use super::{CheckpointError, NamedTensor};
use headroom_memory::output::write_output;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, Metadata, TensorView};
use std::path::{Path, PathBuf};

/// A memory-mapped safetensors file and its parsed header.
#[derive(Debug)]
pub(crate) struct SafetensorsFile {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Where the data section starts.
    data_start: usize,
    metadata: Metadata,
}

impl SafetensorsFile {
    pub(crate) fn open(path: &Path) -> Result<SafetensorsFile, CheckpointError> {
        let file = std::fs::File::open(path).map_err(|e| CheckpointError::io(path, e))?;
        // SAFETY: the map is read-only; a file changed under it by another process is outside
        // what this reader guards against (as for any memory-mapped reader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| CheckpointError::io(path, e))?;
        let (header, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| CheckpointError::Corrupt {
                path: path.into(),
                message: e.to_string(),
            })?;
        Ok(SafetensorsFile {
            path: path.into(),
            map,
            data_start: 8 + header,
            metadata,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.metadata.tensors().into_keys().collect()
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.metadata.info(name).is_some()
    }

    /// Tensor `name` as f32, checked against `expected` (its shape in the checkpoint).
    pub(crate) fn read_f32(
        &self,
        name: &str,
        expected: &[usize],
    ) -> Result<Vec<f32>, CheckpointError> {
        let info = self
            .metadata
            .info(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                dir: self.path.clone(),
                tensor: name.into(),
            })?;
        if info.shape != expected {
            return Err(CheckpointError::Shape {
                path: self.path.clone(),
                tensor: name.into(),
                found: info.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        let (start, end) = info.data_offsets;
        // read_metadata checked the offsets against the file's length.
        let bytes = &self.map[self.data_start + start..self.data_start + end];
        let wide = |size: usize, f: fn(&[u8]) -> f32| bytes.chunks_exact(size).map(f).collect();
        Ok(match info.dtype {
            Dtype::F32 => wide(4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::F16 => wide(2, |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            Dtype::BF16 => wide(2, |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            Dtype::F64 => wide(8, |b| {
                f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
            }),
            other => {
                return Err(CheckpointError::Dtype {
                    path: self.path.clone(),
                    tensor: name.into(),
                    dtype: format!("{other:?}"),
                });
            }
        })
    }
}

/// Writes `tensors` as one f32 safetensors file, atomically, with the `format = pt` metadata
/// that transformers checks.
pub(crate) fn write_f32(path: &Path, tensors: &[NamedTensor]) -> Result<(), CheckpointError> {
    // safetensors stores little-endian values, whatever the host's order.
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| TensorView::new(Dtype::F32, t.shape.clone(), b).map(|v| (t.name.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CheckpointError::io(path, e))?;
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let out =
        safetensors::serialize(views, Some(metadata)).map_err(|e| CheckpointError::io(path, e))?;
    write_output(path, &out).map_err(|e| CheckpointError::io(path, e))
}
