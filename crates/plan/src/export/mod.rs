//! Exports of a plan into the configuration formats that run it: a DeepSpeed `ds_config.json`,
//! an Accelerate config YAML (FSDP settings), a TOML for `headroom train`, a torchtune
//! single-device recipe's overrides, and for LoRA plans PEFT's `adapter_config.json` and
//! bitsandbytes' quantization config. An export either
//! expresses the plan the cost model predicted or refuses with the reason and what the tool
//! would do instead (see `fidelity`). Files are written atomically: to a temporary file in the
//! same directory, then renamed over the target.
//!
//! Not for: choosing the plan.

pub mod accelerate;
pub mod deepspeed;
mod fidelity;
pub mod headroom;
pub mod peft;
pub mod torchtune;

use crate::error::{PlanError, Result};
use std::path::Path;

/// Site settings an export needs that the plan does not decide.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportOptions {
    /// Directory on each node's NVMe for offloaded states (`nvme_path` in ds_config,
    /// `offload_*_nvme_path` in Accelerate's deepspeed_config).
    pub nvme_path: String,
    /// Address of the machine of rank 0 (Accelerate `main_process_ip`); required on several nodes.
    pub main_process_ip: Option<String>,
    /// Port on the machine of rank 0 (Accelerate `main_process_port`).
    pub main_process_port: u16,
}

/// `/local_nvme` is the path of the NVMe examples in the DeepSpeed config docs
/// (deepspeed.ai/docs/config-json, "offload_optimizer"); 29500 is torchrun's default
/// `--master-port` (pytorch.org/docs/stable/elastic/run.html).
impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            nvme_path: "/local_nvme".into(),
            main_process_ip: None,
            main_process_port: 29500,
        }
    }
}

/// Writes an exported file through `headroom_memory::output` (atomic for regular files,
/// written through for FIFOs and devices).
pub fn write_export(path: &Path, contents: &str) -> Result<()> {
    headroom_memory::output::write_output(path, contents.as_bytes()).map_err(|source| {
        PlanError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}
