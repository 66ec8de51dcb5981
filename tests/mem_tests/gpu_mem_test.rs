//! `#[gpu_mem_test]` as users write it.

use std::sync::{Mutex, OnceLock};
use vramscope::{gpu_mem_test, Buffer};

#[gpu_mem_test(iters = 3, warmup = 1)]
fn a_clean_test_passes() {
    let a = vramscope::device(0);
    let x = a.alloc::<f32>(&a.default_stream(), 1 << 16).unwrap();
    drop(x);
}

static KEPT: Mutex<Vec<Buffer<u8>>> = Mutex::new(Vec::new());

#[gpu_mem_test(iters = 3)]
#[should_panic(expected = "tests/mem_tests/gpu_mem_test.rs:19 (mem_tests::..::a_leaky_test_fa")]
fn a_leaky_test_fails_naming_its_line() {
    let a = vramscope::device(0);
    KEPT.lock().unwrap().push(a.alloc::<u8>(&a.default_stream(), 4096).unwrap());
}

#[gpu_mem_test(tolerance = "8 KiB", iters = 2)]
fn growth_within_the_tolerance_passes() {
    let a = vramscope::device(0);
    std::mem::forget(a.alloc::<u8>(&a.default_stream(), 4096).unwrap());
}

#[gpu_mem_test(metric = "live_blocks", warmup = 0, iters = 2)]
fn results_are_returned() -> Result<(), String> {
    let a = vramscope::device(0);
    let _x = a.alloc::<u8>(&a.default_stream(), 10).map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs on a CUDA device (the `cuda` feature and a driver and device present); skipped with a
/// printed reason elsewhere.
#[gpu_mem_test(backend = "cuda")]
fn a_cuda_test_runs_only_on_a_cuda_device() {
    let a = vramscope::device(0);
    assert_eq!(a.backend().name(), "cuda", "this body must not run without a CUDA device");
    let x = a.alloc::<f32>(&a.default_stream(), 1 << 20).unwrap();
    drop(x);
}

#[gpu_mem_test]
#[ignore = "kept ignored: the user's attributes stay"]
fn ignored_tests_stay_ignored() {
    panic!("ignored");
}

static WEIGHTS: OnceLock<Buffer<f32>> = OnceLock::new();

/// Weights made in the warm-up iteration are not growth; the report of what the test keeps
/// alive is pinned with insta.
#[gpu_mem_test(snapshot = true, iters = 2)]
fn what_a_test_keeps_alive_is_pinned() {
    let a = vramscope::device(0);
    WEIGHTS.get_or_init(|| {
        let _s = vramscope::scope("weights");
        a.alloc::<f32>(&a.default_stream(), 256 * 256).unwrap().with_shape(&[256, 256]).unwrap()
    });
    let act = a.alloc::<f32>(&a.default_stream(), 1024).unwrap();
    drop(act);
}

#[tokio::test]
#[gpu_mem_test(iters = 2)]
async fn composes_with_tokio_test_below_it() {
    let a = vramscope::device(0);
    let x = a.alloc::<u8>(&a.default_stream(), 100).unwrap();
    tokio::task::yield_now().await;
    drop(x);
}

#[test]
fn assert_mem_snapshot_pins_an_allocators_live_tensors() {
    let alloc = vramscope::CachingAllocator::new(vramscope::backend::SimBackend::new(1 << 30));
    let mut rec = vramscope::record::RecordConfig::default();
    rec.stacks = vramscope::record::StackMode::Off;
    alloc.record_memory_history(rec);
    let _m = vramscope::scope("model");
    let w = alloc.alloc::<f32>(&alloc.default_stream(), 4096).unwrap().with_shape(&[64, 64]).unwrap();
    vramscope::assert_mem_snapshot!(alloc);
    vramscope::assert_mem_snapshot!("model_snapshot", alloc.snapshot());
    drop(w);
}

/// A test named with a raw identifier: the macro uses the bare name.
#[gpu_mem_test(iters = 2)]
fn r#match() {
    let a = vramscope::device(0);
    drop(a.alloc::<u8>(&a.default_stream(), 64).unwrap());
}
