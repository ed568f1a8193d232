//! Rates of the step's work that is not a counted kernel: the optimizer update per parameter
//! (AdamW with f32, bf16 and 8-bit states over a flat buffer, Adafactor on a matrix) and the
//! copies between device memory and a host-tier buffer (activation offload, paging, offloaded
//! gradients and weights). Part of the speed model (`speed`).
//!
//! Not for: kernel rates or collectives (`speed`).

use super::speed::MEASURE_FOR;
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::optim::StateDtype;
use serde::Serialize;
use std::time::Instant;

/// Parameters updated per second: AdamW by state format, and Adafactor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct UpdateRates {
    pub f32: f64,
    pub bf16: f64,
    pub int8: f64,
    pub adafactor: f64,
}

/// The update an optimizer step runs, for its rate: an Adam-family or SGD loop over states of a
/// format (timed as AdamW's), or Adafactor's factored one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateKind {
    Adam(StateDtype),
    Adafactor,
}

impl UpdateRates {
    pub(super) fn of(&self, kind: UpdateKind) -> f64 {
        match kind {
            UpdateKind::Adam(StateDtype::F32) => self.f32,
            UpdateKind::Adam(StateDtype::Bf16) => self.bf16,
            UpdateKind::Adam(StateDtype::Int8) => self.int8,
            UpdateKind::Adafactor => self.adafactor,
        }
    }
}

/// Parameters of the update measurement.
const UPDATE_PARAMS: usize = 1 << 18;

/// AdamW's update rate with each state format: the best of three repetitions of
/// [`MEASURE_FOR`] each, after one warm-up step.
pub(super) fn measure_updates() -> UpdateRates {
    use headroom_nn::grad::Grads;
    use headroom_nn::optim::{
        AdafactorStep, AdamStep, TensorShape, adafactor_update, adamw_update, adamw8bit_update,
        quant8,
    };
    let n = UPDATE_PARAMS;
    let grads: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) * 1e-3).collect();
    let mut w = vec![0.5f32; n];
    let mut step = 0u64;
    let mut h = move || {
        step += 1;
        AdamStep {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            step,
            grad_multiplier: 1.0,
        }
    };
    let rate = |f: &mut dyn FnMut()| {
        f();
        let best = (0..3)
            .map(|_| {
                let t0 = Instant::now();
                let mut calls = 0u32;
                while t0.elapsed() < MEASURE_FOR {
                    f();
                    calls += 1;
                }
                t0.elapsed().as_secs_f64() / f64::from(calls)
            })
            .fold(f64::INFINITY, f64::min);
        n as f64 / best
    };
    let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
    let f32_rate = rate(&mut || adamw_update(&mut w, Grads::F32(&grads), &mut m, &mut v, h()));
    let (mut mb, mut vb) = (vec![half::bf16::ZERO; n], vec![half::bf16::ZERO; n]);
    let bf16_rate = rate(&mut || adamw_update(&mut w, Grads::F32(&grads), &mut mb, &mut vb, h()));
    let (mut mq, mut vq) = (vec![0u8; n], vec![0u8; n]);
    let (mut ma, mut va) = (vec![0f32; quant8::blocks(n)], vec![0f32; quant8::blocks(n)]);
    let int8_rate = rate(&mut || {
        adamw8bit_update(
            &mut w,
            Grads::F32(&grads),
            (&mut mq, &mut vq),
            (&mut ma, &mut va),
            h(),
        )
    });
    // Adafactor on one square matrix of the same size.
    let side = (n as f64).sqrt() as usize;
    let shapes = [TensorShape::Matrix {
        rows: side,
        cols: n / side,
    }];
    let mut factored = vec![0f32; side + n / side];
    let mut t = 0u64;
    let adafactor_rate = rate(&mut || {
        t += 1;
        let h = AdafactorStep {
            lr: 1e-3,
            weight_decay: 0.0,
            step: t,
            grad_multiplier: 1.0,
        };
        adafactor_update(&mut w, Grads::F32(&grads), &mut factored, &shapes, h)
    });
    UpdateRates {
        f32: f32_rate,
        bf16: bf16_rate,
        int8: int8_rate,
        adafactor: adafactor_rate,
    }
}

/// Bytes per second of a copy from a device buffer into a host-pool buffer of `bytes` and back
/// (what activation offload, paging and offloaded gradients do): the best of three batches of
/// [`MEASURE_FOR`].
pub(super) fn measure_host_copy(bytes: usize) -> f64 {
    let bytes = bytes.max(1 << 16);
    let device = Device::cpu(2 * bytes as u64, AllocatorConfig::default());
    let pool = headroom_memory::host_pool::HostPool::new(None, false);
    let (Ok(mut on_device), Ok(mut on_host)) = (
        device.alloc(bytes as u64, Category::Activation, None),
        pool.alloc::<u8>(bytes),
    ) else {
        return 0.0;
    };
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        let mut copies = 0u32;
        while start.elapsed() < MEASURE_FOR || copies == 0 {
            on_host.copy_from_slice(on_device.as_bytes().expect("a CPU buffer has bytes"));
            on_device
                .as_bytes_mut()
                .expect("a CPU buffer has bytes")
                .copy_from_slice(&on_host);
            copies += 2;
        }
        best = best.min(start.elapsed().as_secs_f64() / f64::from(copies));
    }
    bytes as f64 / best
}
