//! The optimizer step in backward (`--optimizer-in-backward`; torchtune's `optimizer_in_bwd`,
//! built on PyTorch's post-accumulate-grad hooks; LOMO, Lv et al. 2023): with one process and no
//! accumulation, a block's gradient takes bytes when backward enters the block, and once the
//! block's gradient is complete (`block_uses`) the block is updated with the step's learning rate
//! and its gradient's bytes go back. Between steps no gradient holds bytes; during backward only
//! the blocks whose backward is running do, plus a tied embedding, which the output layer reads
//! first and the input layer last.
//!
//! Numbers: each block's update is the ordinary step's (`update::update_block`) on the same
//! gradient, so the weights are bitwise those of the ordinary step (without clipping, which
//! needs every gradient first).
//!
//! Not for: the ordinary step (`step`, `update`).

use super::block_uses::{BlockUses, hook_error};
use super::update::{UpdateParts, update_block};
use super::{TrainError, Trainer};
use headroom_memory::Device;
use headroom_nn::optim::Optimizer;
use headroom_strategy::ZeroStage;
use headroom_tensor::{BlockHooks, ParamBlock, Tensor, TensorError, with_block_hooks};
use std::cell::RefCell;
use std::rc::Rc;

/// What the hooks update blocks with, moved out of the trainer for one pass.
struct StepParts {
    optimizer: Optimizer,
    master: Option<Vec<Tensor>>,
    /// Gradient multiplier and learning rate of the step.
    scale: (f32, f32),
    dry: bool,
    device: Device,
}

/// The hooks of one forward and backward pass whose step runs in backward.
struct FusedStepHooks {
    blocks: Vec<ParamBlock>,
    uses: BlockUses,
    parts: RefCell<StepParts>,
    /// The training error behind a hook's failure, returned instead of the tensor error.
    error: RefCell<Option<TrainError>>,
}

impl FusedStepHooks {
    /// Block `i` is complete: updated, and its gradient's bytes given back.
    fn finish_block(&self, i: usize) -> Result<(), TrainError> {
        let block = &self.blocks[i];
        if !block.flat_grad().is_resident() {
            return Ok(());
        }
        let mut p = self.parts.borrow_mut();
        let StepParts {
            optimizer,
            master,
            scale,
            dry,
            device,
        } = &mut *p;
        let mut parts = UpdateParts {
            optimizer,
            master: master.as_deref(),
            comm: None,
            stage: ZeroStage::default(),
            world: 1,
            dry: *dry,
            device,
        };
        let numel = block.numel();
        update_block(&mut parts, i, block, (0..numel, numel), *scale)?;
        block.release_full_grads();
        Ok(())
    }

    /// Ends the pass: every block not finished yet is.
    fn finish(&self) -> Result<(), TrainError> {
        self.uses
            .end_pass(self.blocks.len(), |b| self.finish_block(b))
    }

    fn run(&self, f: impl FnOnce() -> Result<(), TrainError>) -> Result<(), TensorError> {
        f().map_err(|e| hook_error(e, &self.error))
    }
}

impl BlockHooks for FusedStepHooks {
    fn before_forward(&self, _blocks: &[usize]) -> Result<(), TensorError> {
        Ok(())
    }

    fn after_forward(&self, blocks: &[usize], marked: bool) -> Result<(), TensorError> {
        self.uses.forward_ended(blocks, marked);
        Ok(())
    }

    fn before_backward(&self, blocks: &[usize]) -> Result<(), TensorError> {
        self.run(|| {
            for b in self.uses.backward_begins(blocks) {
                self.finish_block(b)?;
            }
            for &b in blocks {
                self.blocks[b].materialize_grads()?;
            }
            Ok(())
        })
    }
}

impl Trainer {
    /// Runs `f` (one micro-batch's forward and backward) with each block's update in its
    /// backward at gradient multiplier `multiplier` and learning rate `lr`; every block is
    /// updated once when it returns.
    pub(super) fn with_step_in_backward<R>(
        &mut self,
        (multiplier, lr): (f32, f32),
        f: impl FnOnce(&mut Self) -> Result<R, TrainError>,
    ) -> Result<R, TrainError> {
        let lens: Vec<usize> = self.model.blocks().iter().map(|b| b.numel()).collect();
        self.optimizer.reserve_state(&lens)?;
        self.optimizer.begin_step();
        // Blocks are updated from the first backward step on: an out-of-memory error after
        // that is not recoverable.
        self.weights_touched = true;
        let empty = Optimizer::new(*self.optimizer.config(), self.device.clone());
        let hooks = Rc::new(FusedStepHooks {
            blocks: self.model.blocks().to_vec(),
            uses: BlockUses::new(self.model.blocks().len()),
            parts: RefCell::new(StepParts {
                optimizer: std::mem::replace(&mut self.optimizer, empty),
                master: self.master.take(),
                scale: (multiplier, lr),
                dry: self.dry,
                device: self.device.clone(),
            }),
            error: RefCell::new(None),
        });
        let result = with_block_hooks(hooks.clone(), || f(self));
        let finished = result.as_ref().ok().map(|_| hooks.finish());
        let hooks = Rc::try_unwrap(hooks)
            .ok()
            .expect("the hooks are uninstalled when the pass returns");
        let parts = hooks.parts.into_inner();
        self.optimizer = parts.optimizer;
        self.master = parts.master;
        if let Some(e) = hooks.error.into_inner() {
            return Err(e);
        }
        let value = result?;
        finished.transpose()?;
        Ok(value)
    }
}
