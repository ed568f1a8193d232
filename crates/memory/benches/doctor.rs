//! `memory doctor` on a trace of 10^6 events: headroom's JSON trace of a training-like loop
//! with Python frames (1,000 steps of forward, backward, optimizer step and zero_grad, each
//! keeping its loss), read and diagnosed with a capacity, so every analysis and all three
//! replays run. Run: `cargo bench -p headroom-memory --bench doctor`; peak memory with
//! `/usr/bin/time -v` on the bench binary (docs/benchmarks.md).

use divan::Bencher;
use headroom_memory::AllocatorConfig;
use headroom_memory::doctor::{DoctorOptions, diagnose, read_trace};
use std::fmt::Write as _;

fn main() {
    divan::main();
}

/// Events per step: 240 forward allocations, their 240 frees in backward, 2 × 24 gradients
/// allocated and freed, 6 optimizer temporaries allocated and freed, one loss: 1,000 events.
const STEPS: usize = 1000;
const ACTIVATIONS: usize = 240;
const GRADIENTS: usize = 24;

fn frames(out: &mut String, file: &str, line: usize, name: &str) {
    let _ = write!(
        out,
        r#"[{{"filename":"/usr/lib/python3/site-packages/torch/{file}","line":1,"name":"{name}"}},{{"filename":"model.py","line":{line},"name":"forward"}},{{"filename":"train.py","line":20,"name":"main"}}]"#
    );
}

/// The trace, as JSON bytes, and its number of events.
fn trace() -> (Vec<u8>, usize) {
    let mut o = String::from("[");
    let n = std::cell::Cell::new(0usize);
    let mut addr = 0u64;
    let push = |o: &mut String, action: &str, a: u64, size: u64, f: Option<(&str, usize, &str)>| {
        if n.get() > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            r#"{{"action":"{action}","addr":{a},"size":{size},"frames":"#
        );
        match f {
            Some((file, line, name)) => frames(o, file, line, name),
            None => o.push_str("[]"),
        }
        o.push('}');
        n.set(n.get() + 1);
    };
    let params: Vec<u64> = (0..GRADIENTS as u64).map(|i| i + 1).collect();
    for &p in &params {
        push(
            &mut o,
            "alloc",
            p,
            8 << 20,
            Some(("nn/modules/module.py", 5, "cuda")),
        );
    }
    addr += 1000;
    let mut states = false;
    for step in 0..STEPS {
        let mut acts = Vec::with_capacity(ACTIVATIONS);
        for i in 0..ACTIVATIONS {
            addr += 1;
            acts.push(addr);
            let size = (1 + (i % 7) as u64) << 18;
            push(
                &mut o,
                "alloc",
                addr,
                size,
                Some(("nn/modules/linear.py", 10 + i % 40, "forward")),
            );
        }
        addr += 1;
        push(
            &mut o,
            "alloc",
            addr,
            512,
            Some(("nn/functional.py", 21, "cross_entropy")),
        );
        let mut grads = Vec::new();
        for _ in 0..GRADIENTS {
            addr += 1;
            grads.push(addr);
            push(&mut o, "alloc", addr, 8 << 20, None);
        }
        for a in acts.into_iter().rev() {
            push(&mut o, "free", a, 0, None);
        }
        if !states {
            for _ in 0..2 * GRADIENTS {
                addr += 1;
                push(
                    &mut o,
                    "alloc",
                    addr,
                    8 << 20,
                    Some(("optim/adamw.py", 1, "_multi_tensor_adamw")),
                );
            }
            states = true;
        }
        let k = if step == 0 {
            6 - 2 * GRADIENTS as i64
        } else {
            6
        };
        for _ in 0..k.max(0) {
            addr += 1;
            push(
                &mut o,
                "alloc",
                addr,
                16 << 20,
                Some(("optim/adamw.py", 1, "_multi_tensor_adamw")),
            );
            push(
                &mut o,
                "free",
                addr,
                0,
                Some(("optim/adamw.py", 1, "_multi_tensor_adamw")),
            );
        }
        for g in grads {
            push(
                &mut o,
                "free",
                g,
                0,
                Some(("optim/optimizer.py", 1, "zero_grad")),
            );
        }
        // Pad to exactly 1,000 events a step with small temporaries.
        while n.get() < (step + 1) * 1000 + GRADIENTS {
            addr += 1;
            push(
                &mut o,
                "alloc",
                addr,
                4096,
                Some(("nn/functional.py", 30, "gelu")),
            );
            push(
                &mut o,
                "free",
                addr,
                0,
                Some(("nn/functional.py", 30, "gelu")),
            );
        }
    }
    o.push(']');
    (o.into_bytes(), n.get())
}

#[divan::bench(sample_count = 3, sample_size = 1)]
fn read_and_diagnose_a_million_events(bencher: Bencher) {
    let (bytes, n) = trace();
    assert!(n >= 1_000_000, "{n} events");
    let none = |_: &str, _: i64| None;
    bencher.bench_local(|| {
        let events = read_trace(&bytes).expect("the generated trace reads");
        let d = diagnose(
            &events,
            &DoctorOptions {
                capacity: Some(40 << 30),
                allocator: AllocatorConfig::default(),
                sites: 8,
                source: &none,
            },
        );
        assert_eq!(d.events, n);
        d
    });
}
