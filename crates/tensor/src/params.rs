//! Parameters in flat per-block buffers (as FSDP's flat parameters): one `parameter`
//! allocation per block holding every weight back to back, with a tracked view per weight, and a
//! matching flat `gradient` buffer whose views receive the gradients in place. Sharding,
//! offload and fused optimizer updates can then work on one contiguous range per block.
//!
//! Not for: initialisation schemes or optimizers (the nn crate).

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::grads::Gradients;
use crate::shape::{Layout, numel};
use crate::tensor::Tensor;
use headroom_memory::{Category, Device};

/// One weight of a block: its name and shape, and where it sits in the flat buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// Element offset in the flat buffers.
    pub offset: usize,
}

#[derive(Debug)]
pub struct ParamBlock {
    name: String,
    specs: Vec<ParamSpec>,
    flat: Tensor,      // (P,) parameter
    flat_grad: Tensor, // (P,) gradient
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
}

impl ParamBlock {
    /// Allocates a block's zeroed flat parameter and gradient buffers for `weights`
    /// (`(name, shape)` pairs, laid out in order).
    pub fn new(
        device: &Device,
        name: &str,
        weights: &[(&str, &[usize])],
        dtype: DType,
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
        let flat = Tensor::zeros(device, &[total], dtype, Category::Parameter, Some(name))?;
        let grad_name = format!("{name}.grad");
        let flat_grad = Tensor::zeros(
            device,
            &[total],
            dtype,
            Category::Gradient,
            Some(&grad_name),
        )?;
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
        })
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

    /// Binds every weight's gradient to its view of `flat`, a buffer shaped like the flat
    /// gradient (a micro-batch's own gradient, added to the accumulated one afterwards).
    pub fn bind_grads_to(&self, flat: &Tensor, grads: &mut Gradients) -> Result<()> {
        if flat.shape() != self.flat_grad.shape() || flat.dtype() != self.flat_grad.dtype() {
            return Err(TensorError::ShapeMismatch {
                op: "ParamBlock::bind_grads_to",
                lhs: self.flat_grad.shape().to_vec(),
                rhs: flat.shape().to_vec(),
            });
        }
        for (p, g) in self.params.iter().zip(&self.grads) {
            grads.bind(p, flat.with_layout(g.layout().clone()))?;
        }
        Ok(())
    }

    pub fn zero_grad(&self) -> Result<()> {
        self.flat_grad.fill_(0.0)
    }
}
