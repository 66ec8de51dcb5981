//! Export benchmarks: flamegraph and JSON of a snapshot of 1,000,000 live blocks over 10,000
//! distinct stacks, and reading a PyTorch pickle of about 100 MB.
//!
//! `cargo bench --bench export`

use divan::{black_box, Bencher};
use std::sync::OnceLock;
use vramscope::report::{self, FoldedKind};
use vramscope::Snapshot;

fn main() {
    divan::main();
}

/// A snapshot of `blocks` live blocks spread over `stacks` distinct stacks of 12 frames drawn
/// from 2,000 functions, in 64 MiB segments, built through the JSON form (the model is
/// non-exhaustive outside the crate).
fn synthetic(blocks: usize, stacks: usize) -> Snapshot {
    let frames: Vec<serde_json::Value> = (0..2000)
        .map(|i| serde_json::json!({"function": format!("model::layer{}::op{}", i / 40, i % 40), "file": format!("src/layer{}.rs", i / 40), "line": 10 + i % 400}))
        .collect();
    let stack_list: Vec<Vec<u32>> =
        (0..stacks).map(|s| (0..12).map(|d| ((s * 7919 + d * 104_729) % 2000) as u32).collect()).collect();
    let per_segment = 256;
    let segments: Vec<serde_json::Value> = (0..blocks.div_ceil(per_segment))
        .map(|g| {
            let base = 0x7f00_0000_0000u64 + (g as u64) * (64 << 20);
            let n = per_segment.min(blocks - g * per_segment);
            let bl: Vec<serde_json::Value> = (0..n)
                .map(|k| {
                    let i = g * per_segment + k;
                    serde_json::json!({"address": base + (k as u64) * (256 << 10), "size": 256u64 << 10, "requested_size": 250_000,
                        "state": "active_allocated", "context": {"stack": (i % stacks) as u32, "scope": 0, "thread": 0, "step": i / 10_000}})
                })
                .collect();
            serde_json::json!({"address": base, "total_size": 64u64 << 20, "mapped_size": 64u64 << 20, "stream": 0, "pool": "large",
                "allocated_size": (n as u64) * (256 << 10), "active_size": (n as u64) * (256 << 10), "requested_size": (n as u64) * 250_000, "blocks": bl})
        })
        .collect();
    let doc = serde_json::json!({"version": 1, "device": 0, "backend": "synthetic", "segments": segments, "history": [],
        "history_dropped": 0, "frames": frames, "stacks": stack_list, "scopes": [[]], "threads": ["main"], "stats": {}});
    serde_json::from_value(doc).expect("a valid snapshot")
}

fn million() -> &'static Snapshot {
    static S: OnceLock<Snapshot> = OnceLock::new();
    S.get_or_init(|| synthetic(1_000_000, 10_000))
}

#[divan::bench(sample_count = 3, sample_size = 1)]
fn flamegraph_1m_live_blocks(bencher: Bencher) {
    let snap = million();
    bencher.bench(|| {
        let folded = report::folded(snap, FoldedKind::Live);
        black_box(report::flamegraph(&folded, "live").unwrap().len())
    });
}

#[divan::bench(sample_count = 3, sample_size = 1)]
fn json_1m_live_blocks(bencher: Bencher) {
    let snap = million();
    bencher.bench(|| black_box(snap.to_json().len()));
}

#[divan::bench(sample_count = 3, sample_size = 1)]
fn read_pytorch_pickle_100mb(bencher: Bencher) {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    let bytes = P.get_or_init(|| {
        let p = synthetic(110_000, 10_000).to_pytorch_pickle();
        eprintln!("pickle of {} bytes", p.len());
        p
    });
    bencher.bench(|| black_box(Snapshot::from_pytorch_pickle(bytes, "bench").unwrap().segments.len()));
}
