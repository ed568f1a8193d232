"""Writes the GGUF fixtures the engine's GGUF reader is held to (crates/nn/tests/data/gguf/).

The reference is llama.cpp's own Python package, gguf-py (`pip install gguf`): its GGUFWriter
writes the files and `gguf.quants.quantize` / `gguf.quants.dequantize` produce and read the
block formats. Nothing here is computed by headroom.

  blocks.gguf          one (2, 256) tensor per block format headroom reads (F32, F16, BF16,
                       Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), one in a
                       format it refuses (IQ4_NL), a 3-dimensional F32 tensor, a metadata key of
                       every value type (`test.*`), and a data alignment of 64.
                       Formats gguf-py can quantise are quantised from random normals; the
                       k-quants, which gguf-py only dequantises, are random bytes with sane f16
                       scales.
  blocks.safetensors   gguf-py's dequantisation of each tensor (float32, same names and shapes).
  tiny-llama.gguf      a tiny random Llama (2 layers, width 32, 4 heads, 2 KV heads, ffn 64,
                       biases on q/k/v/o, untied head) converted as llama.cpp's
                       convert_hf_to_gguf.py does: Hugging Face names to GGUF names, q and k
                       rows permuted (`permute` below, its formula), layer 0 in F32, layer 1's
                       projections quantised (Q4_1, Q5_0, Q8_0, Q4_0, Q5_1, F16), the token
                       embedding in Q8_0; and a byte-level BPE tokenizer in the metadata
                       (3 control tokens, the 256 byte symbols, 9 merges, pre-tokenizer smollm).
  tiny-llama.safetensors  the Hugging Face tensors (names and [out, in] layout) the reader must
                       give back: the original weights for F32 tensors, and for quantised ones
                       gguf-py's dequantize(quantize(W)) of the unpermuted weights.
  tiny-llama.config.json  the Hugging Face config.json of the tiny model.
  tokenizer-default.gguf  the same tokenizer with one more merge ("1 2") and llama.cpp's
                       fallback pre-tokenizer (`default`), no tensors.

Run: python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf numpy safetensors
     /tmp/gguf-venv/bin/python scripts/gguf-fixtures.py
"""

import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "nn", "tests", "data", "gguf")
rng = np.random.default_rng(38)


def f16_bytes(x):
    return np.array([x], dtype=np.float16).view(np.uint8)


def k_quant_bytes(qtype, rows):
    """Random blocks of a k-quant with finite f16 scales at the offsets of ggml-common.h."""
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, 256 // block * size), dtype=np.uint8)
    scales = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}
    for b in range(data.shape[1] // size):
        for at in scales[qtype]:
            for r in range(rows):
                o = b * size + at
                data[r, o:o + 2] = f16_bytes(rng.uniform(-0.1, 0.1))
    return data


def blocks():
    w = GGUFWriter(os.path.join(OUT, "blocks.gguf"), "test")
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.25)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", -1.5)
    w.add_array("test.array_i32", [1, -2, 3])
    w.add_array("test.array_nested", [["a", "b"], ["c"]])
    expected = {}
    for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
        values = rng.normal(size=(2, 256)).astype(np.float32)
        data = quantize(values, qtype)
        w.add_tensor(qtype.name.lower(), data, raw_dtype=qtype)
        expected[qtype.name.lower()] = dequantize(data, qtype).astype(np.float32)
    for qtype in [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]:
        data = k_quant_bytes(qtype, 2)
        w.add_tensor(qtype.name.lower(), data, raw_dtype=qtype)
        expected[qtype.name.lower()] = dequantize(data, qtype).astype(np.float32)
    w.add_tensor("iq4_nl", rng.integers(0, 256, size=(2, 8 * 18), dtype=np.uint8), raw_dtype=T.IQ4_NL)
    cube = rng.normal(size=(2, 3, 4)).astype(np.float32)
    w.add_tensor("cube", cube)
    expected["cube"] = cube
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(expected, os.path.join(OUT, "blocks.safetensors"))


def permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py, LlamaModel.permute (its formula)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def bytes_to_unicode():
    """GPT-2's byte-to-symbol table (openai/gpt-2 src/encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]


def add_tokenizer(w, pre, merges):
    """A byte-level BPE: 3 control tokens, byte b at 3 + b, then each merge's result."""
    byte_symbol = bytes_to_unicode()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + [byte_symbol[b] for b in range(256)] + [m.replace(" ", "") for m in merges]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    return len(tokens)


