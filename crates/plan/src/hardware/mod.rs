//! The machine a plan runs on: GPU presets (memory, dense peak throughput per precision, memory
//! bandwidth) and the cluster around them (GPUs per node, nodes, interconnects, host RAM, NVMe).
//! Every field can be overridden from a TOML file or from flags ([`HardwareOverrides`]).
//!
//! Sources of the preset figures: the vendors' datasheets and architecture whitepapers (dense,
//! i.e. without structured sparsity; 16-bit tensor figures with fp32 accumulation), one source
//! per GPU in docs/sources.md §20; memory is the `memory.total` nvidia-smi (rocm-smi for the
//! MI300X) reports. Cluster defaults (interconnects, host RAM, NVMe, CUDA context) are typical
//! values, stated in docs/planner.md; override them for your site.
//!
//! Not for: deciding what runs where (that is the strategy and the cost model).

mod custom;
mod names;
mod presets;

pub use custom::resolve;

use presets::GPU_PRESETS;

use crate::error::{PlanError, Result};
use headroom_memory::ByteSize;
use serde::{Deserialize, Serialize};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// One GPU model. Throughputs in TFLOPS (10^12 FLOP/s), bandwidths in GB/s (10^9 B/s).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuSpec {
    pub name: String,
    pub memory_bytes: u64,
    /// Dense bf16 tensor-core peak; 0 when the GPU has no bf16 (V100).
    pub bf16_tflops: f64,
    pub fp16_tflops: f64,
    /// Dense TF32 peak; 0 when the GPU has no TF32 (V100).
    pub tf32_tflops: f64,
    pub fp32_tflops: f64,
    pub memory_bandwidth_gbps: f64,
}

/// Names of every GPU preset.
pub fn gpu_preset_names() -> Vec<&'static str> {
    GPU_PRESETS.iter().map(|r| r.0).collect()
}

/// A GPU preset with the default cluster around it (one node of `gpus_per_node` GPUs).
pub fn preset(name: &str) -> Result<Hardware> {
    let name = names::preset_name(name)?;
    let row = GPU_PRESETS
        .iter()
        .find(|r| r.0 == name)
        .expect("preset_name returns a preset's name");
    let (n, mib, bf16, fp16, tf32, fp32, hbm, intra, pcie, inter, host_gib) = *row;
    Ok(Hardware {
        gpu: GpuSpec {
            name: n.to_string(),
            memory_bytes: mib * MIB,
            bf16_tflops: bf16,
            fp16_tflops: fp16,
            tf32_tflops: tf32,
            fp32_tflops: fp32,
            memory_bandwidth_gbps: hbm,
        },
        gpus_per_node: 1,
        nodes: 1,
        intra_node_bandwidth_gbps: intra,
        inter_node_bandwidth_gbps: inter,
        pcie_bandwidth_gbps: pcie,
        host_memory_bytes: host_gib * GIB,
        // DeepSpeed's DeepNVMe blog: 10 GB/s reads, 5 GB/s writes on four NVMe in RAID 0; the
        // harmonic mean of a read and a write of the same bytes is 6.7.
        nvme_bandwidth_gbps: 6.0,
        nvme_bytes: 3_840_000_000_000,
        // HF "perf_train_gpu_one": CUDA kernels/context measured at 1343 MiB on a V100.
        cuda_context_bytes: 1343 * MIB,
        // ZeRO-Offload's CPU-Adam timing (Ren et al. 2021): 10 B parameters in 2.57 s on one
        // DGX-2 node's CPUs (docs/sources.md §25).
        cpu_optimizer_params_per_s: 3.9e9,
    })
}

/// A cluster of identical GPUs. Bandwidths in GB/s (10^9 B/s).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hardware {
    pub gpu: GpuSpec,
    pub gpus_per_node: u64,
    pub nodes: u64,
    /// GPU↔GPU inside a node, per GPU and direction (NVLink, or PCIe peer-to-peer).
    pub intra_node_bandwidth_gbps: f64,
    /// Between nodes, per GPU (its share of the NICs).
    pub inter_node_bandwidth_gbps: f64,
    /// Host↔GPU per GPU (PCIe), for offload traffic.
    pub pcie_bandwidth_gbps: f64,
    /// Host RAM per node.
    pub host_memory_bytes: u64,
    /// NVMe read/write bandwidth per node.
    pub nvme_bandwidth_gbps: f64,
    /// NVMe capacity per node.
    pub nvme_bytes: u64,
    /// Device memory taken by the CUDA context and kernels before any tensor exists.
    pub cuda_context_bytes: u64,
    /// Host optimizer throughput per node (DeepSpeedCPUAdam), parameters updated per second.
    pub cpu_optimizer_params_per_s: f64,
}

