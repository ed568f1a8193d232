//! A Llama-family model's weights in a Hugging Face checkpoint's names and layout: loading them
//! (linear weights transposed from `nn.Linear`'s out × in to the engine's in × out), writing them
//! back, the LoRA adapters as PEFT names them, and the adapters folded into the base.
//!
//! Not for: reading or writing files (`crate::checkpoint`).

use super::Llama;
use crate::checkpoint::{CheckpointError, NamedTensor, Pretrained};
use crate::model::{HuggingFace, Model, NamedValues};
use crate::models::lora::merge_into;
use crate::modules::join;
use headroom_strategy::LoraTarget;
use headroom_tensor::{Result, TensorError};

/// One tensor of the checkpoint and where the model keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfTensor {
    /// Its name in the checkpoint (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// The block holding it and its slot there.
    pub block: usize,
    pub slot: String,
    /// Where it starts in its block's values, in the plain layout.
    pub offset: usize,
    /// Its shape in the checkpoint.
    pub shape: Vec<usize>,
    /// Whether the model stores it transposed (linear weights: in × out).
    pub transposed: bool,
}

impl Llama {
    /// Every tensor of the checkpoint, in the blocks' order (a QLoRA layer's NF4 projections
    /// included, at their places in the plain layout).
    pub fn hf_tensors(&self) -> Vec<HfTensor> {
        (0..self.blocks.len())
            .flat_map(|bi| {
                let name = self.blocks[bi].name();
                let prefix = match name.starts_with("model.layers.") {
                    true => name.to_string(),
                    false => String::new(),
                };
                self.plain_specs(bi).into_iter().map(move |s| {
                    let transposed = s.shape.len() == 2 && s.name != "model.embed_tokens.weight";
                    let mut shape = s.shape.clone();
                    if transposed {
                        shape.reverse();
                    }
                    HfTensor {
                        name: join(&prefix, &s.name),
                        block: bi,
                        slot: s.name.clone(),
                        offset: s.offset,
                        shape,
                        transposed,
                    }
                })
            })
            .collect()
    }

    /// Sets every base weight from `get(tensor)`, which returns the checkpoint's values of
    /// `tensor` (row-major in its checkpoint shape) or an error naming what is wrong with it.
    /// QLoRA's projections are quantised to NF4 as they load.
    pub fn load_hf(&mut self, mut get: impl FnMut(&HfTensor) -> Result<Vec<f32>>) -> Result<()> {
        let tensors = self.hf_tensors();
        for bi in 0..self.blocks.len() {
            let numel: usize = self
                .plain_specs(bi)
                .iter()
                .map(|s| s.shape.iter().product::<usize>())
                .sum();
            let mut values = vec![0f32; numel];
            for t in tensors.iter().filter(|t| t.block == bi) {
                let got = get(t)?;
                let n: usize = t.shape.iter().product();
                if got.len() != n {
                    return Err(TensorError::invalid(
                        "load",
                        format!(
                            "tensor {} has {} values, expected {n} ({:?})",
                            t.name,
                            got.len(),
                            t.shape
                        ),
                    ));
                }
                let out = &mut values[t.offset..t.offset + n];
                match t.transposed {
                    true => transpose_into(&got, t.shape[0], t.shape[1], out),
                    false => out.copy_from_slice(&got),
                }
            }
            self.set_plain_values(bi, &values)?;
        }
        Ok(())
    }
}

/// `out` (cols × rows) = the transpose of row-major `x` (rows × cols).
fn transpose_into(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    for r in 0..rows {
        for (c, &v) in x[r * cols..(r + 1) * cols].iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
}

/// PEFT's name of the module a LoRA target adapts (`target_modules`).
fn peft_module(target: LoraTarget) -> &'static str {
    match target {
        LoraTarget::Q | LoraTarget::Qkv => "self_attn.q_proj",
        LoraTarget::K => "self_attn.k_proj",
        LoraTarget::V => "self_attn.v_proj",
        LoraTarget::O => "self_attn.o_proj",
        LoraTarget::Gate => "mlp.gate_proj",
        LoraTarget::Up => "mlp.up_proj",
        LoraTarget::Down => "mlp.down_proj",
    }
}

/// The values of block `bi` of `blocks`, checked against the block's size.
fn block_values<'a>(
    blocks: &'a [Vec<f32>],
    bi: usize,
    numel: usize,
    name: &str,
) -> Result<&'a [f32]> {
    let values = blocks
        .get(bi)
        .ok_or_else(|| TensorError::invalid("export", format!("no values for block {name}")))?;
    if values.len() != numel {
        return Err(TensorError::invalid(
            "export",
            format!("block {name} has {} values, expected {numel}", values.len()),
        ));
    }
    Ok(values)
}

impl Llama {
    /// The checkpoint's tensors from each base block's values in the plain layout (the inverse
    /// of [`Llama::load_hf`]).
    pub fn hf_state(&self, blocks: &[Vec<f32>]) -> Result<Vec<NamedTensor>> {
        let sizes: Vec<(String, usize)> = self.plain_blocks();
        self.hf_tensors()
            .into_iter()
            .map(|t| {
                let (name, numel) = &sizes[t.block];
                let values = block_values(blocks, t.block, *numel, name)?;
                let n: usize = t.shape.iter().product();
                let stored = &values[t.offset..t.offset + n];
                let values = match t.transposed {
                    // Stored in × out (the checkpoint's shape reversed); written out × in.
                    true => {
                        let mut out = vec![0f32; n];
                        transpose_into(stored, t.shape[1], t.shape[0], &mut out);
                        out
                    }
                    false => stored.to_vec(),
                };
                Ok(NamedTensor {
                    name: t.name,
                    shape: t.shape,
                    values,
                })
            })
            .collect()
    }

