//! Optimizers over flat parameter buffers (parameters live in flat per-block buffers, as FSDP's
//! flat parameters do, so updates are fused loops over contiguous ranges; docs/sources.md §12).
//! Each optimizer keeps its state on the device, tagged `optimizer_state`, allocated on the
//! first step, in f32 or bf16.
//!
//! Under mixed precision the buffers given to `step` are the fp32 master weights; the trainer
//! casts them back to the 16-bit compute parameters afterwards.
//!
//! Not for: the gradient checks that decide the multiplier (see `grad`).

mod adafactor;
mod adamw;
mod adamw8bit;
mod apply;
mod checkpoint;
mod config;
mod external;
mod lamb;
mod paged;
pub mod quant8;
mod sgd;
mod square_sum;
mod state;

pub use adafactor::{AdafactorStep, TensorShape, adafactor_update};
pub use adamw::{AdamStep, adamw_update};
pub use adamw8bit::adamw8bit_update;
pub use config::{OptimizerConfig, UpdateRule};
pub use lamb::{TensorSums, lamb_apply, lamb_sums, lamb_update};
pub use sgd::{SgdStep, sgd_update};
pub use square_sum::SquareSum;
pub use state::{StateBuffer, StateDtype, StateElem, StateElement};

use apply::{apply, sums_of};

use crate::grad::Grads;
use headroom_memory::{Category, Device, DeviceBuffer, OutOfMemory};
use std::ops::Range;

/// One flat buffer to update: fp32 (master) weights, their gradients, and the ranges of the
/// individual weights inside it (LAMB's trust ratio is per weight).
#[derive(Debug)]
pub struct FlatParams<'a> {
    pub params: &'a mut [f32],
    pub grads: Grads<'a>,
    pub tensors: &'a [Range<usize>],
}

/// An optimizer with its device-resident state.
#[derive(Debug)]
pub struct Optimizer {
    config: OptimizerConfig,
    device: Device,
    step: u64,
    /// Per flat buffer, the state buffers (`states_per_param` of them).
    state: Vec<Vec<DeviceBuffer>>,
    /// Per flat buffer, the shape of each tensor in it (Adafactor factors each matrix).
    shapes: Vec<Vec<TensorShape>>,
    /// Paged states: the host copies (buffers of `state` are then device-resident only while
    /// their flat buffer is updated).
    host: paged::HostPages,
}

impl Optimizer {
    pub fn new(config: OptimizerConfig, device: Device) -> Self {
        Optimizer {
            config,
            device,
            step: 0,
            state: Vec::new(),
            shapes: Vec::new(),
            host: paged::HostPages::default(),
        }
    }

    /// The tensors of every flat buffer, in order (a block's weights); Adafactor's state
    /// depends on them. A buffer without shapes is one vector.
    pub fn set_tensor_shapes(&mut self, shapes: Vec<Vec<TensorShape>>) {
        self.shapes = shapes;
    }

