//! `headroom memory …`: the allocator's observability on traces.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {}

pub fn run(cmd: MemoryCommand) -> anyhow::Result<()> {
    match cmd {}
}
