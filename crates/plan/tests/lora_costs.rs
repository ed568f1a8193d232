//! What the analytical model charges for LoRA and QLoRA, against counts derived by hand for
//! Llama-2-7B (hidden 4,096, MLP 11,008, 32 layers, vocabulary 32,000, untied head) at rank 8
//! on the query and value projections, the setting of PEFT's and the QLoRA paper's examples.

use crate::support;

use headroom_plan::cost::{Problem, evaluate};
use headroom_plan::strategy::{BaseWeights, Category, Lora, Precision};
use support::{plain_strategy, problem};

/// Llama-2-7B on one A100-80GB, one sequence of 512 tokens, with `base` under the adapters.
fn llama(base: BaseWeights) -> Problem {
    let p = problem("llama-2-7b", "A100-80GB", 1, 1, 512, 1);
    let lora = Lora::new(8, 16.0, "q,v".parse().unwrap(), base).unwrap();
    let workload = p.workload.clone().with_lora(&p.spec, lora).unwrap();
    Problem::new(p.spec, p.hardware, workload, p.cost)
}

// Each adapter is 8·(4,096 + 4,096) = 65,536 elements; two per layer, 32 layers.
const ADAPTERS: u64 = 65_536 * 2 * 32;
const BASE: u64 = 6_738_415_616;

#[test]
fn lora_model_states_are_the_adapters_and_a_frozen_16_bit_base() {
    assert_eq!(ADAPTERS, 4_194_304); // PEFT prints "trainable params: 4,194,304"
    let p = llama(BaseWeights::Plain);
    assert_eq!(p.facts.params, ADAPTERS);
    assert_eq!(p.facts.total_params, BASE + ADAPTERS);
    let plan = evaluate(&p, &plain_strategy(Precision::Bf16Mixed, 1, 1));
    let at = |c: Category| plan.memory.breakdown.steady[c];
    assert_eq!(at(Category::Parameter), 2 * (BASE + ADAPTERS));
    // Gradients exist during the step only (freed between steps, as `zero_grad` sets them to
    // None).
    assert_eq!(
        plan.memory.breakdown.at_peak[Category::Gradient],
        2 * ADAPTERS
    );
    assert_eq!(at(Category::Gradient), 0);
    assert_eq!(at(Category::MasterWeight), 4 * ADAPTERS);
    assert_eq!(at(Category::OptimizerState), 8 * ADAPTERS);
}

#[test]
fn qlora_stores_the_block_projections_in_nf4_with_double_quantised_scales() {
    let p = llama(BaseWeights::Nf4);
    let plan = evaluate(&p, &plain_strategy(Precision::Bf16Mixed, 1, 1));
    // NF4 of n elements: n/2 code bytes, n/64 absmax bytes, 4 bytes per 256 absmax, 4 bytes of
    // offset. q, k, v, o (4,096²): 8,388,608 + 262,144 + 4,096 + 4 = 8,654,852 each; gate, up,
    // down (11,008 × 4,096 = 45,088,768): 22,544,384 + 704,512 + 11,008 + 4 = 23,259,908 each.
    let per_layer = 4 * 8_654_852 + 3 * 23_259_908;
    // Embeddings, the head and 65 norms of 4,096 stay bf16: 2·32,000·4,096 + 65·4,096.
    let plain = 2 * 32_000 * 4_096 + 65 * 4_096;
    let expected = 32 * per_layer + 2 * plain + 2 * ADAPTERS;
    assert_eq!(expected, 3_873_981_312);
    assert_eq!(plan.memory.breakdown.steady[Category::Parameter], expected);
    // About 4.127 bits per quantised weight, as the QLoRA paper states.
    let quantised: u64 = 32 * (4 * 4096 * 4096 + 3 * 11_008 * 4096);
    let bits = 8.0 * (32 * per_layer) as f64 / quantised as f64;
    assert!((bits - 4.127).abs() < 0.001, "{bits}");
    // The adapters' states are LoRA's; the 16-bit base of plain LoRA is 3.3 times larger.
    let lora = evaluate(
        &llama(BaseWeights::Plain),
        &plain_strategy(Precision::Bf16Mixed, 1, 1),
    );
    assert_eq!(
        lora.memory.breakdown.steady[Category::OptimizerState],
        plan.memory.breakdown.steady[Category::OptimizerState]
    );
    let ratio = lora.memory.breakdown.steady[Category::Parameter] as f64 / expected as f64;
    assert!((3.4..3.5).contains(&ratio), "{ratio}");
}

