//! Saving and resuming a run: parameters (compute dtype), fp32 master weights, optimizer state,
//! loss scaler, RNG cursor, data position and losses, through the atomic format of
//! `crate::save`. A resumed run continues bit-exactly.
//!
//! Not for: the file format (see `crate::save`).

use super::shard::shard_of;
use super::{TrainError, Trainer};
use crate::save::{
    self, FORMAT_VERSION, Manifest, SaveError, StoredDtype, StoredTensor, TensorGroups,
};
use headroom_comm::Communicator;
use headroom_nn::optim::{StateBuffer, StateElement};
use headroom_tensor::{DType, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub(super) fn stored_dtype(d: DType) -> StoredDtype {
    match d {
        DType::BF16 => StoredDtype::Bf16,
        DType::F16 => StoredDtype::F16,
        DType::I64 => StoredDtype::I64,
        _ => StoredDtype::F32,
    }
}

/// The raw little-endian bytes of a float tensor.
pub(super) fn read_bytes(t: &Tensor) -> Result<Vec<u8>, TrainError> {
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

pub(super) fn write_bytes(t: &Tensor, data: &[u8]) -> Result<(), TrainError> {
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

/// A rank's shard of a flat buffer of `numel` elements stored as `dtype`: gathers every rank's
/// shard (padded to equal parts) into the whole buffer's bytes.
fn gather_stored(
    comm: &mut dyn Communicator,
    shard: &[u8],
    dtype: StoredDtype,
    numel: usize,
) -> Result<Vec<u8>, TrainError> {
    let (_, padded) = shard_of(numel, comm.rank(), comm.world_size());
    // 16-bit values are exact in f32, so the round trip keeps every bit.
    let mut values = save::widen(shard, dtype);
    values.resize(padded, 0.0);
    let mut all = vec![0.0f32; padded * comm.world_size()];
    comm.all_gather(&values, &mut all)?;
    all.truncate(numel);
    Ok(match dtype {
        StoredDtype::Bf16 => all
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        StoredDtype::F16 => all
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => all.iter().flat_map(|v| v.to_le_bytes()).collect(),
    })
}

/// Stored tensors by name.
type Tensors = BTreeMap<String, StoredTensor>;

/// A rank's master weights (per block, when the precision keeps them) and optimizer states
/// (name, bytes, element type).
type LocalState = (Option<Vec<Vec<u8>>>, Vec<(String, Vec<u8>, StateElement)>);

fn stored_element(e: StateElement) -> StoredDtype {
    match e {
        StateElement::F32 => StoredDtype::F32,
        StateElement::Bf16 => StoredDtype::Bf16,
        StateElement::U8 => StoredDtype::U8,
    }
}

/// Bytes `range` (in elements of `size` bytes) of a whole buffer's bytes.
fn shard_bytes(bytes: &[u8], range: &std::ops::Range<usize>, size: usize) -> Vec<u8> {
    bytes[range.start * size..range.end * size].to_vec()
}

impl Trainer {
    /// Saves the run at the current step under `root`; returns the save's directory. In a
    /// data-parallel group every rank calls it: under ZeRO-1 the shards of the optimizer state
    /// and master weights are gathered first, and rank 0 writes the whole state, so a save
    /// resumes at any number of ranks.
    pub fn save(&mut self, root: &Path) -> Result<PathBuf, TrainError> {
        let (master, optimizer) = self.whole_state()?;
        let model = self.whole_parameters()?;
        let dir = root.join(format!("step-{:06}", self.step));
        let Some(model) = model else {
            return Ok(dir);
        };
        let mut groups = TensorGroups::new();
        if let Some((base, merged)) = self.lora_groups(&model)? {
            groups.insert("base".into(), base);
            groups.insert("merged".into(), merged);
        }
        groups.insert("model".into(), model);
        if let Some(master) = master {
            groups.insert("master".into(), master);
        }
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

    /// Every parameter of the model in block order as f32, on every rank (every rank must call
    /// it: under ZeRO-3 each block's shards are gathered).
    pub fn parameters_f32(&mut self) -> Result<Vec<f32>, TrainError> {
        let mut all = Vec::with_capacity(self.model.num_params());
        let blocks = self.model.blocks().to_vec();
        for (i, block) in blocks.iter().enumerate() {
            let shard = match block.shard().and_then(|s| s.params.as_ref()) {
                Some(p) => Some(super::offload::widen(
                    &self.param_shard_bytes(i, p)?,
                    p.dtype(),
                )),
                None => None,
            };
            match (block.shard(), shard, self.comm.as_mut()) {
                (Some(headroom_tensor::BlockShard { padded, .. }), Some(values), Some(c)) => {
                    let mut whole = vec![0.0f32; padded * c.world_size()];
                    c.all_gather(&values, &mut whole)?;
                    all.extend_from_slice(&whole[..block.numel()]);
                }
                _ => all.extend(block.flat().to_vec_f32()?),
            }
        }
        Ok(all)
    }

    /// The model's parameters by block, on rank 0 (`None` on the others): each block's full
    /// buffer, or under ZeRO-3 every rank's shard gathered (every rank joins).
    pub(super) fn whole_parameters(&mut self) -> Result<Option<Tensors>, TrainError> {
        let lead = self.rank().0 == 0;
        let mut model = BTreeMap::new();
        let blocks = self.model.blocks().to_vec();
        for (i, block) in blocks.iter().enumerate() {
            let shard_bytes = match block.shard().and_then(|s| s.params.as_ref()) {
                Some(p) => Some(self.param_shard_bytes(i, p)?),
                None => None,
            };
            let t = match (block.shard(), shard_bytes, self.comm.as_mut()) {
                (
                    Some(
                        shard @ headroom_tensor::BlockShard {
                            params: Some(p), ..
                        },
                    ),
                    Some(bytes),
                    Some(c),
                ) => {
                    let dtype = stored_dtype(p.dtype());
                    let size = dtype.size_bytes();
                    let bytes = bytes[..shard.range.len() * size].to_vec();
                    let data = gather_stored(c.as_mut(), &bytes, dtype, block.numel())?;
                    StoredTensor {
                        dtype,
                        shape: block.flat().shape().to_vec(),
                        data,
                    }
                }
                _ if lead => stored(block.flat())?,
                _ => continue,
            };
            model.insert(block.name().to_string(), t);
        }
        Ok(lead.then_some(model))
    }

    /// The master weights (by block) and optimizer state (by name) of the whole model: this
    /// rank's own, or under ZeRO every rank's shards gathered.
    fn whole_state(&mut self) -> Result<(Option<Tensors>, Tensors), TrainError> {
        let sharded = self.sharded();
        let numels: Vec<usize> = self.model.blocks().iter().map(|b| b.numel()).collect();
        let whole = |comm: Option<&mut Box<dyn Communicator>>,
                     bytes: Vec<u8>,
                     dtype: StoredDtype,
                     numel: usize|
         -> Result<StoredTensor, TrainError> {
            let data = match comm {
                Some(c) if sharded => gather_stored(c.as_mut(), &bytes, dtype, numel)?,
                _ => bytes,
            };
            Ok(StoredTensor {
                dtype,
                shape: vec![data.len() / dtype.size_bytes()],
                data,
            })
        };
        let (masters, states) = self.local_state()?;
        let mut master = None;
        if let Some(masters) = masters {
            let mut m = BTreeMap::new();
            for (i, bytes) in masters.into_iter().enumerate() {
                let s = whole(self.comm.as_mut(), bytes, StoredDtype::F32, numels[i])?;
                m.insert(self.model.blocks()[i].name().to_string(), s);
            }
            master = Some(m);
        }
        let per_block = states.len() / numels.len().max(1);
        let mut optimizer = BTreeMap::new();
        for (k, (name, bytes, element)) in states.into_iter().enumerate() {
            let numel = numels[k / per_block.max(1)];
            let dtype = stored_element(element);
            optimizer.insert(name, whole(self.comm.as_mut(), bytes, dtype, numel)?);
        }
        Ok((master, optimizer))
    }

    /// This rank's master weights per block (when the precision keeps them) and optimizer
    /// states by name (`group{i}.{state}`), from the device or the offload store.
    fn local_state(&mut self) -> Result<LocalState, TrainError> {
        if let Some(off) = self.offload.as_mut() {
            let mut masters = Vec::new();
            let mut states = Vec::new();
            for i in 0..self.model.blocks().len() {
                let (master, block_states) = off.block_state(i)?;
                masters.push(master);
                let layout = self.optimizer.state_layout(i, 0);
                for (part, bytes) in layout.iter().zip(block_states) {
                    states.push((format!("group{i}.{}", part.name), bytes, part.element));
                }
            }
            let masters = self.precision.master_weights().then_some(masters);
            return Ok((masters, states));
        }
        let masters = match &self.master {
            Some(copies) => Some(
                copies
                    .iter()
                    .map(read_bytes)
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            None => None,
        };
        let states = self
            .optimizer
            .state_bytes()
            .into_iter()
            .map(|(name, bytes, element)| (name, bytes.to_vec(), element))
            .collect();
        Ok((masters, states))
    }

    /// Block `i`'s ZeRO-3 parameter shard `p` as bytes: from the offload store when the
    /// shards are offloaded.
    fn param_shard_bytes(&mut self, i: usize, p: &Tensor) -> Result<Vec<u8>, TrainError> {
        match self
            .offload
            .as_mut()
            .map(|o| o.param_shard(i))
            .transpose()?
            .flatten()
        {
            Some(bytes) => Ok(bytes),
            None => read_bytes(p),
        }
    }

    /// Restores the state saved by [`Trainer::save`] into this freshly built trainer
    /// (same model, precision and optimizer; under ZeRO-1 this rank takes its shards, so the
    /// number of ranks may differ from the saved run's). A run that saves (`save_dir`) is
    /// refused when its saves would replace others there (see `save::check_destination`).
    pub fn resume(&mut self, path: &Path) -> Result<(), TrainError> {
        let at = save::locate(path)?;
        let (manifest, groups) = save::read(&at)?;
        if let Some(root) = &self.config.save_dir {
            save::check_destination(root, Some((&at, manifest.step)))?;
        }
        let corrupt = |reason: String| {
            TrainError::Save(SaveError::Corrupt {
                path: path.to_path_buf(),
                reason,
            })
        };
        let (rank, world) = self.rank();
        let sharded = self.sharded();
        let shards: Vec<std::ops::Range<usize>> = self
            .model
            .blocks()
            .iter()
            .map(|b| match sharded {
                true => shard_of(b.numel(), rank, world).0,
                false => 0..b.numel(),
            })
            .collect();
        for key in [
            "model",
            "lora",
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
        let blocks = self.model.blocks().to_vec();
        for (i, block) in blocks.iter().enumerate() {
            let t = model
                .get(block.name())
                .ok_or_else(|| corrupt(format!("block {} is missing", block.name())))?;
            let size = block.flat().dtype().size_in_bytes();
            let expected = block.numel() * size;
            if t.data.len() != expected {
                return Err(corrupt(format!(
                    "block {} has {} bytes, expected {expected}",
                    block.name(),
                    t.data.len()
                )));
            }
            match block
                .shard()
                .and_then(|s| s.params.as_ref().map(|p| (s, p)))
            {
                // ZeRO-3: this rank's shard of the block, pads zero.
                Some((shard, p)) => {
                    let mut bytes = shard_bytes(&t.data, &shard.range, size);
                    bytes.resize(shard.padded * size, 0);
                    match self.offload.as_mut().filter(|o| o.params.is_some()) {
                        Some(off) => off.load_param_shard(i, &bytes)?,
                        None => write_bytes(p, &bytes)?,
                    }
                }
                None => write_bytes(block.flat(), &t.data)?,
            }
        }
        self.resume_base(groups.get("base"), corrupt)?;
        if let Some(master) = &self.master {
            let saved = groups
                .get("master")
                .ok_or_else(|| corrupt("no master weights".into()))?;
            for (i, (block, t)) in self.model.blocks().iter().zip(master).enumerate() {
                let s = saved.get(block.name()).ok_or_else(|| {
                    corrupt(format!("master weights of {} are missing", block.name()))
                })?;
                if s.data.len() != block.numel() * 4 {
                    return Err(corrupt(format!(
                        "master weights of {} have the wrong size",
                        block.name()
                    )));
                }
                write_bytes(t, &shard_bytes(&s.data, &shards[i], 4))?;
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
            shards.iter().map(|r| r.len()).collect()
        };
        let steps = manifest
            .rng
            .get("optimizer_steps")
            .copied()
            .unwrap_or(manifest.step);
        // A state of one element per parameter takes this rank's shard; any other (8-bit
        // states' per-block absmax, never sharded) is taken whole.
        let shard_of_key = |key: &str, part: &StateBuffer| -> Option<Vec<u8>> {
            let t = opt.get(key)?;
            let group: usize = key.strip_prefix("group")?.split('.').next()?.parse().ok()?;
            let range = shards.get(group)?;
            let size = stored_element(part.element).size_bytes();
            if part.bytes == range.len() * size {
                (t.data.len() >= range.end * size).then(|| shard_bytes(&t.data, range, size))
            } else {
                (t.data.len() == part.bytes).then(|| t.data.clone())
            }
        };
        if self.offload.is_some() {
            // The store's regions take the master weights (saved, or the restored weights
            // themselves when the precision keeps none) and the states; the optimizer only
            // its step count.
            let saved_master = groups.get("master");
            for (i, block) in blocks.iter().enumerate() {
                let layout = self.optimizer.state_layout(i, shards[i].len());
                let master = match saved_master.and_then(|m| m.get(block.name())) {
                    Some(m) => shard_bytes(&m.data, &shards[i], 4),
                    None => {
                        let values = match block.shard().and_then(|s| s.params.as_ref()) {
                            Some(p) => {
                                let bytes = self.param_shard_bytes(i, p)?;
                                super::offload::widen(&bytes, p.dtype())[..shards[i].len()].to_vec()
                            }
                            None => block.flat().to_vec_f32()?[shards[i].clone()].to_vec(),
                        };
                        bytemuck::cast_slice(&values).to_vec()
                    }
                };
                let states: Vec<Option<Vec<u8>>> = layout
                    .iter()
                    .map(|part| shard_of_key(&format!("group{i}.{}", part.name), part))
                    .collect();
                if !opt.is_empty() && states.iter().any(Option::is_none) {
                    return Err(corrupt(format!(
                        "the optimizer state of block {i} is missing"
                    )));
                }
                let off = self.offload.as_mut().expect("checked above");
                off.load_block_state(i, &master, &states)?;
            }
            self.optimizer
                .load_state(steps, &[], &|_, _| None)
                .map_err(corrupt)?;
        } else {
            self.optimizer
                .load_state(steps, &lens, &shard_of_key)
                .map_err(corrupt)?;
        }
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
