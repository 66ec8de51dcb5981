#[vramscope::gpu_mem_test(5)]
fn t() {}

#[vramscope::gpu_mem_test]
fn with_args(x: u32) {}

fn main() {}
