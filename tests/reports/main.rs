//! Snapshots and what is read from them: reports, the leak finder, replay of recorded traces,
//! snapshots' contexts, and bad or hostile input. One test binary for the area.

mod bad_input;
mod leak_rates;
mod leak_steps;
mod replay;
mod reports;
mod snapshot_contexts;
