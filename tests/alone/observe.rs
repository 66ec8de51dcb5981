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
    if crate::in_child(module_path!(), "a_leak_through_cudarc_fails_the_test_and_names_its_line") {
        return;
    }
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
    let site = format!("tests/alone/observe.rs:{line}");
    assert!(v.report.contains(&site), "{site} not in\n{}", v.report);
    let temporary = format!("tests/alone/observe.rs:{}", line - 1);
    assert!(!v.report.contains(&temporary), "the temporary is not named:\n{}", v.report);
    // cudarc allocates from the device's stream-ordered pool, which the snapshot reads.
    let snap = vramscope::observe::allocator(0).expect("allocations were seen").snapshot();
    println!("{}", vramscope::report::summary(&snap));
    let pool = snap.driver_pool.expect("the driver's pool is read");
    assert!(pool.used >= 12_000 && pool.reserved >= pool.used && pool.used_high >= pool.used, "{pool:?}");
}

#[test]
fn a_body_that_frees_what_it_allocates_passes() {
    if crate::in_child(module_path!(), "a_body_that_frees_what_it_allocates_passes") {
        return;
    }
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
    if crate::in_child(module_path!(), "the_caching_allocators_own_segments_are_not_observed_again") {
        return;
    }
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
    // Nothing else allocates through cudarc here (each test has its process); a margin anyway.
    let grew = observed().saturating_sub(before);
    assert!(grew < 64 << 20, "the allocator's cuMemAlloc calls are not observed: {grew} B");
}

/// Physical memory mapped by hand, as a framework with its own virtual-memory pool maps it.
mod mapped {
    use cudarc::driver::sys;

    /// One reserved range with a mapping of a page at each page.
    pub struct Range {
        pub base: u64,
        pub page: usize,
        handles: Vec<u64>,
    }

    /// The device's mapping granularity and the allocation properties.
    fn prop() -> (sys::CUmemAllocationProp, usize) {
        // SAFETY: a zeroed CUmemAllocationProp is the documented starting point.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        let mut page = 0usize;
        let gran = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: valid out pointer and properties.
        unsafe { sys::cuMemGetAllocationGranularity(&mut page, &prop, gran) }.result().unwrap();
        (prop, page)
    }

    /// Reserves a range of `pieces` pages and maps fresh memory under each.
    pub fn map(pieces: usize) -> Range {
        let (prop, page) = prop();
        let mut base = 0;
        // SAFETY: valid out pointer; the range is freed by `unmap`.
        unsafe { sys::cuMemAddressReserve(&mut base, page * pieces, page, 0, 0) }.result().unwrap();
        let mut handles = Vec::new();
        for i in 0..pieces {
            let mut handle = 0;
            // SAFETY: valid out pointer and properties; released by `unmap`.
            unsafe { sys::cuMemCreate(&mut handle, page, &prop, 0) }.result().unwrap();
            let at = base + (i * page) as u64;
            // SAFETY: `at` is a page of the range reserved above, mapped once.
            unsafe { sys::cuMemMap(at, page, 0, handle, 0) }.result().unwrap(); // the mapping line
            handles.push(handle);
        }
        Range { base, page, handles }
    }

    /// Unmaps the whole range in one call, then frees its memory and addresses.
    pub fn unmap(r: Range) {
        let len = r.page * r.handles.len();
        // SAFETY: the range and handles are those `map` made, unmapped once.
        unsafe {
            sys::cuMemUnmap(r.base, len).result().unwrap();
            for h in r.handles {
                sys::cuMemRelease(h).result().unwrap();
            }
            sys::cuMemAddressFree(r.base, len).result().unwrap();
        }
    }
}

#[test]
fn mapped_virtual_memory_counts_where_it_is_mapped() {
    if crate::in_child(module_path!(), "mapped_virtual_memory_counts_where_it_is_mapped") {
        return;
    }
    let Some(ctx) = context() else { return };
    let kept: Mutex<Vec<mapped::Range>> = Mutex::default();
    let mut page = 0;
    let v = MemTest::new("observe::mapped").source(Source::Cuda).iters(3).check(|| {
        ctx.bind_to_thread().unwrap();
        // Two pages mapped and unmapped in one call: not kept. One page kept.
        mapped::unmap(mapped::map(2));
        let r = mapped::map(1);
        page = r.page;
        kept.lock().unwrap().push(r);
    });
    println!("{}", v.report);
    assert!(!v.passed, "{}", v.report);
    assert_eq!(v.growth, 3 * page as i64, "one page a run:\n{}", v.report);
    let source = include_str!("observe.rs");
    let line = 1 + source.lines().position(|l| l.ends_with("// the mapping line")).unwrap();
    let site = format!("tests/alone/observe.rs:{line}");
    assert!(v.report.contains(&site), "{site} not in\n{}", v.report);
    let recorded = |base: u64| {
        let snap = vramscope::observe::allocator(0).unwrap().snapshot();
        snap.segments.iter().any(|s| s.address == base)
    };
    let ranges = std::mem::take(&mut *kept.lock().unwrap());
    let bases: Vec<u64> = ranges.iter().map(|r| r.base).collect();
    assert!(bases.iter().all(|&b| recorded(b)), "every kept mapping is recorded");
    for r in ranges {
        mapped::unmap(r);
    }
    assert!(!bases.iter().any(|&b| recorded(b)), "every unmapped mapping is forgotten");
}
