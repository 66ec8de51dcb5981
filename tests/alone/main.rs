//! Tests that need a process of their own: they set environment variables, hold CUPTI or the
//! device's memory for the whole process, or judge growth only where no other memory test
//! runs. Each test runs its body in a child process of this binary ([`in_child`]), so the
//! binary runs under the plain parallel test runner like any other.

use std::process::Command;

mod cuda_capacity;
mod env_vars;
mod ledger_gpu;
mod load_leaks;
mod mem_test_alone;
mod observe;
mod observe_busy;
mod observe_pause;
mod oom_processes;
mod oom_snapshot;

/// Set in a child to the test it runs.
const CHILD: &str = "VRAMSCOPE_TEST_ALONE";

/// Runs the test `name` of module `module` (its `module_path!()`) in a child process of this
/// binary, alone there, and checks that it passed: `true` in the parent, where the test is
/// then done; `false` in the child, which runs the test's body.
pub fn in_child(module: &str, name: &str) -> bool {
    // The harness names a test by its path without the crate's name.
    let path = match module.split_once("::") {
        Some((_, inner)) => format!("{inner}::{name}"),
        None => name.to_string(),
    };
    if std::env::var(CHILD).is_ok_and(|running| running == path) {
        return false;
    }
    let me = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(me)
        .args([path.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, &path)
        .output()
        .expect("the test binary starts again");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // What the child printed (a reason to skip, a report) is the test's own output.
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(out.status.success(), "{path}, run in a process of its own, failed");
    assert!(stdout.contains("1 passed"), "{path}: the child ran no test:\n{stdout}");
    true
}
