//! Injected faults, for testing how a group of ranks ends when one of them fails: at the start of
//! a given step the rank returns an error, panics, or sleeps (a stuck rank). The CLI reads one
//! from the `HEADROOM_FAULT` environment variable as `RANK:KIND@STEP` (e.g. `1:panic@3`).
//!
//! Not for: real failures (they need no help).

use std::str::FromStr;

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The step returns an error.
    Error,
    /// The rank's thread panics.
    Panic,
    /// The rank stops answering for an hour: only a watchdog ends the run.
    Sleep,
}

/// A fault at the start of optimizer step `step` (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub step: u64,
}

impl FromStr for Fault {
    type Err = String;

    /// `KIND@STEP`: `error@3`, `panic@3`, `sleep@3`.
    fn from_str(s: &str) -> Result<Fault, String> {
        let bad = || {
            format!(
                "'{s}' is not a fault; write KIND@STEP with KIND one of error, panic, sleep (e.g. panic@3)"
            )
        };
        let (kind, step) = s.split_once('@').ok_or_else(bad)?;
        let kind = match kind {
            "error" => FaultKind::Error,
            "panic" => FaultKind::Panic,
            "sleep" => FaultKind::Sleep,
            _ => return Err(bad()),
        };
        Ok(Fault {
            kind,
            step: step.parse().map_err(|_| bad())?,
        })
    }
}

/// The fault `spec` (`RANK:KIND@STEP`, from `HEADROOM_FAULT`) sets for `rank`, if any.
pub fn fault_for_rank(spec: &str, rank: usize) -> Result<Option<Fault>, String> {
    let (r, fault) = spec
        .split_once(':')
        .ok_or_else(|| format!("HEADROOM_FAULT='{spec}': write RANK:KIND@STEP (e.g. 1:panic@3)"))?;
    let r: usize = r
        .parse()
        .map_err(|_| format!("HEADROOM_FAULT='{spec}': '{r}' is not a rank"))?;
    let fault: Fault = fault.parse().map_err(|e| format!("HEADROOM_FAULT: {e}"))?;
    Ok((r == rank).then_some(fault))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_apply_to_their_rank_only() {
        let f = Fault {
            kind: FaultKind::Panic,
            step: 3,
        };
        assert_eq!(fault_for_rank("1:panic@3", 1), Ok(Some(f)));
        assert_eq!(fault_for_rank("1:panic@3", 0), Ok(None));
        assert_eq!("sleep@0".parse::<Fault>().unwrap().kind, FaultKind::Sleep);
        assert!(
            fault_for_rank("1:explode@3", 1)
                .unwrap_err()
                .contains("KIND@STEP")
        );
        assert!(
            fault_for_rank("panic@3", 1)
                .unwrap_err()
                .contains("RANK:KIND@STEP")
        );
        assert!("error@x".parse::<Fault>().is_err());
    }
}
