//! What a LoRA run adds to a save: the frozen base (`base`: its blocks, and QLoRA's NF4
//! projections as bytes, so a resume needs nothing but the save) and the merged model
//! (`merged`: every base block in the plain model's layout with its layer's adapters folded in,
//! `W + (α/r)·A·B`, NF4 dequantised first, in f32 under the plain model's block names).
//!
//! Not for: the adapters themselves (saved as the model's trainable blocks, in `save.rs`).

use super::save::{read_bytes, stored_dtype, write_bytes};
use super::{TrainError, Trainer};
use crate::save::{StoredDtype, StoredTensor, widen};
use headroom_tensor::{Nf4Weight, TensorError};
use std::collections::BTreeMap;

/// Stored tensors by name.
type Tensors = BTreeMap<String, StoredTensor>;

impl Trainer {
    /// The `base` and `merged` groups of a LoRA run's save, from the whole adapters of `model`
    /// (the save's trainable blocks); `None` without LoRA.
    pub(super) fn lora_groups(
        &self,
        model: &Tensors,
    ) -> Result<Option<(Tensors, Tensors)>, TrainError> {
        if self.model.frozen_blocks().is_empty() {
            return Ok(None);
        }
        let adapters = self
            .model
            .blocks()
            .iter()
            .map(|b| {
                let t = model.get(b.name()).ok_or_else(|| {
                    TrainError::Engine(TensorError::invalid(
                        "LoRA save",
                        format!("the adapters {} are missing", b.name()),
                    ))
                })?;
                Ok(widen(&t.data, t.dtype))
            })
            .collect::<Result<Vec<_>, TrainError>>()?;
        let Some(merged_blocks) = self.model.merged_blocks(&adapters)? else {
            return Ok(None);
        };
        let mut base = BTreeMap::new();
        for block in self.model.frozen_blocks() {
            let t = StoredTensor {
                dtype: stored_dtype(block.flat().dtype()),
                shape: block.flat().shape().to_vec(),
                data: read_bytes(block.flat())?,
            };
            base.insert(block.name().to_string(), t);
        }
        for w in self.model.quantized() {
            let data = w.bytes().map(<[u8]>::to_vec).unwrap_or_default();
            let t = StoredTensor {
                dtype: StoredDtype::U8,
                shape: vec![data.len()],
                data,
            };
            base.insert(format!("{}.nf4", w.name()), t);
        }
        let merged = merged_blocks
            .into_iter()
            .map(|(name, values)| {
                let t = StoredTensor {
                    dtype: StoredDtype::F32,
                    shape: vec![values.len()],
                    data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                };
                (name, t)
            })
            .collect();
        Ok(Some((base, merged)))
    }

    /// Restores a LoRA run's frozen base (and QLoRA's NF4 projections) from a save's `base`
    /// group.
    pub(super) fn resume_base(
        &mut self,
        base: Option<&Tensors>,
        corrupt: impl Fn(String) -> TrainError,
    ) -> Result<(), TrainError> {
        let frozen = self.model.frozen_blocks().to_vec();
        if frozen.is_empty() {
            return Ok(());
        }
        let base = base.ok_or_else(|| corrupt("no base weights (a LoRA run saves them)".into()))?;
        for block in &frozen {
            let t = base
                .get(block.name())
                .ok_or_else(|| corrupt(format!("base block {} is missing", block.name())))?;
            let expected = block.numel() * block.flat().dtype().size_in_bytes();
            if t.data.len() != expected {
                return Err(corrupt(format!(
                    "base block {} has {} bytes, expected {expected}",
                    block.name(),
                    t.data.len()
                )));
            }
            write_bytes(block.flat(), &t.data)?;
        }
        for w in self.model.quantized_mut() {
            let key = format!("{}.nf4", w.name());
            let t = base
                .get(&key)
                .ok_or_else(|| corrupt(format!("NF4 weight {key} is missing")))?;
            if t.data.len() as u64 != w.len_bytes() {
                return Err(corrupt(format!(
                    "NF4 weight {key} has {} bytes, expected {}",
                    t.data.len(),
                    w.len_bytes()
                )));
            }
            Nf4Weight::set_bytes(w, &t.data)?;
        }
        Ok(())
    }
}
