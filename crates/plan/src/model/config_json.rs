//! Reading a Hugging Face `config.json` into an [`Architecture`]: the field names, defaults and
//! conventions of each supported `model_type`, as the transformers config classes define them.
//!
//! Not for: counting parameters (see `params`) or holding the built-in presets (see `presets`).

use super::{Architecture, Family, MlpKind};
use crate::error::{PlanError, Result};
use serde_json::{Map, Value};

/// Parses the text of a `config.json`. `name` labels the model in reports.
pub fn parse_config(name: &str, text: &str) -> Result<Architecture> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| PlanError::ConfigSyntax(e.to_string()))?;
    let obj = value.as_object().ok_or_else(|| PlanError::ConfigField {
        field: "(top level)".into(),
        problem: "is not a JSON object".into(),
        expected: "an object such as {\"model_type\": \"llama\", ...}".into(),
    })?;
    let model_type = match obj.get("model_type") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(field_err("model_type", "is not a string", ACCEPTED_TYPES)),
        None => return Err(field_err("model_type", "is missing", ACCEPTED_TYPES)),
    };
    let f = Fields { obj };
    let spec = match model_type {
        "llama" => decoder_llama_like(name, Family::Llama, &f)?,
        "mistral" => decoder_llama_like(name, Family::Mistral, &f)?,
        "mixtral" => decoder_llama_like(name, Family::Mixtral, &f)?,
        "qwen2" => decoder_llama_like(name, Family::Qwen2, &f)?,
        "qwen2_moe" => decoder_llama_like(name, Family::Qwen2Moe, &f)?,
        "gemma" => decoder_llama_like(name, Family::Gemma, &f)?,
        "gemma2" => decoder_llama_like(name, Family::Gemma2, &f)?,
        "phi3" => decoder_llama_like(name, Family::Phi3, &f)?,
        "gpt2" => gpt2(name, &f)?,
        "gpt_neox" => gpt_neox(name, &f)?,
        "bert" => bert(name, &f)?,
        "t5" => t5(name, &f)?,
        other => return Err(PlanError::UnsupportedModelType(other.to_string())),
    };
    validate(&spec)?;
    Ok(spec)
}

const ACCEPTED_TYPES: &str = "one of: llama, mistral, mixtral, qwen2, qwen2_moe, gemma, gemma2, phi3, gpt2, gpt_neox, bert, t5";

fn field_err(field: &str, problem: &str, expected: &str) -> PlanError {
    PlanError::ConfigField {
        field: field.to_string(),
        problem: problem.to_string(),
        expected: expected.to_string(),
    }
}

/// Typed access to the fields of one config object.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    /// A required positive integer.
    fn size(&self, field: &str) -> Result<u64> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Err(field_err(field, "is missing", "a positive integer")),
            Some(v) => positive(field, v),
        }
    }

    /// An optional positive integer without a default.
    fn opt_size(&self, field: &str) -> Result<Option<u64>> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => positive(field, v).map(Some),
        }
    }

    /// An optional positive integer inside an optional object (`rope_scaling.factor`).
    fn nested_size(&self, object: &str, field: &str) -> Result<Option<u64>> {
        match self.obj.get(object) {
            Some(Value::Object(inner)) => Fields { obj: inner }.opt_size(field),
            _ => Ok(None),
        }
    }

    /// An optional positive integer; `null` counts as absent (as in transformers).
    fn size_or(&self, field: &str, default: u64) -> Result<u64> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => positive(field, v),
        }
    }

    fn flag_or(&self, field: &str, default: bool) -> Result<bool> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(field_err(field, "is not a boolean", "true or false")),
        }
    }

    fn prob_or(&self, field: &str, default: f64) -> Result<f64> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_f64()
                .filter(|p| (0.0..=1.0).contains(p))
                .ok_or_else(|| field_err(field, "is not a probability", "a number in [0, 1]")),
        }
    }

    fn text_or<'s>(&'s self, field: &str, default: &'s str) -> Result<&'s str> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::String(s)) => Ok(s.as_str()),
            Some(_) => Err(field_err(field, "is not a string", "a string")),
        }
    }
}

