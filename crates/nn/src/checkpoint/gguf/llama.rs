//! A GGUF Llama as a Hugging Face checkpoint: the configuration from the metadata (as a
//! `config.json` document and a [`LlamaConfig`]), and each Hugging Face tensor from its GGUF
//! counterpart, dequantised, in Hugging Face's layout.
//!
//! Names follow llama.cpp's conversion (`gguf-py/gguf/tensor_mapping.py`): `token_embd`,
//! `blk.N.attn_q` … `blk.N.ffn_down`, `attn_norm`, `ffn_norm`, `output_norm`, `output`. GGUF
//! lists dimensions fastest first, so a Hugging Face [out, in] weight is stored as (in, out)
//! with the same bytes: row-major data in the reversed shape is already Hugging Face's layout.
//! The q and k projections (weights and biases) are stored with their rows permuted for
//! llama.cpp's rotary convention (`convert_hf_to_gguf.py`, `LlamaModel.permute`:
//! `w.reshape(n_head, 2, dim // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)`, k with
//! the KV heads); [`unpermute_rows`] undoes it.
//!
//! Not for: other architectures' GGUF files (Qwen2's conversion does not permute, for one),
//! the tokenizer (`tokenizer.rs`).

use super::error::{GgufError, Result};
use super::file::GgufFile;
use super::value::Value;
use crate::models::llama::{HfTensor, LlamaConfig};
use headroom_tensor::TensorError;
use serde_json::{Value as Json, json};

/// The `general.architecture`s read as the Llama family.
pub const ARCHITECTURES: [&str; 1] = ["llama"];

/// Hugging Face module names inside a layer and their GGUF names.
const LAYER_NAMES: [(&str, &str); 9] = [
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
];

/// The GGUF name of a Hugging Face Llama tensor name, if it has one.
pub fn gguf_name(hf_name: &str) -> Option<String> {
    let fixed = match hf_name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = hf_name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let (_, g) = LAYER_NAMES.iter().find(|(hf, _)| *hf == module)?;
    Some(format!("blk.{layer}.{g}.{kind}"))
}

/// Undoes llama.cpp's rotary permutation of the rows of a q or k tensor with `heads` heads
/// (`values` row-major with `rows` rows). Within a head of `hd` rows, the Hugging Face row
/// `s·hd/2 + i` (half s, pair i) is stored at row `2i + s`.
///
/// Panics unless `rows` is a positive multiple of `2 · heads` dividing `values.len()`.
pub fn unpermute_rows(values: &[f32], rows: usize, heads: usize) -> Vec<f32> {
    assert!(
        heads > 0
            && rows > 0
            && rows.is_multiple_of(2 * heads)
            && values.len().is_multiple_of(rows),
        "unpermute_rows: {rows} rows of {} values in {heads} heads",
        values.len()
    );
    let cols = values.len() / rows;
    let (hd, half) = (rows / heads, rows / heads / 2);
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for s in 0..2 {
            for i in 0..half {
                let (hf, stored) = (h * hd + s * half + i, h * hd + 2 * i + s);
                out[hf * cols..][..cols].copy_from_slice(&values[stored * cols..][..cols]);
            }
        }
    }
    out
}

impl GgufFile {
    /// `general.architecture`, checked to be one headroom reads as the Llama family.
    pub fn architecture(&self) -> Result<&str> {
        let key = "general.architecture";
        let v = self.require(key, "every GGUF model file names its architecture")?;
        let arch = self.typed(key, v, "a string", |v| v.as_str())?;
        match ARCHITECTURES.contains(&arch) {
            true => Ok(arch),
            false => Err(GgufError::Unsupported {
                path: self.path().into(),
                what: format!(
                    "architecture '{arch}' is not supported; headroom reads GGUF files of {}",
                    ARCHITECTURES.join(", ")
                ),
            }),
        }
    }

    fn heads(&self) -> Result<(usize, usize)> {
        let arch = self.architecture()?;
        let key = format!("{arch}.attention.head_count");
        let heads = self.require_usize(&key, "a Llama GGUF file has it")?;
        let kv = format!("{arch}.attention.head_count_kv");
        let kv = match self.get(&kv) {
            Some(_) => self.require_usize(&kv, "")?,
            None => heads,
        };
        Ok((heads, kv))
    }

    fn unsupported(&self, what: String) -> GgufError {
        GgufError::Unsupported {
            path: self.path().into(),
            what,
        }
    }

