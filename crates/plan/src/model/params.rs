//! The exact parameter inventory of a model: every module that owns parameters directly
//! (`Linear`/`Conv1D`, `Embedding`, norms, routers), with its shape, in the layout of the
//! transformers implementation. Totals, DeepSpeed's "largest layer", Accelerate's layer sizes,
//! per-block sizes (the FSDP/ZeRO-3 gather unit) and FLOP-relevant counts all derive from it.
//!
//! Conventions (docs/sources.md §7): decoder-only models are counted as
//! `*ForCausalLM`, BERT as `BertModel` with pooler, T5 as `T5ForConditionalGeneration` (equal to
//! `T5Model` when embeddings are tied); a tied output projection is counted once. Mixtral experts
//! follow the classic layout (`experts.{j}.w1/w2/w3` as separate `Linear`s). Each family's
//! layout is built in `layouts`.
//!
//! Not for: activations or optimizer states (see `cost`).

use super::layouts;
use super::{Architecture, Family};
use serde::Serialize;
use std::collections::HashMap;

/// What kind of module owns a leaf's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeafKind {
    /// A lookup table: no matmul FLOPs for the input embedding.
    Embedding,
    /// A dense projection (`nn.Linear`, GPT-2's `Conv1D`): 2 FLOPs per weight per token.
    Linear,
    /// LayerNorm / RMSNorm weights (and biases).
    Norm,
    /// A MoE router (`Linear` without bias, tiny).
    Router,
}

/// One module that owns parameters directly.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Leaf {
    /// Module path in the training model (`model.layers.3.self_attn.q_proj`).
    pub path: String,
    /// The same path with block/expert indices replaced by `*`, for grouping.
    pub group: String,
    pub kind: LeafKind,
    /// Weight shape `(rows, cols)`; vectors are `(1, n)`.
    pub rows: u64,
    pub cols: u64,
    /// Bias elements (0 when the module has no bias).
    pub bias: u64,
    /// Index of the transformer block the leaf belongs to (decoder blocks follow encoder blocks).
    pub block: Option<u64>,
    /// Whether the module is part of the base model (`AutoModel`); the LM head is not.
    pub in_base_model: bool,
    /// Accelerate's layer unit: the `_no_split_modules` block or module containing this leaf.
    pub unit: String,
    /// Whether this is a MoE expert weight (only `experts_per_token / num_experts` of tokens use it).
    pub expert: bool,
}

impl Leaf {
    /// Parameters owned by this module.
    pub fn params(&self) -> u64 {
        self.rows * self.cols + self.bias
    }
}

/// A non-parameter tensor registered on a module (counted by Accelerate, not by DeepSpeed).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Buffer {
    pub path: String,
    pub bytes: u64,
    pub unit: String,
}

/// One row of the per-module breakdown: all modules sharing a `group` path.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleGroup {
    pub name: String,
    pub count: u64,
    pub params_each: u64,
    pub params_total: u64,
}

/// Every parameter-owning module of a model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParamInventory {
    pub leaves: Vec<Leaf>,
    pub buffers: Vec<Buffer>,
    /// Extra matmul weights that are not separate parameters: a tied LM head (V·h).
    pub tied_head_matmul: u64,
}

impl ParamInventory {
    /// Builds the inventory of `spec`.
    pub fn of(spec: &Architecture) -> ParamInventory {
        let (leaves, buffers) = layouts::build(spec);
        let has_head = !matches!(spec.family, Family::Bert);
        let tied_head_matmul = if spec.tie_word_embeddings && has_head {
            spec.vocab_size * spec.hidden_size
        } else {
            0
        };
        ParamInventory {
            leaves,
            buffers,
            tied_head_matmul,
        }
    }

    /// Total parameters, shared tensors counted once (`sum(p.numel())` over unique tensors).
    pub fn total(&self) -> u64 {
        self.leaves.iter().map(Leaf::params).sum()
    }

    /// DeepSpeed's largest layer: the most parameters owned directly by one module
    /// (`max over model.modules() of sum(p.numel() for p in m.parameters(recurse=False))`).
    pub fn largest_layer(&self) -> (&str, u64) {
        let mut best: (&str, u64) = ("", 0);
        for leaf in &self.leaves {
            if leaf.params() > best.1 {
                best = (leaf.path.as_str(), leaf.params());
            }
        }
        best
    }

    /// The per-module breakdown, grouped by path with indices collapsed, in model order.
    pub fn groups(&self) -> Vec<ModuleGroup> {
        let mut out: Vec<ModuleGroup> = Vec::new();
        for leaf in &self.leaves {
            match out
                .iter_mut()
                .find(|g| g.name == leaf.group && g.params_each == leaf.params())
            {
                Some(g) => {
                    g.count += 1;
                    g.params_total += leaf.params();
                }
                None => out.push(ModuleGroup {
                    name: leaf.group.clone(),
                    count: 1,
                    params_each: leaf.params(),
                    params_total: leaf.params(),
                }),
            }
        }
        out
    }

