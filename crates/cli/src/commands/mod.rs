//! One module per `headroom` subcommand: argument definitions and the code that runs them.

pub mod memory;
