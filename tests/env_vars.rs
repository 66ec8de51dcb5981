//! Environment variables that are not UTF-8 are errors naming the variable, not silently the
//! defaults. (Its own test binary, one test: it sets environment variables.)
#![cfg(unix)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

#[test]
fn non_utf8_settings_are_errors() {
    let garbage = OsStr::from_bytes(b"ho\xffst");
    for (k, key) in [vramscope::config::BACKEND_ENV, vramscope::config::CAPACITY_ENV].into_iter().enumerate() {
        // This binary runs this one test, so no other thread reads the environment meanwhile.
        std::env::set_var(key, garbage);
        let e = vramscope::try_device(100 + k).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains("not UTF-8"), "{e}");
        std::env::remove_var(key);
    }
    assert!(vramscope::try_device(102).is_ok(), "unset again, the defaults apply");
}
