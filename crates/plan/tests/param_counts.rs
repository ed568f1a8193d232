//! Parameter counts of the built-in models against published totals, and against counts
//! derived by hand from the configs (derivations in the comments).

use headroom_plan::model::{ParamInventory, load_model};

fn count(name: &str) -> u64 {
    ParamInventory::of(&load_model(name).unwrap()).total()
}

#[test]
fn gpt2_family_matches_published_totals() {
    // keras-hub presets gpt2_{base,medium,large,extra_large}_en "params" (docs/sources.md §7).
    assert_eq!(count("gpt2"), 124_439_808);
    assert_eq!(count("gpt2-medium"), 354_823_168);
    assert_eq!(count("gpt2-large"), 774_030_080);
    assert_eq!(count("gpt2-xl"), 1_557_611_200);
}

#[test]
fn llama_2_matches_published_totals() {
    // keras-hub llama2_7b_en and together-python pcount (docs/sources.md §7).
    assert_eq!(count("llama-2-7b"), 6_738_415_616);
    assert_eq!(count("llama-2-13b"), 13_015_864_320);
}

#[test]
fn bert_base_cased_matches_accelerates_byte_count() {
    // Accelerate's own test (tests/test_cli.py, test_transformers_model): BertModel total
    // size 433,249,280 B at fp32, of which two int64 [1, 512] buffers = 8,192 B.
    // (433,249,280 − 8,192) / 4 = 108,310,272 parameters.
    assert_eq!(count("bert-base-cased"), 108_310_272);
}

#[test]
fn pythia_matches_the_pythia_paper() {
    // Biderman et al. 2023, Table 1: total 162,322,944 and 1,011,781,632 parameters.
    // Non-embedding check for 160M: 12·(4h + (3h² + 3h) + (h² + h) + (4h² + 4h) + (4h² + h)) + 2h
    // at h = 768 = 12·7,087,872 + 1,536 = 85,056,000; plus 2·50304·768 = 77,266,944.
    assert_eq!(count("pythia-160m"), 162_322_944);
    assert_eq!(count("pythia-1b"), 1_011_781_632);
}

#[test]
fn gqa_llamas_match_hand_derivations() {
    // Llama/Mistral closed form (docs/sources.md §7):
    //   L·(2h² + 2·h·kv·(h/heads) + 3·h·inter + 2h) + h + V·h·(1 if tied else 2).
    // llama-3-8b: h=4096, kv·hd=1024, inter=14336, L=32, V=128256:
    //   layer = 33,554,432 + 8,388,608 + 176,160,768 + 8,192 = 218,112,000
    //   32·218,112,000 + 4,096 + 2·525,336,576 = 8,030,261,248 (Meta's "8.03B").
    assert_eq!(count("llama-3-8b"), 8_030_261_248);
    // llama-3-70b: h=8192, kv·hd=1024, inter=28672, L=80:
    //   layer = 134,217,728 + 16,777,216 + 704,643,072 + 16,384 = 855,654,400
    //   80·855,654,400 + 8,192 + 2·1,050,673,152 = 70,553,706,496.
    assert_eq!(count("llama-3-70b"), 70_553_706_496);
    // llama-2-70b: same blocks, V=32000: 68,452,352,000 + 8,192 + 2·262,144,000.
    assert_eq!(count("llama-2-70b"), 68_976_648_192);
    // mistral-7b: llama-3-8b blocks, V=32000: 6,979,584,000 + 4,096 + 2·131,072,000.
    assert_eq!(count("mistral-7b"), 7_241_732_096);
    // llama-3.2-1b, tied: h=2048, q=2048, kv=512, inter=8192, L=16:
    //   layer = 8,388,608 + 2,097,152 + 50,331,648 + 4,096 = 60,821,504
    //   16·60,821,504 + 2,048 + 262,668,288 (one tied table) = 1,235,814,400.
    assert_eq!(count("llama-3.2-1b"), 1_235_814_400);
}

