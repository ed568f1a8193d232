//! Allocator settings: PyTorch's `PYTORCH_CUDA_ALLOC_CONF` knobs that make sense for headroom's
//! devices, with the same names, defaults and string syntax (`key:value,key:[a:b,c:d]`).
//!
//! Not for: the device capacity (a property of the device, see `device`).

use crate::size::MIB;
use serde::Serialize;

/// Minimum allowed `max_split_size` (PyTorch: `max_split_size_mb` ≥ 20).
pub const MIN_MAX_SPLIT_SIZE: u64 = 20 * MIB;

/// Caching-allocator settings.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocatorConfig {
    /// Blocks at least this large are never split and are reused whole only by requests at most
    /// `max_non_split_rounding` smaller. `u64::MAX` means unlimited (PyTorch's default).
    pub max_split_size: u64,
    /// Slack allowed when reusing an oversize block (PyTorch's 20 MiB `max_non_split_rounding_mb`).
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions` per power-of-two interval from 1 MiB (index 0) to 64 GiB (15);
    /// 0 disables.
    pub roundup_power2_divisions: [u32; 16],
    /// Reclaim old cached large blocks once reserved bytes exceed this fraction of capacity;
    /// 0 disables (PyTorch's code default).
    pub garbage_collection_threshold: f64,
    /// One growable segment per pool instead of fixed-size segments.
    pub expandable_segments: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding: 20 * MIB,
            roundup_power2_divisions: [0; 16],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
        }
    }
}

/// A settings string that could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid allocator setting: {0}; accepted keys: max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments (e.g. \"expandable_segments:True,max_split_size_mb:128\")"
)]
pub struct ConfigError(pub String);

impl AllocatorConfig {
    /// The expandable-segments configuration with everything else default.
    pub fn expandable() -> Self {
        AllocatorConfig {
            expandable_segments: true,
            ..Default::default()
        }
    }

    /// Divisions configured for a size's power-of-two interval.
    pub fn divisions_for(&self, size: u64) -> u32 {
        let log2 = 63 - size.max(1).leading_zeros() as i64;
        let index = (log2 - 20).clamp(0, 15) as usize;
        self.roundup_power2_divisions[index]
    }

    /// Parses PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax on top of the defaults.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut config = AllocatorConfig::default();
        for (key, value) in split_options(text)? {
            config.apply(&key, &value)?;
        }
        Ok(config)
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let number = |v: &str| -> Result<f64, ConfigError> {
            v.parse::<f64>()
                .map_err(|_| ConfigError(format!("{key} expects a number, got '{v}'")))
        };
        match key {
            "max_split_size_mb" => {
                let mb = number(value)?;
                let bytes = (mb * MIB as f64) as u64;
                if bytes < MIN_MAX_SPLIT_SIZE {
                    return Err(ConfigError(format!(
                        "max_split_size_mb must be at least 20, got {value}"
                    )));
                }
                self.max_split_size = bytes;
            }
            "max_non_split_rounding_mb" => {
                let mb = number(value)?;
                let bytes = (mb * MIB as f64) as u64;
                if bytes < 20 * MIB {
                    return Err(ConfigError(format!(
                        "max_non_split_rounding_mb must be at least 20, got {value}"
                    )));
                }
                self.max_non_split_rounding = bytes;
            }
            "garbage_collection_threshold" => {
                let t = number(value)?;
                if !(t > 0.0 && t < 1.0) {
                    return Err(ConfigError(format!(
                        "garbage_collection_threshold must be in (0, 1), got {value}"
                    )));
                }
                self.garbage_collection_threshold = t;
            }
            "expandable_segments" => {
                self.expandable_segments = match value {
                    "True" => true,
                    "False" => false,
                    other => {
                        return Err(ConfigError(format!(
                            "expandable_segments expects True or False, got '{other}'"
                        )));
                    }
                }
            }
            "roundup_power2_divisions" => self.apply_divisions(value)?,
            other => return Err(ConfigError(format!("unknown key '{other}'"))),
        }
        Ok(())
    }

    fn apply_divisions(&mut self, value: &str) -> Result<(), ConfigError> {
        let check = |d: &str| -> Result<u32, ConfigError> {
            let v: u32 = d.parse().map_err(|_| {
                ConfigError(format!(
                    "roundup_power2_divisions value '{d}' is not a number"
                ))
            })?;
            if v != 0 && !v.is_power_of_two() {
                return Err(ConfigError(format!(
                    "roundup_power2_divisions values must be powers of two, got {v}"
                )));
            }
            Ok(v)
        };
        if !value.starts_with('[') {
            let d = check(value)?;
            self.roundup_power2_divisions = [d; 16];
            return Ok(());
        }
        // PyTorch's parseRoundUpPower2Divisions: a key of N MB names the interval starting at
        // N MB (index log2(N)); the first key also fills every smaller interval, later keys set
        // only their own, and `>` fills every interval above the last key.
        let inner = value.trim_start_matches('[').trim_end_matches(']');
        let mut last_index: Option<usize> = None;
        for pair in inner.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = pair.split_once(':').ok_or_else(|| {
                ConfigError(format!(
                    "roundup_power2_divisions entry '{pair}' must be SIZE_MB:DIVISIONS"
                ))
            })?;
            let d = check(v.trim())?;
            if k.trim() == ">" {
                let from = last_index.map_or(0, |i| i + 1);
                for slot in self.roundup_power2_divisions.iter_mut().skip(from) {
                    *slot = d;
                }
                continue;
            }
            let mb: u64 = k.trim().parse().map_err(|_| {
                ConfigError(format!(
                    "roundup_power2_divisions key '{k}' is not a size in MB"
                ))
            })?;
            if !mb.is_power_of_two() {
                return Err(ConfigError(format!(
                    "roundup_power2_divisions keys must be powers of two, got {mb}"
                )));
            }
            let index = (mb.trailing_zeros() as usize).min(15);
            if last_index.is_none() {
                for slot in &mut self.roundup_power2_divisions[..index] {
                    *slot = d;
                }
            }
            self.roundup_power2_divisions[index] = d;
            last_index = Some(index);
        }
        Ok(())
    }
}

/// Splits `a:1,b:[x:y,z:w]` into `(a, 1)`, `(b, [x:y,z:w])`.
fn split_options(text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    let mut parts = Vec::new();
    for ch in text.chars().filter(|c| !c.is_whitespace()) {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(ch);
    }
    if depth != 0 {
        return Err(ConfigError(format!("unbalanced brackets in '{text}'")));
    }
    parts.push(current);
    for part in parts.into_iter().filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once(':')
            .ok_or_else(|| ConfigError(format!("'{part}' must be written key:value")))?;
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pytorch_syntax() {
        let c = AllocatorConfig::parse("expandable_segments:True, max_split_size_mb:128").unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, 128 * MIB);
        let c = AllocatorConfig::parse("garbage_collection_threshold:0.6").unwrap();
        assert_eq!(c.garbage_collection_threshold, 0.6);
    }

    #[test]
    fn divisions_list_applies_per_interval() {
        // [256:1,512:2,1024:4,>:8] (PyTorch's parser): below 512 MiB → 1 (the first key also
        // fills smaller intervals), [512 MiB, 1 GiB) → 2, [1 GiB, 2 GiB) → 4, from 2 GiB → 8.
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(c.divisions_for(MIB), 1);
        assert_eq!(c.divisions_for(300 * MIB), 1);
        assert_eq!(c.divisions_for(600 * MIB), 2);
        assert_eq!(c.divisions_for(1536 * MIB), 4);
        assert_eq!(c.divisions_for(4096 * MIB), 8);
        let c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(c.divisions_for(3 * MIB), 4);
    }

    #[test]
    fn rejects_bad_settings_with_the_reason() {
        for (bad, needle) in [
            ("max_split_size_mb:10", "at least 20"),
            ("expandable_segments:yes", "True or False"),
            ("nonsense:1", "unknown key"),
            ("garbage_collection_threshold:1.5", "(0, 1)"),
            ("roundup_power2_divisions:3", "powers of two"),
        ] {
            let e = AllocatorConfig::parse(bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}

/// Which allocator serves a device: `caching` (PyTorch's default), `expandable` (expandable
/// segments) or `planned` (a planned arena for the windows a dry run recorded, the caching
/// pools for the rest).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllocatorKind {
    #[default]
    Caching,
    Expandable,
    Planned,
}

impl AllocatorKind {
    pub const ALL: [AllocatorKind; 3] = [
        AllocatorKind::Caching,
        AllocatorKind::Expandable,
        AllocatorKind::Planned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AllocatorKind::Caching => "caching",
            AllocatorKind::Expandable => "expandable",
            AllocatorKind::Planned => "planned",
        }
    }

    /// The caching pools' settings this kind runs with.
    pub fn config(self) -> AllocatorConfig {
        match self {
            AllocatorKind::Expandable => AllocatorConfig::expandable(),
            AllocatorKind::Caching | AllocatorKind::Planned => AllocatorConfig::default(),
        }
    }
}

impl std::fmt::Display for AllocatorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AllocatorKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        AllocatorKind::ALL
            .into_iter()
            .find(|k| k.name() == text)
            .ok_or_else(|| {
                format!("unknown allocator '{text}'; accepted: caching, expandable, planned")
            })
    }
}
