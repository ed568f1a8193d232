//! `headroom plan --trace MODEL --max-context`: the longest sequence the recommended setting
//! fits. Its levers are kept (precision, checkpointing, micro-batch, the optimizer's
//! implementation, LoRA) and the sequence doubled from `--seq-len` up to 64 times, no further
//! than the model's position limit where its config states one (GPT-2's `n_positions`, else
//! `max_position_embeddings`: fake tensors hold no values, so a position embedding would be read
//! past its end without an error); every length
//! is traced in the one sweep and replayed, and the longest that fits is reported.
//!
//! Not for: the ranking of the settings at `--seq-len` (`plan_trace`).

use super::plan_trace_output::Row;
use super::plan_trace_sweep::trace_peaks;
use anyhow::Result;
use headroom_memory::size::format_bytes;

/// Doublings of the sequence length tried: up to 64 times `--seq-len`.
const DOUBLINGS: u32 = 6;

/// One sequence length traced with the recommended levers.
#[derive(Clone, Debug)]
pub struct Probe {
    pub seq_len: u64,
    /// (allocated, reserved) peaks, or why it could not be traced.
    pub peaks: Result<(u64, u64), String>,
    pub fits: bool,
}

/// The lengths to try: `seq_len` doubled, at most [`DOUBLINGS`] times, none over `limit`.
pub fn lengths(seq_len: u64, limit: Option<u64>) -> Vec<u64> {
    (1..=DOUBLINGS)
        .map(|k| seq_len << k)
        .take_while(|&s| limit.is_none_or(|l| s <= l))
        .collect()
}

/// Traces `best`'s levers at each of `lengths`; probes in order of length.
pub fn probe(
    model: &str,
    steps: u64,
    best: &Row,
    lora: Option<(usize, f32)>,
    lengths: &[u64],
) -> Result<Vec<Probe>> {
    if lengths.is_empty() {
        return Ok(Vec::new());
    }
    let settings: Vec<serde_json::Value> = lengths
        .iter()
        .map(|&s| {
            let mut v = best.variant.tracer_settings(lora);
            v["seq_len"] = s.into();
            v
        })
        .collect();
    eprintln!(
        "tracing the recommended setting at {} longer sequences",
        lengths.len()
    );
    let peaks = trace_peaks(model, lengths[0], steps, &settings)?;
    Ok(lengths
        .iter()
        .zip(peaks)
        .map(|(&seq_len, peaks)| {
            let fits = peaks
                .as_ref()
                .is_ok_and(|&(_, r)| r + best.budget.context <= best.budget.bytes);
            Probe {
                seq_len,
                peaks,
                fits,
            }
        })
        .collect())
}

/// The longest length that fits when every shorter one does too (`seq_len` itself fits: it is
/// the recommendation's).
pub fn longest(seq_len: u64, probes: &[Probe]) -> u64 {
    probes
        .iter()
        .take_while(|p| p.fits)
        .last()
        .map_or(seq_len, |p| p.seq_len)
}

pub fn to_text(seq_len: u64, limit: Option<u64>, probes: &[Probe]) -> String {
    let mut out = String::from("\nLonger sequences with the recommended levers:\n");
    for p in probes {
        let line = match &p.peaks {
            Ok((a, r)) => format!(
                "  seq {:>7}: allocated {}, reserved {}, {}\n",
                p.seq_len,
                format_bytes(*a),
                format_bytes(*r),
                if p.fits { "fits" } else { "does not fit" }
            ),
            Err(e) => format!("  seq {:>7}: not traced: {e}\n", p.seq_len),
        };
        out.push_str(&line);
    }
    let best = longest(seq_len, probes);
    let bound = match (probes.last(), limit) {
        (Some(last), Some(l)) if last.fits && last.seq_len * 2 > l => {
            format!(" (the model's position limit is {l})")
        }
        (Some(last), _) if last.fits => " (the longest tried)".to_string(),
        (None, Some(l)) => format!(" (the model's position limit is {l})"),
        _ => String::new(),
    };
    out.push_str(&format!(
        "Longest sequence that fits: {best} tokens{bound}.\n"
    ));
    out
}

pub fn to_json(seq_len: u64, probes: &[Probe]) -> serde_json::Value {
    serde_json::json!({
        "longest_fitting_seq_len": longest(seq_len, probes),
        "probes": probes.iter().map(|p| {
            let mut v = serde_json::json!({"seq_len": p.seq_len, "fits": p.fits});
            match &p.peaks {
                Ok((a, r)) => {
                    v["allocated_peak_bytes"] = (*a).into();
                    v["reserved_peak_bytes"] = (*r).into();
                }
                Err(e) => v["error"] = e.clone().into(),
            }
            v
        }).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_double_up_to_the_trained_context() {
        // 128 · 2^k for k = 1..6, and only those ≤ 1000 under a 1000-token limit.
        assert_eq!(lengths(128, None), [256, 512, 1024, 2048, 4096, 8192]);
        assert_eq!(lengths(128, Some(1000)), [256, 512]);
        assert!(lengths(128, Some(200)).is_empty());
    }

    #[test]
    fn the_longest_fitting_length_stops_at_the_first_miss() {
        let p = |seq_len, fits| Probe {
            seq_len,
            peaks: Ok((0, 0)),
            fits,
        };
        assert_eq!(
            longest(128, &[p(256, true), p(512, false), p(1024, true)]),
            256
        );
        assert_eq!(longest(128, &[p(256, false)]), 128);
        assert_eq!(longest(128, &[]), 128);
    }
}
