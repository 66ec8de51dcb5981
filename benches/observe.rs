//! What observing CUDA allocations (feature `cupti`) costs a program that allocates through
//! cudarc: `CudaStream::alloc` + drop pairs (`cuMemAllocAsync`, `cuMemFreeAsync`) unobserved,
//! observed with the default recording (a stack per allocation, unwound through CUPTI's and
//! the driver's frames), and observed with recording off (CUPTI's callbacks and the table
//! alone). The benchmarks run in that order (divan runs them by name): observing cannot be
//! stopped once started. Without a device or CUPTI it prints why and measures nothing.
//!
//! `cargo bench --features cupti,cuda --bench observe`

use cudarc::driver::{CudaContext, CudaStream};
use divan::{black_box, Bencher};
use std::sync::{Arc, OnceLock};
use vramscope::record::RecordConfig;

static STREAM: OnceLock<Arc<CudaStream>> = OnceLock::new();

fn main() {
    match std::panic::catch_unwind(|| CudaContext::new(0)) {
        Ok(Ok(ctx)) => {
            STREAM.get_or_init(|| ctx.new_stream().unwrap());
            divan::main();
        }
        Ok(Err(e)) => eprintln!("skipped: no CUDA device: {e}"),
        Err(_) => eprintln!("skipped: no CUDA driver"),
    }
}

fn pair(bencher: Bencher) {
    let stream = STREAM.get().expect("set in main");
    // SAFETY: the memory is never read; it is freed when the slice drops.
    drop(unsafe { stream.alloc::<u8>(512) }.unwrap());
    bencher.bench_local(|| {
        // SAFETY: as above.
        let b = unsafe { stream.alloc::<u8>(black_box(512)) }.unwrap();
        drop(black_box(b));
    });
    stream.synchronize().unwrap();
}

/// 512-byte pairs before observing starts.
#[divan::bench(sample_count = 100, sample_size = 100)]
fn a_cudarc_pair_unobserved(bencher: Bencher) {
    pair(bencher);
}

/// Observed, default recording (stacks, scopes, history).
#[divan::bench(sample_count = 100, sample_size = 100)]
fn b_cudarc_pair_observed(bencher: Bencher) {
    if let Err(e) = vramscope::observe::start() {
        eprintln!("skipped: {e}");
        return;
    }
    pair(bencher);
}

/// Observed, recording off: CUPTI's callbacks and the table of what is live.
#[divan::bench(sample_count = 100, sample_size = 100)]
fn c_cudarc_pair_observed_recording_off(bencher: Bencher) {
    if vramscope::observe::start().is_err() {
        return;
    }
    // The observed allocator exists once something was allocated under observation.
    let stream = STREAM.get().expect("set in main");
    // SAFETY: never read; freed at once.
    drop(unsafe { stream.alloc::<u8>(512) }.unwrap());
    if let Some(a) = vramscope::observe::allocator(0) {
        a.record_memory_history(RecordConfig::off());
    }
    pair(bencher);
}
