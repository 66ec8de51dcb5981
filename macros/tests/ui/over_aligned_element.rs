// A `Pod` type aligned to more than the blocks' 512 bytes cannot be allocated: the slice the
// buffer gives would be misaligned.
use vramscope::{CachingAllocator, backend::HostBackend, Pod};

#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u8; 4096]);

// SAFETY: plain bytes, no padding.
unsafe impl Pod for Page {
    const DTYPE: &'static str = "page";
}

fn main() {
    let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    let _ = alloc.alloc::<Page>(&alloc.default_stream(), 1);
}
