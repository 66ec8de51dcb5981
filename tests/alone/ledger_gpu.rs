//! The ledger on a real device, in a process of its own (the device's bytes count the whole
//! process: another test allocating meanwhile would count too). A memory test over the
//! device's bytes fails naming cuBLAS when a body keeps making cuBLAS handles, and passes when
//! it destroys them; at every step "not explained" stays within 2% of the process's memory or
//! 8 MiB. Prints why it is skipped and returns where there is no driver, device, CUPTI or cuBLAS.
#![cfg(all(feature = "cupti", feature = "cuda"))]

use vramscope::testing::{MemTest, Metric};

#[path = "../common/cublas.rs"]
mod cublas;

fn within_target(l: &vramscope::ledger::Ledger) {
    let (Some(total), Some(rest)) = (l.total, l.not_explained()) else { panic!("no total:\n{}", l.to_text()) };
    let bound = (total / 50).max(8 << 20);
    assert!(rest.unsigned_abs() <= bound, "not explained {rest} B over {bound} B:\n{}", l.to_text());
}

#[test]
fn a_kept_cublas_handle_is_named_and_the_ledger_explains_the_process() {
    if crate::in_child(module_path!(), "a_kept_cublas_handle_is_named_and_the_ledger_explains_the_process") {
        return;
    }
    if let Err(e) = vramscope::observe::start() {
        eprintln!("skipped: {e}");
        return;
    }
    let alloc = match vramscope::try_device(0) {
        Ok(a) if a.backend().name() == "cuda" => a,
        _ => {
            eprintln!("skipped: no CUDA device");
            return;
        }
    };
    let Some((_lib, create, destroy)) = cublas::load() else {
        eprintln!("skipped: cuBLAS not found");
        return;
    };
    let x = alloc.alloc::<u8>(&alloc.default_stream(), 64 << 20).unwrap();
    let first = vramscope::ledger::take(0);
    print!("{}", first.to_text());
    assert!(first.context.is_some(), "the context was measured:\n{}", first.to_text());
    within_target(&first);
    let mut handles = Vec::new();
    let v = MemTest::new("ledger_gpu::kept_handles").iters(3).warmup(1).metric(Metric::DeviceBytes).check(|| {
        let mut h = std::ptr::null_mut();
        // SAFETY: a valid out pointer.
        assert_eq!(unsafe { create(&mut h) }, 0);
        handles.push(h);
    });
    println!("{}", v.report);
    assert!(!v.passed, "{}", v.report);
    assert!(v.report.contains("cuBLAS"), "{}", v.report);
    let during = vramscope::ledger::take(0);
    print!("{}", during.to_text());
    within_target(&during);
    for h in handles.drain(..) {
        // SAFETY: made above by `cublasCreate_v2`.
        unsafe { destroy(h) };
    }
    let clean =
        MemTest::new("ledger_gpu::destroyed_handles").iters(3).warmup(1).metric(Metric::DeviceBytes).check(|| {
            let mut h = std::ptr::null_mut();
            // SAFETY: a valid out pointer; destroyed at once.
            unsafe {
                assert_eq!(create(&mut h), 0);
                destroy(h);
            }
        });
    assert!(clean.passed, "{}", clean.report);
    drop(x);
    within_target(&vramscope::ledger::take(0));
}
