//! LoRA adapters on a transformer (Hu et al. 2021): one trainable block per layer holding an `A`
//! (in × r) and a `B` (r × out) for each targeted projection, added as `(α/r)·(x·A)·B` to the
//! frozen projection's output. `A` starts uniform in ±1/√in (PEFT's Kaiming-uniform with
//! a = √5), `B` at zero, so the adapted model starts as the base model; the adapters draw from
//! their own seed streams, so the base weights are the full model's for the same seed.
//!
//! The frozen projections save nothing for a weight gradient (the tape keeps `x` of `x·W` only
//! when `W` needs one), so the adapters' own inputs and rank-r intermediates are the activations
//! LoRA adds; the base's activations shrink by the inputs only frozen projections read.
//!
//! Not for: the vocabulary (`headroom_strategy::Lora`) or writing merged weights (`merge_block`
//! is the arithmetic; the trainer's saves write them).

use super::gpt::GptConfig;
use crate::init::{Init, initialise};
use crate::modules::LoraAdapter;
use headroom_memory::Device;
use headroom_strategy::{Lora, LoraTarget};
use headroom_tensor::{DType, ParamBlock, ParamSpec, Result, TensorError};

/// The seed stream offset of the adapters (kept apart from the base weights' streams).
const ADAPTER_SEED: u64 = 0x4C6F_5241;

/// One adapter of a block: its target and the projection's input and output features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdapterShape {
    pub target: LoraTarget,
    pub input: usize,
    pub output: usize,
}

/// The adapters of one GPT block, in the order of `lora.targets`; names the target a GPT
/// cannot adapt.
pub fn adapter_shapes(config: &GptConfig, lora: &Lora) -> Result<Vec<AdapterShape>> {
    let (c, f) = (config.width, config.ffn);
    let bad = |msg: String| TensorError::invalid("LoRA", msg);
    let t = &lora.targets;
    if t.contains(LoraTarget::Qkv)
        && [LoraTarget::Q, LoraTarget::K, LoraTarget::V]
            .iter()
            .any(|&s| t.contains(s))
    {
        return Err(bad(format!(
            "--lora-targets {t}: qkv already adapts the fused q, k and v projection; give either qkv or some of q, k, v"
        )));
    }
    t.as_slice()
        .iter()
        .map(|&target| {
            let (input, output) = match target {
                LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::O => (c, c),
                LoraTarget::Qkv => (c, 3 * c),
                LoraTarget::Up => (c, f),
                LoraTarget::Down => (f, c),
                LoraTarget::Gate => {
                    return Err(bad(
                        "--lora-targets gate: headroom's GPT has a plain GELU MLP with no gate projection; adapt up and down instead"
                            .to_string(),
                    ));
                }
            };
            Ok(AdapterShape {
                target,
                input,
                output,
            })
        })
        .collect()
}

/// Trainable elements of one block's adapters.
pub fn block_adapter_params(config: &GptConfig, lora: &Lora) -> Result<usize> {
    Ok(adapter_shapes(config, lora)?
        .iter()
        .map(|s| lora.adapter_params(s.input, s.output))
        .sum())
}

pub(crate) fn names(target: LoraTarget) -> (String, String) {
    (
        format!("{}.lora_a", target.name()),
        format!("{}.lora_b", target.name()),
    )
}

/// Allocates and initialises the GPT's adapter blocks (`lora.i`, one per layer).
pub fn build_adapters(
    config: &GptConfig,
    lora: &Lora,
    device: &Device,
    dtype: DType,
    seed: u64,
) -> Result<Vec<ParamBlock>> {
    let shapes = adapter_shapes(config, lora)?;
    build_adapter_blocks(&shapes, config.layers, lora, device, dtype, seed)
}

/// Allocates and initialises `layers` adapter blocks (`lora.i`) of `shapes` each, whatever
/// the model.
pub fn build_adapter_blocks(
    shapes: &[AdapterShape],
    layers: usize,
    lora: &Lora,
    device: &Device,
    dtype: DType,
    seed: u64,
) -> Result<Vec<ParamBlock>> {
    let mut blocks = Vec::with_capacity(layers);
    for i in 0..layers {
        let dims: Vec<([usize; 2], [usize; 2])> = shapes
            .iter()
            .map(|s| ([s.input, lora.rank], [lora.rank, s.output]))
            .collect();
        let labels: Vec<(String, String)> = shapes.iter().map(|s| names(s.target)).collect();
        let mut weights: Vec<(&str, &[usize])> = Vec::with_capacity(2 * shapes.len());
        for ((a, b), (da, db)) in labels.iter().zip(&dims) {
            weights.push((a, da));
            weights.push((b, db));
        }
        blocks.push(ParamBlock::new(
            device,
            &format!("lora.{i}"),
            &weights,
            dtype,
        )?);
    }
    let bounds: Vec<(String, f32)> = shapes
        .iter()
        .map(|s| (names(s.target).0, 1.0 / (s.input as f32).sqrt()))
        .collect();
    initialise(&blocks, seed ^ ADAPTER_SEED, |name| {
        match bounds.iter().find(|(a, _)| a == name) {
            Some(&(_, bound)) => Init::Uniform(bound),
            None => Init::Zeros, // every B
        }
    })?;
    Ok(blocks)
}

