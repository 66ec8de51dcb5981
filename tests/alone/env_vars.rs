//! Environment variables that are not UTF-8 are errors naming the variable, not silently the
//! defaults. (A process of its own, one test: it sets environment variables.)
#![cfg(unix)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

#[test]
fn non_utf8_settings_are_errors() {
    if crate::in_child(module_path!(), "non_utf8_settings_are_errors") {
        return;
    }
    let garbage = OsStr::from_bytes(b"ho\xffst");
    for (k, key) in [vramscope::config::BACKEND_ENV, vramscope::config::CAPACITY_ENV].into_iter().enumerate() {
        // This process runs this one test, so no other thread reads the environment meanwhile.
        std::env::set_var(key, garbage);
        let e = vramscope::try_device(100 + k).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains("not UTF-8"), "{e}");
        std::env::remove_var(key);
    }
    assert!(vramscope::try_device(102).is_ok(), "unset again, the defaults apply");
    // Named as environment variables, not as allocator configuration keys.
    std::env::set_var(vramscope::config::BACKEND_ENV, garbage);
    let e = vramscope::try_device(103).unwrap_err().to_string();
    assert!(e.starts_with("environment variable `VRAMSCOPE_BACKEND`"), "{e}");
    std::env::remove_var(vramscope::config::BACKEND_ENV);
    // A capacity no segment fits in is refused at once, not at every allocation.
    std::env::set_var(vramscope::config::CAPACITY_ENV, "1MiB");
    let e = vramscope::try_device(104).unwrap_err().to_string();
    assert!(e.contains("less than the smallest segment, 2.00 MiB"), "{e}");
    std::env::set_var(vramscope::config::CAPACITY_ENV, "2MiB");
    let a = vramscope::try_device(105).unwrap();
    drop(a.alloc::<u8>(&a.default_stream(), 1 << 20).unwrap());
    std::env::remove_var(vramscope::config::CAPACITY_ENV);
}
