//! Snapshots: the allocator's segments, blocks and event trace in PyTorch's
//! `torch.cuda.memory._snapshot()` shape, written as a pickle (which pytorch.org/memory_viz and
//! `python -m torch.cuda._memory_viz` open) or as JSON. Each block's and event's frame carries
//! its category and name (`activation:block0.mlp.fc1`) and the step and phase it belongs to.
//!
//! Not for: reading snapshots back (see `replay`).

use crate::allocator::CachingAllocator;
use crate::trace::{TraceAction, TraceEntry};
use serde::Serialize;
use std::io;
use std::path::Path;

/// A stack frame; headroom uses it to carry category, name, step and phase.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct SnapshotBlock {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: &'static str,
    pub frames: Vec<Frame>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SnapshotSegment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: i64,
    pub segment_type: &'static str,
    pub segment_pool_id: (i64, i64),
    pub is_expandable: bool,
    pub frames: Vec<Frame>,
    pub blocks: Vec<SnapshotBlock>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SnapshotTraceEntry {
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
    pub size: u64,
    pub stream: i64,
    pub time_us: u64,
    pub frames: Vec<Frame>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AllocatorSettings {
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF")]
    pub alloc_conf: String,
    pub max_split_size: i64,
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
}

/// PyTorch's snapshot dictionary.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub segments: Vec<SnapshotSegment>,
    pub device_traces: Vec<Vec<SnapshotTraceEntry>>,
    pub allocator_settings: AllocatorSettings,
}

fn tag_frame(category: Option<&str>, name: Option<&str>, step: u64, phase: &str) -> Frame {
    let label = match (category, name) {
        (Some(c), Some(n)) => format!("{c}:{n}"),
        (Some(c), None) => c.to_string(),
        _ => "allocator".to_string(),
    };
    let name = if phase.is_empty() {
        format!("{label} [step {step}]")
    } else {
        format!("{label} [step {step} {phase}]")
    };
    Frame {
        filename: "headroom".into(),
        line: step as i64,
        name,
    }
}

fn trace_entry(e: &TraceEntry) -> SnapshotTraceEntry {
    let oom = e.action == TraceAction::Oom;
    SnapshotTraceEntry {
        action: e.action.name(),
        addr: (!oom).then_some(e.addr),
        device_free: oom.then_some(e.addr),
        size: e.size,
        stream: 0,
        time_us: e.time_us,
        frames: vec![tag_frame(
            e.category.map(|c| c.name()),
            e.name.as_deref(),
            e.step,
            &e.phase,
        )],
    }
}

impl Snapshot {
    /// Captures the allocator's current state and recorded trace.
    pub fn capture(allocator: &CachingAllocator) -> Snapshot {
        let step = allocator.trace().step();
        let phase = allocator.trace().phase().to_string();
        let segments = allocator
            .segments()
            .into_iter()
            .map(|seg| {
                let allocated = seg.allocated_size();
                let requested = seg.requested_size();
                SnapshotSegment {
                    device: 0,
                    address: seg.address,
                    total_size: seg.total_size,
                    allocated_size: allocated,
                    active_size: allocated,
                    requested_size: requested,
                    stream: 0,
                    segment_type: seg.pool.segment_type(),
                    segment_pool_id: (0, 0),
                    is_expandable: seg.is_expandable,
                    frames: vec![],
                    blocks: seg
                        .blocks
                        .iter()
                        .map(|b| SnapshotBlock {
                            address: b.address,
                            size: b.size,
                            requested_size: b.requested_size,
                            state: b.state.name(),
                            frames: match b.category {
                                Some(c) => {
                                    vec![tag_frame(Some(c.name()), b.name.as_deref(), step, &phase)]
                                }
                                None => vec![],
                            },
                        })
                        .collect(),
                }
            })
            .collect();
        let traces = allocator.trace().entries().map(trace_entry).collect();
        let config = allocator.config();
        let mut conf = Vec::new();
        if config.expandable_segments {
            conf.push("expandable_segments:True".to_string());
        }
        if config.max_split_size != u64::MAX {
            conf.push(format!("max_split_size_mb:{}", config.max_split_size >> 20));
        }
        if config.garbage_collection_threshold > 0.0 {
            conf.push(format!(
                "garbage_collection_threshold:{}",
                config.garbage_collection_threshold
            ));
        }
        Snapshot {
            segments,
            device_traces: vec![traces],
            allocator_settings: AllocatorSettings {
                alloc_conf: conf.join(","),
                max_split_size: allocator.stats().max_split_size,
                garbage_collection_threshold: config.garbage_collection_threshold,
                expandable_segments: config.expandable_segments,
            },
        }
    }

    /// The pickle PyTorch's `_dump_snapshot` writes.
    pub fn to_pickle(&self) -> Vec<u8> {
        serde_pickle::to_vec(self, serde_pickle::SerOptions::new())
            .expect("snapshot types always serialise")
    }

    /// Writes the pickle atomically (temporary file, then rename).
    pub fn write_pickle(&self, path: &Path) -> io::Result<()> {
        crate::output::write_output(path, &self.to_pickle())
    }

    /// Writes the snapshot as JSON atomically.
    pub fn write_json(&self, path: &Path) -> io::Result<()> {
        let bytes = serde_json::to_vec(self).map_err(io::Error::other)?;
        crate::output::write_output(path, &bytes)
    }
}
