//! The `estimate` command, run as the built binary: DeepSpeed's and Accelerate's own memory
//! tables, reproduced from their documentation.

use crate::common;

use common::{headroom, stderr};

#[test]
fn estimate_deepspeed_prints_deepspeeds_table() {
    let o = headroom(&[
        "estimate",
        "deepspeed",
        "--stage",
        "3",
        "--params",
        "2851e6",
        "--largest-layer",
        "32e6",
        "--gpus-per-node",
        "8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    // DeepSpeed docs (memory.rst), estimate_zero3_model_states_mem_needs_all_cold example.
    assert!(
        out.contains("SW: Model with 2851M total params, 32M largest layer params."),
        "{out}"
    );
    assert!(
        out.contains(
            "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1"
        ),
        "{out}"
    );
    let o = headroom(&[
        "estimate",
        "deepspeed",
        "--stage",
        "3",
        "--params",
        "2851e6",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--largest-layer"), "{}", stderr(&o));
}

#[test]
fn estimate_accelerate_prints_accelerates_table() {
    let o = headroom(&["estimate", "accelerate", "--model", "bert-base-cased"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    // Accelerate docs: bert-base-cased total 413.18 MB at float32, training 1.61 GB.
    assert!(
        out.contains("413.18 MB") && out.contains("1.61 GB") && out.contains("N/A"),
        "{out}"
    );
}