#[test]
fn targets_a_model_does_not_have_are_refused_by_name() {
    let p = problem("gpt2", "A100-80GB", 1, 1, 512, 1);
    // GPT-2 has no gated MLP.
    let lora = Lora::new(8, 16.0, "gate".parse().unwrap(), BaseWeights::Plain).unwrap();
    let e = p
        .workload
        .clone()
        .with_lora(&p.spec, lora)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--lora-targets gate") && e.contains("gpt2"),
        "{e}"
    );
    // Its fused c_attn serves q, k, v and qkv alike: one adapter of 8·(768 + 2,304) per layer.
    let lora = Lora::new(8, 16.0, "q,v".parse().unwrap(), BaseWeights::Plain).unwrap();
    let w = p.workload.clone().with_lora(&p.spec, lora).unwrap();
    let q = Problem::new(p.spec, p.hardware, w, p.cost);
    assert_eq!(q.facts.params, 12 * 8 * (768 + 2304));
}

#[test]
fn lora_keeps_only_the_projection_inputs_its_adapters_read() {
    use headroom_plan::cost::activation::model_activations;
    use headroom_plan::strategy::{Attention, Checkpoint, Loss};
    let acts = |p: &Problem| {
        model_activations(
            &p.spec,
            512.0,
            1.0,
            2.0,
            Attention::MemoryEfficient,
            Checkpoint::None,
            Loss::Plain,
        )
    };
    let full = problem("llama-2-7b", "A100-80GB", 1, 1, 512, 1);
    let lora = llama(BaseWeights::Plain);
    // Rank 8 on q, v of Llama-2-7B at 512 tokens, 2-byte activations: per block the output
    // projection's input (4,096), the MLP's input (4,096) and the gated product (11,008) are no
    // longer kept, two rank-8 intermediates are; outside the blocks the head's input goes.
    let per_block = -2.0 * 512.0 * (4096.0 + 4096.0 + 11_008.0) + 2.0 * 2.0 * 512.0 * 8.0;
    let expected = 32.0 * per_block - 2.0 * 512.0 * 4096.0;
    assert_eq!(acts(&lora) - acts(&full), expected);
    assert_eq!(expected, -632_815_616.0);
}

