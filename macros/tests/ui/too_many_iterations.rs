#[vramscope::gpu_mem_test(iters = 1000000000000)]
fn huge() {}

#[vramscope::gpu_mem_test(iters = 600000, warmup = 500000)]
fn together() {}

#[vramscope::gpu_mem_test(iters = 0)]
fn none() {}

fn main() {}
