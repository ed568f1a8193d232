//! The in-process thread group: results checked against sums computed here in rank order
//! (bitwise), on every rank and whatever the threads' timing; and the failures, each bounded in
//! time: a stuck rank times out naming it, mismatched collectives are an error, a failing or
//! panicking rank releases the others at once.

use headroom_comm::{Collective, CommError, Communicator, ThreadGroup};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(5);

/// Rank r's values: not exactly representable sums, so the order of addition shows.
fn values(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| 0.1 + (rank * 7 + i) as f32 * 1.0e-3 + (i % 3) as f32 * 1.0e7)
        .collect()
}

/// The reference: element i summed over ranks 0, 1, …, n − 1, starting from rank 0's value.
fn rank_order_sum(n: usize, len: usize) -> Vec<f32> {
    let mut out = values(0, len);
    for r in 1..n {
        for (o, x) in out.iter_mut().zip(values(r, len)) {
            *o += x;
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn all_reduce_is_the_rank_order_sum_on_every_rank() {
    for n in [1, 2, 3, 4, 8] {
        let expected = bits(&rank_order_sum(n, 37));
        for trial in 0..5 {
            let results = ThreadGroup::run(n, DEADLINE, |mut c| {
                // Stagger the ranks differently in every trial.
                std::thread::sleep(Duration::from_micros(
                    ((c.rank() * 31 + trial * 17) % 5) as u64 * 100,
                ));
                let mut data = values(c.rank(), 37);
                c.all_reduce_sum(&mut data).unwrap();
                bits(&data)
            });
            for r in results {
                assert_eq!(r.unwrap(), expected, "n = {n}");
            }
        }
    }
}

#[test]
fn reduce_scatter_then_all_gather_is_an_all_reduce() {
    // 3 ranks × 4 elements: rank r keeps the summed chunk r, then gathering the chunks gives
    // every rank the whole sum.
    let n = 3;
    let expected = bits(&rank_order_sum(n, 12));
    let results = ThreadGroup::run(n, DEADLINE, |mut c| {
        let input = values(c.rank(), 12);
        let mut shard = vec![0.0; 4];
        c.reduce_scatter_sum(&input, &mut shard).unwrap();
        let own = bits(&shard);
        let mut whole = vec![0.0; 12];
        c.all_gather(&shard, &mut whole).unwrap();
        (own, bits(&whole), c.counts())
    });
    for (rank, r) in results.into_iter().enumerate() {
        let (own, whole, counts) = r.unwrap();
        assert_eq!(own, expected[rank * 4..rank * 4 + 4].to_vec());
        assert_eq!(whole, expected);
        // One reduce-scatter of 12 elements and one all-gather of 4, as counted.
        assert_eq!(counts.reduce_scatter, (1, 12));
        assert_eq!(counts.all_gather, (1, 4));
        assert_eq!(counts.elements(), 16);
    }
}

#[test]
fn broadcast_copies_the_root_and_barrier_joins_everyone() {
    let results = ThreadGroup::run(4, DEADLINE, |mut c| {
        let mut data = values(c.rank(), 5);
        c.broadcast(&mut data, 2).unwrap();
        c.barrier().unwrap();
        bits(&data)
    });
    for r in results {
        assert_eq!(r.unwrap(), bits(&values(2, 5)));
    }
}

#[test]
fn a_stuck_rank_times_out_naming_it() {
    let started = Instant::now();
    let results = ThreadGroup::run(3, Duration::from_millis(300), |mut c| {
        if c.rank() == 1 {
            // Rank 1 never joins; it waits until the others have given up.
            std::thread::sleep(Duration::from_millis(600));
            return None;
        }
        let mut data = vec![1.0; 4];
        Some(c.all_reduce_sum(&mut data).unwrap_err())
    });
    assert!(started.elapsed() < Duration::from_secs(5));
    let errors: Vec<CommError> = results.into_iter().filter_map(|r| r.unwrap()).collect();
    assert_eq!(errors.len(), 2);
    // The first to time out names rank 1; the other either times out too or is released by it.
    assert!(errors.iter().any(|e| matches!(e,
        CommError::Timeout { missing, collective: Collective::AllReduce, .. } if missing == &vec![1])));
    for e in &errors {
        assert!(e.to_string().contains("rank"), "{e}");
    }
}

#[test]
fn mismatched_collectives_are_an_error_not_a_hang() {
    let results = ThreadGroup::run(2, DEADLINE, |mut c| {
        let mut data = vec![1.0; 8];
        if c.rank() == 0 {
            c.all_reduce_sum(&mut data).unwrap_err()
        } else {
            c.broadcast(&mut data[..3], 0).unwrap_err()
        }
    });
    for r in results {
        let e = r.unwrap();
        assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains("all_reduce") && e.to_string().contains("broadcast"));
    }
}

#[test]
fn a_failing_or_panicking_rank_releases_the_others_at_once() {
    for panics in [false, true] {
        let started = Instant::now();
        let results = ThreadGroup::run(3, Duration::from_secs(30), |mut c| {
            if c.rank() == 2 {
                if panics {
                    panic!("rank 2 fails at step 3");
                }
                c.fail("loss became NaN at step 3");
                return None;
            }
            let mut data = vec![1.0; 4];
            Some(c.all_reduce_sum(&mut data).unwrap_err())
        });
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "released long before the 30 s deadline"
        );
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(Some(e)) => {
                    assert!(
                        matches!(e, CommError::PeerFailed { failed: 2, .. }),
                        "rank {rank}: {e}"
                    );
                }
                Ok(None) => assert_eq!(rank, 2),
                Err(_) => assert!(panics && rank == 2),
            }
        }
    }
}

#[test]
fn bad_lengths_are_refused_before_joining() {
    let results = ThreadGroup::run(2, DEADLINE, |mut c| {
        let mut out = vec![0.0; 3];
        c.reduce_scatter_sum(&[1.0; 5], &mut out).unwrap_err()
    });
    for r in results {
        assert!(matches!(r.unwrap(), CommError::BadArguments { .. }));
    }
}
