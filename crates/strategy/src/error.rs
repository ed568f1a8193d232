//! The one error a strategy value can raise: an unknown name (with the flag and the accepted
//! names) or a combination that cannot run (with the reason and the fix).
//!
//! Not for: errors of the planner or the engine, which wrap this one.

/// A strategy value or combination that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrategyError {
    /// A value that names nothing the vocabulary knows.
    #[error("invalid value '{value}' for {flag}; accepted: {accepted}")]
    Value {
        flag: &'static str,
        value: String,
        accepted: String,
    },
    /// Values that cannot be combined.
    #[error("incompatible strategy: {0}")]
    Incompatible(String),
}

/// Parses a strategy value given as a command-line flag. The argument parser already names the
/// flag and the value, so the error says only what is accepted.
pub fn parse_flag<T>(text: &str) -> Result<T, String>
where
    T: std::str::FromStr<Err = StrategyError>,
{
    text.parse().map_err(|e| match e {
        StrategyError::Value { accepted, .. } => format!("accepted: {accepted}"),
        other => other.to_string(),
    })
}
