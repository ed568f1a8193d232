//! A linear layer `x·W + b` (W stored in × out, the bias optional) over a plain weight or a
//! frozen NF4 one (QLoRA's base, Dettmers et al. 2023), with an optional LoRA adapter on top.
//! Its slots are `{name}.w` and, with a bias, `{name}.b` (`{name}.weight` and `{name}.bias`
//! under Hugging Face's naming; the weight is stored in × out either way, the transpose of a
//! PyTorch `nn.Linear`'s).
//!
//! [`Linear::forward_gelu`] is the layer applied to GELU of its input with that GELU output
//! recomputed in backward rather than saved (`Tensor::gelu_linear`), where nothing else keeps it.
//!
//! Not for: the adapter's arithmetic (`lora_adapter.rs`) or the NF4 format (the tensor crate).

use super::lora_adapter::adapted;
use super::{LoraAdapter, Naming, Slot, Weights, join};
use headroom_tensor::{ChunkColumns, Nf4Weight, Result, Tensor, TensorError, TensorParallel};
use std::sync::Arc;

/// Where a linear layer's weight lives.
#[derive(Clone, Debug)]
pub enum LinearWeight {
    /// A (possibly trainable) view of the flat block, (in × out).
    Dense(Tensor),
    /// A frozen NF4 weight, dequantised for each product.
    Nf4(Arc<Nf4Weight>),
}

/// A bound linear layer.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: LinearWeight,
    pub bias: Option<Tensor>,
    pub adapter: Option<LoraAdapter>,
}

impl Linear {
    /// The slots of a layer named `name` from `input` to `output` features.
    pub fn slots(name: &str, input: usize, output: usize, bias: bool) -> Vec<Slot> {
        Linear::slots_as(Naming::Short, name, input, output, bias)
    }

    /// [`Linear::slots`] under `naming`.
    pub fn slots_as(
        naming: Naming,
        name: &str,
        input: usize,
        output: usize,
        bias: bool,
    ) -> Vec<Slot> {
        let mut slots = vec![Slot::new(join(name, naming.weight()), &[input, output])];
        if bias {
            slots.push(Slot::new(join(name, naming.bias()), &[output]));
        }
        slots
    }

    /// The layer `name` of `w` (its weight in NF4 where `w` stores it so), with `adapter`.
    pub fn load(
        w: &Weights,
        name: &str,
        bias: bool,
        adapter: Option<LoraAdapter>,
    ) -> Result<Linear> {
        Linear::load_as(Naming::Short, w, name, bias, adapter)
    }

    /// [`Linear::load`] under `naming`.
    pub fn load_as(
        naming: Naming,
        w: &Weights,
        name: &str,
        bias: bool,
        adapter: Option<LoraAdapter>,
    ) -> Result<Linear> {
        let w = w.pp(name);
        let weight = match w.nf4(naming.weight()) {
            Some(q) => LinearWeight::Nf4(q),
            None => LinearWeight::Dense(w.get(naming.weight())?),
        };
        Ok(Linear {
            weight,
            bias: if bias {
                Some(w.get(naming.bias())?)
            } else {
                None
            },
            adapter,
        })
    }

    /// `x·W + b`, without the adapter.
    fn base(&self, x: &Tensor) -> Result<Tensor> {
        match (&self.weight, &self.bias) {
            (LinearWeight::Dense(w), Some(b)) => x.linear(w, b),
            (LinearWeight::Dense(w), None) => x.matmul(w),
            (LinearWeight::Nf4(q), Some(b)) => x.linear_nf4(q, b),
            (LinearWeight::Nf4(q), None) => x.matmul_nf4(q),
        }
    }

    /// `x·W + b`, plus the adapter's update.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        adapted(self.adapter.as_ref(), x, self.base(x)?)
    }

    /// The plain weight a tensor-parallel product splits; adapters and NF4 weights are not split.
    fn dense_for_parallel(&self) -> Result<&Tensor> {
        match (&self.weight, &self.adapter) {
            (LinearWeight::Dense(w), None) => Ok(w),
            _ => Err(TensorError::invalid(
                "tensor parallelism",
                "only plain trainable weights are split over ranks; LoRA adapters and NF4 weights are not: train them without --tensor-parallel",
            )),
        }
    }

    /// Input features of a plain weight (its rows).
    pub(crate) fn dense_rows(&self) -> Result<usize> {
        Ok(self.dense_for_parallel()?.shape()[0])
    }

    /// `x·W + b` with this rank's columns of W and b (`Tensor::column_parallel_linear`).
    pub fn forward_column_parallel(
        &self,
        x: &Tensor,
        tp: &TensorParallel,
        chunks: &[ChunkColumns],
    ) -> Result<Tensor> {
        x.column_parallel_linear(self.dense_for_parallel()?, self.bias.as_ref(), tp, chunks)
    }

    /// `x·W + b` with this rank's rows of W, `x` this rank's input features, the bias whole
    /// (`Tensor::row_parallel_linear`).
    pub fn forward_row_parallel(&self, x: &Tensor, tp: &TensorParallel) -> Result<Tensor> {
        x.row_parallel_linear(self.dense_for_parallel()?, self.bias.as_ref(), tp)
    }

    /// `gelu(pre)·W + b`, plus the adapter's update. The GELU output is recomputed in backward,
    /// never saved, unless the adapter reads it; an NF4 product saves nothing, so its GELU
    /// output is not kept for it either.
    pub fn forward_gelu(&self, pre: &Tensor) -> Result<Tensor> {
        let adapter = self.adapter.as_ref();
        match (&self.weight, adapter) {
            (LinearWeight::Nf4(_), _) => {
                let g = pre.gelu()?;
                let y = self.base(&g)?;
                adapted(adapter, &g, y)
            }
            (LinearWeight::Dense(w), Some(a)) => {
                let y = gelu_product(pre, w, self.bias.as_ref())?;
                a.add_update(&pre.gelu()?, y)
            }
            (LinearWeight::Dense(w), None) => gelu_product(pre, w, self.bias.as_ref()),
        }
    }
}

fn gelu_product(pre: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    match b {
        Some(b) => pre.gelu_linear(w, b),
        None => pre.gelu_matmul(w),
    }
}
