//! Allocator and recording benchmarks on the simulated backend (the allocator alone).
//!
//! `cargo bench --bench alloc`

use divan::{black_box, Bencher};
use vramscope::replay::{replay, ReplayOptions, Trace};
use vramscope::{backend::SimBackend, record::RecordConfig, record::StackMode, CachingAllocator};

fn main() {
    divan::main();
}

fn allocator(record: RecordConfig) -> CachingAllocator {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    alloc.record_memory_history(record);
    alloc
}

fn pair(bencher: Bencher, alloc: &CachingAllocator, bytes: usize) {
    let s = alloc.default_stream();
    // Steady state: the block is cached and the history ring has filled once (its first fill
    // pays the page faults of fresh memory; `cached_pair_recording_first_fill` measures that).
    for _ in 0..alloc.record_config().max_entries {
        drop(alloc.alloc::<u8>(&s, bytes).unwrap());
    }
    drop(alloc.alloc::<u8>(&s, bytes).unwrap());
    bencher.bench_local(|| {
        let b = alloc.alloc::<u8>(&s, black_box(bytes)).unwrap();
        drop(black_box(b));
    });
}

/// A cached alloc+free pair with recording off: the block is in the cache before timing starts.
#[divan::bench(args = [512, 1 << 20, 64 << 20], sample_count = 200, sample_size = 1000)]
fn cached_pair(bencher: Bencher, bytes: usize) {
    pair(bencher, &allocator(RecordConfig::off()), bytes);
}

/// The same pair with the default recording: fast stacks, scopes, history with context on
/// allocations.
#[divan::bench(args = [512, 1 << 20, 64 << 20], sample_count = 200, sample_size = 1000)]
fn cached_pair_recording(bencher: Bencher, bytes: usize) {
    let _scope = vramscope::scope("bench");
    pair(bencher, &allocator(RecordConfig::default()), bytes);
}

/// The recording pair while the history ring is still filling for the first time.
#[divan::bench(args = [512], sample_count = 200, sample_size = 1000)]
fn cached_pair_recording_first_fill(bencher: Bencher, bytes: usize) {
    let alloc = allocator(RecordConfig::default());
    let s = alloc.default_stream();
    drop(alloc.alloc::<u8>(&s, bytes).unwrap());
    bencher.bench_local(|| {
        let b = alloc.alloc::<u8>(&s, black_box(bytes)).unwrap();
        drop(black_box(b));
    });
}

/// The same pair with full (unwinder) stacks.
#[divan::bench(args = [512], sample_count = 200, sample_size = 1000)]
fn cached_pair_full_stacks(bencher: Bencher, bytes: usize) {
    let mut rec = RecordConfig::default();
    rec.stacks = StackMode::Full;
    pair(bencher, &allocator(rec), bytes);
}

#[inline(never)]
fn site_a(alloc: &CachingAllocator, n: usize) -> vramscope::Buffer<u8> {
    alloc.alloc::<u8>(&alloc.default_stream(), 512 + n % 4096).unwrap()
}

#[inline(never)]
fn site_b(alloc: &CachingAllocator, n: usize) -> vramscope::Buffer<u8> {
    alloc.alloc::<u8>(&alloc.default_stream(), (2 << 20) + n % 4096).unwrap()
}

/// A symbolized snapshot of 100,000 history entries with stacks (allocations from two sites,
/// alternating, half of them freed again).
#[divan::bench(sample_count = 10)]
fn snapshot_100k_history(bencher: Bencher) {
    let alloc = allocator(RecordConfig::default());
    let mut live = Vec::new();
    for i in 0..66_667 {
        live.push(if i % 2 == 0 { site_a(&alloc, i) } else { site_b(&alloc, i) });
        if i % 2 == 1 {
            live.swap_remove(i % live.len());
        }
    }
    bencher.bench_local(|| black_box(alloc.snapshot()).history.len());
}

/// A warm pass of a fixture trace: one iteration is a whole `replay()` call (it re-encodes the
/// trace); `vramscope replay` prints ns/op directly.
#[divan::bench(args = ["resnet_train", "leaky_train"], sample_count = 30)]
fn warm_replay_pass(bencher: Bencher, name: &str) {
    let path = format!("{}/fixtures/torch/{name}.trace.json.gz", env!("CARGO_MANIFEST_DIR"));
    let trace = Trace::from_file(path).unwrap();
    let alloc = allocator(RecordConfig::off());
    let mut opts = ReplayOptions::default();
    opts.warm_passes = 0;
    replay(&alloc, &trace, &opts).unwrap();
    bencher.bench_local(|| replay(&alloc, &trace, &opts).unwrap().ns_per_op);
}

/// 40,000 allocations (each freed at once) on one stream, and on 40,000 streams created
/// beforehand: per-stream state must not make the second quadratic. Each new stream needs
/// memory of its own: it takes over an idle stream's cached segment or the one the soft limit
/// would release (after waiting for the old stream), where it used to release one and reserve
/// another.
#[divan::bench(args = ["one stream", "new streams"], sample_count = 10)]
fn streams_40k(bencher: Bencher, streams: &str) {
    const N: usize = 40_000;
    bencher
        .with_inputs(|| {
            let alloc = allocator(RecordConfig::off());
            let list: Vec<_> = if streams == "one stream" {
                vec![alloc.default_stream(); N]
            } else {
                (0..N).map(|_| alloc.new_stream().unwrap()).collect()
            };
            (alloc, list)
        })
        .bench_local_values(|(alloc, list)| {
            for s in &list {
                drop(black_box(alloc.alloc::<u8>(s, 512).unwrap()));
            }
            (alloc, list)
        });
}
