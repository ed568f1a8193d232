//! Batch splits and "the largest that fits": the micro-batch × accumulation splits of a batch,
//! largest micro-batch first, and a bisection that finds the first fitting item of a list whose
//! fitting items form a suffix (memory never grows as the micro-batch shrinks).
//!
//! Not for: deciding whether something fits (the evaluators).

/// Micro-batch × accumulation splits of `per_device` samples allowed by the pinned values,
/// largest micro-batch first.
pub fn batch_splits(
    per_device: u64,
    micro_batch: Option<u64>,
    accumulation: Option<u64>,
) -> Vec<(u64, u64)> {
    let mut micro: Vec<u64> = Vec::new();
    let mut d = 1;
    while d * d <= per_device {
        if per_device.is_multiple_of(d) {
            micro.push(d);
            if d * d != per_device {
                micro.push(per_device / d);
            }
        }
        d += 1;
    }
    micro.sort_unstable_by(|a, b| b.cmp(a));
    micro
        .into_iter()
        .map(|m| (m, per_device / m))
        .filter(|&(m, _)| micro_batch.is_none_or(|p| p == m))
        .filter(|&(_, a)| accumulation.is_none_or(|p| p == a))
        .collect()
}

/// The first item of `items` that fits, by bisection, given that the fitting items are a suffix
/// of the list. Evaluates the first item, then the last, then bisects: at most 2 + ⌈log₂ n⌉
/// evaluations. Returns the fitting evaluation (if any) and every evaluation that did not fit.
pub fn largest_fitting<T, P, E>(
    items: &[T],
    mut eval: impl FnMut(&T) -> Result<P, E>,
    fits: impl Fn(&P) -> bool,
) -> Result<(Option<P>, Vec<P>), E> {
    let mut misses = Vec::new();
    let Some(head) = items.first() else {
        return Ok((None, misses));
    };
    let first = eval(head)?;
    if fits(&first) {
        return Ok((Some(first), misses));
    }
    misses.push(first);
    let (mut lo, mut hi) = (0, items.len() - 1); // lo does not fit; hi fits once tried
    let mut best = None;
    if hi > lo {
        let last = eval(&items[hi])?;
        if !fits(&last) {
            misses.push(last);
            return Ok((None, misses));
        }
        best = Some(last);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let p = eval(&items[mid])?;
        if fits(&p) {
            hi = mid;
            best = Some(p);
        } else {
            lo = mid;
            misses.push(p);
        }
    }
    Ok((best, misses))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_keep_the_batch_and_the_pins() {
        assert_eq!(
            batch_splits(12, None, None),
            vec![(12, 1), (6, 2), (4, 3), (3, 4), (2, 6), (1, 12)]
        );
        assert_eq!(batch_splits(12, None, Some(4)), vec![(3, 4)]);
        assert!(batch_splits(12, Some(5), None).is_empty());
        assert_eq!(batch_splits(1, None, None), vec![(1, 1)]);
        assert_eq!(batch_splits(49, None, None), vec![(49, 1), (7, 7), (1, 49)]);
    }

    #[test]
    fn bisection_finds_the_first_fitting_item_of_every_monotone_list() {
        for n in 0..=12usize {
            let list: Vec<usize> = (0..n).collect();
            for threshold in 0..=n {
                // Index i fits when i ≥ threshold (threshold n: nothing fits).
                let mut tried = 0;
                let (found, misses) = largest_fitting(
                    &list,
                    |&i| {
                        tried += 1;
                        Ok::<_, ()>((i, i >= threshold))
                    },
                    |p| p.1,
                )
                .unwrap();
                assert_eq!(found.map(|p| p.0), (threshold < n).then_some(threshold));
                assert!(misses.iter().all(|p| !p.1));
                let bound = 2 + (n.max(1) as f64).log2().ceil() as usize;
                assert!(tried <= bound, "n {n}, t {threshold}");
            }
        }
    }
}
