//! The Category of a device allocation: the one vocabulary the planner predicts in and the
//! allocator measures in (docs/sources.md §12).
//!
//! Not for: deciding *where* bytes live (that is a placement) or how many there are (that is a
//! `MemoryBreakdown`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What a block of device memory holds. The snake_case names are part of the public surface:
/// they appear verbatim in text reports, JSON and snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    Gradient,
    MasterWeight,
    OptimizerState,
    Activation,
    Temporary,
    Input,
    Communication,
    Other,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 9] = [
        Category::Parameter,
        Category::Gradient,
        Category::MasterWeight,
        Category::OptimizerState,
        Category::Activation,
        Category::Temporary,
        Category::Input,
        Category::Communication,
        Category::Other,
    ];

    /// Number of categories; sizes per-category arrays.
    pub const COUNT: usize = Self::ALL.len();

    /// The snake_case name used in text and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::MasterWeight => "master_weight",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Input => "input",
            Category::Communication => "communication",
            Category::Other => "other",
        }
    }

    /// Position in [`Category::ALL`]; indexes per-category arrays.
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error for a category name that is not one of [`Category::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown memory category '{}'; expected one of: parameter, gradient, master_weight, optimizer_state, activation, temporary, input, communication, other",
    crate::quote::quote(.0)
)]
pub struct UnknownCategory(pub String);

impl FromStr for Category {
    type Err = UnknownCategory;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Category::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| UnknownCategory(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_text_and_json() {
        for c in Category::ALL {
            assert_eq!(c.name().parse::<Category>().unwrap(), c);
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                format!("\"{}\"", c.name())
            );
        }
        assert_eq!(Category::MasterWeight.name(), "master_weight");
        assert!("weights".parse::<Category>().is_err());
    }

    #[test]
    fn index_matches_position_in_all() {
        for (i, c) in Category::ALL.into_iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }
}
