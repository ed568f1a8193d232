//! A measurement window — typically one training step — next to the run's statistics: the
//! allocated peak since the window opened, the bytes per category at that moment, and each
//! allocation name's largest live bytes in the window. A trainer opens a window per step to
//! check that the per-step peak stays constant and, when it grows, to name what grew; the run's
//! own peaks (`memory_stats()`) are untouched.
//!
//! Not for: the PyTorch statistics (see `stats`).

use crate::breakdown::CategoryBytes;
use crate::category::Category;
use std::collections::HashMap;
use std::sync::Arc;

/// Live and peak bytes of one allocation name within a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NameBytes {
    pub category: Option<Category>,
    pub live: u64,
    pub peak: u64,
}

/// What a window saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    /// Allocated bytes when the window opened.
    pub start: u64,
    /// Peak allocated bytes since the window opened.
    pub peak: u64,
    /// Bytes per category at that peak.
    pub at_peak: CategoryBytes,
    /// Largest live bytes of each allocation name in the window (unnamed allocations are
    /// `(unnamed)`).
    pub names: HashMap<Arc<str>, NameBytes>,
}

const UNNAMED: &str = "(unnamed)";

impl Window {
    /// Starts a window with what is live now.
    pub(crate) fn open(&mut self, allocated: u64, by_category: CategoryBytes) {
        self.start = allocated;
        self.peak = allocated;
        self.at_peak = by_category;
        self.names.retain(|_, n| n.live > 0);
        for n in self.names.values_mut() {
            n.peak = n.live;
        }
    }

    pub(crate) fn on_alloc(
        &mut self,
        allocated: u64,
        by_category: impl FnOnce() -> CategoryBytes,
        category: Category,
        name: Option<&Arc<str>>,
        size: u64,
    ) {
        if allocated > self.peak {
            self.peak = allocated;
            self.at_peak = by_category();
        }
        let key = name.map_or(UNNAMED, |n| n.as_ref());
        let entry = match self.names.get_mut(key) {
            Some(e) => e,
            None => self
                .names
                .entry(name.cloned().unwrap_or_else(|| Arc::from(UNNAMED)))
                .or_default(),
        };
        entry.category = Some(category);
        entry.live += size;
        entry.peak = entry.peak.max(entry.live);
    }

    /// Counts an allocation already live when the window first opens.
    pub(crate) fn add_live(&mut self, name: Option<&str>, category: Category, size: u64) {
        let key: Arc<str> = Arc::from(name.unwrap_or(UNNAMED));
        let e = self.names.entry(key).or_default();
        e.category = Some(category);
        e.live += size;
        e.peak = e.peak.max(e.live);
    }

    pub(crate) fn on_free(&mut self, name: Option<&Arc<str>>, size: u64) {
        let key = name.map_or(UNNAMED, |n| n.as_ref());
        if let Some(e) = self.names.get_mut(key) {
            e.live = e.live.saturating_sub(size);
        }
    }

    /// How far the peak rose above the bytes live at the start.
    pub fn rise(&self) -> u64 {
        self.peak - self.start
    }

    /// Names whose peak in this window exceeds their peak in `baseline`, largest growth first.
    pub fn grown_names(&self, baseline: &Window) -> Vec<(Arc<str>, NameBytes, u64)> {
        let mut out: Vec<(Arc<str>, NameBytes, u64)> = self
            .names
            .iter()
            .filter_map(|(name, n)| {
                let before = baseline.names.get(name).map_or(0, |b| b.peak);
                (n.peak > before).then(|| (name.clone(), *n, before))
            })
            .collect();
        out.sort_by(|a, b| (b.1.peak - b.2).cmp(&(a.1.peak - a.2)).then(a.0.cmp(&b.0)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_the_peak_and_each_names_largest_live_bytes() {
        let mut w = Window::default();
        let a: Arc<str> = Arc::from("a");
        let cat = |n: u64| {
            let mut c = CategoryBytes::ZERO;
            c[Category::Activation] = n;
            c
        };
        w.open(0, CategoryBytes::ZERO);
        w.on_alloc(100, || cat(100), Category::Activation, Some(&a), 100);
        w.on_alloc(300, || cat(300), Category::Activation, Some(&a), 200);
        w.on_free(Some(&a), 100);
        w.on_alloc(250, || cat(250), Category::Activation, None, 50);
        assert_eq!(w.peak, 300);
        assert_eq!(w.at_peak[Category::Activation], 300);
        assert_eq!((w.names["a"].live, w.names["a"].peak), (200, 300));
        let base = w.clone();
        w.open(250, cat(250));
        assert_eq!((w.peak, w.rise()), (250, 0));
        assert_eq!(
            w.names["a"].peak, 200,
            "a new window starts from what is live"
        );
        w.on_alloc(650, || cat(650), Category::Activation, Some(&a), 400);
        let grown = w.grown_names(&base);
        assert_eq!(grown.len(), 1);
        assert_eq!((grown[0].1.peak, grown[0].2), (600, 300));
    }
}
