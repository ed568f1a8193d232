//! `headroom plan`'s hardware inputs end to end: a hardware file naming its own GPU, a lone bf16
//! peak, a GPU name in any case, and a GPU memory without its unit.

use crate::common;

use common::{headroom, json, stderr};

#[test]
fn a_hardware_file_may_name_its_own_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let hw = dir.path().join("hw.toml");
    // RTX 3080, not a preset: 10 GiB, 760 GB/s, fp16/bf16 tensor 59.5 TFLOPS, fp32 29.8 (GA102
    // whitepaper).
    std::fs::write(
        &hw,
        "gpu = \"RTX-3080\"\ngpu_memory = \"10GiB\"\nbf16_tflops = 59.5\nfp16_tflops = 59.5\nfp32_tflops = 29.8\nmemory_bandwidth_gbps = 760\n",
    )
    .unwrap();
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--hardware",
        hw.to_str().unwrap(),
        "--seq-len",
        "1024",
        "--global-batch",
        "8",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["hardware"]["gpu"]["name"], "RTX-3080");
    assert_eq!(v["hardware"]["gpu"]["memory_bytes"], 10u64 << 30);
}

#[test]
fn a_lone_bf16_peak_scales_the_fp32_peak_too() {
    // RTX-4090 preset: bf16 165.2, fp32 82.6 TFLOPS; --bf16-tflops 82.6 halves the GPU's
    // speed, so fp32 becomes 41.3 and stays half the bf16 peak: fp32 is not the fastest.
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "RTX-4090",
        "--bf16-tflops",
        "82.6",
        "--seq-len",
        "1024",
        "--global-batch",
        "8",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let fp32 = v["hardware"]["gpu"]["fp32_tflops"].as_f64().unwrap();
    assert!((fp32 - 41.3).abs() < 1e-9, "{fp32}");
    assert_ne!(
        v["recommended"]["strategy"]["precision"], "fp32",
        "{}",
        v["recommended"]
    );
}

#[test]
fn a_gpu_name_may_be_written_in_any_case_and_with_spaces() {
    let plan = |gpu: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            "gpt2",
            "--gpu",
            gpu,
            "--seq-len",
            "1024",
            "--global-batch",
            "8",
            "--json",
        ];
        args.extend_from_slice(extra);
        headroom(&args)
    };
    for typed in ["RTX 4090", "rtx4090", "rtx-4090"] {
        let o = plan(typed, &[]);
        assert!(o.status.success(), "{typed}: {}", stderr(&o));
        assert_eq!(json(&o)["hardware"]["gpu"]["name"], "RTX-4090", "{typed}");
    }
    // Three presets start with H100: the error names them and no other.
    let o = plan("h100", &[]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("matches several presets: H100-80GB, H100-NVL, H100-PCIe"),
        "{e}"
    );
    // A name matching none gets the nearest presets.
    let o = plan("4090", &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nearest: RTX-4090"), "{}", stderr(&o));
}

#[test]
fn a_gpu_memory_without_its_unit_is_refused_not_read_as_bytes() {
    let plan = |memory: &str| {
        headroom(&[
            "plan",
            "--model",
            "gpt2",
            "--gpu",
            "A100-80GB",
            "--gpu-memory",
            memory,
            "--seq-len",
            "1024",
            "--global-batch",
            "8",
            "--json",
        ])
    };
    let o = plan("80");
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("gpu_memory") && e.contains("is 80 bytes") && e.contains("80GB or 80GiB"),
        "{e}"
    );
    let o = plan("80GB");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        json(&o)["hardware"]["gpu"]["memory_bytes"],
        80_000_000_000u64
    );
}
