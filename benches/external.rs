//! What recording an allocation made elsewhere costs, without CUPTI or a GPU: the part of the
//! observer's cost that is vramscope's (`CachingAllocator::record_external` + `forget_external`
//! with the observer's recording: 64-frame stacks, scopes, history), from one call site and
//! from 1,000 distinct call stacks (25 functions reached through 1 to 40 recursive calls, as
//! `benches/observe.rs` does on the GPU host).
//!
//! `cargo bench --bench external` (frame pointers: the project's build);
//! `RUSTFLAGS= CARGO_TARGET_DIR=target/nofp cargo bench --bench external` (as users build).

use divan::{black_box, Bencher};
use std::sync::OnceLock;
use vramscope::record::RecordConfig;
use vramscope::CachingAllocator;

fn main() {
    divan::main();
}

/// One allocator recording as the observer does.
fn seen() -> &'static CachingAllocator {
    static SEEN: OnceLock<CachingAllocator> = OnceLock::new();
    SEEN.get_or_init(|| {
        let a = CachingAllocator::external(0, "bench (observed)", 80 << 30);
        let mut config = RecordConfig::default();
        config.max_depth = 64;
        a.record_memory_history(config);
        a
    })
}

#[inline(never)]
fn pair(bytes: u64) {
    let a = seen();
    a.record_external(0, 0x7000_0000_0000, black_box(bytes)).unwrap();
    a.forget_external(0x7000_0000_0000);
}

macro_rules! leaves {
    ($($name:ident $extra:literal)*) => {
        $(
            #[inline(never)]
            fn $name() {
                pair(black_box(512 + $extra));
            }
        )*
        const LEAVES: &[fn()] = &[$($name),*];
    };
}
leaves!(l0 0 l1 1 l2 2 l3 3 l4 4 l5 5 l6 6 l7 7 l8 8 l9 9 l10 10 l11 11 l12 12 l13 13 l14 14 l15 15 l16 16
    l17 17 l18 18 l19 19 l20 20 l21 21 l22 22 l23 23 l24 24);

/// `depth` frames of recursion, then the leaf.
#[inline(never)]
fn down(depth: usize, leaf: fn()) {
    if depth == 0 {
        leaf();
    } else {
        down(black_box(depth - 1), leaf);
    }
    // Neither call is a tail call: each level keeps its frame.
    black_box(depth);
}

/// Recorded from one site.
#[divan::bench(sample_count = 100, sample_size = 1000)]
fn one_site(bencher: Bencher) {
    bencher.bench_local(|| pair(black_box(512)));
}

/// Recorded from 1,000 distinct stacks.
#[divan::bench(sample_count = 100, sample_size = 1000)]
fn stacks_1000(bencher: Bencher) {
    let mut i = 0usize;
    bencher.bench_local(|| {
        down(1 + (i / LEAVES.len()) % 40, LEAVES[i % LEAVES.len()]);
        i = (i + 1) % 1000;
    });
}