impl Hardware {
    /// Data-parallel world size.
    pub fn world_size(&self) -> u64 {
        self.gpus_per_node * self.nodes
    }

    /// Bandwidth a ring collective over all GPUs runs at: the slowest link it crosses.
    pub fn collective_bandwidth_gbps(&self) -> f64 {
        if self.nodes > 1 {
            self.intra_node_bandwidth_gbps
                .min(self.inter_node_bandwidth_gbps)
        } else {
            self.intra_node_bandwidth_gbps
        }
    }

    /// Applies overrides (from a TOML file or flags); later calls win.
    pub fn apply(&mut self, o: &HardwareOverrides) -> Result<()> {
        if let Some(name) = &o.gpu {
            let keep = self.clone();
            *self = preset(name)?;
            self.gpus_per_node = keep.gpus_per_node;
            self.nodes = keep.nodes;
        }
        let g = &mut self.gpu;
        // Peaks given without the others describe the same GPU at another speed: the peaks
        // not given scale by the ratio of the first one given (bf16, fp16, TF32, fp32 order) to
        // the value it replaces, so a lowered bf16 peak does not leave fp32 at the preset's.
        let peaks = [
            (o.bf16_tflops, g.bf16_tflops),
            (o.fp16_tflops, g.fp16_tflops),
            (o.tf32_tflops, g.tf32_tflops),
            (o.fp32_tflops, g.fp32_tflops),
        ];
        let ratio = peaks
            .iter()
            .find_map(|(new, old)| new.filter(|_| *old > 0.0).map(|n| n / old));
        if let Some(r) = ratio.filter(|r| r.is_finite()) {
            for (field, given) in [
                (&mut g.bf16_tflops, o.bf16_tflops),
                (&mut g.fp16_tflops, o.fp16_tflops),
                (&mut g.tf32_tflops, o.tf32_tflops),
                (&mut g.fp32_tflops, o.fp32_tflops),
            ] {
                if given.is_none() {
                    *field *= r;
                }
            }
        }
        set(&mut g.memory_bytes, o.gpu_memory.map(|b| b.0));
        set(&mut g.bf16_tflops, o.bf16_tflops);
        set(&mut g.fp16_tflops, o.fp16_tflops);
        set(&mut g.tf32_tflops, o.tf32_tflops);
        set(&mut g.fp32_tflops, o.fp32_tflops);
        set(&mut g.memory_bandwidth_gbps, o.memory_bandwidth_gbps);
        set(&mut self.gpus_per_node, o.gpus_per_node);
        set(&mut self.nodes, o.nodes);
        set(
            &mut self.intra_node_bandwidth_gbps,
            o.intra_node_bandwidth_gbps,
        );
        set(
            &mut self.inter_node_bandwidth_gbps,
            o.inter_node_bandwidth_gbps,
        );
        set(&mut self.pcie_bandwidth_gbps, o.pcie_bandwidth_gbps);
        set(&mut self.host_memory_bytes, o.host_memory.map(|b| b.0));
        set(&mut self.nvme_bandwidth_gbps, o.nvme_bandwidth_gbps);
        set(&mut self.nvme_bytes, o.nvme_size.map(|b| b.0));
        set(&mut self.cuda_context_bytes, o.cuda_context.map(|b| b.0));
        set(
            &mut self.cpu_optimizer_params_per_s,
            o.cpu_optimizer_params_per_s,
        );
        self.validate()
    }

