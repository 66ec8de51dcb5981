#[vramscope::gpu_mem_test(iters = 3, iterations = 5)]
fn t() {}

fn main() {}
