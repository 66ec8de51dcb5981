//! Allocator configuration strings (`VRAMSCOPE_ALLOC_CONF`, PyTorch's syntax); what parses
//! builds an allocator that serves a few requests.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope::{config::AllocatorConfig, CachingAllocator, backend::SimBackend};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let Ok(config) = AllocatorConfig::parse(s) else { return };
    let Ok(alloc) = CachingAllocator::with_config(SimBackend::new(1 << 30), config) else { return };
    let stream = alloc.default_stream();
    for len in [1usize, 4096, 3 << 20, 1 << 29] {
        if let Ok(b) = alloc.alloc::<u8>(&stream, len) {
            drop(b);
        }
    }
    alloc.empty_cache();
    alloc.check_invariants().expect("the allocator's invariants hold");
});
