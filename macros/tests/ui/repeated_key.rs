// A key given twice is an error at the second, not "the last one wins".
#[vramscope::gpu_mem_test(iters = 3, tolerance = "1 KiB", iters = 5)]
fn twice() {}

fn main() {}
