//! `MemoryBreakdown`: bytes per Category at the step's peak and at steady state. The planner
//! produces one as a prediction, a run produces one as a measurement, and the two subtract.
//! `MemoryPeaks` adds the allocated and reserved peaks and each category's own peak: what a
//! dry run predicts and a run measures of a device.

use crate::category::Category;
use crate::stats::DeviceStats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::{Index, IndexMut};

/// Bytes per category. Serialises as a JSON object keyed by category name with integer bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CategoryBytes([u64; Category::COUNT]);

impl CategoryBytes {
    pub const ZERO: CategoryBytes = CategoryBytes([0; Category::COUNT]);

    /// Sum over all categories (saturating: a prediction of an absurd run reads as "more than
    /// any device", never as a wrapped small number).
    pub fn total(&self) -> u64 {
        self.0.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// `(category, bytes)` pairs in report order.
    pub fn iter(&self) -> impl Iterator<Item = (Category, u64)> + '_ {
        Category::ALL.into_iter().map(|c| (c, self.0[c.index()]))
    }

    /// Per-category signed difference `self - other` (e.g. predicted − measured).
    pub fn diff(&self, other: &CategoryBytes) -> BTreeMap<Category, i128> {
        Category::ALL
            .into_iter()
            .map(|c| (c, self[c] as i128 - other[c] as i128))
            .collect()
    }
}

impl Index<Category> for CategoryBytes {
    type Output = u64;
    fn index(&self, c: Category) -> &u64 {
        &self.0[c.index()]
    }
}

impl IndexMut<Category> for CategoryBytes {
    fn index_mut(&mut self, c: Category) -> &mut u64 {
        &mut self.0[c.index()]
    }
}

impl FromIterator<(Category, u64)> for CategoryBytes {
    fn from_iter<I: IntoIterator<Item = (Category, u64)>>(iter: I) -> Self {
        let mut out = CategoryBytes::ZERO;
        for (c, b) in iter {
            out[c] = out[c].saturating_add(b);
        }
        out
    }
}

impl Serialize for CategoryBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(Category::COUNT))?;
        for (c, b) in self.iter() {
            m.serialize_entry(c.name(), &b)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for CategoryBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<Category, u64>::deserialize(d)?;
        Ok(map.into_iter().collect())
    }
}

/// Bytes per category at the peak of a training step, and at steady state (between steps).
/// Predictions (the planner's analytical model, the engine's dry run) and measurements alike are
/// expressed in it. Its JSON keys are `by_category` and `steady_by_category`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    /// Bytes per category at the moment of the step's peak; sums to `peak_bytes()`.
    #[serde(rename = "by_category")]
    pub at_peak: CategoryBytes,
    /// Bytes per category held between steps (model states, persistent buffers).
    #[serde(rename = "steady_by_category")]
    pub steady: CategoryBytes,
}

impl MemoryBreakdown {
    /// Total bytes at the peak.
    pub fn peak_bytes(&self) -> u64 {
        self.at_peak.total()
    }

    /// Total bytes at steady state.
    pub fn steady_bytes(&self) -> u64 {
        self.steady.total()
    }
}

/// A device's memory over a run: the allocated and reserved peaks, the breakdown at the
/// allocated peak and between steps, and each category's own peak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPeaks {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// At the allocated peak (sums to `peak_allocated_bytes`) and now (between steps).
    pub breakdown: MemoryBreakdown,
    /// Each category's own peak.
    pub peak_bytes_by_category: CategoryBytes,
}

impl MemoryPeaks {
    /// The figures of a device's statistics, taken between steps.
    pub fn of(stats: &DeviceStats) -> MemoryPeaks {
        MemoryPeaks {
            peak_allocated_bytes: stats.allocated_bytes.all.peak as u64,
            peak_reserved_bytes: stats.reserved_bytes.all.peak as u64,
            breakdown: MemoryBreakdown {
                at_peak: stats.category_bytes_at_peak,
                steady: stats.current_category_bytes(),
            },
            peak_bytes_by_category: stats.peak_category_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_keyed_by_category_name_and_round_trips() {
        let mut b = CategoryBytes::ZERO;
        b[Category::Parameter] = 10;
        b[Category::OptimizerState] = 20;
        let json = serde_json::to_value(b).unwrap();
        assert_eq!(json["parameter"], 10);
        assert_eq!(json["optimizer_state"], 20);
        assert_eq!(json["activation"], 0);
        let back: CategoryBytes = serde_json::from_value(json).unwrap();
        assert_eq!(back, b);
        assert_eq!(b.total(), 30);
    }

    #[test]
    fn diff_is_signed_per_category() {
        let a: CategoryBytes = [(Category::Activation, 5)].into_iter().collect();
        let b: CategoryBytes = [(Category::Activation, 8)].into_iter().collect();
        assert_eq!(a.diff(&b)[&Category::Activation], -3);
    }
}