fn positive(field: &str, v: &Value) -> Result<u64> {
    match v.as_u64() {
        Some(n) if n > 0 => Ok(n),
        _ => Err(field_err(
            field,
            &format!("has the value {v}"),
            "a positive integer",
        )),
    }
}

/// Llama, Mistral, Mixtral, Qwen2, Gemma, Gemma 2 and Phi-3 share one layout (`LlamaConfig`
/// and its copies): Gemma's configs default to `head_dim` 256 and tied embeddings, Gemma 2 adds
/// two norms around each MLP, Phi-3 fuses q/k/v and gate/up into one matrix each.
fn decoder_llama_like(name: &str, family: Family, f: &Fields) -> Result<Architecture> {
    let hidden = f.size("hidden_size")?;
    let heads = f.size("num_attention_heads")?;
    let kv_heads = f.size_or("num_key_value_heads", heads)?;
    let gemma = matches!(family, Family::Gemma | Family::Gemma2);
    let head_dim = match f.obj.get("head_dim") {
        None | Some(Value::Null) if gemma => 256,
        None | Some(Value::Null) => divide(hidden, heads, "num_attention_heads")?,
        Some(v) => positive("head_dim", v)?,
    };
    let (num_experts, experts_per_token) = match family {
        Family::Mixtral => (
            f.size_or("num_local_experts", 8)?,
            f.size_or("num_experts_per_tok", 2)?,
        ),
        // Qwen2MoeConfig's defaults (Qwen1.5-MoE-A2.7B's values).
        Family::Qwen2Moe => (
            f.size_or("num_experts", 60)?,
            f.size_or("num_experts_per_tok", 4)?,
        ),
        _ => (1, 1),
    };
    // Qwen2-MoE: routed experts of moe_intermediate_size plus one shared expert. Layers that
    // stay dense (decoder_sparse_step > 1, mlp_only_layers) would make blocks differ in size,
    // which the planner's per-block model does not express: refused by name.
    let (intermediate, shared_expert_size) = match family {
        Family::Qwen2Moe => {
            if f.size_or("decoder_sparse_step", 1)? != 1 {
                return Err(field_err(
                    "decoder_sparse_step",
                    "is not 1 (some blocks dense, others sparse)",
                    "1: every block a mixture of experts (the released Qwen1.5-MoE and Qwen2-MoE models)",
                ));
            }
            if matches!(f.obj.get("mlp_only_layers"), Some(Value::Array(a)) if !a.is_empty()) {
                return Err(field_err(
                    "mlp_only_layers",
                    "lists dense blocks",
                    "[]: every block a mixture of experts",
                ));
            }
            (
                f.size_or("moe_intermediate_size", 1408)?,
                f.size_or("shared_expert_intermediate_size", 5632)?,
            )
        }
        _ => (f.size("intermediate_size")?, 0),
    };
    let base = Architecture::dense(
        name,
        family,
        f.size("vocab_size")?,
        hidden,
        f.size("num_hidden_layers")?,
        intermediate,
    );
    Ok(Architecture {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        mlp: MlpKind::Gated,
        num_experts,
        experts_per_token,
        trained_context: f.opt_size("max_position_embeddings")?,
        pretraining_context: f.nested_size("rope_scaling", "original_max_position_embeddings")?,
        // LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config and Phi3Config default to
        // untied, GemmaConfig and Gemma2Config to tied.
        tie_word_embeddings: f.flag_or("tie_word_embeddings", gemma)?,
        dropout: f.prob_or("attention_dropout", 0.0)? > 0.0,
        bias: f.flag_or("attention_bias", false)?,
        shared_expert_size,
        kv_cache_in_training: f.flag_or("use_cache", true)?,
        ..base
    })
}

fn gpt2(name: &str, f: &Fields) -> Result<Architecture> {
    let hidden = f.size("n_embd")?;
    let heads = f.size("n_head")?;
    let base = Architecture::dense(
        name,
        Family::Gpt2,
        f.size("vocab_size")?,
        hidden,
        f.size("n_layer")?,
        // `n_inner: null` means 4 × n_embd (GPT2MLP).
        f.size_or("n_inner", 4 * hidden)?,
    );
    Ok(Architecture {
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: divide(hidden, heads, "n_head")?,
        max_learned_positions: Some(f.size_or("n_positions", 1024)?),
        tie_word_embeddings: f.flag_or("tie_word_embeddings", true)?,
        dropout: f.prob_or("resid_pdrop", 0.1)? > 0.0 || f.prob_or("attn_pdrop", 0.1)? > 0.0,
        // GPT2Config's default activation.
        python_gelu: f.text_or("activation_function", "gelu_new")? == "gelu_new",
        kv_cache_in_training: f.flag_or("use_cache", true)?,
        ..base
    })
}

