//! LoRA and QLoRA on a Hugging Face model, counted from the parameter inventory: which `Linear`
//! leaves of the blocks a target list adapts (PEFT's `target_modules` matching the module's
//! name), the adapters' trainable elements (r·(in + out) each), and the frozen base's bytes —
//! in the parameter dtype, or for QLoRA every block `Linear` weight in 4-bit NormalFloat
//! (bitsandbytes `Linear4bit`: embeddings, norms, biases and the output head stay 16-bit).
//!
//! NF4 storage of one weight of n elements (Dettmers et al. 2023, §3 "Double Quantization";
//! bitsandbytes `quantize_4bit` with `compress_statistics`; docs/sources.md §24): n/2 bytes of
//! codes, one absmax per block of 64 quantised to 8 bits (n/64 bytes), one fp32 scale per block
//! of 256 absmax values and one fp32 offset per weight, so 4 + 8/64 + 32/(64·256) = 4.127 bits
//! per parameter.
//!
//! Not for: the adapters' arithmetic (the engine) or the ranking of plans (the search).

use super::params::{Leaf, LeafKind, ParamInventory};
use crate::strategy::{BaseWeights, Lora, LoraTarget};

/// The targets a block `Linear` serves, from its module name; empty for modules LoRA targets
/// cannot name (routers, experts).
fn served_by(leaf: &Leaf) -> &'static [LoraTarget] {
    use LoraTarget::*;
    let name = leaf.path.rsplit('.').next().unwrap_or_default();
    let parent = leaf.path.rsplit('.').nth(1).unwrap_or_default();
    match (parent, name) {
        (_, "q_proj" | "query") => &[Q],
        (_, "k_proj" | "key") => &[K],
        (_, "v_proj" | "value") => &[V],
        // Fused projections: one adapter on the whole module (PEFT adapts modules, not slices).
        (_, "qkv_proj" | "c_attn" | "query_key_value") => &[Q, K, V, Qkv],
        (_, "o_proj") | ("attn" | "attention", "c_proj" | "dense") => &[O],
        ("output", "dense") if leaf.path.contains(".attention.") => &[O],
        (_, "gate_proj") => &[Gate],
        (_, "gate_up_proj") => &[Gate, Up],
        (_, "up_proj" | "c_fc" | "dense_h_to_4h" | "fc1") => &[Up],
        ("intermediate", "dense") => &[Up],
        (_, "down_proj" | "dense_4h_to_h" | "fc2") | ("mlp", "c_proj") => &[Down],
        ("output", "dense") => &[Down],
        _ => &[],
    }
}

/// Whether `targets` adapt `leaf` (`qkv` also names separate q, k and v projections).
fn adapted(leaf: &Leaf, lora: &Lora) -> bool {
    leaf.kind == LeafKind::Linear
        && leaf.block.is_some()
        && served_by(leaf).iter().any(|&t| {
            lora.targets.contains(t)
                || (lora.targets.contains(LoraTarget::Qkv)
                    && matches!(t, LoraTarget::Q | LoraTarget::K | LoraTarget::V))
        })
}

/// The module names PEFT's `target_modules` needs for `lora` on the model of `inv`: for each
/// adapted module the shortest suffix of its path (after the block index) that names no
/// module of the block that is not adapted, sorted, without repeats.
pub fn adapted_modules(inv: &ParamInventory, lora: &Lora) -> Vec<String> {
    // Paths inside a block: `model.layers.3.self_attn.q_proj` → ["self_attn", "q_proj"].
    let inner = |leaf: &Leaf| -> Vec<String> {
        let parts: Vec<&str> = leaf.path.split('.').collect();
        let at = parts
            .iter()
            .position(|p| p.parse::<u64>().is_ok())
            .map_or(0, |i| i + 1);
        parts[at..].iter().map(|p| p.to_string()).collect()
    };
    let in_blocks: Vec<&Leaf> = inv.leaves.iter().filter(|l| l.block.is_some()).collect();
    let mut names = Vec::new();
    for leaf in in_blocks.iter().filter(|l| adapted(l, lora)) {
        let path = inner(leaf);
        let name = (1..=path.len())
            .map(|k| path[path.len() - k..].join("."))
            .find(|suffix| {
                !in_blocks.iter().any(|other| {
                    !adapted(other, lora) && inner(other).join(".").ends_with(suffix.as_str())
                })
            })
            .unwrap_or_else(|| path.join("."));
        names.push(name);
    }
    names.sort();
    names.dedup();
    names
}

/// Bytes of one weight of `n` elements in NF4 with double-quantised scales.
pub fn nf4_bytes(n: u64) -> u64 {
    n.div_ceil(2) + nf4_state_bytes(n)
}