    /// PEFT's adapter tensors from each adapter block's values: layer i's `A` (in × r) is
    /// written as `lora_A.weight` (r × in, `nn.Linear(in, r)`'s weight) and `B` (r × out) as
    /// `lora_B.weight` (out × r), under `base_model.model.model.layers.i.{module}`.
    pub fn peft_state(&self, adapters: &[Vec<f32>]) -> Result<Vec<NamedTensor>> {
        let Some(lora) = &self.config.lora else {
            return Ok(Vec::new());
        };
        let r = lora.rank;
        let shapes = self.config.adapter_shapes(lora)?;
        let mut out = Vec::new();
        for (i, block) in self.adapters.iter().enumerate() {
            let values = block_values(adapters, i, block.numel(), block.name())?;
            let mut at = 0;
            for s in &shapes {
                let prefix = format!(
                    "base_model.model.model.layers.{i}.{}",
                    peft_module(s.target)
                );
                let (na, nb) = (s.input * r, r * s.output);
                let mut a = vec![0f32; na];
                transpose_into(&values[at..at + na], s.input, r, &mut a);
                let mut b = vec![0f32; nb];
                transpose_into(&values[at + na..at + na + nb], r, s.output, &mut b);
                at += na + nb;
                out.push(NamedTensor {
                    name: format!("{prefix}.lora_A.weight"),
                    shape: vec![r, s.input],
                    values: a,
                });
                out.push(NamedTensor {
                    name: format!("{prefix}.lora_B.weight"),
                    shape: vec![s.output, r],
                    values: b,
                });
            }
        }
        Ok(out)
    }

    /// PEFT's `adapter_config.json` for the adapters, naming `base` as the base model.
    pub fn peft_config(&self, base: &str) -> Result<Option<String>> {
        let Some(lora) = &self.config.lora else {
            return Ok(None);
        };
        let modules: Vec<&str> = self
            .config
            .adapter_shapes(lora)?
            .iter()
            .map(|s| peft_module(s.target).rsplit('.').next().unwrap_or_default())
            .collect();
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": lora.rank,
            "lora_alpha": lora.alpha,
            "lora_dropout": 0.0,
            "target_modules": modules,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "inference_mode": true,
            "init_lora_weights": true,
        });
        Ok(Some(
            serde_json::to_string_pretty(&config).expect("JSON of plain values"),
        ))
    }

    /// Every base block in the plain layout with layer i's adapters folded in,
    /// `W + (α/r)·A·B` (the engine's in × out layout of `W`).
    pub fn merged(&self, adapters: &[Vec<f32>]) -> Result<NamedValues> {
        let Some(lora) = &self.config.lora else {
            return Err(TensorError::invalid(
                "merge",
                "the model has no LoRA adapters",
            ));
        };
        let shapes = self.config.adapter_shapes(lora)?;
        let mut out = Vec::with_capacity(self.blocks.len());
        for (bi, block) in self.blocks.iter().enumerate() {
            let mut values = self.plain_values(bi)?;
            let specs = self.plain_specs(bi);
            if let Some(l) = bi.checked_sub(1).filter(|&l| l < self.config.layers) {
                let a = block_values(
                    adapters,
                    l,
                    self.adapters[l].numel(),
                    self.adapters[l].name(),
                )?;
                let mut at = 0;
                for s in &shapes {
                    let slot = format!("{}.weight", peft_module(s.target));
                    let spec = specs.iter().find(|p| p.name == slot).ok_or_else(|| {
                        TensorError::invalid("merge", format!("no weight {slot}"))
                    })?;
                    let (na, nb) = (s.input * lora.rank, lora.rank * s.output);
                    let w = &mut values[spec.offset..spec.offset + s.input * s.output];
                    merge_into(
                        w,
                        s.output,
                        0,
                        &a[at..at + na],
                        &a[at + na..at + na + nb],
                        *s,
                        lora,
                    );
                    at += na + nb;
                }
            }
            out.push((block.name().to_string(), values));
        }
        Ok(out)
    }
}

impl HuggingFace for Llama {
    fn config_json(&self) -> String {
        self.config.to_hf_json()
    }

    fn load(&mut self, checkpoint: &Pretrained) -> std::result::Result<(), CheckpointError> {
        // The checkpoint's own error (file, tensor, fix) is kept whole for the caller.
        let mut failure = None;
        let loaded = self.load_hf(|t| {
            checkpoint.tensor_f32(&t.name, &t.shape).map_err(|e| {
                let message = e.to_string();
                failure = Some(e);
                TensorError::invalid("load", message)
            })
        });
        match (failure, loaded) {
            (Some(e), _) => Err(e),
            (None, Err(e)) => Err(CheckpointError::Load {
                dir: checkpoint.location().into(),
                message: e.to_string(),
            }),
            (None, Ok(())) => Ok(()),
        }
    }

    fn state(&self, blocks: &[Vec<f32>]) -> Result<Vec<NamedTensor>> {
        self.hf_state(blocks)
    }

    fn adapters(
        &self,
        base: &str,
        adapters: &[Vec<f32>],
    ) -> Result<Option<(String, Vec<NamedTensor>)>> {
        match self.peft_config(base)? {
            Some(config) => Ok(Some((config, self.peft_state(adapters)?))),
            None => Ok(None),
        }
    }
}