#[test]
fn mixtral_counts_every_expert() {
    // Per layer: attention 41,943,040 + experts 8·3·4096·14336 = 1,409,286,144
    //   + router 8·4096 = 32,768 + norms 8,192 = 1,451,270,144.
    // 32 layers + 4,096 + 2·131,072,000 = 46,702,792,704 (Mistral AI's "46.7B").
    assert_eq!(count("mixtral-8x7b"), 46_702_792_704);
}

#[test]
fn qwen2_counts_qkv_biases() {
    // h=3584, heads 28 (hd 128), kv 4 (kv·hd 512), inter 18944, L=28, V=152064, untied.
    //   q 3584² + 3584, k and v 3584·512 + 512 each, o 3584² → 29,364,736
    //   mlp 3·3584·18944 = 203,685,888; norms 7,168 → layer 233,057,792
    //   28·233,057,792 + 3,584 + 2·544,997,376 = 7,615,616,512 (Qwen's "7.61B").
    assert_eq!(count("qwen2.5-7b"), 7_615_616_512);
}

#[test]
fn bert_large_and_t5_match_hand_derivations() {
    // BERT closed form: (V + n_pos + 2)·h + 2h + L·(12h² + 13h) + (h² + h).
    // bert-large-uncased: 31,036·1024 + 2,048 + 24·12,596,224 + 1,049,600 = 335,141,888.
    assert_eq!(count("bert-large-uncased"), 335_141_888);
    // t5-large: shared 32128·1024 = 32,899,072;
    //   encoder block 4·1024² + 2·1024·4096 + 2·1024 = 12,584,960, ×24, + rel. bias 32·16 + 1024;
    //   decoder block 8·1024² + 2·1024·4096 + 3·1024 = 16,780,288, ×24, + 512 + 1024;
    //   total 737,668,096 — DeepSpeed's memory docs print "total params: 737.67M".
    assert_eq!(count("t5-large"), 737_668_096);
    // t5-3b (inner 4096, d_ff 16384, 32 heads): 32,899,072 + 1,208,010,752 + 1,610,688,512.
    assert_eq!(count("t5-3b"), 2_851_598_336);
}

#[test]
fn largest_layer_is_the_biggest_single_module() {
    // DeepSpeed docs: t5-large "largest layer params: 32.90M" = the shared 32128×1024 table.
    let t5 = ParamInventory::of(&load_model("t5-large").unwrap());
    assert_eq!(t5.largest_layer(), ("shared", 32_899_072));
    // Llama-2-7B: embed_tokens and lm_head are both 32000×4096; the first one is reported.
    let llama = ParamInventory::of(&load_model("llama-2-7b").unwrap());
    assert_eq!(llama.largest_layer(), ("model.embed_tokens", 131_072_000));
}

#[test]
fn accelerate_sizes_match_accelerates_test() {
    // tests/test_cli.py::test_transformers_model: largest_layer 90,669,056 B, total 433,249,280 B.
    let bert = ParamInventory::of(&load_model("bert-base-cased").unwrap());
    assert_eq!(bert.accelerate_total_bytes(), 433_249_280);
    assert_eq!(bert.accelerate_largest_layer_bytes(), 90_669_056);
}

#[test]
fn groups_collapse_block_indices_and_sum_to_the_total() {
    let inv = ParamInventory::of(&load_model("llama-2-7b").unwrap());
    let groups = inv.groups();
    let q = groups
        .iter()
        .find(|g| g.name == "model.layers.*.self_attn.q_proj")
        .unwrap();
    assert_eq!((q.count, q.params_each), (32, 4096 * 4096));
    assert_eq!(
        groups.iter().map(|g| g.params_total).sum::<u64>(),
        inv.total()
    );
    // One block: 4·4096² + 3·4096·11008 + 2·4096 = 202,383,360.
    assert_eq!(inv.max_block_params(), 202_383_360);
}