    /// Checks that every field is usable.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, problem: String, expected: &str| PlanError::Hardware {
            field: field.to_string(),
            problem,
            expected: expected.to_string(),
        };
        if self.gpus_per_node == 0 {
            return Err(bad("gpus_per_node", "is 0".into(), "at least 1"));
        }
        if self.nodes == 0 {
            return Err(bad("nodes", "is 0".into(), "at least 1"));
        }
        if self.gpu.memory_bytes == 0 {
            return Err(bad("gpu_memory", "is 0".into(), "a size such as 80GiB"));
        }
        // No GPU has less memory than its CUDA context: such a size is a count of gigabytes
        // written without its unit, which counts bytes.
        if self.gpu.memory_bytes < self.cuda_context_bytes {
            let n = self.gpu.memory_bytes;
            return Err(bad(
                "gpu_memory",
                format!(
                    "is {n} bytes, less than the CUDA context alone ({}); a size without a unit \
                     counts bytes",
                    headroom_memory::format_bytes(self.cuda_context_bytes)
                ),
                &format!("a size with its unit, such as {n}GB or {n}GiB"),
            ));
        }
        let rates = [
            ("fp16_tflops", self.gpu.fp16_tflops),
            ("fp32_tflops", self.gpu.fp32_tflops),
            ("memory_bandwidth_gbps", self.gpu.memory_bandwidth_gbps),
            ("intra_node_bandwidth_gbps", self.intra_node_bandwidth_gbps),
            ("inter_node_bandwidth_gbps", self.inter_node_bandwidth_gbps),
            ("pcie_bandwidth_gbps", self.pcie_bandwidth_gbps),
            ("nvme_bandwidth_gbps", self.nvme_bandwidth_gbps),
            (
                "cpu_optimizer_params_per_s",
                self.cpu_optimizer_params_per_s,
            ),
        ];
        for (field, v) in rates {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(field, format!("is {v}"), "a positive number"));
            }
        }
        for (field, v) in [
            ("bf16_tflops", self.gpu.bf16_tflops),
            ("tf32_tflops", self.gpu.tf32_tflops),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(
                    field,
                    format!("is {v}"),
                    "0 (unsupported) or a positive number",
                ));
            }
        }
        Ok(())
    }
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

/// Optional replacements for any hardware field: the TOML file format of `--hardware` and, the
/// same names as flags, `headroom plan`'s hardware flags. Sizes accept units (`80GiB`, `2TB`) or
/// a byte count.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct HardwareOverrides {
    /// The GPU preset (a flag of its own, `--gpu`, on the command line).
    #[arg(skip)]
    pub gpu: Option<String>,
    /// GPUs per node.
    #[arg(long)]
    pub gpus_per_node: Option<u64>,
    /// Number of nodes.
    #[arg(long)]
    pub nodes: Option<u64>,
    /// Device memory per GPU (e.g. 80GiB, 24GB).
    #[arg(long, value_name = "SIZE")]
    pub gpu_memory: Option<ByteSize>,
    /// Dense bf16 peak, TFLOPS.
    #[arg(long)]
    pub bf16_tflops: Option<f64>,
    /// Dense fp16 peak, TFLOPS.
    #[arg(long)]
    pub fp16_tflops: Option<f64>,
    /// Dense TF32 peak, TFLOPS.
    #[arg(long)]
    pub tf32_tflops: Option<f64>,
    /// fp32 peak, TFLOPS.
    #[arg(long)]
    pub fp32_tflops: Option<f64>,
    /// Device memory bandwidth, GB/s.
    #[arg(long)]
    pub memory_bandwidth_gbps: Option<f64>,
    /// GPU-to-GPU bandwidth inside a node, per GPU and direction, GB/s.
    #[arg(long)]
    pub intra_node_bandwidth_gbps: Option<f64>,
    /// Bandwidth between nodes per GPU, GB/s.
    #[arg(long)]
    pub inter_node_bandwidth_gbps: Option<f64>,
    /// Host-to-GPU (PCIe) bandwidth per GPU, GB/s.
    #[arg(long)]
    pub pcie_bandwidth_gbps: Option<f64>,
    /// Host RAM per node (e.g. 1TiB).
    #[arg(long, value_name = "SIZE")]
    pub host_memory: Option<ByteSize>,
    /// NVMe bandwidth per node, GB/s.
    #[arg(long)]
    pub nvme_bandwidth_gbps: Option<f64>,
    /// NVMe capacity per node (e.g. 3.84TB).
    #[arg(long, value_name = "SIZE")]
    pub nvme_size: Option<ByteSize>,
    /// Device memory of the CUDA context (e.g. 500MiB).
    #[arg(long, value_name = "SIZE")]
    pub cuda_context: Option<ByteSize>,
    /// Host optimizer throughput per node, parameters per second.
    #[arg(long)]
    pub cpu_optimizer_params_per_s: Option<f64>,
}

