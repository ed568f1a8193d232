//! ZeRO-2 and ZeRO-3 around a model's parameter scopes (Rajbhandari et al. 2020; the hooks
//! follow PyTorch FSDP's pre-/post-forward and pre-backward hooks): under ZeRO-3 a block's
//! parameters are gathered from every rank before its scope computes, in forward and again in
//! backward, and released after (in forward) or once its gradient is complete (in backward),
//! with `prefetch` blocks ahead gathered early; under ZeRO-2 and 3 a block's full gradient
//! takes bytes when backward enters the block and, once complete, is summed over ranks with a
//! reduce-scatter into the rank's gradient shard and released.
//!
//! A block's gradient is complete when backward has left every scope that reads it (counted by
//! `block_uses`); a tied embedding read at both ends of the model therefore keeps its full
//! gradient through backward. A checkpointed segment's recompute runs inside backward and keeps
//! its blocks gathered until their backward is done (one gather per block per backward, not
//! two).
//!
//! The collectives run on the compute thread, so prefetching moves gathers earlier (more blocks
//! resident, as the planner charges) without overlapping them with compute. With offloaded
//! parameters (`--offload-params`) a block's shard is read from its store for the gather, and
//! the store starts reading the block after the prefetched ones (on disk, behind compute).
//!
//! `Trainer::with_zero` installs the hooks around a pass.
//!
//! Not for: the optimizer step on shards (`step`) or the shards' arithmetic (`shard`).

use super::TrainError;
use super::accumulate::GradSums;
use super::block_uses::{BlockUses, hook_error};
use super::host_grads::HostGrads;
use super::offload::widen;
use super::shard::{gather_into, gather_params, reduce_scatter_into, reduce_scatter_into_host};
use headroom_comm::Communicator;
use headroom_offload::OffloadStore;
use headroom_tensor::{BlockHooks, ParamBlock, Tensor, TensorError, with_block_hooks};
use std::cell::RefCell;
use std::rc::Rc;

/// The hooks of one rank for one forward and backward pass.
pub(super) struct ZeroHooks {
    comm: RefCell<Box<dyn Communicator>>,
    blocks: Vec<ParamBlock>,
    /// Blocks gathered ahead of use (ZeRO-3).
    prefetch: usize,
    uses: BlockUses,
    /// The collective error behind a hook's failure, returned instead of the tensor error.
    error: RefCell<Option<TrainError>>,
    /// Offloaded parameter shards (ZeRO-3 with `--offload-params`).
    params: Option<RefCell<OffloadStore>>,
    /// Reduced gradient shards in host memory (ZeRO-2/3 with offloaded optimizer states).
    host_grads: Option<RefCell<HostGrads>>,
    /// The step's f32 sums of 16-bit gradient shards over micro-batches, where the reduced
    /// shards are added instead of into the gradient shards (`accumulate`).
    sums: Option<Vec<Tensor>>,
}

/// What the hooks borrow from the trainer's offload for one pass and give back.
#[derive(Default)]
pub(super) struct OffloadedParts {
    pub params: Option<OffloadStore>,
    pub host_grads: Option<HostGrads>,
}

impl ZeroHooks {
    /// Hooks over `blocks` (clones sharing the model's buffers) using `comm` until
    /// [`ZeroHooks::into_comm`].
    pub(super) fn new(
        comm: Box<dyn Communicator>,
        blocks: Vec<ParamBlock>,
        prefetch: usize,
        offloaded: OffloadedParts,
        sums: Option<Vec<Tensor>>,
    ) -> ZeroHooks {
        let n = blocks.len();
        ZeroHooks {
            comm: RefCell::new(comm),
            blocks,
            prefetch,
            uses: BlockUses::new(n),
            error: RefCell::new(None),
            params: offloaded.params.map(RefCell::new),
            host_grads: offloaded.host_grads.map(RefCell::new),
            sums,
        }
    }

    /// The communicator and the parameter store back, and the collective error behind a failed
    /// hook, if any.
    pub(super) fn into_parts(self) -> (Box<dyn Communicator>, OffloadedParts, Option<TrainError>) {
        let offloaded = OffloadedParts {
            params: self.params.map(RefCell::into_inner),
            host_grads: self.host_grads.map(RefCell::into_inner),
        };
        (self.comm.into_inner(), offloaded, self.error.into_inner())
    }

    /// Ends a pass: the running scope's backward ends, every block whose full gradient still
    /// holds bytes is reduced and released, every gathered block released.
    pub(super) fn finish(&self) -> Result<(), TrainError> {
        self.uses
            .end_pass(self.blocks.len(), |b| self.finish_block(b))
    }

    /// Runs a hook body, keeping a collective error for the trainer to report.
    fn run(&self, f: impl FnOnce() -> Result<(), TrainError>) -> Result<(), TensorError> {
        f().map_err(|e| hook_error(e, &self.error))
    }

    /// ZeRO-3: block `i`'s parameters gathered if released.
    fn gather(&self, i: usize) -> Result<(), TrainError> {
        let block = &self.blocks[i];
        let Some(shard) = block.shard().and_then(|s| s.params.as_ref()) else {
            return Ok(());
        };
        if !block.materialize_params()? {
            return Ok(());
        }
        match &self.params {
            Some(store) => {
                let dtype = shard.dtype();
                headroom_tensor::backend::work::host_transfer(
                    (shard.numel() * dtype.size_in_bytes()) as u64,
                );
                let values = store
                    .borrow_mut()
                    .read(i, |r| r.map(|r| widen(r.parts[0], dtype)))?;
                let mut comm = self.comm.borrow_mut();
                let values = values.as_deref().unwrap_or(&[]);
                gather_into(
                    comm.as_mut(),
                    block.flat(),
                    block.numel(),
                    values,
                    shard.numel(),
                )?;
            }
            None => gather_params(self.comm.borrow_mut().as_mut(), block.flat(), shard)?,
        }
        Ok(())
    }

