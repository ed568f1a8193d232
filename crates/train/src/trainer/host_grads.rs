//! Host buffers of the offloaded update: the gradient shards of ZeRO-2/3 kept in host memory
//! once reduced (ZeRO-Offload's gradient path: each block's reduce-scatter lands in host memory
//! and the device keeps no gradient shard between backward passes; f32, as DeepSpeed keeps
//! them, the micro-batches' sums rounded to the compute dtype once before the step), and the
//! two f32 staging
//! buffers a ZeRO-0/1 update copies each block's gradient into. On a dry run each is a
//! reservation of the same bytes in the host pool.
//!
//! Not for: the stores of states and parameters (`headroom_offload`) or when gradients move
//! (`offload`, `zero`).

use super::TrainError;
use headroom_memory::host_pool::{HostPool, HostReservation};
use headroom_nn::grad::Grads;
use headroom_offload::{AlignedBytes, OffloadError, page_rounded};
use headroom_tensor::DType;

/// A host buffer of whole pages, or on a dry run its reservation.
#[derive(Debug)]
pub(super) enum HostBytes {
    Real(AlignedBytes),
    Counted(HostReservation),
}

impl HostBytes {
    /// `bytes` rounded up to whole pages from `pool`, zeroed.
    pub(super) fn new(pool: &HostPool, bytes: usize, dry: bool) -> Result<HostBytes, TrainError> {
        Ok(match dry {
            true => HostBytes::Counted(
                pool.reserve(page_rounded(bytes) as u64)
                    .map_err(OffloadError::from)?,
            ),
            false => HostBytes::Real(AlignedBytes::new(pool, bytes).map_err(OffloadError::from)?),
        })
    }

    /// Bytes held (whole pages).
    pub(super) fn len(&self) -> u64 {
        match self {
            HostBytes::Real(b) => b.len() as u64,
            HostBytes::Counted(r) => r.bytes(),
        }
    }

    pub(super) fn bytes(&self) -> Option<&[u8]> {
        match self {
            HostBytes::Real(b) => Some(b.as_bytes()),
            HostBytes::Counted(_) => None,
        }
    }

    pub(super) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            HostBytes::Real(b) => Some(b.as_bytes_mut()),
            HostBytes::Counted(_) => None,
        }
    }
}

/// Each block's reduced gradient shard (`padded` f32 elements) in host memory.
#[derive(Debug)]
pub(super) struct HostGrads {
    /// The dtype of the device's gradients, to which the sums are rounded before the step.
    pub compute: DType,
    /// Elements per shard, padded as the device shard is.
    pub padded: Vec<usize>,
    pub buffers: Vec<HostBytes>,
}

impl HostGrads {
    pub(super) fn new(
        pool: &HostPool,
        padded: Vec<usize>,
        compute: DType,
        dry: bool,
    ) -> Result<HostGrads, TrainError> {
        let buffers = padded
            .iter()
            .map(|&n| HostBytes::new(pool, 4 * n, dry))
            .collect::<Result<_, _>>()?;
        Ok(HostGrads {
            compute,
            padded,
            buffers,
        })
    }

    /// Block `i`'s shard for adding a reduced sum (`None` on a dry run).
    pub(super) fn shard_mut(&mut self, i: usize) -> Option<&mut [f32]> {
        let len = self.padded[i];
        let b = self.buffers[i].bytes_mut()?;
        Some(&mut bytemuck::cast_slice_mut(b)[..len])
    }

    /// The first `len` elements of block `i`'s shard as gradients (`None` on a dry run).
    pub(super) fn grads(&self, i: usize, len: usize) -> Option<Grads<'_>> {
        let b = self.buffers[i].bytes()?;
        Some(Grads::F32(&bytemuck::cast_slice(b)[..len]))
    }

    /// Every sum rounded to the compute dtype (round to nearest even) and kept as f32: the
    /// values a device shard of that dtype holds after the same additions.
    pub(super) fn round_to_compute(&mut self) {
        let compute = self.compute;
        for i in 0..self.buffers.len() {
            let Some(shard) = self.shard_mut(i) else {
                return;
            };
            match compute {
                DType::BF16 => shard
                    .iter_mut()
                    .for_each(|v| *v = half::bf16::from_f32(*v).to_f32()),
                DType::F16 => shard
                    .iter_mut()
                    .for_each(|v| *v = half::f16::from_f32(*v).to_f32()),
                _ => return,
            }
        }
    }

    /// Every shard back to zero (after the optimizer step).
    pub(super) fn zero(&mut self) {
        for b in &mut self.buffers {
            if let Some(b) = b.bytes_mut() {
                b.fill(0);
            }
        }
    }

    /// Host bytes held.
    pub(super) fn total(&self) -> u64 {
        self.buffers.iter().map(HostBytes::len).sum()
    }
}