impl HardwareOverrides {
    /// Parses the TOML of `--hardware FILE`.
    pub fn from_toml(text: &str) -> Result<HardwareOverrides> {
        toml::from_str(text).map_err(|e| PlanError::HardwareToml(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_resolve_case_insensitively() {
        assert_eq!(preset("h100-80gb").unwrap().gpu.name, "H100-80GB");
        assert_eq!(preset("RTX4090").unwrap().gpu.name, "RTX-4090");
        let e = preset("B300").unwrap_err().to_string();
        assert!(e.contains("'B300'") && e.contains("A100-80GB"), "{e}");
    }

    #[test]
    fn aliases_name_their_presets_and_every_preset_is_self_consistent() {
        assert_eq!(preset("H200").unwrap().gpu.name, "H200-141GB");
        assert_eq!(preset("h100-sxm").unwrap().gpu.name, "H100-80GB");
        assert_eq!(preset("A6000").unwrap().gpu.name, "RTX-A6000");
        assert_eq!(preset("rtx3090").unwrap().gpu.name, "RTX-3090");
        for name in gpu_preset_names() {
            let g = preset(name).unwrap().gpu;
            // Dense tensor throughput is at least the vector fp32 rate; bf16/fp16 twice TF32
            // where the GPU has TF32 (every generation since Ampere keeps that ratio; the L40S
            // datasheet rounds its TF32 figure to 183 against 362.05, hence 2 %).
            assert!(g.fp16_tflops >= g.fp32_tflops, "{name}");
            if g.tf32_tflops > 0.0 {
                assert!(
                    (g.bf16_tflops - 2.0 * g.tf32_tflops).abs() < 0.02 * g.bf16_tflops,
                    "{name}"
                );
            }
            assert!(
                g.memory_bytes > (15 << 30) && g.memory_bandwidth_gbps > 100.0,
                "{name}"
            );
        }
    }

    #[test]
    fn toml_overrides_sizes_with_units_and_rejects_unknown_keys() {
        let o = HardwareOverrides::from_toml(
            "gpu = \"A100-40GB\"\nnodes = 2\nhost_memory = \"512GiB\"\n",
        )
        .unwrap();
        let mut hw = preset("H100-80GB").unwrap();
        hw.apply(&o).unwrap();
        assert_eq!(hw.gpu.name, "A100-40GB");
        assert_eq!(hw.nodes, 2);
        assert_eq!(hw.host_memory_bytes, 512 * GIB);
        let e = HardwareOverrides::from_toml("gpu_mem = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpu_mem"), "{e}");
    }

    #[test]
    fn a_peak_given_alone_scales_the_others() {
        // RTX-4090 datasheet row: bf16 165.2, fp16 165.2, TF32 82.6, fp32 82.6 TFLOPS; a bf16
        // peak of 82.6 is half of it, so fp16 becomes 82.6 and TF32 and fp32 41.3.
        let mut hw = preset("RTX-4090").unwrap();
        hw.apply(&HardwareOverrides {
            bf16_tflops: Some(82.6),
            ..Default::default()
        })
        .unwrap();
        let g = &hw.gpu;
        assert_eq!(g.bf16_tflops, 82.6);
        assert!((g.fp16_tflops - 82.6).abs() < 1e-9, "{}", g.fp16_tflops);
        assert!((g.tf32_tflops - 41.3).abs() < 1e-9, "{}", g.tf32_tflops);
        assert!((g.fp32_tflops - 41.3).abs() < 1e-9, "{}", g.fp32_tflops);
        // Given together, each keeps its value.
        let mut hw = preset("RTX-4090").unwrap();
        hw.apply(&HardwareOverrides {
            bf16_tflops: Some(82.6),
            fp32_tflops: Some(80.0),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((hw.gpu.bf16_tflops, hw.gpu.fp32_tflops), (82.6, 80.0));
    }

    #[test]
    fn zero_gpus_is_rejected_with_the_field_name() {
        let mut hw = preset("L4").unwrap();
        let e = hw
            .apply(&HardwareOverrides {
                gpus_per_node: Some(0),
                ..Default::default()
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpus_per_node"), "{e}");
    }
}
