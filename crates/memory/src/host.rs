//! The host's memory as the operating system reports it (Linux `/proc/meminfo`), so a run whose
//! device budget lives in host RAM (the CPU backend) can refuse before it exhausts the machine,
//! and this process's resident memory (`/proc/self/status`), so a run reports its peak RSS.
//!
//! Not for: accounting of host-side buffers (see `host_pool`).

/// Bytes the kernel estimates can be allocated without swapping (`MemAvailable`), if known.
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, "MemAvailable:")
}

/// The host's physical memory (`MemTotal`), if known.
pub fn total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, "MemTotal:")
}

/// This process's resident memory as the kernel counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ProcessMemory {
    /// Resident set now (`VmRSS`).
    pub rss_bytes: u64,
    /// The highest resident set so far (`VmHWM`).
    pub peak_rss_bytes: u64,
    /// Resident anonymous memory (heap, stacks, `RssAnon`).
    pub rss_anon_bytes: u64,
    /// Resident pages of mapped files (`RssFile`): memory-mapped token files land here, as
    /// page cache the kernel can reclaim.
    pub rss_file_bytes: u64,
}

/// This process's resident memory (Linux `/proc/self/status`), if known.
pub fn process_memory() -> Option<ProcessMemory> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status(&text)
}

fn parse_status(text: &str) -> Option<ProcessMemory> {
    Some(ProcessMemory {
        rss_bytes: parse_meminfo(text, "VmRSS:")?,
        peak_rss_bytes: parse_meminfo(text, "VmHWM:")?,
        rss_anon_bytes: parse_meminfo(text, "RssAnon:").unwrap_or(0),
        rss_file_bytes: parse_meminfo(text, "RssFile:").unwrap_or(0),
    })
}

/// A `/proc/meminfo` (or `/proc/self/status`) field in bytes (the files give kB).
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

    #[test]
    fn process_status_gives_resident_and_peak_bytes() {
        let text = "Name:\theadroom\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 1000 kB\nRssFile:\t 24 kB\n";
        let m = parse_status(text).unwrap();
        assert_eq!(m.rss_bytes, 1024 * 1024);
        assert_eq!(m.peak_rss_bytes, 2048 * 1024);
        assert_eq!(m.rss_anon_bytes + m.rss_file_bytes, m.rss_bytes);
        // On Linux this process has a resident set, no larger than its peak.
        if let Some(now) = process_memory() {
            assert!(now.rss_bytes > 0 && now.rss_bytes <= now.peak_rss_bytes);
        }
    }
}