/// Bytes of one NF4 weight's quantisation state: the 8-bit absmax of each block of 64, the
/// fp32 scale of each 256 of them and the fp32 offset. bitsandbytes keeps it in a `QuantState`
/// beside the packed codes, on the `Params4bit` and on its `Linear4bit` module
/// (`bitsandbytes/nn/modules.py`; `Linear4bit.forward` restores it from the module "when the
/// parameter got converted ... for example for fsdp"): it is no parameter or buffer, so FSDP
/// and ZeRO-3 shard, gather and offload only the codes, and every rank keeps the whole state
/// on its device.
pub fn nf4_state_bytes(n: u64) -> u64 {
    let blocks = n.div_ceil(64);
    blocks + 4 * blocks.div_ceil(256) + 4
}

/// A LoRA fine-tune's counts on one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LoraCounts {
    /// The adapters' elements (the only ones with gradients and optimizer state).
    pub trainable: u64,
    /// Modules that get an adapter.
    pub adapted_modules: u64,
    /// The largest adapter matrix (A or B): the step in backward's gradient unit.
    pub largest_adapter: u64,
    /// Adafactor's factored state of the adapters: rows + columns of each matrix.
    pub adafactor_elements: u64,
    /// Frozen elements stored in the parameter dtype.
    pub frozen_plain: u64,
    /// Frozen elements stored in NF4 (QLoRA), and their bytes (codes and quantisation state).
    pub frozen_nf4: u64,
    pub frozen_nf4_bytes: u64,
    /// The part of `frozen_nf4_bytes` that is quantisation state ([`nf4_state_bytes`]): whole
    /// on every rank, never sharded or offloaded.
    pub frozen_nf4_state_bytes: u64,
    /// The largest NF4 weight's elements: what one dequantisation makes at once
    /// ([`LoraCounts::dequantized_bytes`]).
    pub largest_nf4: u64,
    /// The adapted projections' input features, summed over every adapted module: what LoRA
    /// dropout copies per token.
    pub adapted_input_features: u64,
}

impl LoraCounts {
    /// The counts of `lora` on the model of `inv`; `None` when no module matches a target.
    pub fn of(inv: &ParamInventory, lora: &Lora) -> Option<LoraCounts> {
        let mut c = LoraCounts {
            trainable: 0,
            adapted_modules: 0,
            largest_adapter: 0,
            adafactor_elements: 0,
            frozen_plain: 0,
            frozen_nf4: 0,
            frozen_nf4_bytes: 0,
            frozen_nf4_state_bytes: 0,
            largest_nf4: 0,
            adapted_input_features: 0,
        };
        let r = lora.rank as u64;
        for leaf in &inv.leaves {
            if adapted(leaf, lora) {
                // Leaves are (out, in) as nn.Linear stores them; the count is symmetric.
                c.trainable += r * (leaf.rows + leaf.cols);
                c.adapted_modules += 1;
                c.largest_adapter = c.largest_adapter.max(r * leaf.rows.max(leaf.cols));
                c.adafactor_elements += (leaf.cols + r) + (r + leaf.rows);
                c.adapted_input_features += leaf.cols;
            }
            let quantised = lora.base == BaseWeights::Nf4
                && leaf.kind == LeafKind::Linear
                && leaf.block.is_some();
            if quantised {
                let n = leaf.rows * leaf.cols;
                c.frozen_nf4 += n;
                c.frozen_nf4_bytes += nf4_bytes(n);
                c.frozen_nf4_state_bytes += nf4_state_bytes(n);
                c.largest_nf4 = c.largest_nf4.max(n);
                c.frozen_plain += leaf.bias;
            } else {
                c.frozen_plain += leaf.params();
            }
        }
        (c.adapted_modules > 0).then_some(c)
    }

    /// Device bytes of the frozen base with the parameter dtype's `param_bytes` per element.
    pub fn frozen_bytes(&self, param_bytes: u64) -> u64 {
        self.frozen_plain * param_bytes + self.frozen_nf4_bytes
    }

    /// The transient of one NF4 projection's forward or input gradient, `compute_bytes` per
    /// element: bitsandbytes' `MatMul4Bit` multiplies by the weight dequantised whole,
    /// `F.dequantize_4bit(B, quant_state).to(A.dtype)` (`bitsandbytes/autograd/_functions.py`),
    /// an out × in tensor in the dtype the weight was quantised from, here the compute dtype
    /// (QLoRA recipes load with `torch_dtype` = `bnb_4bit_compute_dtype`, so the cast is a
    /// no-op); under double quantisation `dequantize_4bit` first restores the fp32 block scales
    /// (one per 64 weights, `dequantize_blockwise`), alive until the weight is made. The largest
    /// weight sets it; 0 without NF4 weights.
    pub fn dequantized_bytes(&self, compute_bytes: u64) -> u64 {
        self.largest_nf4 * compute_bytes + 4 * self.largest_nf4.div_ceil(64)
    }

    /// The frozen base's bytes that FSDP and ZeRO-3 shard, gather and offload: all of
    /// [`LoraCounts::frozen_bytes`] but the NF4 quantisation state.
    pub fn frozen_sharded_bytes(&self, param_bytes: u64) -> u64 {
        self.frozen_bytes(param_bytes) - self.frozen_nf4_state_bytes
    }
}

