// An element type aligned to exactly the blocks' 512 bytes is allocated, and its slice is
// aligned. (Having a passing case also makes trybuild build rather than check, so that the
// alignment bound, checked when `alloc` is instantiated, shows in over_aligned_element.rs.)
use vramscope::{CachingAllocator, backend::HostBackend, Pod};

#[derive(Clone, Copy)]
#[repr(C, align(512))]
struct Line([u8; 512]);

// SAFETY: plain bytes, no padding.
unsafe impl Pod for Line {
    const DTYPE: &'static str = "line";
}

fn main() {
    let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    let s = alloc.default_stream();
    let _spacer = alloc.alloc::<u8>(&s, 1).unwrap();
    let b = alloc.alloc::<Line>(&s, 3).unwrap();
    let slice = b.as_host_slice().unwrap();
    assert_eq!(slice.as_ptr() as usize % 512, 0);
    assert_eq!(slice.len(), 3);
}

// Every unit the byte-size parser accepts works in a tolerance.
#[vramscope::gpu_mem_test(iters = 2, warmup = 1, tolerance = "1.5 kib")]
fn tolerance_in_any_case() {}

#[vramscope::gpu_mem_test(iters = 2, warmup = 1, tolerance = 4096)]
fn tolerance_as_a_number() {}
