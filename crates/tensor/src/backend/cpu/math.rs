//! Scalar definitions of the element-wise functions and, next to each, its derivative. These
//! are the formulas the CPU kernels apply per element (in f32).
//!
//! Not for: looping or layouts (see `elementwise`).

use crate::backend::UnaryOp;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

#[inline(always)]
pub fn unary(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => x.max(0.0),
        // gelu(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
        UnaryOp::Gelu => 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh()),
        // silu(x) = x·σ(x)
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
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
            let t = u.tanh();
            dy * (0.5 * (1.0 + t)
                + 0.5 * s * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * s * s))
        }
        // silu'(x) = σ(x)·(1 + x·(1 − σ(x)))
        UnaryOp::Silu => {
            let sig = 1.0 / (1.0 + (-s).exp());
            dy * sig * (1.0 + s * (1.0 - sig))
        }
        UnaryOp::Affine { mul, .. } => dy * mul,
        // y = xᵖ: dy/dx = p·xᵖ⁻¹
        UnaryOp::Powf(p) => dy * p * s.powf(p - 1.0),
    }
}
