//! The GPU preset table: for each GPU its memory as the vendor's tool reports it, its dense peak
//! throughput per precision, its memory bandwidth, and the interconnects and host RAM of the
//! node it usually sits in; and the other names some presets go by. Sources: docs/sources.md §20
//! and the vendors' datasheets (see the parent module).
//!
//! Not for: resolving a name or applying overrides (the parent module).

/// The preset table: name, memory (nvidia-smi MiB), bf16, fp16, tf32, fp32, HBM GB/s,
/// NVLink/PCIe GB/s per GPU per direction, host PCIe GB/s, inter-node GB/s per GPU,
/// host RAM per node (GiB). Host PCIe is what pinned copies measure, not the link's rate:
/// 12 GB/s on PCIe 3.0 x16, 20 on 4.0, 35 on 5.0 (docs/sources.md §25).
pub(super) type PresetRow = (
    &'static str,
    u64,
    f64,
    f64,
    f64,
    f64,
    f64,
    f64,
    f64,
    f64,
    u64,
);

pub(super) const GPU_PRESETS: &[PresetRow] = &[
    (
        "V100-16GB",
        16_160,
        0.0,
        125.0,
        0.0,
        15.7,
        900.0,
        150.0,
        12.0,
        12.5,
        512,
    ),
    (
        "V100-32GB",
        32_510,
        0.0,
        125.0,
        0.0,
        15.7,
        900.0,
        150.0,
        12.0,
        12.5,
        512,
    ),
    (
        "A100-40GB",
        40_960,
        312.0,
        312.0,
        156.0,
        19.5,
        1555.0,
        300.0,
        20.0,
        25.0,
        1024,
    ),
    (
        "A100-80GB",
        81_920,
        312.0,
        312.0,
        156.0,
        19.5,
        2039.0,
        300.0,
        20.0,
        25.0,
        1024,
    ),
    (
        "H100-80GB",
        81_559,
        989.0,
        989.0,
        495.0,
        67.0,
        3350.0,
        450.0,
        35.0,
        50.0,
        2048,
    ),
    (
        "H200-141GB",
        143_771,
        989.0,
        989.0,
        495.0,
        67.0,
        4800.0,
        450.0,
        35.0,
        50.0,
        2048,
    ),
    (
        "L4", 23_034, 121.0, 121.0, 60.0, 30.3, 300.0, 25.0, 20.0, 6.25, 128,
    ),
    (
        "A10G", 23_028, 125.0, 125.0, 62.5, 31.2, 600.0, 25.0, 20.0, 6.25, 128,
    ),
    (
        "RTX-4090", 24_564, 165.2, 165.2, 82.6, 82.6, 1008.0, 25.0, 20.0, 6.25, 128,
    ),
    (
        "RTX-3090", 24_576, 71.0, 71.0, 35.6, 35.6, 936.0, 25.0, 20.0, 6.25, 128,
    ),
    (
        "RTX-A6000",
        49_140,
        154.8,
        154.8,
        77.4,
        38.7,
        768.0,
        25.0,
        20.0,
        6.25,
        256,
    ),
    (
        "L40S", 46_068, 362.05, 362.05, 183.0, 91.6, 864.0, 25.0, 20.0, 12.5, 512,
    ),
    (
        "H100-PCIe",
        81_559,
        756.0,
        756.0,
        378.0,
        51.0,
        2000.0,
        50.0,
        35.0,
        25.0,
        1024,
    ),
    (
        "H100-NVL", 95_830, 835.5, 835.5, 417.5, 60.0, 3938.0, 50.0, 35.0, 25.0, 1024,
    ),
    (
        "B200", 183_359, 2250.0, 2250.0, 1125.0, 75.0, 8000.0, 900.0, 35.0, 50.0, 2048,
    ),
    (
        "MI300X", 196_592, 1307.4, 1307.4, 653.7, 163.4, 5300.0, 448.0, 35.0, 50.0, 2048,
    ),
];

/// Other names of presets: the generation alone where it has one form (H200), the SXM form of
/// the H100 by its bus name, and the workstation card without its prefix.
pub(super) const GPU_ALIASES: &[(&str, &str)] = &[
    ("H200", "H200-141GB"),
    ("H100-SXM", "H100-80GB"),
    ("A6000", "RTX-A6000"),
];
