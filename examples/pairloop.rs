//! Times cached alloc+free pairs on the simulated backend in a tight loop (no harness):
//! `cargo run --release --example pairloop [pairs] [size,size,...]`.
use std::time::Instant;
use vramscope::{CachingAllocator, SimBackend};
fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5_000_000);
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let sizes: Vec<usize> = match std::env::args().nth(2) {
        Some(a) => a.split(',').filter_map(|x| x.parse().ok()).collect(),
        None => vec![512, 1 << 20, 64 << 20],
    };
    for bytes in sizes {
        drop(alloc.alloc::<u8>(&s, bytes).unwrap());
        let t = Instant::now();
        for _ in 0..n {
            let b = alloc.alloc::<u8>(&s, std::hint::black_box(bytes)).unwrap();
            drop(std::hint::black_box(b));
        }
        println!("{bytes}: {:.1} ns/pair", t.elapsed().as_nanos() as f64 / n as f64);
    }
}
