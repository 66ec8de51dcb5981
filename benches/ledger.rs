//! What taking the ledger costs (`vramscope::ledger::take_from`) with 10,000 live observed
//! allocations from 100 distinct stacks, against NVML's answers recorded on an H200
//! (`fixtures/nvml/h200_probe.json`), symbol resolution for the sites included (warm: each
//! address is resolved once per allocator, as in a program that takes the ledger repeatedly).
//! The target is at most 1 ms. On a GPU, NVML's own call adds to it (`examples/ledger.rs`
//! prints each ledger's time there).
//!
//! `cargo bench --bench ledger`

use divan::{black_box, Bencher};
use vramscope::ledger::DriverReading;
use vramscope::CachingAllocator;

const DEVICE: usize = 7_301;

fn main() {
    divan::main();
}

/// The recorded answer of the step after PyTorch's first 1 GiB.
fn reading() -> DriverReading {
    let text = include_str!("../fixtures/nvml/h200_probe.json");
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    let step = &v["steps"][2];
    let d = &step["devices"][0];
    let processes = d["processes"]
        .as_array()
        .map(|ps| ps.iter().map(|p| (p["pid"].as_u64().unwrap() as u32, p["used"].as_u64())).collect());
    DriverReading::new(
        step["pid"].as_u64().unwrap() as u32,
        d["used"].as_u64().unwrap(),
        d["total"].as_u64().unwrap(),
        processes,
    )
}

/// Records `n` allocations from a stack `depth` frames deeper than the caller's.
#[inline(never)]
fn deep(seen: &CachingAllocator, depth: u32, n: u64, next: &mut u64) {
    if depth > 0 {
        deep(seen, depth - 1, n, next);
        black_box(depth);
        return;
    }
    for _ in 0..n {
        seen.record_external(0, *next, 4096).unwrap();
        *next += 1 << 16;
    }
}

fn observed(live: u64, stacks: u32) -> CachingAllocator {
    let seen = CachingAllocator::external(DEVICE, vramscope::backend::OBSERVED_BACKEND, 150 << 30);
    let mut next = 0x7f00_0000_0000u64;
    for s in 0..stacks {
        deep(&seen, s, live / u64::from(stacks), &mut next);
    }
    seen
}

#[divan::bench(args = [0, 10_000])]
fn take_from(bencher: Bencher, live: u64) {
    let seen = observed(live, 100);
    let r = reading();
    // The first call resolves every address; later calls find them cached.
    let first = vramscope::ledger::take_from(DEVICE, Ok(r.clone()), Some(&seen));
    assert_eq!(first.observed.as_ref().unwrap().iter().map(|o| o.allocations).sum::<u64>(), live);
    bencher.bench_local(|| vramscope::ledger::take_from(DEVICE, Ok(black_box(r.clone())), Some(&seen)));
}
