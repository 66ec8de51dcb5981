//! Trace reading and replay on the simulated backend (a small device, so that replays also
//! run out of memory).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope::replay::{replay, ReplayOptions, Trace};
use vramscope::{CachingAllocator, backend::SimBackend};

fuzz_target!(|data: &[u8]| {
    let Ok(trace) = Trace::from_bytes(data, "fuzz") else { return };
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let mut options = ReplayOptions::default();
    options.warm_passes = 1;
    let _ = replay(&alloc, &trace, &options);
    alloc.check_invariants().expect("the allocator's invariants hold after a replay");
});