    /// Gathers `blocks` and the `prefetch` blocks that come next in the direction of travel.
    fn gather_with_prefetch(&self, blocks: &[usize], forward: bool) -> Result<(), TrainError> {
        for &b in blocks {
            self.gather(b)?;
        }
        let n = self.blocks.len();
        let ahead: Vec<usize> = match forward {
            true => {
                let last = blocks.iter().copied().max().unwrap_or(0);
                (last + 1..n).take(self.prefetch).collect()
            }
            false => {
                let first = blocks.iter().copied().min().unwrap_or(0);
                (0..first).rev().take(self.prefetch).collect()
            }
        };
        for &b in &ahead {
            self.gather(b)?;
        }
        // The offloaded shard after those starts moving now.
        if let Some(store) = &self.params {
            let last = ahead.last().or(blocks.last()).copied().unwrap_or(0);
            let beyond = match forward {
                true => last + 1,
                false => last.wrapping_sub(1),
            };
            if beyond < n {
                store.borrow_mut().prefetch(beyond)?;
            }
        }
        Ok(())
    }

    /// Block `i`'s backward is complete: its gradient reduce-scattered into the rank's shard and
    /// released, its parameters released.
    fn finish_block(&self, i: usize) -> Result<(), TrainError> {
        let block = &self.blocks[i];
        if let Some(shard) = block.shard().and_then(|s| s.grads.as_ref())
            && block.flat_grad().is_resident()
        {
            let label = format!("{}.grad.bucket", block.name());
            let mut comm = self.comm.borrow_mut();
            match &self.host_grads {
                Some(host) => {
                    let mut host = host.borrow_mut();
                    let (grad, padded) = (block.flat_grad(), shard.numel());
                    let values = host.shard_mut(i);
                    reduce_scatter_into_host(comm.as_mut(), grad, padded, &label, values)?;
                }
                None => {
                    let target = self.sums.as_ref().map_or(shard, |s| &s[i]);
                    reduce_scatter_into(comm.as_mut(), block.flat_grad(), target, &label)?;
                }
            }
            block.release_grads();
        }
        block.release_params();
        Ok(())
    }
}

impl BlockHooks for ZeroHooks {
    fn before_forward(&self, blocks: &[usize]) -> Result<(), TensorError> {
        self.run(|| self.gather_with_prefetch(blocks, true))
    }

    fn after_forward(&self, blocks: &[usize], marked: bool) -> Result<(), TensorError> {
        // A recompute inside backward keeps its blocks for the backward that follows.
        if !self.uses.forward_ended(blocks, marked) {
            for &b in blocks {
                self.blocks[b].release_params();
            }
        }
        Ok(())
    }

    fn before_backward(&self, blocks: &[usize]) -> Result<(), TensorError> {
        self.run(|| {
            for b in self.uses.backward_begins(blocks) {
                self.finish_block(b)?;
            }
            self.gather_with_prefetch(blocks, false)?;
            for &b in blocks {
                self.blocks[b].materialize_grads()?;
            }
            Ok(())
        })
    }
}

impl super::Trainer {
    /// Runs `f` (a forward, with or without its backward) with the ZeRO-2/3 hooks around the
    /// model's parameter scopes when the stage needs them; afterwards every block's full
    /// gradient is reduced into its shard (or into its f32 sum of the step, `sums`) and every
    /// gathered block released. A collective's error takes precedence over the engine error it
    /// caused.
    pub(super) fn with_zero<R>(
        &mut self,
        sums: Option<&GradSums>,
        f: impl FnOnce(&mut Self) -> Result<R, TrainError>,
    ) -> Result<R, TrainError> {
        if !self.zero_stage().shards_gradients() {
            return f(self);
        }
        let comm = self.comm.take().expect("a sharded run has a communicator");
        let blocks = self.model.blocks().to_vec();
        let offloaded = match self.offload.as_mut() {
            Some(o) => OffloadedParts {
                params: o.params.take(),
                host_grads: o.host_grads.take(),
            },
            None => OffloadedParts::default(),
        };
        let hooks = Rc::new(ZeroHooks::new(
            comm,
            blocks,
            self.config.zero_prefetch,
            offloaded,
            sums.map(|s| s.sums().to_vec()),
        ));
        let result = with_block_hooks(hooks.clone(), || f(self));
        let finished = result.as_ref().ok().map(|_| hooks.finish());
        let hooks = Rc::try_unwrap(hooks)
            .ok()
            .expect("the hooks are uninstalled when the pass returns");
        let (comm, offloaded, error) = hooks.into_parts();
        self.comm = Some(comm);
        if let Some(o) = self.offload.as_mut() {
            o.params = o.params.take().or(offloaded.params);
            o.host_grads = o.host_grads.take().or(offloaded.host_grads);
        }
        if let Some(e) = error {
            return Err(e);
        }
        let value = result?;
        finished.transpose()?;
        Ok(value)
    }
}
