//! A GPT's base weights in the plain model's layout, whatever the run stores: the merged model
//! a LoRA save writes (adapters folded in, QLoRA's NF4 projections dequantised) and the loading
//! of another run's weights (`--init-from`; QLoRA re-quantises them).
//!
//! Not for: the adapters' arithmetic (`lora.rs`) or the NF4 format (the tensor crate).

use super::super::lora::merge_block;
use super::super::qlora::{self, QUANTIZED};
use super::Gpt;
use super::block::layer_slots;
use crate::model::NamedValues;
use crate::modules::slot_pairs;
use headroom_tensor::{Nf4Weight, Result, TensorError};

impl Gpt {
    /// The plain layout of every base block's weights, with layer i's adapters (the values
    /// of `adapters[i]`, laid out as the adapter block) folded in: what a merged export writes,
    /// under the plain model's block names. QLoRA's NF4 projections are dequantised first.
    pub fn merged_blocks(&self, adapters: &[Vec<f32>]) -> Result<NamedValues> {
        let Some(lora) = &self.config.lora else {
            return Err(TensorError::invalid(
                "merge",
                "the model has no LoRA adapters",
            ));
        };
        let slots = layer_slots(&self.config);
        let weights = slot_pairs(&slots);
        let specs = qlora::layout(&weights);
        let mut out = Vec::with_capacity(self.blocks.len());
        for (bi, block) in self.blocks.iter().enumerate() {
            let layer = bi.checked_sub(1).filter(|&l| l < self.config.layers);
            let mut values = match layer.and_then(|l| self.quantized.get(l)) {
                Some(q) => qlora::full_values(block, q, &weights)?,
                None => block.flat().to_vec_f32()?,
            };
            if let Some(l) = layer {
                let a = adapters.get(l).ok_or_else(|| {
                    TensorError::invalid("merge", format!("no adapter values for layer {l}"))
                })?;
                merge_block(&self.config, lora, &specs, &mut values, a)?;
            }
            out.push((block.name().to_string(), values));
        }
        Ok(out)
    }

    /// The plain model's block names and sizes (`Model::plain_blocks`): a QLoRA layer's
    /// in the full layout of twelve weights.
    pub(super) fn plain_layout(&self) -> Vec<(String, usize)> {
        let full: usize = layer_slots(&self.config).iter().map(|s| s.numel()).sum();
        self.blocks
            .iter()
            .map(|b| match b.name().starts_with("block.") {
                true => (b.name().to_string(), full),
                false => (b.name().to_string(), b.numel()),
            })
            .collect()
    }

    /// Sets plain block `name` from the plain layout's values (`Model::load_plain_block`).
    pub(super) fn load_plain(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let bi = self
            .blocks
            .iter()
            .position(|b| b.name() == name)
            .ok_or_else(|| TensorError::invalid("load", format!("no block {name}")))?;
        let Some(nf4) = bi.checked_sub(1).and_then(|l| self.quantized.get_mut(l)) else {
            return self.blocks[bi].set_values(values);
        };
        // QLoRA: the plain layout's projections re-quantised, the rest into the frozen block.
        let slots = layer_slots(&self.config);
        let weights = slot_pairs(&slots);
        let mut kept = Vec::new();
        for spec in qlora::layout(&weights) {
            let n: usize = spec.shape.iter().product();
            let part = &values[spec.offset..spec.offset + n];
            match QUANTIZED.iter().position(|q| *q == spec.name) {
                Some(i) => {
                    let bytes = headroom_tensor::nf4::quantize_nf4(part);
                    Nf4Weight::set_bytes(&mut nf4[i], &bytes)?;
                }
                None => kept.extend_from_slice(part),
            }
        }
        self.blocks[bi].set_values(&kept)
    }
}