fn count_config(text: &str) -> u64 {
    ParamInventory::of(&headroom_plan::model::parse_config("test", text).unwrap()).total()
}

#[test]
fn gemma_gemma2_and_phi3_match_hand_derivations_and_published_totals() {
    // google/gemma-7b (config.json: V 256,000, h 3,072, 28 layers, 16 heads of head_dim 256,
    // 16 kv heads, intermediate 24,576; GemmaConfig ties the embeddings by default):
    //   layer = 4·3,072·4,096 + 3·3,072·24,576 + 2·3,072 = 276,830,208
    //   28·276,830,208 + 3,072 + 256,000·3,072 = 8,537,680,896 (the model card's 8.54B).
    let gemma = r#"{"model_type": "gemma", "vocab_size": 256000, "hidden_size": 3072,
        "intermediate_size": 24576, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 16, "head_dim": 256, "max_position_embeddings": 8192}"#;
    assert_eq!(count_config(gemma), 8_537_680_896);
    // Without head_dim the config class's default, 256, applies.
    assert_eq!(
        count_config(&gemma.replace(r#""head_dim": 256,"#, "")),
        8_537_680_896
    );
    // google/gemma-2-9b (h 3,584, 42 layers, 16 heads and 8 kv heads of 256, intermediate
    // 14,336); four norms a layer (pre/post attention, pre/post feed-forward):
    //   layer = 2·3,584·4,096 + 2·3,584·2,048 + 3·3,584·14,336 + 4·3,584 = 198,195,200
    //   42·198,195,200 + 3,584 + 256,000·3,584 = 9,241,705,984 (9.24B).
    let gemma2 = r#"{"model_type": "gemma2", "vocab_size": 256000, "hidden_size": 3584,
        "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "max_position_embeddings": 8192}"#;
    assert_eq!(count_config(gemma2), 9_241_705_984);
    // microsoft/Phi-3-mini-4k-instruct (V 32,064, h 3,072, 32 layers, 32 heads, intermediate
    // 8,192, untied): fused qkv_proj (3h × h) and gate_up_proj (2·8,192 × h) count as the
    // separate matrices would:
    //   layer = 4·3,072² + 3·3,072·8,192 + 2·3,072 = 113,252,352
    //   32·113,252,352 + 3,072 + 2·32,064·3,072 = 3,821,079,552 (3.8B).
    let phi3 = r#"{"model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
        "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "max_position_embeddings": 4096, "tie_word_embeddings": false}"#;
    assert_eq!(count_config(phi3), 3_821_079_552);
    let spec = headroom_plan::model::parse_config("phi3", phi3).unwrap();
    let inventory = ParamInventory::of(&spec);
    let (largest, _) = inventory.largest_layer();
    assert!(
        largest.contains("embed_tokens") || largest.contains("lm_head"),
        "{largest}"
    );
}

#[test]
fn unsupported_families_name_the_supported_ones() {
    let e = headroom_plan::model::parse_config("x", r#"{"model_type": "deepseek_v2"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("deepseek_v2") && e.contains("qwen2_moe") && e.contains("gemma2"),
        "{e}"
    );
    // Qwen2-MoE variants with dense blocks are refused by the field that makes them so.
    let moe = |extra: &str| {
        let text = format!(
            r#"{{"model_type": "qwen2_moe", "hidden_size": 64, "num_attention_heads": 4,
                "num_hidden_layers": 2, "vocab_size": 100, "intermediate_size": 128{extra}}}"#
        );
        headroom_plan::model::parse_config("x", &text)
    };
    assert!(moe("").is_ok());
    let e = moe(r#", "decoder_sparse_step": 2"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("decoder_sparse_step"), "{e}");
    let e = moe(r#", "mlp_only_layers": [0]"#).unwrap_err().to_string();
    assert!(e.contains("mlp_only_layers"), "{e}");
    // More experts per token than experts: named by Qwen2-MoE's own field.
    let e = moe(r#", "num_experts": 2, "num_experts_per_tok": 4"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("(4) exceeds num_experts (2)"), "{e}");
}

#[test]
fn llama_3_1_and_3_2_match_hand_counts() {
    // Llama-3.2-3B (tied head): 28 blocks of q 3072·3072, k and v 3072·1024 each, o 3072·3072,
    // gate, up and down 3072·8192 each, two norms 3072:
    //   28·(2·9,437,184 + 2·3,145,728 + 3·25,165,824 + 6,144) = 28·100,669,440 = 2,818,744,320,
    // plus the embedding 128,256·3072 = 394,002,432 and the final norm 3072: 3,212,749,824,
    // the count its Hub model card rounds to 3.21B.
    assert_eq!(count("llama-3.2-3b"), 3_212_749_824);
    // Llama-3.1-8B has Llama-3-8B's shapes (only the RoPE scaling and the context differ).
    assert_eq!(count("llama-3.1-8b"), count("llama-3-8b"));
    assert_eq!(count("llama-3.1-8b"), 8_030_261_248);
}

#[test]
fn llama_3_1_70b_and_405b_match_hand_counts() {
    // Llama-3.1-70B: 80 blocks of q and o 8192·8192, k and v 8192·1024, gate, up and down
    // 8192·28672, two norms 8192:
    //   80·(2·67,108,864 + 2·8,388,608 + 3·234,881,024 + 16,384) = 80·855,654,400
    //   = 68,452,352,000, plus the untied embedding and head 2·128,256·8192 = 2,101,346,304 and
    // the final norm 8192: 70,553,706,496.
    assert_eq!(count("llama-3.1-70b"), 70_553_706_496);
    // Llama-3.1-405B: 126 blocks of q and o 16384·16384, k and v 16384·1024, gate, up and down
    // 16384·53248, two norms 16384:
    //   126·(2·268,435,456 + 2·16,777,216 + 3·872,415,232 + 32,768) = 126·3,187,703,808
    //   = 401,650,679,808, plus 2·128,256·16384 = 4,202,692,608 and 16384: 405,853,388,800.
    assert_eq!(count("llama-3.1-405b"), 405_853_388_800);
}

#[test]
fn qwen1_5_moe_matches_hand_counts_and_its_published_totals() {
    // Qwen1.5-MoE-A2.7B (Qwen2MoeForCausalLM), per block: q, k, v 2048·2048 with biases
    // 3·(4,194,304 + 2048), o 4,194,304; router 60·2048; 60 experts of gate, up, down
    // 2048·1408 = 60·8,650,752; the shared expert 3·2048·5632 = 34,603,008 and its gate 2048;
    // two norms 2·2048. That is 570,560,512 per block, ×24 = 13,693,452,288; embedding and head
    // 2·151,936·2048 = 622,329,856 and the final norm 2048: 14,315,784,192 — Qwen's "14.3B
    // parameters in total".
    assert_eq!(count("qwen1.5-moe-a2.7b"), 14_315_784_192);
    // Activated per token: the attention's matmuls, the router, the shared expert and its
    // gate, 4 of the 60 experts (4/60 · 519,045,120 = 34,603,008) and the head; with the
    // embedding table's 311,164,928, 2,688,925,696 — Qwen's "2.7B activated".
    let spec = load_model("qwen1.5-moe-a2.7b").unwrap();
    let inv = ParamInventory::of(&spec);
    let per_block = 4.0 * 4_194_304.0 + 60.0 * 2048.0 + 2048.0 + 34_603_008.0 + 34_603_008.0;
    let active = 24.0 * per_block + 311_164_928.0;
    assert!((inv.active_matmul_params(&spec) - active).abs() < 1.0);
    assert_eq!(active as u64 + 311_164_928, 2_688_925_696);
}
