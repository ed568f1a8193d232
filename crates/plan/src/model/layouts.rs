//! Each family's module layout, as its transformers implementation builds it: the leaves
//! (parameter-owning modules with their shapes, block and Accelerate unit) and buffers that
//! `ParamInventory` is made of. One builder method per family; paths follow the Hub's state
//! dicts (`model.layers.3.self_attn.q_proj`).
//!
//! Not for: what is derived from the inventory (see `params`).

use super::params::{Buffer, Leaf, LeafKind};
use super::{Architecture, Family, MlpKind};

/// The leaves and buffers of `spec`, in model order.
pub(super) fn build(spec: &Architecture) -> (Vec<Leaf>, Vec<Buffer>) {
    let mut b = Builder {
        spec,
        leaves: Vec::new(),
        buffers: Vec::new(),
    };
    match spec.family {
        Family::Llama
        | Family::Mistral
        | Family::Mixtral
        | Family::Qwen2
        | Family::Qwen2Moe
        | Family::Gemma
        | Family::Gemma2
        | Family::Phi3 => b.llama_like(),
        Family::Gpt2 => b.gpt2(),
        Family::GptNeox => b.gpt_neox(),
        Family::Bert => b.bert(),
        Family::T5 => b.t5(),
        Family::ResMlp => b.resmlp(),
    }
    (b.leaves, b.buffers)
}

struct Builder<'a> {
    spec: &'a Architecture,
    leaves: Vec<Leaf>,
    buffers: Vec<Buffer>,
}

/// Shape of one leaf as the builder records it.
struct Shape {
    kind: LeafKind,
    rows: u64,
    cols: u64,
    bias: u64,
}

fn linear(out: u64, inp: u64, bias: bool) -> Shape {
    Shape {
        kind: LeafKind::Linear,
        rows: out,
        cols: inp,
        bias: if bias { out } else { 0 },
    }
}

fn norm(h: u64, bias: bool) -> Shape {
    Shape {
        kind: LeafKind::Norm,
        rows: 1,
        cols: h,
        bias: if bias { h } else { 0 },
    }
}

fn embedding(n: u64, h: u64) -> Shape {
    Shape {
        kind: LeafKind::Embedding,
        rows: n,
        cols: h,
        bias: 0,
    }
}

