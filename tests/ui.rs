//! Compile errors of `#[gpu_mem_test]`, pinned with trybuild.

#[test]
fn gpu_mem_test_errors() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
