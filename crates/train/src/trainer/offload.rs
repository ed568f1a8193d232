//! Offload in the trainer (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al.
//! 2021): with `--offload-optimizer cpu|nvme` each block shard's fp32 master weights and
//! optimizer states live in one region of an offload store (host memory, or a file under
//! `--offload-dir`) and the update runs there: the shard's gradient is copied into a host f32
//! buffer (ZeRO-Offload's fp32 gradient partition; the next block's copy runs on a second
//! thread while the current block updates), the optimizer steps the region in place with the
//! same arithmetic as on the device (so losses are bitwise those of a run without offload), and
//! the updated weights are cast into the compute parameters. With `--offload-params cpu|nvme`
//! (ZeRO-3) each block's parameter shard lives in a second store: the ZeRO hooks gather a block
//! from it (reading the next block ahead) and the update writes it back.
//!
//! On a dry run the stores count the same host and disk bytes and move nothing, and the
//! device-side allocations and collectives are the real step's.
//!
//! Not for: the step itself (`offload_step`), the stores (`headroom_offload`) or the update rule
//! (`headroom_nn::optim`).

use super::TrainError;
use super::host_grads::{HostBytes, HostGrads};
use super::shard::block_shards;
use crate::config::RunConfig;
use crate::report::OffloadReport;
use headroom_memory::Category;
use headroom_memory::host_pool::HostPool;
use headroom_nn::Model;
use headroom_nn::optim::Optimizer;
use headroom_offload::{OffloadStore, Part, StoreOptions, TierKind};
use headroom_strategy::Offload;
use headroom_strategy::ZeroStage;
use headroom_tensor::DType;
use std::ops::Range;

/// Host swap buffers of a disk store: one worked on, one being read ahead, one written behind.
pub const SWAP_BUFFERS: usize = 3;
/// I/O worker threads of a disk store (requests in flight at once).
pub const IO_WORKERS: usize = 2;

/// The offloaded states of one rank.
#[derive(Debug)]
pub(super) struct Offloaded {
    /// Region i: block i's shard as [fp32 master weights | optimizer state…].
    pub optimizer: OffloadStore,
    /// Region i: block i's parameter shard in the compute dtype (`--offload-params`).
    pub params: Option<OffloadStore>,
    /// ZeRO-2/3: each block's reduced gradient shard in host memory (none on the device).
    pub host_grads: Option<HostGrads>,
    /// ZeRO-0/1: two host f32 buffers each block's gradient is copied into (one updated from,
    /// one being filled); none under ZeRO-2/3.
    pub(super) staging: Vec<HostBytes>,
    /// Each block's shard of the flat buffers and the padded shard length.
    pub(super) shards: Vec<(Range<usize>, usize)>,
    /// Gradient copies to the host: seconds copying, and seconds the update waited for them.
    pub(super) copy_seconds: f64,
    pub(super) copy_waited_seconds: f64,
}

fn tier(offload: Offload) -> TierKind {
    match offload {
        Offload::Nvme => TierKind::Disk,
        _ => TierKind::Host,
    }
}

fn store(
    pool: &HostPool,
    config: &RunConfig,
    what: &str,
    rank: usize,
    offload: Offload,
    dry: bool,
) -> Result<OffloadStore, TrainError> {
    Ok(OffloadStore::new(
        pool.clone(),
        StoreOptions {
            name: format!("{what}.rank{rank}"),
            tier: tier(offload),
            dir: config.offload_dir.clone(),
            swap_buffers: SWAP_BUFFERS,
            io_workers: IO_WORKERS,
            dry,
        },
    )?)
}

/// A block's weights as f32: its shard of the flat buffer, or under ZeRO-3 its parameter shard.
fn shard_values(
    block: &headroom_tensor::ParamBlock,
    range: &Range<usize>,
) -> Result<Vec<f32>, TrainError> {
    Ok(match block.shard().and_then(|s| s.params.as_ref()) {
        Some(p) => p.to_vec_f32()?[..range.len()].to_vec(),
        None => block.flat().to_vec_f32()?[range.clone()].to_vec(),
    })
}

/// `bytes` of `dtype` elements read as f32.
pub(super) fn widen(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::BF16 => bytemuck::cast_slice::<_, half::bf16>(bytes)
            .iter()
            .map(|x| x.to_f32())
            .collect(),
        DType::F16 => bytemuck::cast_slice::<_, half::f16>(bytes)
            .iter()
            .map(|x| x.to_f32())
            .collect(),
        _ => bytemuck::cast_slice::<_, f32>(bytes).to_vec(),
    }
}

