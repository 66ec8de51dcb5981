//! Allocator benchmarks on the simulated backend (the allocator alone).
//!
//! `cargo bench --bench alloc`

use divan::{black_box, Bencher};
use vramscope::replay::{replay, ReplayOptions, Trace};
use vramscope::{CachingAllocator, SimBackend};

fn main() {
    divan::main();
}

/// A cached alloc+free pair: the block is in the cache before timing starts.
#[divan::bench(args = [512, 1 << 20, 64 << 20])]
fn cached_pair(bencher: Bencher, bytes: usize) {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    drop(alloc.alloc::<u8>(&s, bytes).unwrap());
    bencher.bench_local(|| {
        let b = alloc.alloc::<u8>(&s, black_box(bytes)).unwrap();
        drop(black_box(b));
    });
}

/// A warm pass of a fixture trace: one iteration is a whole pass; divide by the op count
/// (`vramscope replay` prints ns/op directly).
#[divan::bench(args = ["resnet_train", "leaky_train"], sample_count = 30)]
fn warm_replay_pass(bencher: Bencher, name: &str) {
    let path = format!("{}/fixtures/torch/{name}.trace.json", env!("CARGO_MANIFEST_DIR"));
    let trace = Trace::from_file(path).unwrap();
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let mut opts = ReplayOptions::default();
    opts.warm_passes = 0;
    replay(&alloc, &trace, &opts).unwrap();
    bencher.bench_local(|| replay(&alloc, &trace, &opts).unwrap().ns_per_op);
}
