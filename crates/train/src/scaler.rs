//! Dynamic loss scaling for fp16-mixed training, with PyTorch GradScaler's defaults and
//! semantics (docs/sources.md §3): initial scale 2^16; after `growth_interval` (2000)
//! consecutive finite steps the scale doubles (only if the result is finite); on an inf/nan
//! gradient the step is skipped and the scale halves. Under accumulation the scale stays fixed
//! across micro-batches and is updated once per optimizer step. Gradients are unscaled before
//! clipping.
//!
//! Not for: finding the non-finite values (the trainer checks the unscaled gradients).

use serde::{Deserialize, Serialize};

/// GradScaler settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScalerConfig {
    pub init_scale: f32,
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: u32,
}

impl Default for ScalerConfig {
    fn default() -> Self {
        ScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// The scaler's state; part of a saved run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    pub config: ScalerConfig,
    pub scale: f32,
    /// Consecutive finite steps since the last change (PyTorch's growth tracker).
    pub growth_tracker: u32,
    /// Optimizer steps skipped for non-finite gradients.
    pub skipped_steps: u64,
}

/// What `update` decided for this optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalerDecision {
    /// Gradients were finite: apply the optimizer step.
    Step,
    /// A gradient was inf or nan: skip the optimizer step (parameters untouched).
    Skip,
}

impl LossScaler {
    pub fn new(config: ScalerConfig) -> LossScaler {
        LossScaler {
            config,
            scale: config.init_scale,
            growth_tracker: 0,
            skipped_steps: 0,
        }
    }

    /// Factor to multiply the loss by before backward.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Factor to multiply gradients by before clipping and the step: 1/scale computed in f64
    /// and rounded to f32, as PyTorch does.
    pub fn inv_scale(&self) -> f32 {
        (1.0f64 / self.scale as f64) as f32
    }

    /// Ends an optimizer step: `found_inf` says whether any unscaled gradient was non-finite.
    pub fn update(&mut self, found_inf: bool) -> ScalerDecision {
        if found_inf {
            self.scale *= self.config.backoff_factor;
            self.growth_tracker = 0;
            self.skipped_steps += 1;
            return ScalerDecision::Skip;
        }
        self.growth_tracker += 1;
        if self.growth_tracker == self.config.growth_interval {
            let grown = self.scale * self.config.growth_factor;
            if grown.is_finite() {
                self.scale = grown;
            }
            self.growth_tracker = 0;
        }
        ScalerDecision::Step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_overflow_skips_the_step_and_halves_the_scale() {
        let mut s = LossScaler::new(ScalerConfig::default());
        assert_eq!(s.scale(), 65536.0);
        assert_eq!(s.update(true), ScalerDecision::Skip);
        assert_eq!(s.scale(), 32768.0);
        assert_eq!(s.skipped_steps, 1);
    }

    #[test]
    fn scale_doubles_after_the_growth_interval_of_finite_steps() {
        let mut s = LossScaler::new(ScalerConfig {
            growth_interval: 3,
            ..Default::default()
        });
        s.update(false);
        s.update(false);
        assert_eq!(s.scale(), 65536.0);
        s.update(false);
        assert_eq!(s.scale(), 131072.0);
        // An overflow resets the tracker: three more finite steps are needed.
        s.update(true);
        s.update(false);
        s.update(false);
        assert_eq!(s.scale(), 65536.0);
        s.update(false);
        assert_eq!(s.scale(), 131072.0);
    }

    #[test]
    fn growth_stops_at_the_largest_finite_scale() {
        let mut s = LossScaler::new(ScalerConfig {
            init_scale: f32::MAX / 1.5,
            growth_interval: 1,
            ..Default::default()
        });
        s.update(false);
        assert_eq!(
            s.scale(),
            f32::MAX / 1.5,
            "2 × scale would overflow, so it stays"
        );
        assert_eq!(s.inv_scale(), (1.0 / (f32::MAX as f64 / 1.5)) as f32);
    }
}
