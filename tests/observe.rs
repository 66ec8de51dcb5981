//! The observer of CUDA allocations (feature `cupti`) on a real device: memory allocated
//! through cudarc, not through vramscope, counted by memory tests and named by its line. Every
//! test prints why it is skipped and returns where there is no driver, device or CUPTI.
#![cfg(feature = "cupti")]

use cudarc::driver::{CudaContext, CudaSlice};
use std::sync::{Arc, Mutex};
use vramscope::testing::{MemTest, Source};

/// The device's context, or why there is none.
fn context() -> Option<Arc<CudaContext>> {
    match vramscope::observe::start() {
        Ok(path) => println!("CUPTI: {path}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            return None;
        }
    }
    match std::panic::catch_unwind(|| CudaContext::new(0)) {
        Ok(Ok(ctx)) => Some(ctx),
        Ok(Err(e)) => {
            eprintln!("skipped: no CUDA device: {e}");
            None
        }
        Err(_) => {
            eprintln!("skipped: no CUDA driver");
            None
        }
    }
}

#[test]
fn a_leak_through_cudarc_fails_the_test_and_names_its_line() {
    let Some(ctx) = context() else { return };
    let stream = ctx.default_stream();
    let kept: Mutex<Vec<CudaSlice<f32>>> = Mutex::default();
    let line = line!() + 3;
    let v = MemTest::new("observe::leak").source(Source::Cuda).iters(3).check(|| {
        let _temporary = stream.alloc_zeros::<f32>(1 << 20).unwrap();
        let leaked = stream.alloc_zeros::<f32>(1000).unwrap();
        kept.lock().unwrap().push(leaked);
    });
    println!("{}", v.report);
    assert!(!v.passed, "{}", v.report);
    assert_eq!(v.growth, 3 * 4000, "{}", v.report);
    let site = format!("tests/observe.rs:{line}");
    assert!(v.report.contains(&site), "{site} not in\n{}", v.report);
    let temporary = format!("tests/observe.rs:{}", line - 1);
    assert!(!v.report.contains(&temporary), "the temporary is not named:\n{}", v.report);
    // cudarc allocates from the device's stream-ordered pool, which the snapshot reads.
    let snap = vramscope::observe::allocator(0).expect("allocations were seen").snapshot();
    println!("{}", vramscope::report::summary(&snap));
    let pool = snap.driver_pool.expect("the driver's pool is read");
    assert!(pool.used >= 12_000 && pool.reserved >= pool.used && pool.used_high >= pool.used, "{pool:?}");
}

#[test]
fn a_body_that_frees_what_it_allocates_passes() {
    let Some(ctx) = context() else { return };
    let stream = ctx.default_stream();
    let v = MemTest::new("observe::clean").source(Source::Cuda).iters(4).check(|| {
        let a = stream.alloc_zeros::<u8>(3 << 20).unwrap();
        let b = stream.clone_htod(&[1u32, 2, 3]).unwrap();
        drop((a, b));
    });
    assert!(v.passed, "{}", v.report);
}

#[test]
fn the_caching_allocators_own_segments_are_not_observed_again() {
    let Some(_ctx) = context() else { return };
    let Ok(alloc) = vramscope::try_device(0) else { return };
    if alloc.backend().name() != "cuda" {
        eprintln!("skipped: device 0 is {}", alloc.backend().name());
        return;
    }
    let observed = || vramscope::observe::allocator(0).map_or(0, |o| o.memory_allocated());
    let before = observed();
    let v = MemTest::new("observe::own").source(Source::Cuda).iters(3).check(|| {
        let s = alloc.default_stream();
        // A new segment each iteration, kept: counted once, as the allocator's block.
        std::mem::forget(alloc.alloc::<u8>(&s, 64 << 20).unwrap());
    });
    assert!(!v.passed);
    assert_eq!(v.growth, 3 * (64 << 20), "counted once:\n{}", v.report);
    // Other tests of this binary allocate through cudarc meanwhile, but far less than 64 MiB.
    let grew = observed().saturating_sub(before);
    assert!(grew < 64 << 20, "the allocator's cuMemAlloc calls are not observed: {grew} B");
}
