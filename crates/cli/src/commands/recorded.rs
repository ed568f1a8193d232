//! The record `headroom.record` writes beside a real run's snapshot (`<snapshot>.json`, format
//! `headroom-record`): the model (class, parameters by dtype), the optimizer and its settings,
//! the strategy the user stated, the device, torch's version, the phases tagged and how the run
//! ended; and, when the user gave the run's sequence length and batch split, a doctor side JSON
//! (`"side"`) that `headroom memory doctor` takes as its `--side`. `memory replay` and `memory
//! doctor` print the record with their report.
//!
//! Not for: the snapshot itself (`headroom_memory::replay`, `headroom_memory::doctor`) or the
//! side JSON's checks (`doctor_side`).

use anyhow::{Context, Result, bail};
use headroom_memory::size::format_bytes;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// What a record file says is its format.
pub const FORMAT: &str = "headroom-record";

/// A record read from beside a trace.
pub struct Recorded {
    pub path: PathBuf,
    pub facts: Value,
}

impl Recorded {
    /// The doctor side JSON the record carries, if the run's split was given.
    pub fn side(&self) -> Option<&Value> {
        self.facts.get("side").filter(|s| s.is_object())
    }
}

/// The record beside `trace` (`<trace>.json`), if there is one. A file there that is not a
/// record (another tool's JSON) is left alone; a record that cannot be read is an error naming it.
pub fn beside(trace: &Path) -> Result<Option<Recorded>> {
    let mut name = trace.file_name().unwrap_or_default().to_os_string();
    name.push(".json");
    let path = trace.with_file_name(name);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let Ok(facts) = serde_json::from_str::<Value>(&text) else {
        return Ok(None);
    };
    if facts.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Ok(None);
    }
    match facts.get("version").and_then(Value::as_u64) {
        Some(1) => {}
        other => bail!(
            "{}: a headroom record of version {} — this headroom reads version 1; update headroom, or record the run again",
            path.display(),
            other.map_or("(none)".to_string(), |v| v.to_string())
        ),
    }
    Ok(Some(Recorded { path, facts }))
}

fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The record in one paragraph, each part on its line.
pub fn text(r: &Recorded) -> String {
    let f = &r.facts;
    let mut lines = vec![format!("Recorded run ({}):", r.path.display())];
    if let Some(m) = f.get("model") {
        let class = m.get("class").and_then(Value::as_str).unwrap_or("a model");
        let total = m.get("parameters").and_then(Value::as_u64).unwrap_or(0);
        let dtypes = m
            .get("parameters_by_dtype")
            .and_then(Value::as_object)
            .map(|d| {
                d.iter()
                    .map(|(k, v)| format!("{k} {}", group_digits(v.as_u64().unwrap_or(0))))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let trainable = m.get("trainable_parameters").and_then(Value::as_u64);
        lines.push(format!(
            "  model      {class}: {} parameters ({dtypes}){}",
            group_digits(total),
            match trainable {
                Some(t) if t != total => format!(", {} trainable", group_digits(t)),
                _ => String::new(),
            }
        ));
    }
    if let Some(o) = f.get("optimizer") {
        let settings = o
            .get("settings")
            .and_then(Value::as_object)
            .map(|s| {
                // Switches left off and settings left to PyTorch's choice say nothing.
                s.iter()
                    .filter(|(_, v)| !matches!(v, Value::Null | Value::Bool(false)))
                    .map(|(k, v)| format!("{k} {}", scalar(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        lines.push(format!(
            "  optimizer  {} ({settings})",
            o.get("class").and_then(Value::as_str).unwrap_or("?")
        ));
    }
    if let Some(s) = f
        .get("strategy")
        .and_then(Value::as_object)
        .filter(|s| !s.is_empty())
    {
        let parts: Vec<String> = s
            .iter()
            .map(|(k, v)| format!("{k}={}", scalar(v)))
            .collect();
        lines.push(format!("  strategy   {}", parts.join(", ")));
    }
    if let Some(d) = f.get("device") {
        lines.push(format!(
            "  device     {}, {}; torch {}",
            d.get("name").and_then(Value::as_str).unwrap_or("?"),
            format_bytes(
                d.get("total_memory_bytes")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            ),
            f.get("torch").and_then(Value::as_str).unwrap_or("?")
        ));
    }
    if let Some(p) = f
        .get("phases")
        .and_then(Value::as_array)
        .filter(|p| !p.is_empty())
    {
        let names: Vec<String> = p.iter().map(scalar).collect();
        lines.push(format!("  phases     {}", names.join(", ")));
    }
    if let Some(e) = f.get("ended_by").and_then(Value::as_str) {
        lines.push(format!("  ended by   {e}"));
    }
    lines.join("\n") + "\n"
}

/// The record's side JSON checked as `--side` would be (a relative model path read from the
/// record's folder).
pub fn side(r: &Recorded) -> Result<Option<crate::commands::doctor_side::Side>> {
    let Some(side) = r.side() else {
        return Ok(None);
    };
    let base = r.path.parent().unwrap_or(Path::new("."));
    crate::commands::doctor_side::side_from_text(&side.to_string(), base)
        .map(Some)
        .with_context(|| format!("the side JSON inside {}", r.path.display()))
}
