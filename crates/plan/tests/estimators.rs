//! DeepSpeed's and Accelerate's estimators against their documented outputs.

use headroom_plan::estimators::{accelerate, deepspeed};
use headroom_plan::model::{ParamInventory, load_model};

const SETUP_8: deepspeed::EstimateSetup = deepspeed::EstimateSetup {
    gpus_per_node: 8,
    nodes: 1,
    additional_buffer_factor: 1.5,
};

#[test]
fn zero3_cold_reproduces_deepspeed_docs() {
    // docs/code-docs/source/memory.rst, estimate_zero3_model_states_mem_needs_all_cold(
    //   total_params=2851e6, largest_layer_params=32e6, num_gpus_per_node=8, num_nodes=1):
    //   71.69/0.12, 127.45/0.12, 63.72/0.78, 127.45/0.78, 1.43/6.09, 127.45/6.09 (GB = 2^30).
    let text = deepspeed::render(
        2851e6,
        Some(32e6),
        SETUP_8,
        &deepspeed::zero3_rows(2851e6, 32e6, SETUP_8),
    );
    let expected = "\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 8 GPUs per node.
SW: Model with 2851M total params, 32M largest layer params.
  per CPU  |  per GPU |   Options
   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1
  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1
  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0
";
    assert_eq!(text, expected);
}

#[test]
fn zero3_live_on_t5_3b_reproduces_deepspeed_docs() {
    // The same page, `_all_live` on AutoModel("t5-3b"): 2851M total, 32M largest layer,
    // 71.71/0.12, 127.48/0.12, 63.74/0.79, 127.48/0.79, 1.47/6.10, 127.48/6.10.
    let inv = ParamInventory::of(&load_model("t5-3b").unwrap());
    let (total, largest) = (inv.total() as f64, inv.largest_layer().1 as f64);
    let rows = deepspeed::zero3_rows(total, largest, SETUP_8);
    let gb: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            let g = |b: u64| format!("{:.2}", b as f64 / (1u64 << 30) as f64);
            (g(r.cpu_bytes), g(r.gpu_bytes))
        })
        .collect();
    let expected = [
        ("71.71", "0.12"),
        ("127.48", "0.12"),
        ("63.74", "0.79"),
        ("127.48", "0.79"),
        ("1.47", "6.10"),
        ("127.48", "6.10"),
    ];
    for (got, want) in gb.iter().zip(expected) {
        assert_eq!((got.0.as_str(), got.1.as_str()), want);
    }
}

#[test]
fn zero2_offload_row_reproduces_docs_and_no_offload_follows_current_code() {
    // Docs: cpu_offload=1 → 127.45GB per CPU, 5.31GB per GPU (P = 2851e6, 8 GPUs).
    // No offload, current code (PR #5099): 2P + int(18P/8) = 5,702e6 + 6,414.75e6
    //   = 12,116.75e6 B = 11.28 GiB (the docs' 15.93 is the pre-2024 4P + 16P/N).
    let rows = deepspeed::zero2_rows(2851e6, SETUP_8);
    let text = deepspeed::render(2851e6, None, SETUP_8, &rows);
    assert!(
        text.contains("SW: Model with 2851M total params.\n"),
        "{text}"
    );
    assert!(
        text.contains("  127.45GB |   5.31GB | offload_optimizer=cpu \n"),
        "{text}"
    );
    // CPU without offload: P·4·num_gpus_per_node·1.5 = 2851e6·48 B = 127.45 GiB.
    assert!(
        text.contains("  127.45GB |  11.28GB | offload_optimizer=none\n"),
        "{text}"
    );
}

#[test]
fn deepspeed_docs_t5_large_case_sums() {
    // memory.rst, t5-large on 4 GPUs: largest layer memory 125MB (>>20), case1 3291MB,
    // case2 125MB, case3 477MB.
    let inv = ParamInventory::of(&load_model("t5-large").unwrap());
    let (p, l) = (inv.total() as f64, inv.largest_layer().1 as f64);
    let setup = deepspeed::EstimateSetup {
        gpus_per_node: 4,
        nodes: 1,
        additional_buffer_factor: 1.5,
    };
    let mib = |b: u64| b >> 20;
    assert_eq!(
        mib(deepspeed::zero3(p, l, setup, false, false, true).1),
        3291
    );
    assert_eq!(mib(deepspeed::zero3(p, l, setup, true, true, true).1), 125);
    assert_eq!(mib(deepspeed::zero3(p, l, setup, true, false, true).1), 477);
}

