// Releasing a segment is `unsafe`: the caller promises that nothing uses it any more (a
// buffer of an allocator could still point into it).
use vramscope::{backend::Backend, backend::HostBackend};

fn main() {
    let host = HostBackend::new(1 << 30);
    let addr = host.reserve(2 << 20).unwrap();
    host.release(addr, 2 << 20).unwrap();
}
