//! Parameters in flat per-block buffers (as FSDP's flat parameters): one `parameter`
//! allocation per block holding every weight back to back, with a tracked view per weight, and a
//! matching flat `gradient` buffer whose views receive the gradients in place. Sharding,
//! offload and fused optimizer updates can then work on one contiguous range per block.
//!
//! A block built under a sharded layout (`shard::with_sharding`) holds its rank's shard of the
//! gradient (ZeRO-2, 3) and of the parameters (ZeRO-3) as buffers of their own, and its full
//! flat buffers start released: they take bytes only while the block computes.
//!
//! A frozen block ([`ParamBlock::frozen`], LoRA's base weights) holds parameters only: its views
//! are not tracked, so backward computes no gradient for them and saves nothing on their behalf,
//! and its gradient buffer never takes bytes. It is whole on every rank.
//!
//! Not for: initialisation schemes or optimizers (the nn crate).

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::grads::Gradients;
use crate::shape::{Layout, numel};
use crate::shard::{ShardLayout, current_layout, gradients_released, shard_range};
use crate::tensor::Tensor;
use headroom_memory::{Category, Device};
use std::ops::Range;

/// A rank's part of a sharded block.
#[derive(Clone, Debug)]
pub struct BlockShard {
    pub layout: ShardLayout,
    /// This rank's elements of the flat buffers.
    pub range: Range<usize>,
    /// Every rank's shard length (the last rank's is padded).
    pub padded: usize,
    /// `(padded,)` this rank's parameters (ZeRO-3); pads stay zero.
    pub params: Option<Tensor>,
    /// `(padded,)` this rank's gradient summed over ranks (ZeRO-2 and 3); pads stay zero.
    pub grads: Option<Tensor>,
}

/// One weight of a block: its name and shape, and where it sits in the flat buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// Element offset in the flat buffers.
    pub offset: usize,
}

/// A block of weights in flat buffers. Cloning shares the buffers (a handle for hooks).
#[derive(Clone, Debug)]
pub struct ParamBlock {
    name: String,
    specs: Vec<ParamSpec>,
    flat: Tensor,      // (P,) parameter
    flat_grad: Tensor, // (P,) gradient
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
    shard: Option<BlockShard>,
    frozen: bool,
}

impl ParamBlock {
    /// Allocates a frozen block's zeroed flat parameter buffer for `weights`: no gradient, not
    /// tracked, not sharded (the base weights of a LoRA fine-tune).
    pub fn frozen(
        device: &Device,
        name: &str,
        weights: &[(&str, &[usize])],
        dtype: DType,
    ) -> Result<ParamBlock> {
        let mut block = crate::shard::without_sharding(|| {
            ParamBlock::with_gradients(device, name, weights, dtype, false)
        })?;
        block.params = block.params.iter().map(Tensor::detach).collect();
        block.frozen = true;
        Ok(block)
    }

    /// Whether the block is frozen (no gradient, no optimizer state).
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Allocates a block's zeroed flat parameter and gradient buffers for `weights`
    /// (`(name, shape)` pairs, laid out in order).
    pub fn new(
        device: &Device,
        name: &str,
        weights: &[(&str, &[usize])],
        dtype: DType,
    ) -> Result<ParamBlock> {
        ParamBlock::with_gradients(device, name, weights, dtype, true)
    }

    fn with_gradients(
        device: &Device,
        name: &str,
        weights: &[(&str, &[usize])],
        dtype: DType,
        gradients: bool,
    ) -> Result<ParamBlock> {
        if !dtype.is_float() {
            return Err(TensorError::UnsupportedDType {
                op: "ParamBlock",
                dtype,
            });
        }
        let mut specs = Vec::with_capacity(weights.len());
        let mut total = 0;
        for (w, shape) in weights {
            specs.push(ParamSpec {
                name: w.to_string(),
                shape: shape.to_vec(),
                offset: total,
            });
            total += numel(shape);
        }
        let layout = current_layout();
        let shard_params = layout.is_some_and(|l| l.parameters);
        let shard_grads = layout.is_some_and(|l| l.gradients || l.parameters);
        let flat = match shard_params {
            true => Tensor::released(device, &[total], dtype, Category::Parameter),
            false => Tensor::zeros(device, &[total], dtype, Category::Parameter, Some(name))?,
        };
        let grad_name = format!("{name}.grad");
        let flat_grad = match shard_grads || gradients_released() || !gradients {
            true => Tensor::released(device, &[total], dtype, Category::Gradient),
            false => Tensor::zeros(
                device,
                &[total],
                dtype,
                Category::Gradient,
                Some(&grad_name),
            )?,
        };
        let shard = match layout {
            None => None,
            Some(layout) => {
                let (range, padded) = shard_range(total, layout.rank, layout.world);
                let zeros = |category, label: String| {
                    Tensor::zeros(device, &[padded], dtype, category, Some(&label))
                };
                Some(BlockShard {
                    layout,
                    range,
                    padded,
                    params: shard_params
                        .then(|| zeros(Category::Parameter, format!("{name}.shard")))
                        .transpose()?,
                    grads: shard_grads
                        .then(|| zeros(Category::Gradient, format!("{name}.grad.shard")))
                        .transpose()?,
                })
            }
        };
        let view = |t: &Tensor, s: &ParamSpec| {
            t.with_layout(Layout::new(
                s.shape.clone(),
                crate::shape::contiguous_strides(&s.shape),
                s.offset,
            ))
        };
        let params = specs.iter().map(|s| view(&flat, s).track()).collect();
        let grads = specs.iter().map(|s| view(&flat_grad, s)).collect();
        Ok(ParamBlock {
            name: name.to_string(),
            specs,
            flat,
            flat_grad,
            params,
            grads,
            shard,
            frozen: false,
        })
    }

