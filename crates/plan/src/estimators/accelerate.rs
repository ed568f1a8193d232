//! `accelerate estimate-memory` (src/accelerate/commands/estimate.py and utils, current code;
//! docs/sources.md §6): the base model's size at float32 (parameters and buffers), its largest
//! layer (`get_max_layer_size` over `_no_split_modules` blocks and childless modules), each
//! dtype row (float16 /2, int8 /4, int4 /8), "Training using Adam" as the largest of the
//! `estimate_training_usage` components (float32 4× the fp32 size, float16 2×, int8/int4 N/A),
//! sizes printed by `convert_bytes` (divide by 1024, `round(x, 2)`), in its ASCII table.

use crate::model::ParamInventory;

/// The dtypes Accelerate accepts, in its default order.
pub const DTYPES: [&str; 4] = ["float32", "float16", "int8", "int4"];

/// A size as Python holds it: integer bytes or a float after division.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PySize {
    Int(u64),
    Float(f64),
}

/// One table row: dtype, largest layer, total size, training size (`None` = "N/A").
#[derive(Clone, Debug, PartialEq)]
pub struct AccelerateRow {
    pub dtype: String,
    pub largest_layer: PySize,
    pub total_size: PySize,
    pub training: Option<u64>,
}

/// `gather_data` for one model and a list of dtypes (unknown dtypes are rejected by the caller).
pub fn rows(inv: &ParamInventory, dtypes: &[&str]) -> Vec<AccelerateRow> {
    let total = inv.accelerate_total_bytes();
    let largest = inv.accelerate_largest_layer_bytes();
    dtypes
        .iter()
        .map(|&dtype| {
            let div = match dtype {
                "float16" => 2.0,
                "int8" => 4.0,
                "int4" => 8.0,
                _ => 1.0,
            };
            let size = |b: u64| {
                if div == 1.0 {
                    PySize::Int(b)
                } else {
                    PySize::Float(b as f64 / div)
                }
            };
            // estimate_training_usage(fp32 bytes): float32 → max = step = 4·fp32;
            // float16/bfloat16 → max = optimizer = step = 2·fp32; int8/int4 → all −1 → "N/A".
            let training = match dtype {
                "float32" => Some(4 * total),
                "float16" => Some(2 * total),
                _ => None,
            };
            AccelerateRow {
                dtype: dtype.to_string(),
                largest_layer: size(largest),
                total_size: size(total),
                training,
            }
        })
        .collect()
}

/// Accelerate's `convert_bytes`: divide by 1024 until below 1024, print `round(size, 2)`.
pub fn convert_bytes(size: PySize) -> String {
    let (mut v, is_int) = match size {
        PySize::Int(b) => (b as f64, true),
        PySize::Float(f) => (f, false),
    };
    for unit in ["bytes", "KB", "MB", "GB", "TB"] {
        if v < 1024.0 {
            return format!("{} {unit}", py_round2(v, is_int && unit == "bytes"));
        }
        v /= 1024.0;
    }
    format!("{} PB", py_round2(v, false))
}

/// `str(round(x, 2))`: an int stays an int; a float prints its shortest repr with at least ".0".
fn py_round2(x: f64, is_int: bool) -> String {
    if is_int {
        return format!("{}", x as u64);
    }
    let r = (x * 100.0).round() / 100.0;
    let s = format!("{r}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// `create_ascii_table(headers, rows, title)` of estimate.py.
pub fn render(model_name: &str, rows: &[AccelerateRow]) -> String {
    let headers = [
        "dtype",
        "Largest Layer",
        "Total Size",
        "Training using Adam",
    ];
    let cells: Vec<[String; 4]> = rows
        .iter()
        .map(|r| {
            [
                r.dtype.clone(),
                convert_bytes(r.largest_layer),
                convert_bytes(r.total_size),
                r.training
                    .map_or("N/A".to_string(), |t| convert_bytes(PySize::Int(t))),
            ]
        })
        .collect();
    let title = format!("Memory Usage for loading `{model_name}`");
    ascii_table(&headers, &cells, &title)
}

fn ascii_table(headers: &[&str; 4], rows: &[[String; 4]], title: &str) -> String {
    let (sep, line) = ('│', "─");
    let mut widths: Vec<usize> = (0..4)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([headers[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let make_row = |l: &str, m: &str, r: &str, widths: &[usize], diff: usize| {
        let parts: Vec<String> = widths.iter().map(|w| line.repeat(*w)).collect();
        format!("{l}{}{}{r}", parts.join(m), line.repeat(diff))
    };
    let mut diff = 0;
    let separator = make_row("├", "┼", "┤", &widths, diff);
    if title.chars().count() > widths.iter().sum::<usize>() {
        diff = title.chars().count().abs_diff(separator.chars().count());
        if let Some(last) = widths.last_mut() {
            *last += diff;
        }
    }
    let separator = make_row("├", "┼", "┤", &widths, diff);
    let inner = separator.chars().count() - 2;
    let mut table = format!(
        "{}\n{sep}{}{sep}\n{}\n",
        make_row("┌", line, "┐", &widths, diff),
        py_center(title, inner),
        make_row("├", "┬", "┤", &widths, diff)
    );
    if let Some(last) = widths.last_mut() {
        *last += diff;
    }
    let fmt_row = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| py_center(c, widths[i]))
            .collect();
        format!("{sep}{}{sep}", parts.join(&sep.to_string()))
    };
    let header_cells: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    table += &format!("{}\n{separator}\n", fmt_row(&header_cells));
    for r in rows {
        table += &format!("{}\n", fmt_row(r));
    }
    let bottom: Vec<String> = widths.iter().map(|w| line.repeat(*w)).collect();
    table += &format!("└{}┘", bottom.join("┴"));
    table
}

/// Python's `str.center(width)`: extra padding goes to the right when the total is odd and the
/// text length is even, following CPython (`left = pad/2 + (pad & width & 1)`).
fn py_center(text: &str, width: usize) -> String {
    let len = text.chars().count();
    if len >= width {
        return text.to_string();
    }
    let pad = width - len;
    let left = pad / 2 + (pad & width & 1);
    format!("{}{text}{}", " ".repeat(left), " ".repeat(pad - left))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn convert_bytes_prints_like_python() {
        assert_eq!(convert_bytes(PySize::Int(512)), "512 bytes");
        assert_eq!(convert_bytes(PySize::Float(512.0)), "512.0 bytes");
        // 433,249,280 / 1024² = 413.1789… → "413.18 MB" (Accelerate docs, bert-base-cased).
        assert_eq!(convert_bytes(PySize::Int(433_249_280)), "413.18 MB");
        assert_eq!(convert_bytes(PySize::Int(9 * 1024 * 1024)), "9.0 MB");
    }

    #[test]
    fn center_matches_cpython() {
        // 'ab'.center(5) == '  ab ', 'abc'.center(6) == ' abc  ', 'a'.center(4) == ' a  '.
        assert_eq!(py_center("ab", 5), "  ab ");
        assert_eq!(py_center("abc", 6), " abc  ");
        assert_eq!(py_center("a", 4), " a  ");
    }
}