/// Which projection inputs a LoRA run's backward keeps: a projection's input is needed only for
/// its weight's gradient, so a frozen projection without an adapter keeps none (as PyTorch's
/// autograd saves `x` of `x·W` only when `W` requires a gradient); each adapter keeps its
/// rank-r intermediate.
///
/// With LoRA dropout (`lora_dropout` > 0) PEFT's adapter computes `lora_B(lora_A(dropout(x)))`
/// with one `nn.Dropout` per adapted module (`peft/tuners/lora/layer.py`, `Linear.forward`; the
/// bitsandbytes layers in `bnb.py` alike; `nn.Identity` at 0): each adapted projection keeps a
/// dropped copy of its input, which `lora_A` saves, and the dropout's mask, one byte an element
/// on CUDA (`native_dropout` returns a bool mask), beside the input the frozen path shares.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct LoraSaves {
    /// The attention's input (q, k, v adapted).
    pub qkv_input: bool,
    /// The attention output projection's input (o adapted).
    pub o_input: bool,
    /// The MLP's input (gate or up adapted).
    pub mlp_input: bool,
    /// The down projection's input, the activation's output (down adapted).
    pub down_input: bool,
    /// Adapters per block, each keeping `rank` elements per token.
    pub adapters_per_block: f64,
    pub rank: f64,
    /// Input features per block that LoRA dropout copies (0 without dropout): each kept at the
    /// activation width with a one-byte mask.
    pub dropout_features_per_block: f64,
}

impl LoraSaves {
    /// The saves of `lora`, whose counts on a model of `blocks` transformer blocks are `counts`,
    /// with LoRA dropout probability `dropout`.
    pub fn of(lora: &Lora, counts: &LoraCounts, blocks: u64, dropout: f32) -> LoraSaves {
        use LoraTarget::*;
        let t = &lora.targets;
        LoraSaves {
            qkv_input: [Q, K, V, Qkv].iter().any(|&x| t.contains(x)),
            o_input: t.contains(O),
            mlp_input: t.contains(Gate) || t.contains(Up),
            down_input: t.contains(Down),
            adapters_per_block: counts.adapted_modules as f64 / blocks.max(1) as f64,
            rank: lora.rank as f64,
            dropout_features_per_block: match dropout > 0.0 {
                true => counts.adapted_input_features as f64 / blocks.max(1) as f64,
                false => 0.0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nf4_costs_the_published_4_127_bits_per_parameter() {
        // Llama-2-7B's q_proj, 4096 × 4096: 8,388,608 code bytes, 262,144 absmax bytes, 1,024
        // second-level scales and one offset.
        let n = 4096 * 4096;
        assert_eq!(nf4_bytes(n), 8_388_608 + 262_144 + 4 * 1_024 + 4);
        let bits = 8.0 * nf4_bytes(n) as f64 / n as f64;
        assert!((bits - 4.127).abs() < 0.001, "{bits}");
        // Odd sizes round every part up.
        assert_eq!(nf4_bytes(65), 33 + 2 + 4 + 4);
    }

    #[test]
    fn nf4_state_is_the_absmax_scales_and_offset_without_the_codes() {
        // Llama-2-7B's q_proj, 4096 × 4096: 262,144 blocks of 64 → 262,144 absmax bytes,
        // ⌈262,144 / 256⌉ = 1,024 fp32 scales, one fp32 offset; the 8,388,608 code bytes apart.
        let n = 4096 * 4096;
        assert_eq!(nf4_state_bytes(n), 262_144 + 4 * 1_024 + 4);
        assert_eq!(nf4_bytes(n) - nf4_state_bytes(n), 8_388_608);
        // 65 elements: 2 blocks, one scale, the offset.
        assert_eq!(nf4_state_bytes(65), 2 + 4 + 4);
    }

    #[test]
    fn dequantising_makes_the_largest_weight_in_the_compute_dtype_and_its_fp32_scales() {
        // Llama-2-70B under QLoRA: the largest NF4 weight is an MLP projection, 28,672 × 8,192
        // = 234,881,024 elements: 469,762,048 bytes in bf16 and 234,881,024 / 64 = 3,670,016
        // fp32 block scales (14,680,064 bytes) restored first.
        let inv =
            crate::model::ParamInventory::of(&crate::model::load_model("llama-2-70b").unwrap());
        let all: crate::strategy::LoraTargets = "all-linear".parse().unwrap();
        let lora = |base| Lora::new(8, 16.0, all.clone(), base).unwrap();
        let counts = LoraCounts::of(&inv, &lora(BaseWeights::Nf4)).unwrap();
        assert_eq!(counts.largest_nf4, 28_672 * 8_192);
        assert_eq!(counts.dequantized_bytes(2), 469_762_048 + 14_680_064);
        // Plain LoRA has no NF4 weight and no transient.
        let plain = LoraCounts::of(&inv, &lora(BaseWeights::Plain)).unwrap();
        assert_eq!(plain.dequantized_bytes(2), 0);
    }
}
