//! Synthetic allocation traces for benchmarks and comparisons: a training-like trace (a forward
//! pass that saves activations block by block, a backward that frees them in reverse while
//! gradients and temporaries come and go, an optimizer step) and a trace built to fragment
//! (interleaved lifetimes of mixed sizes that drift upward, as with dynamic shapes).
//!
//! Not for: tests of exact rules (those use hand-built sequences).

use crate::category::Category;
use crate::replay::{ReplayEvent, Trace, TraceFormat};
use crate::size::{KIB, MIB};

/// SplitMix64: a tiny deterministic generator, so traces are identical on every machine.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }
}

struct Builder {
    events: Vec<ReplayEvent>,
    next_id: u64,
}

impl Builder {
    fn alloc(&mut self, size: u64, category: Category) -> u64 {
        self.next_id += 1;
        self.events.push(ReplayEvent::Alloc {
            id: self.next_id,
            size,
            category,
        });
        self.next_id
    }

    fn free(&mut self, id: u64) {
        self.events.push(ReplayEvent::Free { id, lenient: false });
    }
}

/// A GPT-like training trace: `layers` blocks, `steps` steps, activations of `width`-scaled
/// sizes per block (attention scores, MLP hidden, norms), small bias/temporary allocations, and
/// per-step input batches whose size varies with `seed` (variable sequence lengths).
pub fn training_like(layers: usize, steps: usize, width: u64, seed: u64) -> Trace {
    let mut rng = SplitMix64::new(seed);
    let mut b = Builder {
        events: Vec::new(),
        next_id: 0,
    };
    let params: Vec<(u64, u64)> = (0..layers)
        .map(|_| {
            (
                b.alloc(12 * width * width, Category::Parameter),
                b.alloc(4 * width, Category::Parameter),
            )
        })
        .collect();
    let grads: Vec<u64> = (0..layers)
        .map(|_| b.alloc(12 * width * width, Category::Gradient))
        .collect();
    let states: Vec<u64> = (0..2 * layers)
        .map(|_| b.alloc(12 * width * width, Category::OptimizerState))
        .collect();
    for _ in 0..steps {
        let tokens = rng.range(256, 1024);
        let input = b.alloc(tokens * 8, Category::Input);
        let mut saved = Vec::new();
        for _ in 0..layers {
            let act = |mult: u64| tokens * width * mult;
            saved.push(b.alloc(act(4), Category::Activation)); // norm output
            saved.push(b.alloc(act(12), Category::Activation)); // qkv
            saved.push(b.alloc(tokens * tokens * 4 * 4, Category::Activation)); // scores (4 heads)
            saved.push(b.alloc(act(16), Category::Activation)); // mlp hidden
            let tmp = b.alloc(act(4), Category::Temporary);
            b.free(tmp);
        }
        for ids in saved.chunks(4).rev() {
            let g1 = b.alloc(tokens * width * 16, Category::Temporary);
            let g2 = b.alloc(tokens * width * 4, Category::Temporary);
            for &id in ids.iter().rev() {
                b.free(id);
            }
            b.free(g1);
            b.free(g2);
            let small = b.alloc(rng.range(KIB, 64 * KIB), Category::Temporary);
            b.free(small);
        }
        b.free(input);
    }
    for (w, bias) in params {
        b.free(w);
        b.free(bias);
    }
    for id in grads.into_iter().chain(states) {
        b.free(id);
    }
    Trace {
        format: TraceFormat::HeadroomJson,
        events: b.events,
        labels: crate::replay_labels::Labels::default(),
    }
}

/// A trace built to fragment: `n` allocations of mixed sizes (small, medium, large) with
/// interleaved lifetimes, sizes drifting upward over time, about a third kept alive long.
pub fn fragmenting(n: usize, seed: u64) -> Trace {
    let mut rng = SplitMix64::new(seed);
    let mut b = Builder {
        events: Vec::new(),
        next_id: 0,
    };
    let mut live: Vec<u64> = Vec::new();
    for i in 0..n {
        let drift = 1 + (i as u64 * 4) / n as u64; // sizes grow ×1 … ×5 over the trace
        let size = match rng.range(0, 10) {
            0..=3 => rng.range(KIB, 512 * KIB),
            4..=7 => rng.range(MIB, 8 * MIB) * drift,
            _ => rng.range(12 * MIB, 40 * MIB) * drift,
        };
        live.push(b.alloc(size, Category::Activation));
        // Free a random earlier allocation most of the time: lifetimes interleave.
        if live.len() > 8 && rng.range(0, 3) > 0 {
            let idx = rng.range(0, live.len() as u64) as usize;
            let id = live.swap_remove(idx);
            b.free(id);
        }
        if live.len() > 48 {
            let id = live.remove(0);
            b.free(id);
        }
    }
    for id in live {
        b.free(id);
    }
    Trace {
        format: TraceFormat::HeadroomJson,
        events: b.events,
        labels: crate::replay_labels::Labels::default(),
    }
}

/// The trace as headroom's JSON trace format.
pub fn to_json(trace: &Trace) -> serde_json::Value {
    let events: Vec<serde_json::Value> = trace
        .events
        .iter()
        .map(|e| match *e {
            ReplayEvent::Alloc { id, size, category } => {
                serde_json::json!({"action": "alloc", "addr": id, "size": size, "category": category})
            }
            ReplayEvent::Free { id, .. } => serde_json::json!({"action": "free", "addr": id}),
        })
        .collect();
    serde_json::Value::Array(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::parse_trace;

    #[test]
    fn synthetic_traces_are_balanced_and_parse_back() {
        for trace in [training_like(4, 3, 256, 1), fragmenting(500, 2)] {
            let allocs = trace
                .events
                .iter()
                .filter(|e| matches!(e, ReplayEvent::Alloc { .. }))
                .count();
            let frees = trace.events.len() - allocs;
            assert_eq!(allocs, frees, "every allocation is freed");
            let text = serde_json::to_vec(&to_json(&trace)).unwrap();
            assert_eq!(parse_trace(&text).unwrap().events, trace.events);
        }
    }
}