    /// The model's Hugging Face `config.json` as a JSON value.
    pub fn hf_config(&self) -> Result<Json> {
        let arch = self.architecture()?;
        let hint = "a Llama GGUF file written by llama.cpp's converter has it";
        let size = |k: &str| self.require_usize(&format!("{arch}.{k}"), hint);
        let float = |k: &str, default: Option<f64>| -> Result<f64> {
            let key = format!("{arch}.{k}");
            let v = match (self.get(&key), default) {
                (None, Some(d)) => return Ok(d),
                (None, None) => self.require(&key, hint)?,
                (Some(v), _) => v,
            };
            // An f32 is given as its shortest decimal (1e-5, not 9.99999974737875e-6), the
            // value the converter read from config.json.
            self.typed(&key, v, "a float", |v| match v {
                Value::F32(x) => x.to_string().parse().ok(),
                _ => v.as_f64(),
            })
        };
        let (width, (heads, kv_heads)) = (size("embedding_length")?, self.heads()?);
        if let Some(scaling) = self.get(&format!("{arch}.rope.scaling.type"))
            && scaling.as_str() != Some("none")
        {
            return Err(self.unsupported(format!(
                "rotary scaling {scaling:?} is not supported; headroom builds the default rotary frequencies"
            )));
        }
        if self.tensor_info("rope_freqs.weight").is_some() {
            return Err(self.unsupported(
                "tensor 'rope_freqs.weight' (Llama 3.1 frequency scaling) is not supported; headroom builds the default rotary frequencies".into(),
            ));
        }
        if let Some(v) = self.get(&format!("{arch}.rope.dimension_count"))
            && v.as_u64() != Some((width / heads.max(1)) as u64)
        {
            return Err(self.unsupported(format!(
                "rope.dimension_count {v:?} is not the head dimension {width} / {heads}; headroom rotates whole heads"
            )));
        }
        let vocab = match self.get(&format!("{arch}.vocab_size")) {
            Some(_) => size("vocab_size")?,
            None => {
                let key = "tokenizer.ggml.tokens";
                let v = self.require(
                    key,
                    "without a vocab_size key, the token list gives the vocabulary",
                )?;
                self.typed(key, v, "an array", |v| v.as_array())?.len()
            }
        };
        let has = |name: &str| self.tensor_info(name).is_some();
        let (q_bias, o_bias) = (has("blk.0.attn_q.bias"), has("blk.0.attn_output.bias"));
        if q_bias != o_bias {
            return Err(self.unsupported(format!(
                "biases on q/k/v ({q_bias}) and on the output projection ({o_bias}) differ; a Llama has both or neither"
            )));
        }
        let mut config = json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "hidden_size": width,
            "intermediate_size": size("feed_forward_length")?,
            "num_hidden_layers": size("block_count")?,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "max_position_embeddings": size("context_length")?,
            "vocab_size": vocab,
            "rms_norm_eps": float("attention.layer_norm_rms_epsilon", None)?,
            "rope_theta": float("rope.freq_base", Some(10_000.0))?,
            "tie_word_embeddings": !has("output.weight"),
            "attention_bias": q_bias,
            "mlp_bias": has("blk.0.ffn_gate.bias"),
            "torch_dtype": "float32",
        });
        for (key, hf) in [
            ("bos", "bos_token_id"),
            ("eos", "eos_token_id"),
            ("padding", "pad_token_id"),
        ] {
            if let Some(id) = self
                .get(&format!("tokenizer.ggml.{key}_token_id"))
                .and_then(|v| v.as_u64())
            {
                config[hf] = json!(id);
            }
        }
        Ok(config)
    }

    /// The model's Hugging Face `config.json` text.
    pub fn hf_config_json(&self) -> Result<String> {
        let config = self.hf_config()?;
        Ok(serde_json::to_string_pretty(&config).expect("a JSON value serialises") + "\n")
    }

    /// The engine's configuration of the model (that of [`GgufFile::hf_config_json`]).
    pub fn llama_config(&self) -> Result<LlamaConfig> {
        let text = self.hf_config_json()?;
        LlamaConfig::from_hf_json(&text).map_err(|e| self.unsupported(e.to_string()))
    }

    /// The Hugging Face tensor `hf_name` (row-major) and its shape, dequantised and unpermuted.
    pub fn hf_tensor_named(&self, hf_name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let name = gguf_name(hf_name).ok_or_else(|| {
            self.unsupported(format!("'{hf_name}' is not a tensor of the Llama family"))
        })?;
        let info = self
            .tensor_info(&name)
            .ok_or_else(|| GgufError::MissingTensor {
                path: self.path().into(),
                tensor: name.clone(),
                hint: match hf_name {
                    "lm_head.weight" => format!(
                        "Hugging Face '{hf_name}' is absent: the file ties the output head to the token embedding (tie_word_embeddings)"
                    ),
                    _ => format!(
                        "Hugging Face '{hf_name}' is absent though the configuration implies it; convert the model again"
                    ),
                },
            })?;
        let shape = info.shape();
        let values = self.dequantize(info)?;
        let heads = match () {
            _ if name.contains(".attn_q.") => Some(self.heads()?.0),
            _ if name.contains(".attn_k.") => Some(self.heads()?.1),
            _ => None,
        };
        let Some(heads) = heads else {
            return Ok((shape, values));
        };
        let rows = shape.first().copied().unwrap_or(0);
        if heads == 0 || rows == 0 || !rows.is_multiple_of(2 * heads) {
            return Err(self.unsupported(format!(
                "tensor '{name}' has {rows} rows, not a whole number of rotary pairs for {heads} heads"
            )));
        }
        Ok((shape, unpermute_rows(&values, rows, heads)))
    }

    /// The values of one checkpoint tensor in its Hugging Face shape; a shape other than
    /// `tensor.shape` is an error naming the tensor.
    pub fn hf_tensor(&self, tensor: &HfTensor) -> Result<Vec<f32>> {
        let (shape, values) = self.hf_tensor_named(&tensor.name)?;
        match shape == tensor.shape {
            true => Ok(values),
            false => Err(GgufError::ShapeMismatch {
                path: self.path().into(),
                tensor: gguf_name(&tensor.name).unwrap_or_default(),
                found: shape,
                expected: tensor.shape.clone(),
            }),
        }
    }

    /// [`GgufFile::hf_tensor`] as the closure [`crate::models::llama::Llama::load_hf`] takes.
    pub fn hf_loader(&self) -> impl FnMut(&HfTensor) -> headroom_tensor::Result<Vec<f32>> + '_ {
        |tensor| {
            self.hf_tensor(tensor)
                .map_err(|e| TensorError::invalid("gguf", e.to_string()))
        }
    }
}
