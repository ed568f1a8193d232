//! What the planner knows about a model: its shape (`Architecture`, read from a Hugging Face
//! `config.json` or a built-in preset) and its exact parameter inventory (`params`).
//!
//! Not for: building or running the model; the planner never touches weights.

pub mod config_json;
mod layouts;
pub mod lora;
pub mod params;
pub mod presets;

use serde::Serialize;

pub use config_json::parse_config;
pub use lora::LoraCounts;
pub use params::{Leaf, LeafKind, ParamInventory};
pub use presets::{PRESET_NAMES, load_model};

/// The model families the planner understands, by their `config.json` `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Llama,
    Mistral,
    Mixtral,
    Qwen2,
    /// Qwen2-MoE (Qwen1.5-MoE): Qwen2 attention, every block a routed MoE of gated experts plus
    /// a gated shared expert.
    Qwen2Moe,
    Gemma,
    Gemma2,
    Phi3,
    Gpt2,
    GptNeox,
    Bert,
    T5,
    /// headroom's residual MLP (no attention): embedding, blocks `x + W2·GELU(W1·LN(x))`, final
    /// norm, untied output head. Not a Hugging Face family; built from a headroom model.
    ResMlp,
}

impl Family {
    /// The `model_type` string of `config.json`.
    pub const fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Mixtral => "mixtral",
            Family::Qwen2 => "qwen2",
            Family::Qwen2Moe => "qwen2_moe",
            Family::Gemma => "gemma",
            Family::Gemma2 => "gemma2",
            Family::Phi3 => "phi3",
            Family::Gpt2 => "gpt2",
            Family::GptNeox => "gpt_neox",
            Family::Bert => "bert",
            Family::T5 => "t5",
            Family::ResMlp => "headroom_resmlp",
        }
    }

    /// The transformers class of one repeated block: the FSDP wrap unit and Accelerate's
    /// `_no_split_modules` entry.
    pub const fn block_class(self) -> &'static str {
        match self {
            Family::Llama => "LlamaDecoderLayer",
            Family::Mistral => "MistralDecoderLayer",
            Family::Mixtral => "MixtralDecoderLayer",
            Family::Qwen2 => "Qwen2DecoderLayer",
            Family::Qwen2Moe => "Qwen2MoeDecoderLayer",
            Family::Gemma => "GemmaDecoderLayer",
            Family::Gemma2 => "Gemma2DecoderLayer",
            Family::Phi3 => "Phi3DecoderLayer",
            Family::Gpt2 => "GPT2Block",
            Family::GptNeox => "GPTNeoXLayer",
            Family::Bert => "BertLayer",
            Family::T5 => "T5Block",
            Family::ResMlp => "ResMlpBlock",
        }
    }
}

/// The feed-forward kind of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MlpKind {
    /// Two matrices with an activation between (GPT-2, BERT, GPT-NeoX, T5 "relu").
    Plain,
    /// Three matrices, `down(act(gate(x)) * up(x))` (Llama SwiGLU, T5 "gated-gelu").
    Gated,
}

