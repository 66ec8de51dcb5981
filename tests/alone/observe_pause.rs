//! Pausing the observer (feature `cupti`) on a real device: nothing is recorded while paused,
//! and observing goes on after `resume`. Alone in its process, as pausing is for the whole
//! process. Skipped, with the reason printed, where there is no driver, device or CUPTI.
#![cfg(feature = "cupti")]

use cudarc::driver::CudaContext;

#[test]
fn nothing_is_recorded_while_paused() {
    if crate::in_child(module_path!(), "nothing_is_recorded_while_paused") {
        return;
    }
    if let Err(e) = vramscope::observe::start() {
        return eprintln!("skipped: {e}");
    }
    let ctx = match std::panic::catch_unwind(|| CudaContext::new(0)) {
        Ok(Ok(c)) => c,
        _ => return eprintln!("skipped: no CUDA device"),
    };
    let stream = ctx.default_stream();
    let live = || vramscope::observe::allocator(0).map_or(0, |a| a.stats().requested_bytes.all.current);
    let seen = stream.alloc_zeros::<u8>(1000).unwrap();
    assert_eq!(live(), 1000);
    vramscope::observe::pause().unwrap();
    let unseen = stream.alloc_zeros::<u8>(3000).unwrap();
    assert_eq!(live(), 1000, "not recorded while paused");
    vramscope::observe::resume().unwrap();
    drop(unseen);
    assert_eq!(live(), 1000, "the free of an allocation never seen changes nothing");
    let again = stream.alloc_zeros::<u8>(500).unwrap();
    assert_eq!(live(), 1500);
    drop((seen, again));
    assert_eq!(live(), 0);
}