    /// The tensors of flat buffer `index` of `len` parameters.
    fn shapes_of(&self, index: usize, len: usize) -> Vec<TensorShape> {
        match self.shapes.get(index) {
            Some(s) if s.iter().map(|t| t.numel()).sum::<usize>() == len => s.clone(),
            _ => vec![TensorShape::Vector(len)],
        }
    }

    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Bytes of full-size state per parameter (8-bit states: their codes, without the
    /// per-block absmax).
    pub fn state_bytes_per_param(&self) -> u64 {
        self.config.kind.states_per_param(self.config.momentum) as u64
            * self.config.state_dtype.size_bytes()
    }

    /// Allocates zeroed state for buffer `index` of `len` parameters if it has none yet.
    fn ensure_state(&mut self, index: usize, len: usize) -> Result<(), OutOfMemory> {
        while self.state.len() <= index {
            self.state.push(Vec::new());
        }
        let layout = self.state_layout(index, len);
        if self.state[index].len() == layout.len() {
            return Ok(());
        }
        if self.config.paged && self.host.has(index) {
            self.state[index] = self.host.page_in(&self.device, index, &layout)?;
            return Ok(());
        }
        for part in layout {
            let label = format!("group{index}.{}", part.name);
            let mut buffer =
                self.device
                    .alloc(part.bytes as u64, Category::OptimizerState, Some(&label))?;
            // Zero bytes are zero values in every format (an 8-bit block with absmax 0).
            if let Some(b) = buffer.as_bytes_mut() {
                b.fill(0);
            }
            self.state[index].push(buffer);
        }
        Ok(())
    }

    /// One optimizer step over every flat buffer. `grad_multiplier` scales gradients first
    /// (inverse loss scale × clip coefficient); `lr` is this step's learning rate.
    pub fn step(
        &mut self,
        groups: &mut [FlatParams<'_>],
        grad_multiplier: f32,
        lr: f32,
    ) -> Result<(), OutOfMemory> {
        self.begin_step();
        for (i, group) in groups.iter_mut().enumerate() {
            self.update_group(i, group, grad_multiplier, lr)?;
        }
        Ok(())
    }

    /// Allocates the state of every flat buffer (lengths `lens`) that has none yet, so that an
    /// out-of-memory error comes before any weight changes.
    pub fn reserve_state(&mut self, lens: &[usize]) -> Result<(), OutOfMemory> {
        for (i, &len) in lens.iter().enumerate() {
            self.ensure_state(i, len)?;
            // Paged: one buffer's state on the device at a time, the rest on the host.
            self.page_out(i);
        }
        Ok(())
    }

    /// Paged states: copies buffer `index`'s state to the host and gives its device bytes back.
    fn page_out(&mut self, index: usize) {
        if self.config.paged
            && let Some(buffers) = self.state.get_mut(index)
            && !buffers.is_empty()
        {
            self.host.page_out(index, buffers);
            buffers.clear();
        }
    }

    /// Starts an optimizer step (advances the bias-correction counter); follow with one
    /// `update_group` per flat buffer.
    pub fn begin_step(&mut self) {
        self.step += 1;
    }

    /// Updates flat buffer `index` within the current step, allocating its state on first use.
    pub fn update_group(
        &mut self,
        index: usize,
        group: &mut FlatParams<'_>,
        grad_multiplier: f32,
        lr: f32,
    ) -> Result<(), OutOfMemory> {
        self.update_group_with(index, group, grad_multiplier, lr, None)
    }

    /// Whether the update rule needs sums over whole tensors ([`Optimizer::tensor_sums`]): LAMB's
    /// trust ratio does.
    pub fn needs_tensor_sums(&self) -> bool {
        self.config.kind == UpdateRule::Lamb
    }

    /// LAMB: the sums of each of `group`'s tensors (or the pieces of them it holds) that this
    /// step's update of buffer `index` would compute; nothing changes but the state's
    /// allocation on first use. Empty for the other rules.
    pub fn tensor_sums(
        &mut self,
        index: usize,
        group: &FlatParams<'_>,
        grad_multiplier: f32,
        lr: f32,
    ) -> Result<Vec<TensorSums>, OutOfMemory> {
        if !self.needs_tensor_sums() {
            return Ok(Vec::new());
        }
        self.ensure_state(index, group.params.len())?;
        let state: Vec<&[u8]> = self.state[index]
            .iter()
            .map(|b| {
                b.as_bytes()
                    .expect("optimizer state lives on a backed device")
            })
            .collect();
        Ok(sums_of(
            &self.config,
            self.step,
            &state,
            group,
            grad_multiplier,
            lr,
        ))
    }

    /// [`Optimizer::update_group`] with the sums of `group`'s whole tensors given (one per
    /// tensor: a ZeRO shard's pieces completed over ranks); LAMB computes them itself without.
    pub fn update_group_with(
        &mut self,
        index: usize,
        group: &mut FlatParams<'_>,
        grad_multiplier: f32,
        lr: f32,
        sums: Option<&[TensorSums]>,
    ) -> Result<(), OutOfMemory> {
        self.ensure_state(index, group.params.len())?;
        let shapes = self.shapes_of(index, group.params.len());
        let mut state: Vec<&mut [u8]> = self.state[index]
            .iter_mut()
            .map(|b| {
                b.as_bytes_mut()
                    .expect("optimizer state lives on a backed device")
            })
            .collect();
        apply(
            &self.config,
            (self.step, &shapes),
            &mut state,
            group,
            grad_multiplier,
            lr,
            sums,
        );
        self.page_out(index);
        Ok(())
    }

    /// The state buffers of flat buffer `index` of `len` parameters, in the order the update
    /// takes them (what a tier outside the device must hold for [`Optimizer::update_external`]):
    /// one per state tensor, for 8-bit states both moments' codes then both absmax arrays, for
    /// Adafactor one f32 buffer of every tensor's factored state.
    pub fn state_layout(&self, index: usize, len: usize) -> Vec<StateBuffer> {
        if self.config.kind == UpdateRule::Adafactor {
            let values: usize = self
                .shapes_of(index, len)
                .iter()
                .map(|t| t.state_len())
                .sum();
            return vec![StateBuffer {
                name: self.config.kind.state_names()[0].to_string(),
                bytes: 4 * values,
                element: StateElement::F32,
            }];
        }
        let count = self.config.kind.states_per_param(self.config.momentum);
        let names = &self.config.kind.state_names()[..count];
        let full = |element, size: usize| -> Vec<StateBuffer> {
            names
                .iter()
                .map(|&n| StateBuffer {
                    name: n.to_string(),
                    bytes: len * size,
                    element,
                })
                .collect()
        };
        match self.config.state_dtype {
            StateDtype::F32 => full(StateElement::F32, 4),
            StateDtype::Bf16 => full(StateElement::Bf16, 2),
            StateDtype::Int8 => {
                let mut parts = full(StateElement::U8, 1);
                for p in &mut parts {
                    p.name.push_str(".codes");
                }
                parts.extend(names.iter().map(|&n| StateBuffer {
                    name: format!("{n}.absmax"),
                    bytes: 4 * quant8::blocks(len),
                    element: StateElement::F32,
                }));
                parts
            }
        }
    }
}

#[cfg(test)]
mod tests;