    /// This rank's part of the block when it is sharded.
    pub fn shard(&self) -> Option<&BlockShard> {
        self.shard.as_ref()
    }

    /// Sets the block's values (every weight back to back, `numel` of them): into the full
    /// buffer when it holds bytes, and into this rank's parameter shard when there is one.
    pub fn set_values(&self, values: &[f32]) -> Result<()> {
        if values.len() != self.numel() {
            return Err(TensorError::ShapeMismatch {
                op: "ParamBlock::set_values",
                lhs: vec![self.numel()],
                rhs: vec![values.len()],
            });
        }
        if self.flat.is_resident() {
            self.flat.copy_from_f32(values)?;
        }
        if let Some(BlockShard {
            range,
            padded,
            params: Some(p),
            ..
        }) = &self.shard
        {
            let mut part = values[range.clone()].to_vec();
            part.resize(*padded, 0.0);
            p.copy_from_f32(&part)?;
        }
        Ok(())
    }

    /// Gives the bytes of the full parameters back when they are sharded (ZeRO-3); their values
    /// live on in the rank shards.
    pub fn release_params(&self) {
        if self.shard.as_ref().is_some_and(|s| s.params.is_some()) {
            self.flat.release_storage();
        }
    }

    /// Takes bytes for the full parameters again (uninitialised: the caller gathers them);
    /// returns whether they had been released.
    pub fn materialize_params(&self) -> Result<bool> {
        let released = !self.flat.is_resident();
        self.flat.materialize_storage(Some(&self.name))?;
        Ok(released)
    }

    /// Gives the bytes of the full gradient back when it is sharded (ZeRO-2, 3).
    pub fn release_grads(&self) {
        if self.shard.as_ref().is_some_and(|s| s.grads.is_some()) {
            self.flat_grad.release_storage();
        }
    }

    /// Gives the bytes of the full gradient back whatever the sharding (the optimizer step in
    /// backward releases each block's gradient once it is applied).
    pub fn release_full_grads(&self) {
        self.flat_grad.release_storage();
    }

    /// Takes bytes for the full gradient again, zeroed, if they had been released; returns
    /// whether they had.
    pub fn materialize_grads(&self) -> Result<bool> {
        if self.flat_grad.is_resident() {
            return Ok(false);
        }
        let name = format!("{}.grad", self.name);
        self.flat_grad.materialize_storage(Some(&name))?;
        self.flat_grad.fill_(0.0)?;
        Ok(true)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// Elements in the block.
    pub fn numel(&self) -> usize {
        self.flat.numel()
    }

    /// The flat `(P,)` parameter buffer (untracked).
    pub fn flat(&self) -> &Tensor {
        &self.flat
    }

    /// The flat `(P,)` gradient buffer.
    pub fn flat_grad(&self) -> &Tensor {
        &self.flat_grad
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.specs
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| {
                TensorError::invalid(
                    "ParamBlock",
                    format!("block '{}' has no weight '{name}'", self.name),
                )
            })
    }

    /// The tracked view of weight `name`.
    pub fn param(&self, name: &str) -> Result<&Tensor> {
        Ok(&self.params[self.index(name)?])
    }

    /// The gradient view of weight `name`.
    pub fn grad(&self, name: &str) -> Result<&Tensor> {
        Ok(&self.grads[self.index(name)?])
    }

    /// Element ranges of the weights inside the flat buffers, in order.
    pub fn ranges(&self) -> Vec<std::ops::Range<usize>> {
        self.specs
            .iter()
            .map(|s| s.offset..s.offset + numel(&s.shape))
            .collect()
    }

    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Binds every weight's gradient to its view of the flat gradient buffer.
    pub fn bind_grads(&self, grads: &mut Gradients) -> Result<()> {
        for (p, g) in self.params.iter().zip(&self.grads) {
            grads.bind(p, g.clone())?;
        }
        Ok(())
    }

    /// Zeroes the gradient: the full buffer when it holds bytes, and this rank's shard.
    pub fn zero_grad(&self) -> Result<()> {
        if self.flat_grad.is_resident() {
            self.flat_grad.fill_(0.0)?;
        }
        // A shard whose sum lives elsewhere (offloaded to the host) holds no bytes.
        if let Some(g) = self.shard.as_ref().and_then(|s| s.grads.as_ref())
            && g.is_resident()
        {
            g.fill_(0.0)?;
        }
        Ok(())
    }
}
