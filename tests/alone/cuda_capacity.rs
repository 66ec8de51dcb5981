//! `VRAMSCOPE_CAPACITY` on a real CUDA device (feature `cuda`): the default device's allocator
//! may reserve no more than it. Skipped, saying why, where there is no driver or device. (A
//! process of its own, one test: it sets environment variables before the default device
//! exists.)
#![cfg(feature = "cuda-backend")]

use vramscope::Error;

#[test]
fn the_default_devices_capacity_caps_what_it_reserves() {
    if crate::in_child(module_path!(), "the_default_devices_capacity_caps_what_it_reserves") {
        return;
    }
    // This process runs this one test, so no other thread reads the environment meanwhile.
    std::env::set_var(vramscope::config::BACKEND_ENV, "cuda");
    std::env::set_var(vramscope::config::CAPACITY_ENV, "256 MiB");
    let alloc = match vramscope::try_device(0) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let s = alloc.default_stream();
    let a = alloc.alloc::<u8>(&s, 200 << 20).unwrap();
    let err = alloc.alloc::<u8>(&s, 100 << 20).unwrap_err();
    let Error::OutOfMemory(report) = &err else { panic!("{err}") };
    assert_eq!(report.allowed, Some(256 << 20), "{err}");
    assert!(report.capacity > 256 << 20, "the device's own capacity is reported beside the cap: {err}");
    drop(a);
    drop(alloc.alloc::<u8>(&s, 250 << 20).expect("the cache is given back for a request that fits the cap"));
    alloc.check_invariants().unwrap();
}
