//! Scalar definitions of the element-wise functions and, next to each, its derivative. These
//! are the formulas the CPU kernels apply per element (in f32).
//!
//! Not for: looping or layouts (see `elementwise`).

use crate::backend::UnaryOp;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

/// eˣ for f32 without a libm call, so loops over it vectorise: x = n·ln2 + r with
/// |r| ≤ ln2/2 (Cody–Waite split of ln2), eʳ by its degree-6 Taylor polynomial (truncation error
/// r⁷/7! ≤ 1.2e-7), times 2ⁿ built from the exponent bits. Below −87 (where eˣ is no longer a
/// normal f32) the result is 0, so masked scores (−∞) get exactly zero probability; above 88 it
/// saturates at e⁸⁸.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    let e = fast_exp_normal(x);
    if x < -87.0 { 0.0 } else { e }
}

#[inline(always)]
fn fast_exp_normal(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.0, 88.0);
    // Round to nearest by adding and subtracting 1.5·2²³ (no libm call, so it vectorises).
    const ROUND: f32 = 12_582_912.0;
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // n as an integer without a float→int conversion: t lies in [2²³, 2²⁴), where the ulp is 1,
    // so its mantissa bits count t − 2²³ and t's bits minus ROUND's bits are exactly n (the
    // value `n as i32` gives). `as i32` must saturate and map NaN to 0, which LLVM does one
    // lane at a time; this integer arithmetic vectorises. (A NaN x yields NaN either way.)
    let biased = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127); // n + 127
    p * f32::from_bits(biased << 23)
}

/// tanh(u) = sign(u)·(1 − 2/(e^{2|u|} + 1)) on [`fast_exp`]; absolute error below 2e-7, which is
/// what GELU's 0.5·x·(1 + tanh(·)) needs.
#[inline(always)]
fn fast_tanh(u: f32) -> f32 {
    let t = 1.0 - 2.0 / (fast_exp(2.0 * u.abs()) + 1.0);
    t.copysign(u)
}

#[inline(always)]
pub fn unary(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => fast_exp(x),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + fast_exp(-x)),
        UnaryOp::Relu => x.max(0.0),
        // gelu(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
        UnaryOp::Gelu => 0.5 * x * (1.0 + fast_tanh(SQRT_2_OVER_PI * (x + GELU_C * x * x * x))),
        // silu(x) = x·σ(x)
        UnaryOp::Silu => x / (1.0 + fast_exp(-x)),
        UnaryOp::Affine { mul, add } => x * mul + add,
        UnaryOp::Powf(p) => x.powf(p),
    }
}

/// `dy · f'(·)`, where `s` is the op's output for ops with `grad_from_output`, else its input.
#[inline(always)]
pub fn unary_grad(op: UnaryOp, s: f32, dy: f32) -> f32 {
    match op {
        UnaryOp::Neg => -dy,
        // y = eˣ: dy/dx = y
        UnaryOp::Exp => dy * s,
        // y = ln x: dy/dx = 1/x
        UnaryOp::Log => dy / s,
        // y = √x: dy/dx = 1/(2y)
        UnaryOp::Sqrt => dy / (2.0 * s),
        // y = tanh x: dy/dx = 1 − y²
        UnaryOp::Tanh => dy * (1.0 - s * s),
        // y = σ(x): dy/dx = y(1 − y)
        UnaryOp::Sigmoid => dy * s * (1.0 - s),
        // y = max(x, 0): dy/dx = [y > 0]
        UnaryOp::Relu => {
            if s > 0.0 {
                dy
            } else {
                0.0
            }
        }
        // gelu'(x) = 0.5(1 + t) + 0.5·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²), t = tanh(u)
        UnaryOp::Gelu => {
            let u = SQRT_2_OVER_PI * (s + GELU_C * s * s * s);
            let t = fast_tanh(u);
            dy * (0.5 * (1.0 + t)
                + 0.5 * s * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * s * s))
        }
        // silu'(x) = σ(x)·(1 + x·(1 − σ(x)))
        UnaryOp::Silu => {
            let sig = 1.0 / (1.0 + fast_exp(-s));
            dy * sig * (1.0 + s * (1.0 - sig))
        }
        UnaryOp::Affine { mul, .. } => dy * mul,
        // y = xᵖ: dy/dx = p·xᵖ⁻¹
        UnaryOp::Powf(p) => dy * p * s.powf(p - 1.0),
    }
}

/// GELU's derivative times `dy` and GELU's value at `x` together, sharing one tanh: the bits of
/// `unary_grad(Gelu, x, dy)` and of `unary(Gelu, x)` (the same expressions in the same order).
#[inline(always)]
pub fn gelu_grad_and_value(x: f32, dy: f32) -> (f32, f32) {
    let t = fast_tanh(SQRT_2_OVER_PI * (x + GELU_C * x * x * x));
    let grad = dy
        * (0.5 * (1.0 + t)
            + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x));
    (grad, 0.5 * x * (1.0 + t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_and_tanh_match_libm() {
        let mut worst_exp = 0.0f64;
        let mut worst_tanh = 0.0f64;
        for i in -20_000..=20_000 {
            let x = i as f32 * 0.004; // [-80, 80]
            let e = fast_exp(x) as f64;
            let want = (x as f64).exp();
            worst_exp = worst_exp.max(((e - want) / want).abs());
            let u = i as f32 * 0.0005; // [-10, 10]
            worst_tanh = worst_tanh.max((fast_tanh(u) as f64 - (u as f64).tanh()).abs());
        }
        // A few ulps of f32 (ulp = 1.19e-7 relative).
        assert!(worst_exp < 5e-7, "exp relative error {worst_exp}");
        assert!(worst_tanh < 2e-7, "tanh absolute error {worst_tanh}");
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
    }
}
