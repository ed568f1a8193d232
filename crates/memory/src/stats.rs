//! Allocator statistics with PyTorch's names and meanings (`torch.cuda.memory_stats()`), plus
//! per-category bytes. Each `Stat` holds current, peak, allocated (running sum of increases)
//! and freed (running sum of decreases).
//!
//! Not for: derived fragmentation figures (see `fragmentation`).

use crate::breakdown::CategoryBytes;
use crate::category::Category;
use crate::rounding::Pool;
use serde::Serialize;
use std::collections::BTreeMap;

/// One PyTorch `Stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    pub fn increase(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current += amount;
        self.allocated += amount;
        self.peak = self.peak.max(self.current);
    }

    pub fn decrease(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current -= amount;
        self.freed += amount;
        debug_assert!(self.current >= 0, "stat went negative");
    }

    /// Applies a signed change as an increase or a decrease.
    pub fn change(&mut self, delta: i64) {
        if delta >= 0 {
            self.increase(delta as u64)
        } else {
            self.decrease(delta.unsigned_abs())
        }
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// A stat kept for `all`, `large_pool` and `small_pool`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatArray {
    pub all: Stat,
    pub large_pool: Stat,
    pub small_pool: Stat,
}

impl StatArray {
    pub fn increase(&mut self, pool: Pool, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(pool).increase(amount);
    }

    pub fn decrease(&mut self, pool: Pool, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(pool).decrease(amount);
    }

    pub fn change(&mut self, pool: Pool, delta: i64) {
        self.all.change(delta);
        self.pool_mut(pool).change(delta);
    }

    pub fn pool(&self, pool: Pool) -> &Stat {
        match pool {
            Pool::Small => &self.small_pool,
            Pool::Large => &self.large_pool,
        }
    }

    fn pool_mut(&mut self, pool: Pool) -> &mut Stat {
        match pool {
            Pool::Small => &mut self.small_pool,
            Pool::Large => &mut self.large_pool,
        }
    }

    fn reset_peak(&mut self) {
        self.all.reset_peak();
        self.large_pool.reset_peak();
        self.small_pool.reset_peak();
    }

    fn rows(&self) -> [(&'static str, &Stat); 3] {
        [
            ("all", &self.all),
            ("large_pool", &self.large_pool),
            ("small_pool", &self.small_pool),
        ]
    }
}

/// Everything `memory_stats()` reports.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DeviceStats {
    pub allocation: StatArray,
    pub segment: StatArray,
    pub active: StatArray,
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_sync_all_streams: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// Configured `max_split_size`, −1 when unlimited (PyTorch stores SIZE_MAX cast to int64).
    pub max_split_size: i64,
    /// Allocated (rounded) bytes per category: current and peak of each category on its own.
    pub category_bytes: [Stat; Category::COUNT],
    /// Allocated bytes per category at the moment `allocated_bytes.all` last reached its peak.
    pub category_bytes_at_peak: CategoryBytes,
}

impl DeviceStats {
    /// `reset_peak_memory_stats()`: every peak becomes the current value.
    pub fn reset_peaks(&mut self) {
        for array in [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ] {
            array.reset_peak();
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
        for stat in &mut self.category_bytes {
            stat.reset_peak();
        }
        self.category_bytes_at_peak = self.current_category_bytes();
    }

    /// Current allocated bytes per category.
    pub fn current_category_bytes(&self) -> CategoryBytes {
        Category::ALL
            .into_iter()
            .map(|c| (c, self.category_bytes[c.index()].current as u64))
            .collect()
    }

    /// Peak allocated bytes of each category on its own (the peaks need not coincide).
    pub fn peak_category_bytes(&self) -> CategoryBytes {
        Category::ALL
            .into_iter()
            .map(|c| (c, self.category_bytes[c.index()].peak as u64))
            .collect()
    }

    /// PyTorch's flat dictionary (`allocated_bytes.all.current`, `num_ooms`, …) plus
    /// `category_bytes.<category>.current|peak` and `category_bytes_at_peak.<category>`.
    pub fn flat(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        let arrays: [(&str, &StatArray); 9] = [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ];
        for (name, array) in arrays {
            for (pool, stat) in array.rows() {
                insert_stat(&mut out, &format!("{name}.{pool}"), stat);
            }
        }
        insert_stat(&mut out, "oversize_allocations", &self.oversize_allocations);
        insert_stat(&mut out, "oversize_segments", &self.oversize_segments);
        for (key, value) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
        ] {
            out.insert(key.to_string(), value as i64);
        }
        out.insert("max_split_size".to_string(), self.max_split_size);
        for c in Category::ALL {
            let stat = &self.category_bytes[c.index()];
            out.insert(format!("category_bytes.{c}.current"), stat.current);
            out.insert(format!("category_bytes.{c}.peak"), stat.peak);
            out.insert(
                format!("category_bytes_at_peak.{c}"),
                self.category_bytes_at_peak[c] as i64,
            );
        }
        out
    }
}

fn insert_stat(out: &mut BTreeMap<String, i64>, prefix: &str, stat: &Stat) {
    out.insert(format!("{prefix}.current"), stat.current);
    out.insert(format!("{prefix}.peak"), stat.peak);
    out.insert(format!("{prefix}.allocated"), stat.allocated);
    out.insert(format!("{prefix}.freed"), stat.freed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_current_peak_and_running_sums() {
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        assert_eq!((s.current, s.peak, s.allocated, s.freed), (3, 15, 15, 12));
        s.reset_peak();
        assert_eq!(s.peak, 3);
    }

    #[test]
    fn flat_keys_use_pytorch_names() {
        let stats = DeviceStats::default();
        let flat = stats.flat();
        for key in [
            "allocated_bytes.all.current",
            "reserved_bytes.large_pool.peak",
            "active_bytes.all.freed",
            "inactive_split_bytes.all.current",
            "requested_bytes.all.peak",
            "allocation.small_pool.allocated",
            "segment.all.current",
            "num_alloc_retries",
            "num_ooms",
            "num_device_alloc",
            "num_device_free",
            "oversize_allocations.peak",
            "oversize_segments.current",
            "category_bytes.activation.peak",
        ] {
            assert!(flat.contains_key(key), "missing {key}");
        }
    }
}
