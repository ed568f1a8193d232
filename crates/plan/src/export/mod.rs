//! Exports of a plan into the configuration formats that run it: a DeepSpeed `ds_config.json`,
//! an Accelerate config YAML (FSDP settings), a TOML for `headroom train`, a torchtune
//! single-device recipe's overrides, for LoRA plans PEFT's `adapter_config.json` and
//! bitsandbytes' quantization config, and for meshes (or plain data parallelism) a torchtitan
//! job TOML and Megatron-LM's arguments (`mesh_run`). An export either
//! expresses the plan the cost model predicted or refuses with the reason and what the tool
//! would do instead (see `fidelity`), and is held to the documented working combinations
//! (`rules`). Files are written atomically: to a temporary file in the same directory, then
//! renamed over the target; several files of one command all or none (`write_exports`).
//!
//! Not for: choosing the plan.

pub mod accelerate;
pub mod deepspeed;
mod fidelity;
pub mod headroom;
pub mod megatron;
pub mod mesh_rules;
pub mod mesh_run;
pub mod peft;
pub mod rules;
pub mod torchtitan;
pub mod torchtune;

use crate::error::{PlanError, Result};
use headroom_memory::output::AtomicFile;
use std::io::Write;
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
    /// The ds_config written beside an Accelerate export that uses the DeepSpeed plugin
    /// (Accelerate's `deepspeed_config_file`): the YAML then points at it instead of repeating
    /// the few settings its own keys can say.
    pub deepspeed_config_file: Option<String>,
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
            deepspeed_config_file: None,
        }
    }
}

/// Holds an export to the documented rules (`rules`): a broken one is refused by name.
fn hold_to_rules<R: std::fmt::Display>(
    format: &str,
    checked: std::result::Result<(), R>,
) -> Result<()> {
    checked.map_err(|rule| PlanError::Export {
        format: format.into(),
        reason: format!("the written configuration would break a documented rule: {rule}"),
    })
}

/// Writes several exported files all or none: every regular file is first written to a
/// temporary beside it, and only when all are written are they renamed over their paths; when
/// writing or a rename fails, the temporaries and the files already put in place are removed.
/// Outputs that are not regular files (`/dev/stdout`, a FIFO) cannot be staged and are written
/// through after the others are in place.
pub fn write_exports(files: &[(&Path, &str)]) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PlanError::Io { path, source }
    };
    let special = |p: &Path| {
        p.starts_with("/dev")
            || p.starts_with("/proc")
            || std::fs::metadata(p).is_ok_and(|m| !m.is_file() && !m.is_dir())
    };
    let mut staged = Vec::new();
    for (path, text) in files.iter().filter(|(p, _)| !special(p)) {
        let mut f = AtomicFile::create(path).map_err(io(path))?;
        f.write_all(text.as_bytes()).map_err(io(path))?;
        staged.push((*path, f));
    }
    let mut placed: Vec<&Path> = Vec::new();
    for (path, f) in staged {
        if let Err(e) = f.commit() {
            for p in placed {
                let _ = std::fs::remove_file(p);
            }
            return Err(io(path)(e));
        }
        placed.push(path);
    }
    for (path, text) in files.iter().filter(|(p, _)| special(p)) {
        if let Err(e) = write_export(path, text) {
            for p in placed {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
    }
    Ok(())
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
