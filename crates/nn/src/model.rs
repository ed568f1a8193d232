//! What the trainer needs of a model: its parameter blocks (flat buffers, in a fixed order),
//! the loss of a micro-batch under a recomputation plan, and the shared runner that executes a
//! chain of blocks with checkpoint segments.
//!
//! Not for: training (see the train crate) or choosing plans (the train crate's `recompute`).

use crate::checkpoint::{CheckpointError, NamedTensor, Pretrained};
use headroom_tensor::{ParamBlock, Result, Tensor, checkpoint_block};
use std::ops::Range;

/// Blocks by name with their values (f32, back to back in the block's layout).
pub type NamedValues = Vec<(String, Vec<f32>)>;

/// What to recompute in backward instead of storing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recompute {
    /// Runs of consecutive repeated blocks, each run inside one checkpoint scope (only its input
    /// is kept; its blocks are re-run in backward). Disjoint, in order.
    pub segments: Vec<Range<usize>>,
    /// Selective recomputation inside blocks that are not in a segment: keep matmul outputs,
    /// recompute attention scores, softmax and attention dropout (Korthikanti et al. 2022).
    /// GELU outputs are recomputed under every policy (`Tensor::gelu_linear`).
    pub selective: bool,
    /// The output projection and cross-entropy in this many chunks of tokens, each recomputed
    /// in backward so the logits of the whole micro-batch never exist at once (`--loss
    /// chunked:K`); 0 or 1 is the plain loss.
    pub loss_chunks: usize,
}

impl Recompute {
    pub fn none() -> Recompute {
        Recompute::default()
    }
}

/// A trainable model on the tensor engine.
pub trait Model {
    /// Preset or configuration name.
    fn name(&self) -> &str;
    /// Trainable parameter blocks in a fixed order (the order of checkpoints and optimizer
    /// state).
    fn blocks(&self) -> &[ParamBlock];
    /// Frozen parameter blocks (LoRA's base weights): parameters only, no gradient, no
    /// optimizer state, whole on every rank.
    fn frozen_blocks(&self) -> &[ParamBlock] {
        &[]
    }
    /// Number of repeated blocks (transformer blocks, residual MLP blocks) a recomputation plan
    /// chooses among.
    fn depth(&self) -> usize;
    /// Mean cross-entropy of a micro-batch: `inputs` and `targets` are `(B, T)` integer tensors.
    fn loss(&self, inputs: &Tensor, targets: &Tensor, recompute: &Recompute) -> Result<Tensor>;

    /// Frozen weights stored in NF4 (QLoRA's base projections), in a fixed order.
    fn quantized(&self) -> Vec<std::sync::Arc<headroom_tensor::Nf4Weight>> {
        Vec::new()
    }

    /// The same weights for restoring their bytes (a resumed run's); call between steps.
    fn quantized_mut(&mut self) -> Vec<&mut std::sync::Arc<headroom_tensor::Nf4Weight>> {
        Vec::new()
    }

    /// With LoRA: every frozen block in the plain model's layout with the adapters folded in,
    /// given each trainable block's values (`None` without adapters).
    fn merged_blocks(&self, adapters: &[Vec<f32>]) -> Result<Option<NamedValues>> {
        let _ = adapters;
        Ok(None)
    }

    /// The model's weights as a plain run lays them out: block names and element counts (the
    /// trainable blocks, or under LoRA the base's blocks in the full layout).
    fn plain_blocks(&self) -> Vec<(String, usize)> {
        let blocks = match self.frozen_blocks() {
            [] => self.blocks(),
            frozen => frozen,
        };
        blocks
            .iter()
            .map(|b| (b.name().to_string(), b.numel()))
            .collect()
    }

    /// Sets plain block `name` from `values` in the plain layout (another run's weights).
    fn load_plain_block(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let blocks = match self.frozen_blocks() {
            [] => self.blocks(),
            frozen => frozen,
        };
        let block = blocks.iter().find(|b| b.name() == name).ok_or_else(|| {
            headroom_tensor::TensorError::invalid("load", format!("no block {name}"))
        })?;
        block.set_values(values)
    }

    /// Parameters training updates.
    fn num_params(&self) -> usize {
        self.blocks().iter().map(|b| b.numel()).sum()
    }

    /// The model's Hugging Face side (checkpoint names, loading, export), when it has one.
    fn hugging_face(&self) -> Option<&dyn HuggingFace> {
        None
    }

    /// The same, to load weights into.
    fn hugging_face_mut(&mut self) -> Option<&mut dyn HuggingFace> {
        None
    }

    /// Frozen parameters (the base of a LoRA fine-tune, its NF4 weights included).
    fn num_frozen_params(&self) -> usize {
        let quantized: usize = self
            .quantized()
            .iter()
            .map(|w| w.shape().iter().product::<usize>())
            .sum();
        self.frozen_blocks()
            .iter()
            .map(|b| b.numel())
            .sum::<usize>()
            + quantized
    }
}

/// A model that a Hugging Face checkpoint describes: its weights load from one and write back
/// to one, and its LoRA adapters write as PEFT's.
pub trait HuggingFace {
    /// The `config.json` describing the model.
    fn config_json(&self) -> String;
    /// Sets every base weight from the pretrained model; an error names the file and the
    /// tensor.
    fn load(&mut self, pretrained: &Pretrained) -> std::result::Result<(), CheckpointError>;
    /// The checkpoint's tensors, given each base block's values in the plain layout (the
    /// frozen blocks under LoRA, merged or not).
    fn state(&self, blocks: &[Vec<f32>]) -> Result<Vec<NamedTensor>>;
    /// PEFT's `adapter_config.json` (naming `base` as the base model) and
    /// `adapter_model.safetensors` tensors, given each adapter block's values; `None`
    /// without LoRA.
    fn adapters(
        &self,
        base: &str,
        adapters: &[Vec<f32>],
    ) -> Result<Option<(String, Vec<NamedTensor>)>>;
}

/// Runs `x` through `blocks` in order; the blocks of each segment run inside one checkpoint scope.
/// `forward` is one block's forward; block parameters are cheap clones of weight views.
pub fn run_blocks<B: Clone + 'static>(
    mut x: Tensor,
    blocks: Vec<B>,
    segments: &[Range<usize>],
    forward: fn(&B, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let mut i = 0;
    let mut segs = segments.iter().peekable();
    while i < blocks.len() {
        match segs.peek() {
            Some(s) if s.start == i => {
                let run: Vec<B> = blocks[s.start..s.end.min(blocks.len())].to_vec();
                i = s.end.max(i + 1);
                segs.next();
                x = checkpoint_block(&[&x], move |xs| {
                    let mut h = xs[0].clone();
                    for b in &run {
                        h = forward(b, &h)?;
                    }
                    Ok(h)
                })?;
            }
            _ => {
                x = forward(&blocks[i], &x)?;
                i += 1;
            }
        }
    }
    Ok(x)
}
