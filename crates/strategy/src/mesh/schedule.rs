//! The pipeline schedule: the order in which pipeline stages run their micro-batches' forwards
//! and backwards, with its CLI/TOML/JSON names.
//!
//! Not for: the mesh's axes (`Mesh`) or the constraints on them (`validate`).

use crate::StrategyError;
use crate::named::serde_by_name;
use std::str::FromStr;

/// The order in which pipeline stages run their micro-batches' forwards and backwards. Its
/// CLI/TOML/JSON names: `1f1b`, `interleaved:V`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PipelineSchedule {
    /// One forward, one backward (PipeDream-Flush; Narayanan et al. 2021, §2.2): stage i runs
    /// p − i − 1 warm-up forwards before its first backward.
    #[default]
    OneFOneB,
    /// Interleaved 1F1B: each device holds `chunks` (v) non-adjacent model chunks
    /// (Narayanan et al. 2021, §2.2), cutting the bubble by v.
    Interleaved { chunks: u64 },
}

impl PipelineSchedule {
    /// Model chunks per pipeline rank (v): 1 for 1F1B.
    pub fn chunks(&self) -> u64 {
        match self {
            PipelineSchedule::OneFOneB => 1,
            PipelineSchedule::Interleaved { chunks } => *chunks,
        }
    }
}

impl PipelineSchedule {
    const FLAG: &'static str = "--pp-schedule";
    const ACCEPTED: &'static str = "1f1b, interleaved:V (V ≥ 2 model chunks per stage)";
}

impl std::fmt::Display for PipelineSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipelineSchedule::OneFOneB => f.write_str("1f1b"),
            PipelineSchedule::Interleaved { chunks } => write!(f, "interleaved:{chunks}"),
        }
    }
}

impl FromStr for PipelineSchedule {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, StrategyError> {
        let bad = || StrategyError::Value {
            flag: PipelineSchedule::FLAG,
            value: s.to_string(),
            accepted: PipelineSchedule::ACCEPTED.into(),
        };
        if s == "1f1b" {
            return Ok(PipelineSchedule::OneFOneB);
        }
        let chunks: u64 = s
            .strip_prefix("interleaved:")
            .and_then(|v| v.parse().ok())
            .ok_or_else(bad)?;
        if chunks < 2 {
            return Err(bad());
        }
        Ok(PipelineSchedule::Interleaved { chunks })
    }
}

serde_by_name!(PipelineSchedule);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::Mesh;
    use crate::mesh::tests::megatron_175b;

    #[test]
    fn schedules_parse_and_print_their_cli_names() {
        assert_eq!("1f1b".parse(), Ok(PipelineSchedule::OneFOneB));
        let v4 = PipelineSchedule::Interleaved { chunks: 4 };
        assert_eq!("interleaved:4".parse(), Ok(v4));
        assert_eq!(v4.to_string(), "interleaved:4");
        for bad in ["gpipe", "interleaved", "interleaved:1", "interleaved:x"] {
            let e = bad.parse::<PipelineSchedule>().unwrap_err().to_string();
            assert!(e.contains("--pp-schedule") && e.contains(bad), "{e}");
        }
        // A mesh in JSON uses the same names.
        let mesh = megatron_175b();
        let json = serde_json::to_value(mesh).unwrap();
        assert_eq!(json["schedule"], "interleaved:2");
        assert_eq!(serde_json::from_value::<Mesh>(json).unwrap(), mesh);
    }
}
