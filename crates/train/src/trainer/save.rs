//! Saving and resuming a run: parameters (compute dtype), fp32 master weights, optimizer state,
//! loss scaler, RNG cursor, data position and losses, through the atomic format of
//! `crate::save`. A resumed run continues bit-exactly.
//!
//! Not for: the file format (see `crate::save`).

use super::{TrainError, Trainer};
use crate::save::{
    self, FORMAT_VERSION, Manifest, SaveError, StoredDtype, StoredTensor, TensorGroups,
};
use headroom_nn::optim::StateDtype;
use headroom_tensor::{DType, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn stored_dtype(d: DType) -> StoredDtype {
    match d {
        DType::BF16 => StoredDtype::Bf16,
        DType::F16 => StoredDtype::F16,
        DType::I64 => StoredDtype::I64,
        _ => StoredDtype::F32,
    }
}

/// The raw little-endian bytes of a float tensor.
fn read_bytes(t: &Tensor) -> Result<Vec<u8>, TrainError> {
    Ok(match t.dtype() {
        DType::BF16 => {
            t.with_slice::<half::bf16, _>(|s| bytemuck::cast_slice::<_, u8>(s).to_vec())?
        }
        DType::F16 => {
            t.with_slice::<half::f16, _>(|s| bytemuck::cast_slice::<_, u8>(s).to_vec())?
        }
        _ => t.with_slice::<f32, _>(|s| bytemuck::cast_slice::<_, u8>(s).to_vec())?,
    })
}

fn write_bytes(t: &Tensor, data: &[u8]) -> Result<(), TrainError> {
    match t.dtype() {
        DType::BF16 => t.with_slice_mut::<half::bf16, _>(|s| {
            bytemuck::cast_slice_mut::<_, u8>(s).copy_from_slice(data)
        })?,
        DType::F16 => t.with_slice_mut::<half::f16, _>(|s| {
            bytemuck::cast_slice_mut::<_, u8>(s).copy_from_slice(data)
        })?,
        _ => t.with_slice_mut::<f32, _>(|s| {
            bytemuck::cast_slice_mut::<_, u8>(s).copy_from_slice(data)
        })?,
    }
    Ok(())
}

fn stored(t: &Tensor) -> Result<StoredTensor, TrainError> {
    Ok(StoredTensor {
        dtype: stored_dtype(t.dtype()),
        shape: t.shape().to_vec(),
        data: read_bytes(t)?,
    })
}

impl Trainer {
    /// Saves the run at the current step under `root`; returns the save's directory.
    pub fn save(&self, root: &Path) -> Result<PathBuf, TrainError> {
        let mut groups = TensorGroups::new();
        let mut model = BTreeMap::new();
        for block in self.model.blocks() {
            model.insert(block.name().to_string(), stored(block.flat())?);
        }
        groups.insert("model".into(), model);
        if let Some(master) = &self.master {
            let mut m = BTreeMap::new();
            for (block, t) in self.model.blocks().iter().zip(master) {
                m.insert(block.name().to_string(), stored(t)?);
            }
            groups.insert("master".into(), m);
        }
        let state_dtype = match self.optimizer.config().state_dtype {
            StateDtype::F32 => StoredDtype::F32,
            StateDtype::Bf16 => StoredDtype::Bf16,
        };
        let optimizer: BTreeMap<String, StoredTensor> = self
            .optimizer
            .state_bytes()
            .into_iter()
            .map(|(name, bytes)| {
                let len = bytes.len() / state_dtype.size_bytes();
                (
                    name,
                    StoredTensor {
                        dtype: state_dtype,
                        shape: vec![len],
                        data: bytes.to_vec(),
                    },
                )
            })
            .collect();
        if !optimizer.is_empty() {
            groups.insert("optimizer".into(), optimizer);
        }
        let rng = headroom_tensor::rng::get_state();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            step: self.step,
            files: BTreeMap::new(),
            checksums: BTreeMap::new(),
            scaler: self.scaler,
            data_position: self.sampler.position(),
            rng: BTreeMap::from([
                ("seed".to_string(), rng.seed),
                ("offset".to_string(), rng.offset),
                ("optimizer_steps".to_string(), self.optimizer.steps()),
            ]),
            losses: self.report.losses.clone(),
            val_losses: self.report.val_losses.clone(),
            config: serde_json::to_value(&self.config).expect("config serialises"),
        };
        Ok(save::write(root, &manifest, &groups)?)
    }

    /// Restores the state saved by [`Trainer::save`] into this freshly built trainer
    /// (same model, precision and optimizer).
    pub fn resume(&mut self, path: &Path) -> Result<(), TrainError> {
        let (manifest, groups) = save::read(path)?;
        let corrupt = |reason: String| {
            TrainError::Save(SaveError::Corrupt {
                path: path.to_path_buf(),
                reason,
            })
        };
        for key in [
            "model",
            "precision",
            "optimizer",
            "layers",
            "width",
            "heads",
            "seq_len",
        ] {
            let saved = &manifest.config[key];
            let now = serde_json::to_value(&self.config).expect("config serialises")[key].clone();
            if *saved != now {
                return Err(TrainError::Save(SaveError::Mismatch {
                    path: path.to_path_buf(),
                    key,
                    saved: saved.to_string(),
                    now: now.to_string(),
                }));
            }
        }
        let model = groups
            .get("model")
            .ok_or_else(|| corrupt("no model tensors".into()))?;
        for block in self.model.blocks() {
            let t = model
                .get(block.name())
                .ok_or_else(|| corrupt(format!("block {} is missing", block.name())))?;
            let expected = block.flat().numel() * block.flat().dtype().size_in_bytes();
            if t.data.len() != expected {
                return Err(corrupt(format!(
                    "block {} has {} bytes, expected {expected}",
                    block.name(),
                    t.data.len()
                )));
            }
            write_bytes(block.flat(), &t.data)?;
        }
        if let Some(master) = &self.master {
            let saved = groups
                .get("master")
                .ok_or_else(|| corrupt("no master weights".into()))?;
            for (block, t) in self.model.blocks().iter().zip(master) {
                let s = saved.get(block.name()).ok_or_else(|| {
                    corrupt(format!("master weights of {} are missing", block.name()))
                })?;
                if s.data.len() != t.numel() * 4 {
                    return Err(corrupt(format!(
                        "master weights of {} have the wrong size",
                        block.name()
                    )));
                }
                write_bytes(t, &s.data)?;
            }
        }
        let empty = BTreeMap::new();
        // An optimizer with state that has stepped saved that state: a save without it would
        // silently restart the optimizer.
        let c = self.optimizer.config();
        let stateful = c.kind.states_per_param(c.momentum) > 0 && manifest.step > 0;
        let opt = match groups.get("optimizer") {
            Some(opt) => opt,
            None if stateful => {
                return Err(corrupt(
                    "the optimizer's state is missing (no optimizer entry in the manifest)".into(),
                ));
            }
            None => &empty,
        };
        let lens: Vec<usize> = if opt.is_empty() {
            Vec::new()
        } else {
            self.model.blocks().iter().map(|b| b.numel()).collect()
        };
        let steps = manifest
            .rng
            .get("optimizer_steps")
            .copied()
            .unwrap_or(manifest.step);
        self.optimizer
            .load_state(steps, &lens, &|key| opt.get(key).map(|t| t.data.clone()))
            .map_err(corrupt)?;
        self.scaler = manifest.scaler;
        self.sampler.seek(manifest.data_position);
        headroom_tensor::rng::set_state(headroom_tensor::rng::RngState {
            seed: manifest
                .rng
                .get("seed")
                .copied()
                .unwrap_or(self.config.seed),
            offset: manifest.rng.get("offset").copied().unwrap_or(0),
        });
        self.step = manifest.step;
        self.report.losses = manifest.losses;
        self.report.val_losses = manifest.val_losses;
        Ok(())
    }
}
