// A test named with a raw identifier expands (its tolerance constant uses the bare name).
#[vramscope::gpu_mem_test(iters = 2, backend = "host")]
fn r#match() {
    let alloc = vramscope::device(0);
    drop(alloc.alloc::<u8>(alloc.default_stream(), 64).unwrap());
}

fn main() {}
