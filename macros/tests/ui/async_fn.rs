#[vramscope::gpu_mem_test]
async fn t() {}

fn main() {}
