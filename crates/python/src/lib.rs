//! `headroom._headroom`, the native module of the `headroom-mem` Python package: the `headroom`
//! command line (`main`, behind the package's console script) and one command's `--json` report
//! as a string (`run_json`, behind `headroom.plan` and `headroom.replay`). The GIL is released
//! while a command runs.
//!
//! Not for: argument building or the Python-facing API (`python/headroom`), or any planning or
//! replay logic (the Rust crates the CLI calls).

use pyo3::prelude::*;

/// Runs the headroom command line with `argv` (the program name first) and returns its exit
/// status; output and errors go to the process's stdout and stderr.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| headroom_cli::run(argv))
}

/// Runs one headroom command (`argv` with the program name first, including `--json`) and
/// returns `(report, error)`: the JSON report as a string if the command wrote one, and the
/// error message if it failed.
#[pyfunction]
fn run_json(py: Python<'_>, argv: Vec<String>) -> (Option<String>, Option<String>) {
    let run = py.detach(|| headroom_cli::run_json(argv));
    (run.report, run.error)
}

#[pymodule]
fn _headroom(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(run_json, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