/// Views of one block's adapters, cheap to clone into a checkpoint scope.
#[derive(Clone, Debug)]
pub struct BlockAdapters {
    adapters: Vec<(LoraTarget, LoraAdapter)>,
}

impl BlockAdapters {
    /// The tracked views of `block`'s adapters.
    pub fn of(block: &ParamBlock, lora: &Lora) -> Result<BlockAdapters> {
        BlockAdapters::of_targets(block, lora.targets.as_slice(), lora)
    }

    /// The tracked views of `block`'s adapters on `targets` (a model's own list where one
    /// target name stands for several projections).
    pub fn of_targets(
        block: &ParamBlock,
        targets: &[LoraTarget],
        lora: &Lora,
    ) -> Result<BlockAdapters> {
        let adapters = targets
            .iter()
            .map(|&t| {
                let (a, b) = names(t);
                let adapter = LoraAdapter {
                    a: block.param(&a)?.clone(),
                    b: block.param(&b)?.clone(),
                    scale: lora.scale(),
                };
                Ok((t, adapter))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(BlockAdapters { adapters })
    }

    /// The adapter on `target`, if it has one.
    pub fn get(&self, target: LoraTarget) -> Option<LoraAdapter> {
        self.adapters
            .iter()
            .find(|(t, _)| *t == target)
            .map(|(_, a)| a.clone())
    }
}

/// The base weight an adapter on `target` updates, and which third of its columns when the
/// target is one of q, k, v inside the fused projection.
pub fn adapted_weight(target: LoraTarget) -> (&'static str, Option<usize>) {
    match target {
        LoraTarget::Q => ("attn.qkv.w", Some(0)),
        LoraTarget::K => ("attn.qkv.w", Some(1)),
        LoraTarget::V => ("attn.qkv.w", Some(2)),
        LoraTarget::Qkv => ("attn.qkv.w", None),
        LoraTarget::O => ("attn.proj.w", None),
        LoraTarget::Up | LoraTarget::Gate => ("mlp.fc.w", None),
        LoraTarget::Down => ("mlp.proj.w", None),
    }
}

/// Folds one adapter into its weight: `W[:, cols] += (α/r)·A·B`, with `w` the (in × `w_cols`)
/// weight row-major and `col` the first column the adapter's `shape.output` columns update.
pub fn merge_into(
    w: &mut [f32],
    w_cols: usize,
    col: usize,
    a: &[f32],
    b: &[f32],
    shape: AdapterShape,
    lora: &Lora,
) {
    let (n_out, r) = (shape.output, lora.rank);
    let scale = lora.scale();
    for i in 0..shape.input {
        let out = &mut w[i * w_cols + col..i * w_cols + col + n_out];
        for k in 0..r {
            let aik = a[i * r + k] * scale;
            for (m, &bkj) in out.iter_mut().zip(&b[k * n_out..(k + 1) * n_out]) {
                *m += aik * bkj;
            }
        }
    }
}

/// Folds every adapter of one layer into the layer's base block: `base` holds the block's
/// weights back to back as `specs` lay them out, `adapters` the adapter block's (as
/// `build_adapters` lays them out: A then B per target, in target order).
pub fn merge_block(
    config: &GptConfig,
    lora: &Lora,
    specs: &[ParamSpec],
    base: &mut [f32],
    adapters: &[f32],
) -> Result<()> {
    let mut at = 0;
    for shape in adapter_shapes(config, lora)? {
        let (weight, third) = adapted_weight(shape.target);
        let spec = specs
            .iter()
            .find(|s| s.name == weight)
            .ok_or_else(|| TensorError::invalid("LoRA merge", format!("no weight {weight}")))?;
        let (rows, cols) = (spec.shape[0], spec.shape[1]);
        let (na, nb) = (shape.input * lora.rank, lora.rank * shape.output);
        let (a, b) = (&adapters[at..at + na], &adapters[at + na..at + na + nb]);
        at += na + nb;
        let w = &mut base[spec.offset..spec.offset + rows * cols];
        merge_into(
            w,
            cols,
            third.map_or(0, |t| t * shape.output),
            a,
            b,
            shape,
            lora,
        );
    }
    Ok(())
}