/// Builds the offload stores of `config`'s placement for `model` (`None` when nothing is
/// offloaded), filled with the model's current weights and zero optimizer state. Under ZeRO-3
/// with `--offload-params` the blocks' device parameter shards are released afterwards.
pub(super) fn build(
    config: &RunConfig,
    model: &dyn Model,
    optimizer: &Optimizer,
    (rank, world, stage): (usize, usize, ZeroStage),
    pool: &HostPool,
    dry: bool,
) -> Result<Option<Offloaded>, TrainError> {
    let placement = config.strategy.placement;
    if !placement.offload_optimizer.is_offloaded() {
        return Ok(None);
    }
    let shards = block_shards(model, rank, world, stage);
    let mut states = store(
        pool,
        config,
        "optimizer",
        rank,
        placement.offload_optimizer,
        dry,
    )?;
    for (i, (block, (range, _))) in model.blocks().iter().zip(&shards).enumerate() {
        let len = range.len();
        let mut parts = vec![Part {
            category: Category::MasterWeight,
            bytes: 4 * len,
        }];
        parts.extend(optimizer.state_layout(i, len).into_iter().map(|part| Part {
            category: Category::OptimizerState,
            bytes: part.bytes,
        }));
        let values = match dry {
            true => Vec::new(),
            false => shard_values(block, range)?,
        };
        states.add_region(parts, |mut r| {
            bytemuck::cast_slice_mut::<_, f32>(&mut *r.parts[0]).copy_from_slice(&values);
        })?;
    }
    let params = match placement.offload_params.is_offloaded() && stage.shards_parameters() {
        true => {
            let mut store = store(pool, config, "params", rank, placement.offload_params, dry)?;
            for block in model.blocks() {
                let shard = block
                    .shard()
                    .and_then(|s| s.params.as_ref())
                    .expect("ZeRO-3 blocks hold a parameter shard");
                let bytes = shard.numel() * shard.dtype().size_in_bytes();
                let parts = vec![Part {
                    category: Category::Parameter,
                    bytes,
                }];
                let values = match dry {
                    true => Vec::new(),
                    false => super::save::read_bytes(shard)?,
                };
                store.add_region(parts, |mut r| r.parts[0].copy_from_slice(&values))?;
                shard.release_storage();
            }
            store.wait_idle()?;
            Some(store)
        }
        false => None,
    };
    // The initial regions are on disk (or the disk's error is known) before training starts.
    states.wait_idle()?;
    let largest = shards.iter().map(|(r, _)| r.len()).max().unwrap_or(0);
    // ZeRO-2/3: reduced gradients go to the host; the device's shards give their bytes back.
    let host_grads = match stage.shards_gradients() {
        true => {
            let mut padded = Vec::new();
            let mut dtype = DType::F32;
            for block in model.blocks() {
                let g = block
                    .shard()
                    .and_then(|s| s.grads.as_ref())
                    .expect("ZeRO-2/3 blocks hold a gradient shard");
                padded.push(g.numel());
                dtype = g.dtype();
                g.release_storage();
            }
            Some(HostGrads::new(pool, padded, dtype, dry)?)
        }
        _ => None,
    };
    let staging = match host_grads {
        Some(_) => Vec::new(),
        None => vec![
            HostBytes::new(pool, 4 * largest, dry)?,
            HostBytes::new(pool, 4 * largest, dry)?,
        ],
    };
    Ok(Some(Offloaded {
        optimizer: states,
        params,
        host_grads,
        staging,
        shards,
        copy_seconds: 0.0,
        copy_waited_seconds: 0.0,
    }))
}

impl Offloaded {
    pub(super) fn report(&self) -> OffloadReport {
        let mut stores = vec![self.optimizer.stats()];
        stores.extend(self.params.as_ref().map(OffloadStore::stats));
        let each = self.staging.first().map_or(0, HostBytes::len);
        let mut host = headroom_memory::CategoryBytes::ZERO;
        let mut disk = headroom_memory::CategoryBytes::ZERO;
        let mut swap_bytes = 0;
        for s in &stores {
            for (c, b) in s.host.iter() {
                host[c] += b;
            }
            for (c, b) in s.disk.iter() {
                disk[c] += b;
            }
            swap_bytes += s.swap_buffers as u64 * s.swap_buffer_bytes;
        }
        host[Category::Gradient] +=
            self.staging.len() as u64 * each + self.host_grads.as_ref().map_or(0, HostGrads::total);
        OffloadReport {
            stores,
            gradient_buffers: self.staging.len(),
            gradient_buffer_bytes: each,
            gradient_copy_seconds: self.copy_seconds,
            gradient_copy_waited_seconds: self.copy_waited_seconds,
            host,
            swap_bytes,
            disk,
        }
    }

    /// Block `i`'s master weights (f32 bytes) and each optimizer state's bytes, read from the
    /// store (a save).
    pub(super) fn block_state(&mut self, i: usize) -> Result<(Vec<u8>, Vec<Vec<u8>>), TrainError> {
        Ok(self.optimizer.read(i, |r| {
            let r = r.expect("saves run on a backed device");
            let master = r.parts[0].to_vec();
            let states = r.parts[1..].iter().map(|p| p.to_vec()).collect();
            (master, states)
        })?)
    }

    /// Replaces block `i`'s master weights and optimizer states (a resume). `None` for a state
    /// leaves it zero.
    pub(super) fn load_block_state(
        &mut self,
        i: usize,
        master: &[u8],
        states: &[Option<Vec<u8>>],
    ) -> Result<(), TrainError> {
        Ok(self.optimizer.write(i, |r| {
            let r = r.expect("resume runs on a backed device");
            let mut parts = r.parts.into_iter();
            parts.next().expect("a master part").copy_from_slice(master);
            for (part, s) in parts.zip(states) {
                match s {
                    Some(s) => part.copy_from_slice(s),
                    None => part.fill(0),
                }
            }
        })?)
    }

    /// Block `i`'s parameter shard bytes (`--offload-params`).
    pub(super) fn param_shard(&mut self, i: usize) -> Result<Option<Vec<u8>>, TrainError> {
        match &mut self.params {
            None => Ok(None),
            Some(s) => {
                Ok(Some(s.read(i, |r| {
                    r.map(|r| r.parts[0].to_vec()).unwrap_or_default()
                })?))
            }
        }
    }

    /// Replaces block `i`'s parameter shard bytes (`--offload-params`, a resume).
    pub(super) fn load_param_shard(&mut self, i: usize, bytes: &[u8]) -> Result<(), TrainError> {
        if let Some(s) = &mut self.params {
            s.write(i, |r| {
                if let Some(r) = r {
                    r.parts
                        .into_iter()
                        .next()
                        .expect("one part")
                        .copy_from_slice(bytes);
                }
            })?;
        }
        Ok(())
    }
}
