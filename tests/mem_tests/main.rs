//! Memory tests (`#[gpu_mem_test]`, `MemTest`) and the recording they rest on: stacks, scopes
//! (in threads, async tasks and `tracing` spans). One test binary for the area.

mod async_scopes;
mod gpu_mem_test;
mod mem_tests;
mod record;
mod tracing_scopes;