fn gpt_neox(name: &str, f: &Fields) -> Result<Architecture> {
    let hidden = f.size("hidden_size")?;
    let heads = f.size("num_attention_heads")?;
    let base = Architecture::dense(
        name,
        Family::GptNeox,
        f.size("vocab_size")?,
        hidden,
        f.size("num_hidden_layers")?,
        f.size("intermediate_size")?,
    );
    Ok(Architecture {
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: divide(hidden, heads, "num_attention_heads")?,
        trained_context: f.opt_size("max_position_embeddings")?,
        tie_word_embeddings: f.flag_or("tie_word_embeddings", false)?,
        dropout: f.prob_or("hidden_dropout", 0.0)? > 0.0
            || f.prob_or("attention_dropout", 0.0)? > 0.0,
        bias: f.flag_or("attention_bias", true)?,
        kv_cache_in_training: f.flag_or("use_cache", true)?,
        ..base
    })
}

fn bert(name: &str, f: &Fields) -> Result<Architecture> {
    let hidden = f.size("hidden_size")?;
    let heads = f.size("num_attention_heads")?;
    let base = Architecture::dense(
        name,
        Family::Bert,
        f.size("vocab_size")?,
        hidden,
        f.size("num_hidden_layers")?,
        f.size("intermediate_size")?,
    );
    Ok(Architecture {
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: divide(hidden, heads, "num_attention_heads")?,
        max_learned_positions: Some(f.size_or("max_position_embeddings", 512)?),
        dropout: f.prob_or("hidden_dropout_prob", 0.1)? > 0.0,
        type_vocab_size: f.size_or("type_vocab_size", 2)?,
        ..base
    })
}

fn t5(name: &str, f: &Fields) -> Result<Architecture> {
    let layers = f.size("num_layers")?;
    let mlp = match f.text_or("feed_forward_proj", "relu")? {
        "relu" | "gelu" => MlpKind::Plain,
        "gated-gelu" | "gated-relu" | "gated-silu" => MlpKind::Gated,
        other => {
            return Err(field_err(
                "feed_forward_proj",
                &format!("has the value \"{other}\""),
                "one of: relu, gelu, gated-gelu, gated-relu, gated-silu",
            ));
        }
    };
    let heads = f.size("num_heads")?;
    let base = Architecture::dense(
        name,
        Family::T5,
        f.size("vocab_size")?,
        f.size("d_model")?,
        layers,
        f.size("d_ff")?,
    );
    Ok(Architecture {
        num_decoder_layers: f.size_or("num_decoder_layers", layers)?,
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: f.size("d_kv")?,
        mlp,
        trained_context: f.opt_size("max_position_embeddings")?,
        tie_word_embeddings: f.flag_or("tie_word_embeddings", true)?,
        dropout: f.prob_or("dropout_rate", 0.1)? > 0.0,
        bias: false,
        relative_attention_buckets: f.size_or("relative_attention_num_buckets", 32)?,
        ..base
    })
}

fn divide(hidden: u64, heads: u64, heads_field: &str) -> Result<u64> {
    if !hidden.is_multiple_of(heads) {
        return Err(field_err(
            heads_field,
            &format!("({heads}) does not divide the hidden size {hidden}"),
            "a divisor of the hidden size, or an explicit head_dim",
        ));
    }
    Ok(hidden / heads)
}

/// The largest sizes a config.json may give, checked before anything is counted or allocated:
/// far beyond any published model, small enough that every product the planner forms stays
/// exact in 64 bits.
const LIMITS: [(&str, u64); 7] = [
    ("num_hidden_layers", 100_000),
    ("hidden_size", 1 << 20),
    ("intermediate_size", 1 << 22),
    ("vocab_size", 1 << 24),
    ("num_attention_heads", 1 << 16),
    ("num_local_experts", 1 << 12),
    ("shared_expert_intermediate_size", 1 << 22),
];