impl Builder<'_> {
    /// Adds a leaf outside any block. `unit` defaults to the leaf itself.
    fn top(&mut self, path: &str, shape: Shape, base: bool, unit: Option<&str>) {
        self.push(
            path.to_string(),
            path.to_string(),
            shape,
            None,
            base,
            unit.unwrap_or(path).to_string(),
            false,
        );
    }

    /// Adds a leaf of block `i`; `template` uses `*` for the block index.
    fn in_block(&mut self, template: &str, i: u64, unit_template: &str, shape: Shape) {
        let path = numbered(template, i);
        let unit = numbered(unit_template, i);
        let expert = template.contains("experts.");
        let group = if expert {
            collapse_expert(template)
        } else {
            template.to_string()
        };
        self.push(path, group, shape, Some(i), true, unit, expert);
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        path: String,
        group: String,
        s: Shape,
        block: Option<u64>,
        base: bool,
        unit: String,
        expert: bool,
    ) {
        self.leaves.push(Leaf {
            path,
            group,
            kind: s.kind,
            rows: s.rows,
            cols: s.cols,
            bias: s.bias,
            block,
            in_base_model: base,
            unit,
            expert,
        });
    }

    /// `LlamaForCausalLM` and its copies (Mistral, Mixtral, Qwen2, Gemma, Gemma 2, Phi-3).
    fn llama_like(&mut self) {
        let s = self.spec;
        let (h, q, kv, inter) = (s.hidden_size, s.q_dim(), s.kv_dim(), s.intermediate_size);
        // Qwen2Attention hard-codes bias on q/k/v and none on o; Llama's `attention_bias` covers all four.
        let qwen = matches!(s.family, Family::Qwen2 | Family::Qwen2Moe);
        let qkv_bias = s.bias || qwen;
        let o_bias = s.bias && !qwen;
        self.top("model.embed_tokens", embedding(s.vocab_size, h), true, None);
        let unit = "model.layers.*";
        for i in 0..s.num_layers {
            let p = "model.layers.*.self_attn";
            if s.family == Family::Phi3 {
                // Phi3Attention: one qkv_proj of q + 2·kv rows.
                let qkv = linear(q + 2 * kv, h, qkv_bias);
                self.in_block(&format!("{p}.qkv_proj"), i, unit, qkv);
            } else {
                self.in_block(&format!("{p}.q_proj"), i, unit, linear(q, h, qkv_bias));
                self.in_block(&format!("{p}.k_proj"), i, unit, linear(kv, h, qkv_bias));
                self.in_block(&format!("{p}.v_proj"), i, unit, linear(kv, h, qkv_bias));
            }
            self.in_block(&format!("{p}.o_proj"), i, unit, linear(h, q, o_bias));
            if s.family == Family::Phi3 {
                // Phi3MLP: one gate_up_proj of 2·intermediate rows.
                let m = "model.layers.*.mlp";
                let gate_up = linear(2 * inter, h, false);
                self.in_block(&format!("{m}.gate_up_proj"), i, unit, gate_up);
                self.in_block(&format!("{m}.down_proj"), i, unit, linear(h, inter, false));
            } else if s.family == Family::Mixtral {
                let m = "model.layers.*.block_sparse_moe";
                let router = Shape {
                    kind: LeafKind::Router,
                    rows: s.num_experts,
                    cols: h,
                    bias: 0,
                };
                self.in_block(&format!("{m}.gate"), i, unit, router);
                for e in 0..s.num_experts {
                    let ex = format!("{m}.experts.{e}");
                    self.in_block(&format!("{ex}.w1"), i, unit, linear(inter, h, false));
                    self.in_block(&format!("{ex}.w2"), i, unit, linear(h, inter, false));
                    self.in_block(&format!("{ex}.w3"), i, unit, linear(inter, h, false));
                }
            } else if s.family == Family::Qwen2Moe {
                // Qwen2MoeSparseMoeBlock: router, gated experts, a gated shared expert and its
                // one-output sigmoid gate.
                let m = "model.layers.*.mlp";
                let router = |rows| Shape {
                    kind: LeafKind::Router,
                    rows,
                    cols: h,
                    bias: 0,
                };
                self.in_block(&format!("{m}.gate"), i, unit, router(s.num_experts));
                for e in 0..s.num_experts {
                    let ex = format!("{m}.experts.{e}");
                    self.in_block(&format!("{ex}.gate_proj"), i, unit, linear(inter, h, false));
                    self.in_block(&format!("{ex}.up_proj"), i, unit, linear(inter, h, false));
                    self.in_block(&format!("{ex}.down_proj"), i, unit, linear(h, inter, false));
                }
                let shared = s.shared_expert_size;
                let se = format!("{m}.shared_expert");
                self.in_block(
                    &format!("{se}.gate_proj"),
                    i,
                    unit,
                    linear(shared, h, false),
                );
                self.in_block(&format!("{se}.up_proj"), i, unit, linear(shared, h, false));
                self.in_block(
                    &format!("{se}.down_proj"),
                    i,
                    unit,
                    linear(h, shared, false),
                );
                self.in_block(&format!("{m}.shared_expert_gate"), i, unit, router(1));
            } else {
                let m = "model.layers.*.mlp";
                self.in_block(&format!("{m}.gate_proj"), i, unit, linear(inter, h, false));
                self.in_block(&format!("{m}.up_proj"), i, unit, linear(inter, h, false));
                self.in_block(&format!("{m}.down_proj"), i, unit, linear(h, inter, false));
            }
            self.in_block("model.layers.*.input_layernorm", i, unit, norm(h, false));
            self.in_block(
                "model.layers.*.post_attention_layernorm",
                i,
                unit,
                norm(h, false),
            );
            if s.family == Family::Gemma2 {
                // Gemma2DecoderLayer normalises the MLP's input and output too.
                for n in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
                    self.in_block(&format!("model.layers.*.{n}"), i, unit, norm(h, false));
                }
            }
        }
        self.top("model.norm", norm(h, false), true, None);
        if !s.tie_word_embeddings {
            self.top("lm_head", linear(s.vocab_size, h, false), false, None);
        }
        // Rotary inverse frequencies: fp32, head_dim/2 (LlamaRotaryEmbedding, non-persistent).
        self.buffers.push(Buffer {
            path: "model.rotary_emb.inv_freq".into(),
            bytes: s.head_dim / 2 * 4,
            unit: "model.rotary_emb".into(),
        });
    }

    /// `GPT2LMHeadModel` (Conv1D projections with biases, tied head).
    fn gpt2(&mut self) {
        let s = self.spec;
        let (h, inter) = (s.hidden_size, s.intermediate_size);
        let positions = s.max_learned_positions.unwrap_or(1024);
        self.top("transformer.wte", embedding(s.vocab_size, h), true, None);
        self.top("transformer.wpe", embedding(positions, h), true, None);
        let unit = "transformer.h.*";
        for i in 0..s.num_layers {
            self.in_block("transformer.h.*.ln_1", i, unit, norm(h, true));
            self.in_block(
                "transformer.h.*.attn.c_attn",
                i,
                unit,
                linear(3 * h, h, true),
            );
            self.in_block("transformer.h.*.attn.c_proj", i, unit, linear(h, h, true));
            self.in_block("transformer.h.*.ln_2", i, unit, norm(h, true));
            self.in_block("transformer.h.*.mlp.c_fc", i, unit, linear(inter, h, true));
            self.in_block(
                "transformer.h.*.mlp.c_proj",
                i,
                unit,
                linear(h, inter, true),
            );
        }
        self.top("transformer.ln_f", norm(h, true), true, None);
        if !s.tie_word_embeddings {
            self.top("lm_head", linear(s.vocab_size, h, false), false, None);
        }
    }

    /// headroom's residual MLP: `embed`, blocks of `ln`, `fc1`, `fc2` (with biases), `ln_f`
    /// and an untied `head` without bias.
    fn resmlp(&mut self) {
        let s = self.spec;
        let (h, inter) = (s.hidden_size, s.intermediate_size);
        self.top("embed", embedding(s.vocab_size, h), true, None);
        let unit = "blocks.*";
        for i in 0..s.num_layers {
            self.in_block("blocks.*.ln", i, unit, norm(h, true));
            self.in_block("blocks.*.fc1", i, unit, linear(inter, h, true));
            self.in_block("blocks.*.fc2", i, unit, linear(h, inter, true));
        }
        self.top("ln_f", norm(h, true), true, None);
        self.top("head", linear(s.vocab_size, h, false), false, None);
    }

    /// `GPTNeoXForCausalLM` (Pythia): fused QKV, parallel residual, untied `embed_out`.
    fn gpt_neox(&mut self) {
        let s = self.spec;
        let (h, inter, bias) = (s.hidden_size, s.intermediate_size, s.bias);
        self.top("gpt_neox.embed_in", embedding(s.vocab_size, h), true, None);
        let unit = "gpt_neox.layers.*";
        for i in 0..s.num_layers {
            let p = "gpt_neox.layers.*";
            self.in_block(&format!("{p}.input_layernorm"), i, unit, norm(h, true));
            self.in_block(
                &format!("{p}.post_attention_layernorm"),
                i,
                unit,
                norm(h, true),
            );
            self.in_block(
                &format!("{p}.attention.query_key_value"),
                i,
                unit,
                linear(3 * h, h, bias),
            );
            self.in_block(&format!("{p}.attention.dense"), i, unit, linear(h, h, bias));
            self.in_block(
                &format!("{p}.mlp.dense_h_to_4h"),
                i,
                unit,
                linear(inter, h, true),
            );
            self.in_block(
                &format!("{p}.mlp.dense_4h_to_h"),
                i,
                unit,
                linear(h, inter, true),
            );
        }
        self.top("gpt_neox.final_layer_norm", norm(h, true), true, None);
        if !s.tie_word_embeddings {
            self.top("embed_out", linear(s.vocab_size, h, false), false, None);
        }
    }

    /// `BertModel` with pooler; `BertEmbeddings` is one Accelerate unit with its two int64
    /// buffers (`position_ids`, `token_type_ids`, each `[1, max_position_embeddings]`).
    fn bert(&mut self) {
        let s = self.spec;
        let (h, inter) = (s.hidden_size, s.intermediate_size);
        let positions = s.max_learned_positions.unwrap_or(512);
        let e = Some("embeddings");
        self.top(
            "embeddings.word_embeddings",
            embedding(s.vocab_size, h),
            true,
            e,
        );
        self.top(
            "embeddings.position_embeddings",
            embedding(positions, h),
            true,
            e,
        );
        self.top(
            "embeddings.token_type_embeddings",
            embedding(s.type_vocab_size, h),
            true,
            e,
        );
        self.top("embeddings.LayerNorm", norm(h, true), true, e);
        for name in ["position_ids", "token_type_ids"] {
            self.buffers.push(Buffer {
                path: format!("embeddings.{name}"),
                bytes: positions * 8,
                unit: "embeddings".into(),
            });
        }
        let unit = "encoder.layer.*";
        for i in 0..s.num_layers {
            let p = "encoder.layer.*";
            for m in ["query", "key", "value"] {
                self.in_block(
                    &format!("{p}.attention.self.{m}"),
                    i,
                    unit,
                    linear(h, h, true),
                );
            }
            self.in_block(
                &format!("{p}.attention.output.dense"),
                i,
                unit,
                linear(h, h, true),
            );
            self.in_block(
                &format!("{p}.attention.output.LayerNorm"),
                i,
                unit,
                norm(h, true),
            );
            self.in_block(
                &format!("{p}.intermediate.dense"),
                i,
                unit,
                linear(inter, h, true),
            );
            self.in_block(
                &format!("{p}.output.dense"),
                i,
                unit,
                linear(h, inter, true),
            );
            self.in_block(&format!("{p}.output.LayerNorm"), i, unit, norm(h, true));
        }
        self.top("pooler.dense", linear(h, h, true), true, None);
    }

    /// `T5ForConditionalGeneration`: shared embedding, relative attention bias in block 0 of
    /// each stack, bias-free projections and norms, LM head tied unless configured otherwise.
    fn t5(&mut self) {
        let s = self.spec;
        let (h, inner, ff) = (s.hidden_size, s.q_dim(), s.intermediate_size);
        self.top("shared", embedding(s.vocab_size, h), true, None);
        for (stack, layers, offset) in [
            ("encoder", s.num_layers, 0),
            ("decoder", s.num_decoder_layers, s.num_layers),
        ] {
            for j in 0..layers {
                let at = T5Block {
                    stack,
                    local: j,
                    global: offset + j,
                };
                let attention = |b: &mut Self, layer: &str| {
                    for m in ["q", "k", "v"] {
                        b.t5_leaf(&at, &format!("{layer}.{m}"), linear(inner, h, false));
                    }
                    b.t5_leaf(&at, &format!("{layer}.o"), linear(h, inner, false));
                };
                attention(self, "layer.0.SelfAttention");
                if j == 0 {
                    let bias = embedding(s.relative_attention_buckets, s.num_heads);
                    let path =
                        format!("{stack}.block.0.layer.0.SelfAttention.relative_attention_bias");
                    let unit = format!("{stack}.block.0");
                    self.push(path.clone(), path, bias, Some(offset), true, unit, false);
                }
                let ff_index = if stack == "decoder" {
                    attention(self, "layer.1.EncDecAttention");
                    2
                } else {
                    1
                };
                for l in 0..ff_index {
                    self.t5_leaf(&at, &format!("layer.{l}.layer_norm"), norm(h, false));
                }
                let d = format!("layer.{ff_index}.DenseReluDense");
                if s.mlp == MlpKind::Gated {
                    self.t5_leaf(&at, &format!("{d}.wi_0"), linear(ff, h, false));
                    self.t5_leaf(&at, &format!("{d}.wi_1"), linear(ff, h, false));
                } else {
                    self.t5_leaf(&at, &format!("{d}.wi"), linear(ff, h, false));
                }
                self.t5_leaf(&at, &format!("{d}.wo"), linear(h, ff, false));
                self.t5_leaf(&at, &format!("layer.{ff_index}.layer_norm"), norm(h, false));
            }
            let path = format!("{stack}.final_layer_norm");
            self.top(&path, norm(h, false), true, None);
        }
        if !s.tie_word_embeddings {
            self.top("lm_head", linear(s.vocab_size, h, false), false, None);
        }
    }

    /// A leaf of a T5 block: the path uses the stack-local index, `block` the global one.
    fn t5_leaf(&mut self, at: &T5Block, tail: &str, shape: Shape) {
        let path = format!("{}.block.{}.{tail}", at.stack, at.local);
        let group = format!("{}.block.*.{tail}", at.stack);
        let unit = format!("{}.block.{}", at.stack, at.local);
        self.push(path, group, shape, Some(at.global), true, unit, false);
    }
}

/// Where a T5 block sits: its stack, its index in the stack, its index over both stacks.
struct T5Block {
    stack: &'static str,
    local: u64,
    global: u64,
}

/// `model.layers.*.block_sparse_moe.experts.3.w1` → `model.layers.*.block_sparse_moe.experts.*.w1`.
/// `template` with its first `*` replaced by the block index `i` (one pass: a model of 100,000
/// blocks has a million leaves).
fn numbered(template: &str, i: u64) -> String {
    match template.split_once('*') {
        Some((head, tail)) => format!("{head}{i}{tail}"),
        None => template.to_string(),
    }
}

fn collapse_expert(template: &str) -> String {
    template
        .split('.')
        .map(|seg| {
            if seg.chars().all(|c| c.is_ascii_digit()) {
                "*"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}
