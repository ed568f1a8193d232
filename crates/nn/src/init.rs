//! Deterministic initial values: normal(0, σ) from the tensor engine's counter-based generator
//! (Box–Muller on two uniforms), so a seed gives the same weights on every machine.
//!
//! Not for: which rule a weight follows (each model says so).

use headroom_tensor::rng::uniform;
use headroom_tensor::{ParamBlock, ParamSpec, Result};

/// How one weight starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    Zeros,
    Ones,
    /// normal(0, σ)
    Normal(f32),
    /// uniform(−b, b)
    Uniform(f32),
}

/// Fills every weight of `blocks` by `rule(weight name)`; weight w of block b draws from stream
/// (b << 8 | w) of `seed`, so each weight's values depend only on its position, not on the others.
pub fn initialise(blocks: &[ParamBlock], seed: u64, rule: impl Fn(&str) -> Init) -> Result<()> {
    for (bi, block) in blocks.iter().enumerate() {
        initialise_at(block, bi, seed, &rule)?;
    }
    Ok(())
}

/// Fills `block` as [`initialise`] fills the block at index `bi` of a list.
pub fn initialise_at(
    block: &ParamBlock,
    bi: usize,
    seed: u64,
    rule: &impl Fn(&str) -> Init,
) -> Result<()> {
    if !block.flat().device().is_backed() {
        return Ok(()); // a dry run's device holds no values: drawing them would only cost time
    }
    block.set_values(&block_values(bi, block.specs(), seed, rule))
}

/// The initial values of block `bi` whose weights `specs` lays out (back to back, in order),
/// as [`initialise`] draws them: on the host, without a block on any device.
pub fn block_values(
    bi: usize,
    specs: &[ParamSpec],
    seed: u64,
    rule: &impl Fn(&str) -> Init,
) -> Vec<f32> {
    let mut values = Vec::new();
    for (wi, spec) in specs.iter().enumerate() {
        let n: usize = spec.shape.iter().product();
        let stream = ((bi as u64) << 8) | wi as u64;
        match rule(&spec.name) {
            Init::Zeros => values.extend(std::iter::repeat_n(0.0, n)),
            Init::Ones => values.extend(std::iter::repeat_n(1.0, n)),
            Init::Normal(std) => values.extend(normal(n, std, seed, stream)),
            Init::Uniform(bound) => {
                let base = stream << 40;
                values.extend((0..n).map(|i| (2.0 * uniform(seed, base + i as u64) - 1.0) * bound))
            }
        }
    }
    values
}

/// `n` values drawn from normal(0, `std`) for stream `stream` of `seed`.
pub fn normal(n: usize, std: f32, seed: u64, stream: u64) -> Vec<f32> {
    let base = stream << 40;
    (0..n)
        .map(|i| {
            let u1 = uniform(seed, base + 2 * i as u64).max(f32::MIN_POSITIVE) as f64;
            let u2 = uniform(seed, base + 2 * i as u64 + 1) as f64;
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (z * std as f64) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_has_the_requested_moments_and_is_reproducible() {
        let v = normal(200_000, 0.02, 7, 3);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        // Standard error of the mean: 0.02/√200000 ≈ 4.5e-5; of the std: ≈ 0.02/√400000 ≈ 3e-5.
        assert!(mean.abs() < 3e-4, "{mean}");
        assert!((var.sqrt() - 0.02).abs() < 3e-4, "{}", var.sqrt());
        assert_eq!(v[..10], normal(10, 0.02, 7, 3)[..]);
        assert_ne!(v[..10], normal(10, 0.02, 7, 4)[..]);
    }
}