def default_tokenizer():
    """llama.cpp's fallback pre-tokenizer, with one more merge ("1 2") that only its
    three-digit split lets form."""
    w = GGUFWriter(os.path.join(OUT, "tokenizer-default.gguf"), "llama")
    add_tokenizer(w, "default", MERGES + ["1 2"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_llama():
    cfg = dict(width=32, heads=4, kv_heads=2, ffn=64, layers=2, context=128)
    vocab = 3 + 256 + len(MERGES)
    width, ffn, hd = cfg["width"], cfg["ffn"], cfg["width"] // cfg["heads"]
    kv = cfg["kv_heads"] * hd

    hf = {"model.embed_tokens.weight": rng.normal(size=(vocab, width))}
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        for name, shape in [
            ("self_attn.q_proj.weight", (width, width)), ("self_attn.q_proj.bias", (width,)),
            ("self_attn.k_proj.weight", (kv, width)), ("self_attn.k_proj.bias", (kv,)),
            ("self_attn.v_proj.weight", (kv, width)), ("self_attn.v_proj.bias", (kv,)),
            ("self_attn.o_proj.weight", (width, width)), ("self_attn.o_proj.bias", (width,)),
            ("mlp.gate_proj.weight", (ffn, width)), ("mlp.up_proj.weight", (ffn, width)),
            ("mlp.down_proj.weight", (width, ffn)),
            ("input_layernorm.weight", (width,)), ("post_attention_layernorm.weight", (width,)),
        ]:
            hf[p + name] = rng.normal(size=shape)
    hf["model.norm.weight"] = rng.normal(size=(width,))
    hf["lm_head.weight"] = rng.normal(size=(vocab, width))
    hf = {k: v.astype(np.float32) for k, v in hf.items()}

    gguf_names = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    layer1 = {"attn_q": T.Q4_1, "attn_k": T.Q4_1, "attn_v": T.Q5_0, "attn_output": T.Q8_0,
              "ffn_gate": T.Q4_0, "ffn_up": T.Q5_1, "ffn_down": T.F16}
    w = GGUFWriter(os.path.join(OUT, "tiny-llama.gguf"), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(cfg["layers"])
    w.add_context_length(cfg["context"])
    w.add_embedding_length(width)
    w.add_feed_forward_length(ffn)
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv_heads"])
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    assert add_tokenizer(w, "smollm", MERGES) == vocab

    expected = {}
    for name, value in hf.items():
        if name == "model.embed_tokens.weight":
            gname, qtype = "token_embd.weight", T.Q8_0
        elif name == "model.norm.weight":
            gname, qtype = "output_norm.weight", T.F32
        elif name == "lm_head.weight":
            gname, qtype = "output.weight", T.F32
        else:
            _, _, i, module = name.split(".", 3)
            module, kind = module.rsplit(".", 1)
            base = gguf_names[module]
            gname = f"blk.{i}.{base}.{kind}"
            qtype = layer1.get(base, T.F32) if i == "1" and kind == "weight" else T.F32
        stored = value
        if "q_proj" in name:
            stored = permute(value, cfg["heads"])
        elif "k_proj" in name:
            stored = permute(value, cfg["kv_heads"])
        data = quantize(stored, qtype)
        w.add_tensor(gname, data, raw_dtype=qtype)
        # Quantisation works on blocks within a row and the permutation moves whole rows, so
        # the unpermuted reference is the round trip of the unpermuted weights.
        reference = dequantize(quantize(value, qtype), qtype).astype(np.float32)
        if "q_proj" in name or "k_proj" in name:
            heads = cfg["heads"] if "q_proj" in name else cfg["kv_heads"]
            assert np.array_equal(permute(reference, heads), dequantize(data, qtype))
        expected[name] = reference
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(expected, os.path.join(OUT, "tiny-llama.safetensors"))

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": width, "intermediate_size": ffn, "num_hidden_layers": cfg["layers"],
        "num_attention_heads": cfg["heads"], "num_key_value_heads": cfg["kv_heads"],
        "max_position_embeddings": cfg["context"], "vocab_size": vocab, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "tie_word_embeddings": False, "attention_bias": True,
        "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    }
    with open(os.path.join(OUT, "tiny-llama.config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    blocks()
    tiny_llama()
    default_tokenizer()