#[test]
fn lora_dropout_keeps_a_dropped_copy_and_a_mask_per_adapted_input() {
    use headroom_plan::cost::activation::model_activations;
    use headroom_plan::strategy::{Attention, Checkpoint, Loss};
    let acts = |p: &Problem| {
        model_activations(
            &p.spec,
            512.0,
            1.0,
            2.0,
            Attention::MemoryEfficient,
            Checkpoint::None,
            Loss::Plain,
        )
    };
    let plain = llama(BaseWeights::Plain);
    let p = llama(BaseWeights::Plain);
    let workload = p.workload.clone().with_lora_dropout(0.05).unwrap();
    let dropped = Problem::new(p.spec, p.hardware, workload, p.cost);
    // Rank 8 on q and v of Llama-2-7B at 512 tokens, 2-byte activations. Without dropout a
    // block keeps the attention's input once (4,096 features, 2 bytes) for both adapters; with
    // PEFT's per-module dropout q and v each keep their own dropped copy (2 bytes) and its
    // 1-byte mask, and the shared input is kept by no one: 512·(2·4,096·3 − 4,096·2) bytes.
    let per_block = 512.0 * (2.0 * 4096.0 * 3.0 - 4096.0 * 2.0);
    assert_eq!(per_block, 8_388_608.0);
    assert_eq!(acts(&dropped) - acts(&plain), 32.0 * per_block);
    // A probability is needed, and a LoRA run.
    let w = plain.workload.clone();
    assert!(w.clone().with_lora_dropout(1.0).is_err());
    assert!(w.with_lora_dropout(-0.1).is_err());
    let full = problem("llama-2-7b", "A100-80GB", 1, 1, 512, 1);
    let e = full
        .workload
        .with_lora_dropout(0.1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--lora-rank"), "{e}");
}

/// Llama-2-70B (hidden 8,192, MLP 28,672, 8 key/value heads of 128, 80 layers, vocabulary
/// 32,000, untied) on two RTX 4090s under FSDP, pure bf16, parameters and optimizer on the
/// host, with or without QLoRA on every linear of the blocks at rank 8.
fn llama70b_fsdp_offloaded(lora: bool) -> headroom_plan::cost::Plan {
    llama70b_fsdp(lora, true)
}

/// As [`llama70b_fsdp_offloaded`], the parameters and optimizer on the host or not.
fn llama70b_fsdp(lora: bool, offload: bool) -> headroom_plan::cost::Plan {
    use headroom_plan::strategy::{
        Attention, Checkpoint, Framework, Loss, Offload, Optimizer, Placement, Strategy, ZeroStage,
    };
    let p = support::problem("llama-2-70b", "RTX-4090", 2, 1, 2048, 8);
    let workload = match lora {
        true => {
            let l = Lora::new(8, 16.0, "all-linear".parse().unwrap(), BaseWeights::Nf4).unwrap();
            p.workload.clone().with_lora(&p.spec, l).unwrap()
        }
        false => p.workload.clone(),
    };
    let p = Problem::new(p.spec, p.hardware, workload, p.cost).with_framework(Framework::Fsdp);
    let s = Strategy {
        precision: Precision::Bf16,
        optimizer: Optimizer::AdamW,
        placement: Placement {
            zero_stage: ZeroStage::new(3).unwrap(),
            offload_optimizer: if offload { Offload::Cpu } else { Offload::None },
            offload_params: if offload { Offload::Cpu } else { Offload::None },
            offload_activations: Offload::None,
        },
        checkpoint: Checkpoint::ALL_BLOCKS,
        attention: Attention::MemoryEfficient,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch: 2,
        accumulation: 2,
    };
    evaluate(&p, &s)
}

#[test]
fn fsdp_shards_the_nf4_codes_and_keeps_the_quantisation_state_whole() {
    // Between steps each of the 2 ranks holds half of what FSDP flattens: the bf16 root
    // (embedding, head, final norm: 524,296,192 elements), each block's NF4 codes (q, o
    // 33,554,432; k, v 4,194,304; gate, up, down 117,440,512 bytes) and bf16 norms (32,768
    // bytes) and its adapters (1,294,336 bf16 elements), over 80 blocks; and the whole NF4
    // quantisation state, 13,578,268 bytes a block (see the offload test), which bitsandbytes
    // keeps on the `Linear4bit` module, outside FSDP's flat parameters.
    let codes = 2 * 33_554_432 + 2 * 4_194_304 + 3 * 117_440_512 + 32_768u64;
    let sharded = 2 * 524_296_192 + 80 * (codes + 2 * 1_294_336u64);
    assert_eq!(sharded, 35_483_828_224);
    let state = 80 * 13_578_268u64;
    let plan = llama70b_fsdp(true, false);
    assert_eq!(
        plan.memory.breakdown.steady[Category::Parameter],
        sharded / 2 + state
    );
}

#[test]
fn fsdp_gathers_the_frozen_base_units_under_cpu_offload() {
    use headroom_plan::cost::memory::Phase;
    // FSDP all-gathers the root unit (embedding + head 2·32,000·8,192 + final norm 8,192 =
    // 524,296,192 elements) and two blocks to the device, offloaded or not, frozen or not.
    let root = 524_296_192u64;
    // A block: q, o 8,192²; k, v 8,192·1,024; gate, up, down 8,192·28,672; two norms 8,192.
    let block = 2 * 67_108_864 + 2 * 8_388_608 + 3 * 234_881_024 + 2 * 8_192;
    assert_eq!(block, 855_654_400u64);
    let full = llama70b_fsdp_offloaded(false);
    assert_eq!(full.memory.peak_phase, Phase::ForwardBackward);
    assert_eq!(
        full.memory.breakdown.at_peak[Category::Parameter],
        2 * (root + 2 * block)
    );
    // QLoRA: the block's linears in NF4 (n/2 + n/64 + 4·⌈n/16,384⌉ + 4 bytes each): q, o
    // 34,619,396; k, v 4,327,428; gate, up, down 121,167,876; the norms' 32,768 bf16 bytes; and
    // its adapters 8·(16,384·2 + 9,216·2 + 36,864·3) = 1,294,336 elements in bf16.
    // Of those bytes FSDP gathers the codes (n/2: q, o 33,554,432; k, v 4,194,304; gate, up,
    // down 117,440,512) and the norms; the quantisation state (n/64 + 4·⌈n/16,384⌉ + 4: q, o
    // 1,064,964; k, v 133,124; gate, up, down 3,727,364, so 13,578,268 a block) is no
    // parameter: neither sharded nor offloaded, all 80 blocks' of it stay on each device.
    assert_eq!(33_554_432 + 1_064_964, 34_619_396);
    assert_eq!(4_194_304 + 133_124, 4_327_428);
    assert_eq!(117_440_512 + 3_727_364, 121_167_876);
    let nf4_block = 2 * 33_554_432 + 2 * 4_194_304 + 3 * 117_440_512 + 32_768u64;
    let nf4_state = 80 * (2 * 1_064_964 + 2 * 133_124 + 3 * 3_727_364u64);
    assert_eq!(nf4_state, 1_086_261_440);
    let adapters = 1_294_336u64;
    let qlora = llama70b_fsdp_offloaded(true);
    assert_eq!(qlora.memory.peak_phase, Phase::ForwardBackward);
    let expected = (2 * root + 2 * (nf4_block + 2 * adapters) + nf4_state) as f64;
    let got = qlora.memory.breakdown.at_peak[Category::Parameter] as f64;
    assert!((got - expected).abs() <= 1.0, "{got} vs {expected}");
    // The gradients go to the host; the device holds one unit's unsharded bf16 gradient before
    // its reduce-scatter: a block's adapters only.
    assert_eq!(
        qlora.memory.breakdown.at_peak[Category::Gradient],
        2 * adapters
    );
    // The peak is in the blocks' backward, where bitsandbytes dequantises each NF4 weight whole
    // for the input gradient: the largest, gate/up/down's 234,881,024 elements, in bf16
    // (469,762,048 bytes) after its 3,670,016 fp32 block scales (14,680,064 bytes). The
    // attention is fused, so that is the block's whole workspace.
    assert_eq!(
        qlora.memory.breakdown.at_peak[Category::Temporary],
        469_762_048 + 14_680_064
    );
}

#[test]
fn the_frozen_base_is_counted_in_the_dtype_it_was_loaded_in() {
    use headroom_plan::strategy::{BaseDtype, Framework};
    let with_dtype = |framework: Framework, dtype: Option<BaseDtype>| {
        let p = llama(BaseWeights::Plain);
        let workload = match dtype {
            Some(d) => p.workload.clone().with_lora_base_dtype(d).unwrap(),
            None => p.workload.clone(),
        };
        let p = Problem::new(p.spec, p.hardware, workload, p.cost).with_framework(framework);
        let plan = evaluate(&p, &plain_strategy(Precision::Bf16Mixed, 1, 1));
        plan.memory.breakdown.steady[Category::Parameter]
    };
    // FSDP mixed precision keeps the trainable adapters in fp32 (they are the master copy); the
    // frozen base stays as loaded: bf16 by default, fp32 as PEFT's FSDP example loads it.
    assert_eq!(with_dtype(Framework::Fsdp, None), 2 * BASE + 4 * ADAPTERS);
    assert_eq!(
        with_dtype(Framework::Fsdp, Some(BaseDtype::Fp32)),
        4 * BASE + 4 * ADAPTERS
    );
    assert_eq!(
        with_dtype(Framework::Fsdp, Some(BaseDtype::Bf16)),
        2 * BASE + 4 * ADAPTERS
    );
    // DeepSpeed's bf16 engine casts the whole module to bf16, whatever it was loaded in.
    assert_eq!(
        with_dtype(Framework::DeepSpeed, Some(BaseDtype::Fp32)),
        2 * (BASE + ADAPTERS)
    );
    // Without a LoRA fine-tune the flag means nothing, and says so.
    let p = problem("llama-2-7b", "A100-80GB", 1, 1, 512, 1);
    let e = p
        .workload
        .with_lora_base_dtype(BaseDtype::Fp32)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--lora-base-dtype") && e.contains("--lora-rank"),
        "{e}"
    );
}