    /// Parameters of the largest transformer block: the unit ZeRO-3/FSDP gathers at once.
    pub fn max_block_params(&self) -> u64 {
        let mut sums: Vec<u64> = Vec::new();
        for leaf in &self.leaves {
            if let Some(i) = leaf.block {
                let i = i as usize;
                if sums.len() <= i {
                    sums.resize(i + 1, 0);
                }
                sums[i] += leaf.params();
            }
        }
        sums.into_iter().max().unwrap_or(0)
    }

    /// Parameters of modules outside every transformer block (embeddings, final norm, an
    /// untied head): what FSDP's root unit holds when each block is wrapped.
    pub fn outside_block_params(&self) -> u64 {
        self.leaves
            .iter()
            .filter(|l| l.block.is_none())
            .map(Leaf::params)
            .sum()
    }

    /// Parameters in tensors of at most `threshold` elements, a weight and its bias counted as
    /// separate tensors (DeepSpeed's `stage3_param_persistence_threshold` is per tensor).
    pub fn small_tensor_params(&self, threshold: u64) -> u64 {
        let small = |n: u64| if n <= threshold { n } else { 0 };
        self.leaves
            .iter()
            .map(|l| small(l.rows * l.cols) + small(l.bias))
            .sum()
    }

    /// Parameters of the input embeddings (token, position, token-type tables).
    pub fn embedding_params(&self) -> u64 {
        self.leaves
            .iter()
            .filter(|l| l.kind == LeafKind::Embedding)
            .map(Leaf::params)
            .sum()
    }

    /// Matmul weights one token passes through (2 FLOPs each forward): every dense projection
    /// including the LM head (tied or not), with MoE experts scaled by `k / E`.
    pub fn active_matmul_params(&self, spec: &Architecture) -> f64 {
        self.matmul(spec, |_| true) + self.tied_head_matmul as f64
    }

    /// The part of [`Self::active_matmul_params`] inside transformer blocks (what activation
    /// checkpointing recomputes).
    pub fn active_block_matmul_params(&self, spec: &Architecture) -> f64 {
        self.matmul(spec, |l| l.block.is_some())
    }

    fn matmul(&self, spec: &Architecture, keep: impl Fn(&Leaf) -> bool) -> f64 {
        let expert_share = spec.experts_per_token as f64 / spec.num_experts as f64;
        self.leaves
            .iter()
            .filter(|l| matches!(l.kind, LeafKind::Linear | LeafKind::Router) && keep(l))
            .map(|l| {
                let w = (l.rows * l.cols) as f64;
                if l.expert { w * expert_share } else { w }
            })
            .sum()
    }

    /// Elements of Adafactor's second-moment state: a row and a column vector for every matrix
    /// (factored, Shazeer & Stern 2018 §3), the full vector for 1-D tensors and biases.
    pub fn adafactor_state_elements(&self) -> u64 {
        self.leaves
            .iter()
            .map(|l| {
                let w = if l.rows > 1 && l.cols > 1 {
                    l.rows + l.cols
                } else {
                    l.rows * l.cols
                };
                w + l.bias
            })
            .sum()
    }

    /// Accelerate's `total_size` at float32: parameters of the base model × 4 plus buffers.
    pub fn accelerate_total_bytes(&self) -> u64 {
        let params: u64 = self
            .leaves
            .iter()
            .filter(|l| l.in_base_model)
            .map(Leaf::params)
            .sum();
        params * 4 + self.buffers.iter().map(|b| b.bytes).sum::<u64>()
    }

    /// Accelerate's `largest_layer` at float32: the largest `_no_split_modules` block or
    /// childless module of the base model, buffers included.
    ///
    /// One pass: consecutive leaves of a unit (a block's) are summed as a run, and the runs are
    /// merged in a hash map, so a model of 100,000 blocks (as many units, a million leaves) takes
    /// linear time, not a search of the units per leaf.
    pub fn accelerate_largest_layer_bytes(&self) -> u64 {
        let leaves = self.leaves.iter().filter(|l| l.in_base_model);
        let sizes = leaves
            .map(|l| (l.unit.as_str(), l.params() * 4))
            .chain(self.buffers.iter().map(|b| (b.unit.as_str(), b.bytes)));
        let mut units: HashMap<&str, u64> = HashMap::new();
        let mut run: Option<(&str, u64)> = None;
        for (unit, bytes) in sizes {
            match &mut run {
                Some((u, sum)) if *u == unit => *sum += bytes,
                _ => {
                    if let Some((u, sum)) = run.replace((unit, bytes)) {
                        *units.entry(u).or_default() += sum;
                    }
                }
            }
        }
        if let Some((u, sum)) = run {
            *units.entry(u).or_default() += sum;
        }
        units.into_values().max().unwrap_or(0)
    }
}