fn validate(spec: &Architecture) -> Result<()> {
    let values = [
        spec.num_layers + spec.num_decoder_layers,
        spec.hidden_size,
        spec.intermediate_size,
        spec.vocab_size,
        spec.num_heads,
        spec.num_experts,
        spec.shared_expert_size,
    ];
    for ((field, limit), value) in LIMITS.into_iter().zip(values) {
        if value > limit {
            return Err(field_err(
                field,
                &format!("is {value}, above the planner's limit"),
                &format!("at most {limit}"),
            ));
        }
    }
    if spec.head_dim > 1 << 16 {
        return Err(field_err(
            "head_dim",
            &format!("is {}, above the planner's limit", spec.head_dim),
            "at most 65536",
        ));
    }
    if !spec.num_heads.is_multiple_of(spec.num_kv_heads) {
        return Err(field_err(
            "num_key_value_heads",
            &format!(
                "({}) does not divide num_attention_heads ({})",
                spec.num_kv_heads, spec.num_heads
            ),
            "a divisor of num_attention_heads",
        ));
    }
    if spec.experts_per_token > spec.num_experts {
        // Mixtral names its expert count num_local_experts, Qwen2-MoE num_experts.
        let experts = match spec.family {
            Family::Qwen2Moe => "num_experts",
            _ => "num_local_experts",
        };
        return Err(field_err(
            "num_experts_per_tok",
            &format!(
                "({}) exceeds {experts} ({})",
                spec.experts_per_token, spec.num_experts
            ),
            &format!("at most {experts}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_json_is_a_syntax_error() {
        let e = parse_config("x", "{\"model_type\": \"llama\",").unwrap_err();
        assert!(matches!(e, PlanError::ConfigSyntax(_)), "{e}");
    }

    #[test]
    fn unknown_model_type_lists_the_accepted_ones() {
        let e = parse_config("x", r#"{"model_type": "falcon"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'falcon'") && e.contains("gpt_neox") && e.contains("t5"),
            "{e}"
        );
    }

    #[test]
    fn missing_field_is_named() {
        let e = parse_config("x", r#"{"model_type": "llama", "hidden_size": 64}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'num_attention_heads'") && e.contains("missing"),
            "{e}"
        );
    }

    #[test]
    fn zero_or_negative_sizes_are_rejected() {
        let e = parse_config("x", r#"{"model_type": "gpt2", "n_embd": -4}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'n_embd'") && e.contains("positive integer"),
            "{e}"
        );
    }

    #[test]
    fn hostile_sizes_are_refused_before_anything_is_counted() {
        let text = r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1000000000,
            "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000}"#;
        let e = parse_config("hostile", text).unwrap_err().to_string();
        assert!(
            e.contains("num_hidden_layers") && e.contains("at most 100000"),
            "{e}"
        );
        let text = text
            .replace("1000000000", "32")
            .replace("32000", "100000000000");
        let e = parse_config("hostile", &text).unwrap_err().to_string();
        assert!(e.contains("vocab_size"), "{e}");
    }

    #[test]
    fn kv_heads_must_divide_heads() {
        let text = r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8,
            "num_key_value_heads": 3, "num_hidden_layers": 2, "intermediate_size": 128,
            "vocab_size": 100}"#;
        let e = parse_config("x", text).unwrap_err().to_string();
        assert!(e.contains("num_key_value_heads"), "{e}");
    }

    #[test]
    fn defaults_follow_transformers() {
        // GPT2Config: n_inner null → 4·n_embd, tied embeddings; LlamaConfig: kv heads = heads.
        let g = parse_config(
            "g",
            r#"{"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 10}"#,
        )
        .unwrap();
        assert_eq!(g.intermediate_size, 256);
        assert!(g.tie_word_embeddings);
        let l = parse_config(
            "l",
            r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8,
                "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100}"#,
        )
        .unwrap();
        assert_eq!((l.num_kv_heads, l.head_dim), (8, 8));
        assert!(!l.tie_word_embeddings);
    }
}
