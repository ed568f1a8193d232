//! What the CLI tests share: running the built binary and reading what it printed.

#![allow(dead_code)] // each test file uses its own subset

pub mod mesh;

use serde_json::Value;
use std::process::{Command, Output};

/// Runs the built `headroom` binary with `args`.
pub fn headroom(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .output()
        .expect("run headroom")
}

/// Runs the built `headroom` binary with `args` in the directory `dir`.
pub fn headroom_in(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run headroom")
}

/// Standard output then standard error, as one text.
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Standard output as JSON (a panic shows what was printed instead, on both streams).
pub fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", String::from_utf8_lossy(&o.stdout), stderr(o)))
}
