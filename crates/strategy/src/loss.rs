//! How the loss is computed, as `--loss`, the TOML and the JSON spell it: `plain` (the output
//! projection's logits for every token at once, then the cross-entropy) or `chunked:K` (the rows
//! cut into K chunks, each chunk's projection and loss recomputed in backward, so the
//! micro-batch × sequence × vocabulary logits never exist at once; torchtune's
//! `CEWithChunkedOutputLoss` uses 8 chunks).
//!
//! Not for: the computation itself (the tensor crate's `linear_cross_entropy`) or its cost (the
//! planner).

use crate::StrategyError;
use crate::named::serde_by_name;
use std::fmt;
use std::str::FromStr;

/// The loss computation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Loss {
    /// Logits of the whole micro-batch at once.
    #[default]
    Plain,
    /// The tokens of a micro-batch in this many chunks (at least 2).
    Chunked(u64),
}

impl Loss {
    /// The accepted spellings.
    pub const ACCEPTED: &'static str = "plain, chunked:K (K ≥ 2, e.g. chunked:8)";
    const FLAG: &'static str = "--loss";
    /// The chunk counts `--auto` and the planner try.
    pub const SEARCHED: &'static [Loss] = &[Loss::Plain, Loss::Chunked(8)];

    /// The number of chunks (1 for the plain loss).
    pub fn chunks(self) -> u64 {
        match self {
            Loss::Plain => 1,
            Loss::Chunked(k) => k,
        }
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::Plain => f.write_str("plain"),
            Loss::Chunked(k) => write!(f, "chunked:{k}"),
        }
    }
}

impl FromStr for Loss {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, StrategyError> {
        let bad = || StrategyError::Value {
            flag: Loss::FLAG,
            value: s.to_string(),
            accepted: Loss::ACCEPTED.to_string(),
        };
        if s == "plain" {
            return Ok(Loss::Plain);
        }
        match s.strip_prefix("chunked:").map(str::parse::<u64>) {
            Some(Ok(k)) if k >= 2 => Ok(Loss::Chunked(k)),
            _ => Err(bad()),
        }
    }
}

serde_by_name!(Loss);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_parse_from_their_names_and_print_back() {
        assert_eq!("plain".parse::<Loss>().unwrap(), Loss::Plain);
        assert_eq!("chunked:8".parse::<Loss>().unwrap(), Loss::Chunked(8));
        for text in ["plain", "chunked:2", "chunked:16"] {
            assert_eq!(text.parse::<Loss>().unwrap().to_string(), text);
        }
        assert_eq!(Loss::Plain.chunks(), 1);
        assert_eq!(Loss::Chunked(8).chunks(), 8);
    }

    #[test]
    fn bad_losses_name_the_flag_and_the_spellings() {
        for bad in ["chunked:1", "chunked:0", "chunked:x", "chunked", "fused"] {
            let e = bad.parse::<Loss>().unwrap_err().to_string();
            assert!(
                e.contains("--loss") && e.contains("chunked:K") && e.contains(bad),
                "{e}"
            );
        }
    }
}
