//! DeepSpeed's `estimate_zero2_model_states_mem_needs_all_cold` and
//! `estimate_zero3_model_states_mem_needs_all_cold` (deepspeed/runtime/zero/stage_1_and_2.py and
//! stage3.py, current code; docs/sources.md §6), with their printed tables. Arithmetic follows
//! the Python: floats, `int()` truncation, sizes divided by 2^30 and labelled "GB".
//!
//! The ZeRO-2 no-offload GPU formula is the one in the code since 2024 (PR #5099):
//! `2·P + int(18·P/T)`; DeepSpeed's docs still print the older `4·P + int(16·P/T)` sample.

/// One row of an estimate: bytes per CPU (host) and per GPU, and DeepSpeed's option text.
#[derive(Clone, Debug, PartialEq)]
pub struct EstimateRow {
    pub cpu_bytes: u64,
    pub gpu_bytes: u64,
    pub options: String,
}

/// Hardware and safety factor of an estimate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EstimateSetup {
    pub gpus_per_node: u64,
    pub nodes: u64,
    pub additional_buffer_factor: f64,
}

/// `estimate_zero2_model_states_mem_needs` → `(cpu_mem, gpu_mem)`.
pub fn zero2(total_params: f64, setup: EstimateSetup, cpu_offload: bool) -> (u64, u64) {
    let total_gpus = (setup.nodes * setup.gpus_per_node) as f64;
    let f = setup.additional_buffer_factor;
    let (cpu, gpu) = if cpu_offload {
        (
            total_params * (4.0 * total_gpus).max(16.0) * f,
            2.0 * total_params,
        )
    } else {
        // 2 = params_16bit; 18 = 2 grads_16bit + 4 grads_32bit + 4 params_32bit + 8 optimizer states.
        (
            total_params * 4.0 * setup.gpus_per_node as f64 * f,
            2.0 * total_params + (18.0 * total_params / total_gpus).trunc(),
        )
    };
    (cpu as u64, gpu as u64)
}

/// `estimate_zero3_model_states_mem_needs` → `(cpu_mem, gpu_mem)`.
pub fn zero3(
    total_params: f64,
    largest_layer_params: f64,
    setup: EstimateSetup,
    cpu_offload: bool,
    cpu_offload_params: bool,
    zero_init: bool,
) -> (u64, u64) {
    let total_gpus = (setup.nodes * setup.gpus_per_node) as f64;
    let per_node = setup.gpus_per_node as f64;
    let gpus_factor = 1.0 / setup.nodes as f64;
    let f = setup.additional_buffer_factor;
    let largest_layer_memory = 4.0 * largest_layer_params;
    let (cpu, gpu) = if cpu_offload {
        if cpu_offload_params {
            let cpu = if zero_init {
                total_params * 18.0 * gpus_factor * f
            } else {
                total_params * (4.0 * per_node).max(18.0 * gpus_factor) * f
            };
            (cpu, largest_layer_memory)
        } else {
            let cpu = if zero_init {
                total_params * 16.0 * gpus_factor * f
            } else {
                total_params * (4.0 * per_node).max(16.0 * gpus_factor) * f
            };
            (
                cpu,
                largest_layer_memory + (2.0 * total_params / total_gpus).trunc(),
            )
        }
    } else {
        let cpu = if zero_init {
            largest_layer_params * 4.0 * per_node * f
        } else {
            total_params * 4.0 * per_node * f
        };
        (
            cpu,
            largest_layer_memory + (18.0 * total_params / total_gpus).trunc(),
        )
    };
    (cpu as u64, gpu as u64)
}

/// The rows `estimate_zero2_model_states_mem_needs_all_cold` prints, in its order.
pub fn zero2_rows(total_params: f64, setup: EstimateSetup) -> Vec<EstimateRow> {
    [true, false]
        .into_iter()
        .map(|cpu_offload| {
            let (cpu_bytes, gpu_bytes) = zero2(total_params, setup, cpu_offload);
            let device = if cpu_offload { "cpu " } else { "none" };
            EstimateRow {
                cpu_bytes,
                gpu_bytes,
                options: format!("offload_optimizer={device}"),
            }
        })
        .collect()
}

/// The rows `estimate_zero3_model_states_mem_needs_all_cold` prints, in its order.
pub fn zero3_rows(
    total_params: f64,
    largest_layer_params: f64,
    setup: EstimateSetup,
) -> Vec<EstimateRow> {
    let mut rows = Vec::new();
    for cpu_offload in [true, false] {
        for cpu_offload_params in [true, false] {
            if !cpu_offload && cpu_offload_params {
                continue;
            }
            for zero_init in [true, false] {
                let (cpu_bytes, gpu_bytes) = zero3(
                    total_params,
                    largest_layer_params,
                    setup,
                    cpu_offload,
                    cpu_offload_params,
                    zero_init,
                );
                let dev = |on: bool| if on { "cpu " } else { "none" };
                rows.push(EstimateRow {
                    cpu_bytes,
                    gpu_bytes,
                    options: format!(
                        "offload_param={}, offload_optimizer={}, zero_init={}",
                        dev(cpu_offload_params),
                        dev(cpu_offload),
                        u8::from(zero_init)
                    ),
                });
            }
        }
    }
    rows
}

/// DeepSpeed's printout: header, column titles, one line per row.
pub fn render(
    total_params: f64,
    largest_layer_params: Option<f64>,
    setup: EstimateSetup,
    rows: &[EstimateRow],
) -> String {
    let nodes = if setup.nodes > 1 { "nodes" } else { "node" };
    let gpus = if setup.gpus_per_node > 1 {
        "GPUs"
    } else {
        "GPU"
    };
    let mut out =
        String::from("Estimated memory needed for params, optim states and gradients for a:\n");
    out += &format!(
        "HW: Setup with {} {nodes}, {} {gpus} per node.\n",
        setup.nodes, setup.gpus_per_node
    );
    out += &format!(
        "SW: Model with {}M total params",
        (total_params / 1e6) as u64
    );
    if let Some(l) = largest_layer_params {
        out += &format!(", {}M largest layer params", (l / 1e6) as u64);
    }
    out += ".\n  per CPU  |  per GPU |   Options\n";
    const GIB: f64 = (1u64 << 30) as f64;
    for r in rows {
        out += &format!(
            " {:7.2}GB | {:6.2}GB | {}\n",
            r.cpu_bytes as f64 / GIB,
            r.gpu_bytes as f64 / GIB,
            r.options
        );
    }
    out
}
