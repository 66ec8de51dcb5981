#[vramscope::gpu_mem_test(iters = 0, tolerance = 1.5, metric = "speed", backend = "tpu", snapshot = "yes", warmup = -1)]
fn t() {}

fn main() {}
