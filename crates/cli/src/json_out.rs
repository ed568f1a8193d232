//! Where a command's `--json` report goes: stdout for the binary, or a buffer when the command
//! runs inside another program (the Python module's `headroom.plan(...)`), which reads the
//! report as a string instead of parsing a process's output.
//!
//! Not for: text reports, warnings or progress (those always go to the terminal).

use std::cell::RefCell;

thread_local! {
    /// `Some` while a caller on this thread captures the JSON report.
    static CAPTURED: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Prints the JSON report, or keeps it for the capturing caller.
pub(crate) fn print_json(value: &serde_json::Value) -> serde_json::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    let kept = CAPTURED.with(|c| match c.borrow_mut().as_mut() {
        Some(buffer) => {
            buffer.push_str(&text);
            true
        }
        None => false,
    });
    if !kept {
        println!("{text}");
    }
    Ok(())
}

/// Runs `f` with the JSON report captured; returns what `f` returned and the report, if one was
/// written.
pub(crate) fn capturing<R>(f: impl FnOnce() -> R) -> (R, Option<String>) {
    CAPTURED.with(|c| *c.borrow_mut() = Some(String::new()));
    let result = f();
    let text = CAPTURED.with(|c| c.borrow_mut().take());
    (result, text.filter(|t| !t.is_empty()))
}
