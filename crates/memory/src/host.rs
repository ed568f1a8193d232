//! The host's memory as the operating system reports it (Linux `/proc/meminfo`), so a run whose
//! device budget lives in host RAM (the CPU backend) can refuse before it exhausts the machine.
//!
//! Not for: accounting of host-side buffers (a later host pool does that).

/// Bytes the kernel estimates can be allocated without swapping (`MemAvailable`), if known.
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, "MemAvailable:")
}

/// A `/proc/meminfo` field in bytes (the file gives kB).
fn parse_meminfo(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line[field.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(
            parse_meminfo(text, "MemAvailable:"),
            Some(20_480_000 * 1024)
        );
        assert_eq!(parse_meminfo(text, "Missing:"), None);
    }
}
