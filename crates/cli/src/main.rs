//! The `headroom` command: plan a training run that fits, run it, and see where every byte went.
//! The command line itself lives in the library (`headroom_cli::run`), which the Python
//! package's console script calls too.

use std::process::ExitCode;

fn main() -> ExitCode {
    headroom_cli::die_quietly_on_closed_stdout();
    ExitCode::from(headroom_cli::run(std::env::args_os()))
}