#[test]
fn accelerate_table_for_bert_base_cased() {
    // Accelerate's test pins total 433,249,280 B and largest layer 90,669,056 B at fp32.
    // Current estimate_training_usage: float32 → 4 × 433,249,280 = 1.61 GB (docs: 1.61 GB);
    // float16 → 2 × 433,249,280 = 826.36 MB (docs: 826.36 MB); int8/int4 → "N/A".
    // Sizes: 433,249,280/2^20 = 413.18 MB, /2 → 206.59 MB, /4 → 103.29 MB, /8 → 51.65 MB
    // (docs); largest layer 90,669,056/2^20 = 86.47 MB (docs' 84.95 MB used the older rule).
    let inv = ParamInventory::of(&load_model("bert-base-cased").unwrap());
    let rows = accelerate::rows(&inv, &accelerate::DTYPES);
    let cells: Vec<[String; 4]> = rows
        .iter()
        .map(|r| {
            [
                r.dtype.clone(),
                accelerate::convert_bytes(r.largest_layer),
                accelerate::convert_bytes(r.total_size),
                r.training.map_or("N/A".into(), |t| {
                    accelerate::convert_bytes(accelerate::PySize::Int(t))
                }),
            ]
        })
        .collect();
    let s = |a: &str, b: &str, c: &str, d: &str| {
        [a.to_string(), b.to_string(), c.to_string(), d.to_string()]
    };
    assert_eq!(cells[0], s("float32", "86.47 MB", "413.18 MB", "1.61 GB"));
    assert_eq!(cells[1], s("float16", "43.23 MB", "206.59 MB", "826.36 MB"));
    assert_eq!(cells[2], s("int8", "21.62 MB", "103.29 MB", "N/A"));
    assert_eq!(cells[3], s("int4", "10.81 MB", "51.65 MB", "N/A"));
    let table = accelerate::render("bert-base-cased", &rows);
    assert!(table.starts_with('┌') && table.contains("Memory Usage for loading `bert-base-cased`"));
    // create_ascii_table: column widths max(len(header), len(values)) = 7, 13, 10, 19; cells are
    // str.center'ed: "86.47 MB".center(13) pads 3 left/2 right, "413.18 MB".center(10) 0/1,
    // "1.61 GB".center(19) 6/6.
    assert!(
        table.contains("│float32│   86.47 MB  │413.18 MB │      1.61 GB      │"),
        "{table}"
    );
}

/// A Llama of `layers` blocks, width 64, 4 heads (head_dim 16), MLP 128, vocabulary 100.
fn small_llama(layers: u64) -> ParamInventory {
    let json = format!(
        r#"{{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_hidden_layers": {layers}, "vocab_size": 100}}"#
    );
    ParamInventory::of(&headroom_plan::model::parse_config("small", &json).unwrap())
}

/// By hand: a block is q, k, v, o (64 × 64 = 4,096 each), gate, up, down (128 × 64 = 8,192
/// each) and two RMSNorms of 64: 41,088 parameters, 164,352 bytes at float32, the largest unit
/// (the embedding is 100 × 64 = 6,400). The base model (no lm_head) is the embedding, the blocks
/// and the final norm (64), × 4 bytes, plus the rotary inv_freq buffer (head_dim / 2 × 4 = 32 B).
fn llama_bytes(layers: u64) -> (u64, u64) {
    let block = 4 * 4_096 + 3 * 8_192 + 2 * 64;
    assert_eq!(block, 41_088);
    (4 * block, 4 * (6_400 + layers * block + 64) + 32)
}

#[test]
fn accelerate_counts_a_small_llama_as_by_hand() {
    let inv = small_llama(3);
    let (largest, total) = llama_bytes(3);
    assert_eq!((largest, total), (164_352, 518_944));
    let rows = accelerate::rows(&inv, &["float32", "float16"]);
    assert_eq!(rows[0].largest_layer, accelerate::PySize::Int(largest));
    assert_eq!(rows[0].total_size, accelerate::PySize::Int(total));
    assert_eq!(rows[0].training, Some(4 * total));
    assert_eq!(rows[1].largest_layer, accelerate::PySize::Float(82_176.0));
}

/// The config.json limit of 100,000 blocks (a million leaves, 100,000 units): counted in one
/// pass (a search of the units per leaf took minutes), with the same per-block numbers.
#[test]
fn accelerate_counts_the_100000_layer_limit() {
    let inv = small_llama(100_000);
    let (largest, total) = llama_bytes(100_000);
    assert_eq!(total, 16_435_225_888);
    let rows = accelerate::rows(&inv, &["float32"]);
    assert_eq!(rows[0].largest_layer, accelerate::PySize::Int(largest));
    assert_eq!(rows[0].total_size, accelerate::PySize::Int(total));
    // 16,435,225,888 / 2^30 = 15.306… GB.
    assert_eq!(accelerate::convert_bytes(rows[0].total_size), "15.31 GB");
}
