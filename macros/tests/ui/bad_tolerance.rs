// The tolerance text goes through vramscope's one byte-size parser, at compile time.
#[vramscope::gpu_mem_test(tolerance = "5 parsecs")]
fn unknown_unit() {}

#[vramscope::gpu_mem_test(tolerance = "99999999999 TiB")]
fn too_large() {}

fn main() {}