/// The shape of a transformer, normalised across families. Sizes are element counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Architecture {
    /// Preset name or the file the config came from.
    pub name: String,
    pub family: Family,
    pub vocab_size: u64,
    pub hidden_size: u64,
    /// Transformer blocks (encoder blocks for T5).
    pub num_layers: u64,
    /// Decoder blocks of an encoder-decoder model (T5); 0 otherwise.
    pub num_decoder_layers: u64,
    pub num_heads: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
    pub intermediate_size: u64,
    pub mlp: MlpKind,
    /// Experts per MoE block (1 for dense models) and experts each token is routed to.
    pub num_experts: u64,
    pub experts_per_token: u64,
    /// FFN width of a shared expert every token passes through besides its routed ones
    /// (Qwen2-MoE's `shared_expert_intermediate_size`); 0 when there is none.
    pub shared_expert_size: u64,
    /// Limit of learned absolute position embeddings (GPT-2, BERT); `None` for RoPE/relative.
    pub max_learned_positions: Option<u64>,
    /// Context the model was trained for, where positions are rotary or relative and nothing
    /// stops a longer sequence (`max_position_embeddings` of Llama-family and GPT-NeoX configs);
    /// a longer `--seq-len` is a warning, not an error.
    pub trained_context: Option<u64>,
    /// The sequence length of the model's pre-training, where its config records it apart from
    /// an extended context (`rope_scaling.original_max_position_embeddings`: 8192 for Llama
    /// 3.1, whose context was extended to 131,072 after pre-training; Llama 3 paper §3.4).
    pub pretraining_context: Option<u64>,
    pub tie_word_embeddings: bool,
    /// Whether the model applies dropout in training (adds 1-byte masks to the activations).
    pub dropout: bool,
    /// Linear layers carry biases (GPT-2, BERT, GPT-NeoX) — Qwen2's q/k/v biases are counted in
    /// the inventory but do not change activations.
    pub bias: bool,
    /// T5's `relative_attention_num_buckets`; 0 for other families.
    pub relative_attention_buckets: u64,
    /// The MLP's activation output (GELU's) is recomputed in backward from its input instead
    /// of being saved: headroom's engine does so (as `torch.compile`'s partitioner does);
    /// eager PyTorch, and so the frameworks planned for, saves it.
    pub recomputed_mlp_activation: bool,
    /// The MLP's activation is transformers' `NewGELUActivation` (GPT-2's `gelu_new`), written
    /// as Python-level tensor operations (`0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`,
    /// `transformers/activations.py`): besides its input and output, autograd saves `0.5·x`,
    /// the `tanh` output and `1 + tanh`, three more FFN-wide tensors per block.
    pub python_gelu: bool,
    /// The attention writes K and V into a `DynamicCache` in training as well (`use_cache`,
    /// true by default in the decoder configs: `GPT2Config`, `GPTNeoXConfig`, `LlamaConfig`
    /// and its kin; transformers turns it off under gradient checkpointing), whose
    /// `torch.cat` copies are what the attention then reads, and the model's output returns
    /// that cache. GPT-2's fused `c_attn` output stays alive through the query's view that
    /// SDPA saves, so its K and V are held twice (`cost::activation::kv_cache_copies`); a loop
    /// that keeps the output holds the cache (`cost::activation::previous_outputs`).
    pub kv_cache_in_training: bool,
    /// The attention runs SDPA's math path (set by `cost::sdpa::as_run` for a plan whose SDPA
    /// dispatch leaves the fused kernels): naive attention's bytes, but without the additive
    /// mask eager attention receives (transformers passes SDPA `is_causal` and no mask).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sdpa_math_path: bool,
    /// The blocks are transformers' eager modules (`modeling_*.py`), whose RMSNorm upcast,
    /// fp32 eager softmax, `repeat_kv` and Python GELU the activation terms count
    /// (`cost::activation`); false for headroom's engine and for runs whose framework builds its
    /// own modules (torchtune, torchtitan, Megatron-LM: `Problem::with_loss_impl` clears it
    /// with the loss implementation they use).
    pub transformers_modules: bool,
    /// The loss is PyTorch's eager `F.cross_entropy` on logits upcast to fp32 (Hugging Face's
    /// `ForCausalLMLoss`, torchtune's and torchtitan's loops), whose backward allocates two
    /// fp32 vocabulary-sized gradients (see `cost::activation::logits_grad`); false for
    /// headroom's engine, whose loss writes the logits' gradient alone, and for Megatron-LM's
    /// in-place loss (`Problem::with_loss_impl` clears it).
    pub upcasting_loss: bool,
    /// The loop's loss is `logits.sum()` on the model's own compute-dtype logits, no
    /// cross-entropy (a forward/backward benchmark; `LossImpl::Sum`, set by
    /// `Problem::with_loss_impl`): the logits are held by the output the loop keeps and one
    /// logits-shaped gradient exists in backward (see `cost::activation::logits`).
    pub sum_loss: bool,
    /// The loop keeps the model's output, its compute-dtype logits with it, through backward
    /// and until its next forward returns (`outputs = model(**batch); outputs.loss.backward()`,
    /// as Hugging Face's `*_no_trainer.py` examples and most hand-written loops do); the
    /// Trainer keeps the loss alone (`Problem::with_outputs_kept`; a `logits.sum()` loop keeps
    /// its output by construction, `sum_loss`).
    pub outputs_kept: bool,
    /// BERT's `type_vocab_size`; 0 for other families.
    pub type_vocab_size: u64,
    /// Under LoRA, which projection inputs backward still needs (the frozen projections' own
    /// are not kept); set by `Problem::new` from the workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_saves: Option<lora::LoraSaves>,
}

impl Architecture {
    /// A dense model without attention (headroom's residual MLP family's shape: blocks of a norm
    /// and a plain biased MLP), untied, without dropout; set the attention fields of an
    /// attention family on top.
    pub fn dense(
        name: &str,
        family: Family,
        vocab: u64,
        hidden: u64,
        layers: u64,
        intermediate: u64,
    ) -> Architecture {
        Architecture {
            name: name.to_string(),
            family,
            vocab_size: vocab,
            hidden_size: hidden,
            num_layers: layers,
            num_decoder_layers: 0,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            intermediate_size: intermediate,
            mlp: MlpKind::Plain,
            num_experts: 1,
            experts_per_token: 1,
            max_learned_positions: None,
            trained_context: None,
            pretraining_context: None,
            tie_word_embeddings: false,
            dropout: false,
            bias: true,
            relative_attention_buckets: 0,
            recomputed_mlp_activation: false,
            python_gelu: false,
            kv_cache_in_training: false,
            sdpa_math_path: false,
            transformers_modules: family != Family::ResMlp,
            // Every family but headroom's residual MLP is a Hugging Face model.
            upcasting_loss: family != Family::ResMlp,
            sum_loss: false,
            outputs_kept: false,
            type_vocab_size: 0,
            lora_saves: None,
            shared_expert_size: 0,
        }
    }

    /// Width of the attention's query/output projection (`heads × head_dim`).
    pub fn q_dim(&self) -> u64 {
        self.num_heads * self.head_dim
    }

    /// Width of the key/value projections (`kv_heads × head_dim`; smaller with GQA).
    pub fn kv_dim(&self) -> u64 {
        self.num_kv_heads * self.head_dim
    }

    /// Whether the blocks have attention (every family but the residual MLP).
    pub fn has_attention(&self) -> bool {
        self.num_heads > 0
    }

    /// All transformer blocks, encoder and decoder.
    pub fn total_blocks(&self) -> u64 {
        self.num_layers + self.num_decoder_layers
    }
}
