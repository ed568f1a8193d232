//! How many micro-batches' activations each pipeline stage holds at its peak, found by replaying
//! the order in which Megatron-LM's schedules run forwards and backwards
//! (NVIDIA/Megatron-LM `megatron/core/pipeline_parallel/schedules.py`; Narayanan et al. 2021,
//! arXiv:2104.04473, §2.2).
//!
//! Stage i of p with v model chunks and m micro-batches runs
//! w = min(2(p − i − 1) + (v − 1)·p, m·v) warm-up forwards (w = min(p − i − 1, m) for 1F1B, where
//! v = 1 and the rule reads p − i − 1), then alternates one forward and one backward, then drains
//! the remaining backwards. The k-th forward runs chunk (k mod p·v) / p and the k-th backward
//! chunk v − 1 − (k mod p·v) / p. A forward keeps its chunk's activations until that chunk's
//! backward for the same micro-batch frees them, so the peak is reached just after a forward.
//!
//! For 1F1B this gives min(p − i, m) micro-batches on stage i; for the interleaved schedule on
//! stage 0 with m ≥ p, (v + 1)·p − 1 chunk-micro-batches: L·(1 + (p − 1)/(p·v)) layers' worth,
//! Narayanan et al.'s interleaving penalty.
//!
//! Not for: the bytes a chunk holds (`activation`, `rank`).

/// The chunk-micro-batches stage `stage` holds, per model chunk, at the moment their bytes are
/// largest, one micro-batch of chunk c weighing `weights[c]` (its layers' activations and what
/// else it keeps per micro-batch; equal weights find the largest count): `result[c]`
/// micro-batches of chunk c (chunk c of stage i is virtual stage c·p + i).
pub fn peak_in_flight(
    stage: u64,
    pp: u64,
    chunks: u64,
    microbatches: u64,
    weights: &[f64],
) -> Vec<u64> {
    let (p, v, m) = (pp, chunks, microbatches);
    let total = m * v;
    let warmup = if v == 1 {
        (p - stage - 1).min(m)
    } else {
        (2 * (p - stage - 1) + (v - 1) * p).min(total)
    };
    let forward_chunk = |k: u64| (k % (p * v)) / p;
    let backward_chunk = |k: u64| v - 1 - (k % (p * v)) / p;
    let mut held = vec![0u64; v as usize];
    let mut peak = held.clone();
    let bytes =
        |held: &Vec<u64>| -> f64 { held.iter().zip(weights).map(|(n, w)| *n as f64 * w).sum() };
    let record = |held: &Vec<u64>, peak: &mut Vec<u64>| {
        if bytes(held) > bytes(peak) {
            peak.clone_from(held);
        }
    };
    for k in 0..warmup {
        held[forward_chunk(k) as usize] += 1;
        record(&held, &mut peak);
    }
    for j in 0..total - warmup {
        held[forward_chunk(warmup + j) as usize] += 1;
        record(&held, &mut peak);
        held[backward_chunk(j) as usize] -= 1;
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_holds_p_minus_i_micro_batches() {
        // p = 4, m = 8: stages hold 4, 3, 2, 1.
        for (i, want) in [4, 3, 2, 1].into_iter().enumerate() {
            assert_eq!(peak_in_flight(i as u64, 4, 1, 8, &[1.0]), vec![want]);
        }
        // Fewer micro-batches than stages: never more than m.
        assert_eq!(peak_in_flight(0, 4, 1, 2, &[1.0]), vec![2]);
        // No pipeline: one micro-batch at a time.
        assert_eq!(peak_in_flight(0, 1, 1, 16, &[1.0]), vec![1]);
    }

    #[test]
    fn interleaving_holds_the_penalty_on_stage_0() {
        // p = 4, v = 2, m = 8: warm-up 2·3 + 1·4 = 10 forwards (chunk 0 for micro-batches 0–3,
        // chunk 1 for 0–3, chunk 0 for 4–5), then the 11th forward (chunk 0, micro-batch 6)
        // before the first backward: 7 of chunk 0 and 4 of chunk 1, 11 = (v + 1)·p − 1.
        assert_eq!(peak_in_flight(0, 4, 2, 8, &[1.0, 1.0]), vec![7, 4]);
        // The last stage: no extra warm-up beyond (v − 1)·p = 4 (chunk 0 for micro-batches
        // 0–3), then the 5th forward (chunk 1, micro-batch 0) before its backward: 4 + 1.
        assert_eq!(peak_in_flight(3, 4, 2, 8, &[1.0, 1.0]), vec![4, 1]);
    }

    #[test]
    fn weights_choose_the_heaviest_moment_not_the_largest_count() {
        // p = 2, v = 2, m = 4 on stage 1: warm-up 2·0 + 1·2 = 2 forwards (chunk 0 of
        // micro-batches 0, 1), then forward k = 2 (chunk 1, micro-batch 0) → (2, 1) before the
        // first backward (chunk 1) frees it, then forward k = 3 (chunk 1, micro-batch 1) →
        // (2, 1) again, backward of chunk 1 → (2, 0), forward k = 4 (chunk 0, micro-batch 2) →
        // (3, 0), … Counts tie at 3 between (2, 1) and (3, 0): with chunk 1 ten times heavier
        // (the output layer's logits) the peak is (2, 1) = 2 + 10 = 12 against 3.
        assert_eq!(peak_in_flight(1, 2, 2, 4, &[1.0, 10.0]), vec![2, 1]);
        // With chunk 0 heavier the first moment holding three of chunk 0 wins.
        assert_eq!(peak_in_flight(1, 2, 2, 4, &[10.0, 1.0]), vec![3, 0]);
    }
}
