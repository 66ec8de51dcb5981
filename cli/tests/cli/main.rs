//! The `vramscope` command line as users run it: every subcommand, its outputs and its errors,
//! and hostile files. One test binary.

mod commands;
mod hostile_fixtures;
