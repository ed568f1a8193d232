//! Which preset a GPU name typed by a user means: case, spaces, hyphens, underscores and dots
//! do not matter (`h100-80gb`, `RTX 4090`), an alias counts as its preset, and a name that is
//! the leading part of preset names (`h100` for `H100-80GB`, `H100-PCIe`, `H100-NVL`) means
//! the one preset it starts, or lists them when it starts several. A name that matches nothing
//! gets the nearest preset names as a suggestion.
//!
//! Not for: the preset figures (the `presets` table) or GPUs of a user's own (`custom`).

use super::gpu_preset_names as names;
use super::presets::{GPU_ALIASES, GPU_PRESETS};
use crate::error::PlanError;

/// How many presets an unknown name is told are nearest.
const SUGGESTIONS: usize = 3;

/// The name of the preset `name` means, or why there is none.
pub(super) fn preset_name(name: &str) -> Result<&'static str, PlanError> {
    let typed = normal(name);
    let spellings = || {
        GPU_PRESETS
            .iter()
            .map(|r| (r.0, r.0))
            .chain(GPU_ALIASES.iter().copied())
    };
    if let Some((_, target)) = spellings().find(|(n, _)| normal(n) == typed) {
        return Ok(target);
    }
    let mut starts: Vec<&'static str> = spellings()
        .filter(|(spelled, _)| leading_segments(spelled).any(|lead| lead == typed))
        .map(|(_, target)| target)
        .collect();
    starts.sort_unstable();
    starts.dedup();
    match starts.as_slice() {
        [one] => Ok(one),
        [] => Err(PlanError::UnknownGpu {
            name: name.to_string(),
            nearest: nearest(&typed).join(", "),
            accepted: names().join(", "),
        }),
        several => Err(PlanError::AmbiguousGpu {
            name: name.to_string(),
            candidates: several.join(", "),
        }),
    }
}

/// `name` in lower case without separators.
fn normal(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The normalised leading parts of a hyphenated name: `H100-80GB` → `h100`, `h10080gb`.
fn leading_segments(spelled: &str) -> impl Iterator<Item = String> + '_ {
    let segments: Vec<&str> = spelled.split('-').collect();
    (1..=segments.len()).map(move |k| normal(&segments[..k].concat()))
}

/// The presets whose names are closest to `typed` (normalised): those containing it or
/// contained in it first, then by edit distance.
fn nearest(typed: &str) -> Vec<&'static str> {
    let mut ranked: Vec<(bool, usize, &'static str)> = names()
        .into_iter()
        .map(|n| {
            let candidate = normal(n);
            let overlaps = !typed.is_empty()
                && (candidate.contains(typed) || typed.contains(candidate.as_str()));
            (!overlaps, edit_distance(typed, &candidate), n)
        })
        .collect();
    ranked.sort();
    ranked
        .into_iter()
        .take(SUGGESTIONS)
        .map(|(_, _, n)| n)
        .collect()
}

/// Levenshtein distance (insertions, deletions and substitutions of one character each).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_and_separators_do_not_matter() {
        for typed in ["rtx-4090", "RTX 4090", "rtx_4090", "Rtx4090"] {
            assert_eq!(preset_name(typed).unwrap(), "RTX-4090", "{typed}");
        }
        assert_eq!(preset_name("h100 80gb").unwrap(), "H100-80GB");
        assert_eq!(preset_name("h100-sxm").unwrap(), "H100-80GB");
        assert_eq!(preset_name("a6000").unwrap(), "RTX-A6000");
        assert_eq!(preset_name("mi300x").unwrap(), "MI300X");
    }

    #[test]
    fn a_leading_part_means_the_one_preset_it_starts_or_lists_them() {
        // The H100 comes as SXM (80GB), PCIe and NVL presets: a bare H100 is ambiguous.
        let e = preset_name("h100").unwrap_err().to_string();
        for candidate in ["H100-80GB", "H100-NVL", "H100-PCIe"] {
            assert!(e.contains(candidate), "{e}");
        }
        assert!(!e.contains("A100"), "{e}");
        let e = preset_name("A100").unwrap_err().to_string();
        assert!(e.contains("A100-40GB") && e.contains("A100-80GB"), "{e}");
        // One preset starts with "H200" (and so does its alias): no ambiguity.
        assert_eq!(preset_name("h200").unwrap(), "H200-141GB");
        // "H20" is another GPU, not the start of H200-141GB's first segment.
        assert!(preset_name("h20").is_err());
    }

    #[test]
    fn an_unknown_name_gets_the_nearest_presets() {
        let e = preset_name("4090").unwrap_err().to_string();
        assert!(e.contains("nearest: RTX-4090"), "{e}");
        let e = preset_name("RTX-3080").unwrap_err().to_string();
        assert!(e.contains("nearest: RTX-3090"), "{e}");
    }

    #[test]
    fn edit_distance_counts_single_character_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", "abc"), 0);
    }
}
