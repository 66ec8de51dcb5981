//! Observing while another CUPTI subscriber holds CUPTI (a profiler such as Nsight Systems, or
//! PyTorch's profiler): starting is an error that says so, never a panic, memory tests that
//! observe are skipped with it printed, and the program runs on, unobserved. Alone in its
//! process: it subscribes to CUPTI first, for the whole process.
#![cfg(feature = "cupti")]

use std::ffi::{c_char, c_void, CString};
use vramscope::testing::{MemTest, Source};

type Callback = unsafe extern "C" fn(*mut c_void, i32, u32, *const c_void);
type Subscribe = unsafe extern "C" fn(*mut *mut c_void, Callback, *mut c_void) -> i32;

/// Another tool's callback: does nothing.
unsafe extern "C" fn another_tool(_: *mut c_void, _: i32, _: u32, _: *const c_void) {}

/// A CUPTI library to subscribe through first, and its path.
fn cupti() -> Option<(*mut c_void, String)> {
    let names = ["libcupti.so", "libcupti.so.13", "libcupti.so.12"];
    let mut paths: Vec<String> = std::env::var("VRAMSCOPE_CUPTI").into_iter().collect();
    paths.extend(names.iter().map(|n| n.to_string()));
    for root in ["/usr/local/cuda", "/usr/local/cuda-13.0", "/usr/local/cuda-12"] {
        for dir in ["extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib"] {
            paths.extend(names.iter().map(|n| format!("{root}/{dir}/{n}")));
        }
    }
    paths.into_iter().find_map(|p| {
        let c = CString::new(p.clone()).ok()?;
        // SAFETY: a NUL-terminated path; loading CUPTI runs its initializers only.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
        (!lib.is_null()).then_some((lib, p))
    })
}

#[test]
fn another_subscriber_is_an_error_and_the_program_runs_on() {
    if crate::in_child(module_path!(), "another_subscriber_is_an_error_and_the_program_runs_on") {
        return;
    }
    let Some((lib, path)) = cupti() else {
        return eprintln!("skipped: no CUPTI library here");
    };
    // SAFETY: the symbol has `cuptiSubscribe`'s C signature (`cupti_callbacks.h`).
    let subscribe: Subscribe = unsafe {
        let sym = libc::dlsym(lib, c"cuptiSubscribe".as_ptr() as *const c_char);
        assert!(!sym.is_null(), "{path} has cuptiSubscribe");
        std::mem::transmute::<*mut c_void, Subscribe>(sym)
    };
    let mut subscriber = std::ptr::null_mut();
    // SAFETY: a valid out pointer and a callback that lives as long as the process.
    let r = unsafe { subscribe(&mut subscriber, another_tool, std::ptr::null_mut()) };
    assert_eq!(r, 0, "the other tool subscribes first");
    // The observer loads the same library (CUPTI allows one subscriber per process).
    std::env::set_var("VRAMSCOPE_CUPTI", &path);
    let e = vramscope::observe::start().expect_err("CUPTI is taken").to_string();
    println!("{e}");
    assert!(e.contains("only one CUPTI subscriber"), "{e}");
    assert!(!vramscope::observe::is_running());
    let why = MemTest::new("busy").source(Source::Cuda).skip_reason().expect("skipped");
    assert!(why.contains("cannot be observed here") && why.contains("only one CUPTI subscriber"), "{why}");
    // The program runs on, unobserved.
    if let Ok(Ok(ctx)) = std::panic::catch_unwind(|| cudarc::driver::CudaContext::new(0)) {
        let stream = ctx.default_stream();
        let x = stream.alloc_zeros::<f32>(1 << 20).unwrap();
        assert_eq!(stream.clone_dtoh(&x).unwrap().len(), 1 << 20);
        assert!(vramscope::observe::allocator(0).is_none(), "nothing was observed");
    }
}
