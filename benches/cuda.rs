//! Cached alloc+free pairs on a CUDA device (feature `cuda`): vramscope's allocator against
//! cudarc's own `CudaStream::alloc` (`cuMemAllocAsync` from the device's default pool, then
//! `cuMemFreeAsync` on drop). Without a device it prints why and measures nothing.
//!
//! `cargo bench --features cuda --bench cuda` (tests/gpu/README.md runs it on the device machine).

use cudarc::driver::{CudaContext, CudaStream};
use divan::{black_box, Bencher};
use std::sync::{Arc, OnceLock};
use vramscope::{backend::CudaBackend, record::RecordConfig, CachingAllocator};

static ALLOC: OnceLock<CachingAllocator> = OnceLock::new();
static RECORDING: OnceLock<CachingAllocator> = OnceLock::new();
static CTX: OnceLock<Arc<CudaContext>> = OnceLock::new();

fn main() {
    match CudaBackend::new(0) {
        Ok(b) => {
            CTX.get_or_init(|| b.context().clone());
            let b = Arc::new(b);
            ALLOC.get_or_init(|| {
                let alloc = CachingAllocator::new(b.clone());
                alloc.record_memory_history(RecordConfig::off());
                alloc
            });
            RECORDING.get_or_init(|| CachingAllocator::new(b));
            divan::main();
        }
        Err(e) => eprintln!("skipped: {e}"),
    }
}

const SIZES: [usize; 3] = [512, 1 << 20, 64 << 20];

fn pair(bencher: Bencher, alloc: &CachingAllocator, bytes: usize) {
    let s = alloc.default_stream();
    // Steady state: the block is cached and the history ring (when recording) has filled once.
    for _ in 0..alloc.record_config().max_entries.max(1) {
        drop(alloc.alloc::<u8>(&s, bytes).unwrap());
    }
    bencher.bench_local(|| {
        let b = alloc.alloc::<u8>(&s, black_box(bytes)).unwrap();
        drop(black_box(b));
    });
}

/// vramscope with recording off, as PyTorch's allocator runs by default: the block is cached
/// before timing starts.
#[divan::bench(args = SIZES, sample_count = 200, sample_size = 1000)]
fn vramscope_pair(bencher: Bencher, bytes: usize) {
    pair(bencher, ALLOC.get().expect("set in main"), bytes);
}

/// vramscope with its default recording (`CachingAllocator::new`): fast stacks, scopes, a
/// history of 100,000 events.
#[divan::bench(args = SIZES, sample_count = 200, sample_size = 1000)]
fn vramscope_pair_recording(bencher: Bencher, bytes: usize) {
    pair(bencher, RECORDING.get().expect("set in main"), bytes);
}

fn cudarc_pair(bencher: Bencher, stream: &Arc<CudaStream>, bytes: usize) {
    // SAFETY: the memory is never read; it is freed when the slice drops.
    drop(unsafe { stream.alloc::<u8>(bytes) }.unwrap());
    bencher.bench_local(|| {
        // SAFETY: as above.
        let b = unsafe { stream.alloc::<u8>(black_box(bytes)) }.unwrap();
        drop(black_box(b));
    });
    stream.synchronize().unwrap();
}

/// cudarc as a user gets it: `CudaStream::alloc` on a new stream, with cudarc's event tracking
/// on (its default: two events per slice).
#[divan::bench(args = SIZES, sample_count = 100, sample_size = 100)]
fn cudarc_stream_alloc_pair(bencher: Bencher, bytes: usize) {
    let ctx = CTX.get().expect("set in main");
    cudarc_pair(bencher, &ctx.new_stream().unwrap(), bytes);
}
