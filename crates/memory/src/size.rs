//! Byte sizes as people write them (`512MiB`, `80GB`, `1.5GiB`, `1048576`) and as reports print
//! them. GB/MB/KB are powers of ten, GiB/MiB/KiB powers of two, and output always names which.
//!
//! Not for: the allocator's own rounding rules (see `rounding`).

use std::fmt;
use std::str::FromStr;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// A size that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid size '{input}': {reason}; write a number of bytes or a number with a unit, e.g. 512MiB, 80GB, 1.5GiB (GB = 10^9 bytes, GiB = 2^30 bytes)"
)]
pub struct SizeError {
    pub input: String,
    pub reason: String,
}

/// Parses a size with an optional unit. Decimal units (kB, MB, GB, TB) are powers of ten,
/// binary units (KiB, MiB, GiB, TiB) powers of two; a bare number is bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let trimmed = input.trim();
    let err = |reason: &str| SizeError {
        input: input.to_string(),
        reason: reason.to_string(),
    };
    if trimmed.is_empty() {
        return Err(err("it is empty"));
    }
    if trimmed.starts_with('-') {
        return Err(err("a size cannot be negative"));
    }
    parse_size::Config::new()
        .with_decimal()
        .parse_size(trimmed)
        .map_err(|e| err(&e.to_string()))
}

/// A byte count that parses from and prints as a human size (`ByteSize::from_str("2GiB")`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_size(s).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_bytes(self.0))
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    /// Accepts either an integer number of bytes or a string with a unit.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(b) => Ok(ByteSize(b)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Binary-unit size with two decimals, `B` below 1 KiB: `1.50 GiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < KIB {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / KIB as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// Signed variant of [`format_bytes`] for differences (`-12.00 MiB`).
pub fn format_bytes_signed(bytes: i128) -> String {
    let sign = if bytes < 0 { "-" } else { "+" };
    format!(
        "{sign}{}",
        format_bytes(bytes.unsigned_abs().min(u64::MAX as u128) as u64)
    )
}

/// PyTorch's `format_size` in OOM messages: `N bytes`, then KiB/MiB/GiB with two decimals.
pub fn format_size_pytorch(bytes: u64) -> String {
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", bytes as f64 / KIB as f64)
    } else if bytes <= GIB {
        format!("{:.2} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_and_binary_units_differ_as_documented() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 * 1024 * 1024);
        assert_eq!(parse_size("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("80 GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 * (1 << 29));
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("2KiB").unwrap(), 2048);
        assert_eq!(parse_size("2kB").unwrap(), 2000);
    }

    #[test]
    fn bad_sizes_name_the_input_and_the_fix() {
        for bad in ["", "-5MiB", "lots", "12XB"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("GiB = 2^30"), "{e}");
        }
    }

    #[test]
    fn formats_match_hand_values() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(20 * MIB), "20.00 MiB");
        assert_eq!(format_size_pytorch(1024), "1024 bytes");
        assert_eq!(format_size_pytorch(20 * MIB), "20.00 MiB");
        assert_eq!(format_size_pytorch(3 * GIB / 2), "1.50 GiB");
        assert_eq!(format_bytes_signed(-(2 * MIB as i128)), "-2.00 MiB");
    }

    #[test]
    fn byte_size_deserialises_from_number_or_text() {
        let a: ByteSize = serde_json::from_str("1024").unwrap();
        let b: ByteSize = serde_json::from_str("\"1KiB\"").unwrap();
        assert_eq!(a, b);
    }
}
