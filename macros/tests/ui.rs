//! Compile errors, pinned with trybuild: `#[gpu_mem_test]`'s, an over-aligned element type, and
//! releasing backend memory outside `unsafe`.

#[test]
fn compile_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
