//! A GPU that is not a preset: a hardware file (or flags) may name its own GPU and give its
//! figures. Memory, fp16 and fp32 peaks and memory bandwidth are required; bf16 and TF32 peaks
//! default to 0 (unsupported); the cluster around it takes the defaults of the PCIe presets
//! (one GPU per node, PCIe 25 GB/s to the host and between GPUs, 6.25 GB/s between nodes,
//! 128 GiB host RAM), stated in docs/planner.md.
//!
//! Not for: the preset table (see the parent module).

use super::{GpuSpec, Hardware, HardwareOverrides, preset};
use crate::error::{PlanError, Result};

/// The preset called `name`, or, when there is none, a GPU of that name built from the figures
/// the overrides give (the first override that sets a field wins, as the file is applied before
/// the flags and the flags win afterwards anyway).
pub fn resolve(name: &str, overrides: &[&HardwareOverrides]) -> Result<Hardware> {
    let unknown = match preset(name) {
        Ok(hw) => return Ok(hw),
        Err(e) => e,
    };
    let pick = |f: fn(&HardwareOverrides) -> Option<f64>| overrides.iter().rev().find_map(|o| f(o));
    let memory = overrides.iter().rev().find_map(|o| o.gpu_memory);
    let fp16 = pick(|o| o.fp16_tflops);
    let fp32 = pick(|o| o.fp32_tflops);
    let bandwidth = pick(|o| o.memory_bandwidth_gbps);
    let missing: Vec<&str> = [
        ("gpu_memory", memory.is_none()),
        ("fp16_tflops", fp16.is_none()),
        ("fp32_tflops", fp32.is_none()),
        ("memory_bandwidth_gbps", bandwidth.is_none()),
    ]
    .into_iter()
    .filter_map(|(f, m)| m.then_some(f))
    .collect();
    if !missing.is_empty() {
        return Err(PlanError::Hardware {
            field: "gpu".into(),
            problem: format!(
                "'{name}' is not a preset ({unknown}) and its figures are incomplete: {} missing",
                missing.join(", ")
            ),
            expected: "a preset name, or a GPU of your own with gpu_memory, fp16_tflops, fp32_tflops and memory_bandwidth_gbps (bf16_tflops, tf32_tflops optional)".into(),
        });
    }
    let base = preset("RTX-4090")?;
    let hw = Hardware {
        gpu: GpuSpec {
            name: name.to_string(),
            memory_bytes: memory.map_or(0, |b| b.0),
            bf16_tflops: pick(|o| o.bf16_tflops).unwrap_or(0.0),
            fp16_tflops: fp16.unwrap_or(0.0),
            tf32_tflops: pick(|o| o.tf32_tflops).unwrap_or(0.0),
            fp32_tflops: fp32.unwrap_or(0.0),
            memory_bandwidth_gbps: bandwidth.unwrap_or(0.0),
        },
        ..base
    };
    hw.validate()?;
    Ok(hw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hardware_file_names_its_own_gpu() {
        // RTX 3080, not a preset (NVIDIA GA102 whitepaper, dense): fp16 tensor 59.5 TFLOPS,
        // fp32 29.8 TFLOPS, 760 GB/s, 10 GiB.
        let o = HardwareOverrides::from_toml(
            "gpu = \"RTX-3080\"\ngpu_memory = \"10GiB\"\nfp16_tflops = 59.5\nbf16_tflops = 59.5\nfp32_tflops = 29.8\nmemory_bandwidth_gbps = 760\n",
        )
        .unwrap();
        let hw = resolve("RTX-3080", &[&o]).unwrap();
        assert_eq!(hw.gpu.name, "RTX-3080");
        assert_eq!(hw.gpu.memory_bytes, 10 << 30);
        assert_eq!((hw.gpu.bf16_tflops, hw.gpu.fp32_tflops), (59.5, 29.8));
        assert_eq!(hw.gpu.tf32_tflops, 0.0);
        let e = resolve("RTX-3080", &[&HardwareOverrides::default()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gpu_memory, fp16_tflops, fp32_tflops, memory_bandwidth_gbps missing"),
            "{e}"
        );
    }
}
