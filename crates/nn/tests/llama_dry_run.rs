//! The dry run predicts a Llama-family step exactly: a forward and backward of each family
//! (Mistral's sliding window, Qwen2's biases and tied head included) on a shape-only device,
//! which allocates and frees what the kernels would without computing, gives the same
//! allocator statistics — peaks by category, allocated and reserved bytes — as the real step,
//! under each attention kind, recomputation policy, chunked loss, and LoRA on every projection.

use headroom_memory::{AllocatorConfig, Category, Device, DeviceStats};
use headroom_nn::models::llama::{Llama, LlamaConfig};
use headroom_nn::{Model, Recompute};
use headroom_strategy::{Attention, BaseWeights, Lora};
use headroom_tensor::{DType, Gradients, Tape, Tensor};
use std::path::PathBuf;

fn config(family: &str) -> LlamaConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/data/llama/{family}/config.json"));
    LlamaConfig::from_hf_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn step(device: &Device, config: &LlamaConfig, dtype: DType, recompute: &Recompute) -> DeviceStats {
    let model = Llama::new("llama", config.clone(), device, dtype, 5).unwrap();
    let (b, t) = (2, 16);
    let ids: Vec<i64> = (0..(b * t) as i64).map(|i| (i * 37 + 11) % 256).collect();
    let tensor = |v: &[i64]| {
        Tensor::from_i64(device, &[b, t], v, DType::I64, Category::Input, None).unwrap()
    };
    let (x, y) = (
        tensor(&ids),
        tensor(
            &ids[1..]
                .iter()
                .chain(&ids[..1])
                .copied()
                .collect::<Vec<_>>(),
        ),
    );
    let mut grads = Gradients::new();
    for block in model.blocks() {
        block.bind_grads(&mut grads).unwrap();
    }
    let tape = Tape::new();
    let loss = tape.record(|| model.loss(&x, &y, recompute)).unwrap();
    tape.backward(&loss, &mut grads).unwrap();
    drop(loss);
    device.stats()
}

#[test]
fn shape_only_steps_allocate_what_real_steps_do() {
    let policies = [
        Recompute::none(),
        Recompute {
            selective: true,
            ..Recompute::none()
        },
        Recompute {
            segments: vec![0..1, 1..2],
            loss_chunks: 4,
            ..Recompute::none()
        },
    ];
    let lora = Lora::new(
        4,
        8.0,
        "q,k,v,o,gate,up,down".parse().unwrap(),
        BaseWeights::Plain,
    )
    .unwrap();
    let mut checked = 0;
    for family in ["llama", "mistral", "qwen2"] {
        for attention in [Attention::Naive, Attention::MemoryEfficient] {
            for adapters in [None, Some(lora.clone())] {
                for (p, recompute) in policies.iter().enumerate() {
                    let mut c = config(family);
                    c.attention = attention;
                    c.lora = adapters.clone();
                    let real = Device::cpu(64 << 20, AllocatorConfig::default());
                    let dry = Device::shape_only(64 << 20, AllocatorConfig::default());
                    let (m, d) = (
                        step(&real, &c, DType::F32, recompute),
                        step(&dry, &c, DType::F32, recompute),
                    );
                    let what = format!(
                        "{family} {attention} lora={} policy {p}",
                        adapters.is_some()
                    );
                    assert!(m.allocated_bytes.all.peak > 0, "{what}: nothing measured");
                    assert_eq!(
                        d.allocated_bytes, m.allocated_bytes,
                        "{what}: allocated bytes"
                    );
                    assert_eq!(d.reserved_bytes, m.reserved_bytes, "{what}: reserved bytes");
                    for (i, (dc, mc)) in d.category_bytes.iter().zip(&m.category_bytes).enumerate()
                    {
                        assert_eq!(dc, mc, "{what}: category {i}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 36);
}
