//! Export benchmarks: flamegraph and JSON of a snapshot of 1,000,000 live blocks over 10,000
//! distinct stacks, and reading a PyTorch pickle of about 100 MB.
//!
//! `cargo bench --features flamegraph --bench export`

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
    synthetic_with_history(blocks, stacks, 0)
}

/// As [`synthetic`], with a history of `steps` training steps before the snapshot: each step
/// allocates and frees 100 temporaries of 1 MiB from the stacks in turn and keeps one 4 KiB
/// block (a leak), so that the leak finder has 201 events a step to replay.
fn synthetic_with_history(blocks: usize, stacks: usize, steps: usize) -> Snapshot {
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
    let mut history = Vec::new();
    let event = |action: &str, addr: u64, size: u64, stack: usize, t: usize| {
        serde_json::json!({"action": action, "addr": addr, "size": size, "stream": 0, "time_ns": t as u64 * 1000,
            "context": {"stack": (stack % stacks) as u32, "scope": 0, "thread": 0, "step": 0}})
    };
    for step in 0..steps {
        let t = step * 201;
        for k in 0..100 {
            history.push(event("alloc", 0x10_0000_0000 + (k as u64) * (1 << 20), 1 << 20, k, t + k));
        }
        for k in 0..100 {
            history.push(event("free_completed", 0x10_0000_0000 + (k as u64) * (1 << 20), 1 << 20, k, t + 100 + k));
        }
        history.push(event("alloc", 0x20_0000_0000 + (step as u64) * 4096, 4096, stacks - 1, t + 200));
    }
    let doc = serde_json::json!({"version": 1, "device": 0, "backend": "synthetic", "segments": segments, "history": history,
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
    let bytes = pickle_100mb();
    bencher.bench(|| black_box(Snapshot::from_pytorch_pickle(bytes, "bench").unwrap().segments.len()));
}

/// `vramscope leaks` on the pickle above: reading it and finding leaks (it has no history, so
/// this is the reading plus the finder's setup).
#[divan::bench(sample_count = 3, sample_size = 1)]
fn leaks_pytorch_pickle_100mb(bencher: Bencher) {
    let bytes = pickle_100mb();
    bencher.bench(|| {
        let snap = Snapshot::from_pytorch_pickle(bytes, "bench").unwrap();
        black_box(report::leaks(&snap).len())
    });
}

/// `vramscope leaks` on a pickle of about the same size with a history: 10,000 live blocks
/// and 350 steps of 100 temporaries and one leaked block (70,350 trace entries).
#[divan::bench(sample_count = 3, sample_size = 1)]
fn leaks_pytorch_pickle_with_history(bencher: Bencher) {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    let bytes = P.get_or_init(|| {
        let p = synthetic_with_history(10_000, 10_000, 350).to_pytorch_pickle();
        eprintln!("pickle with history: {} bytes", p.len());
        dump("with_history.pickle", &p);
        p
    });
    bencher.bench(|| {
        let snap = Snapshot::from_pytorch_pickle(bytes, "bench").unwrap();
        let found = report::leaks(&snap);
        assert_eq!(found.len(), 1, "the one leaking line");
        black_box(found.len())
    });
}

/// The pickle of 110,000 live blocks with 12-frame stacks (about 99 MB).
fn pickle_100mb() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| {
        let p = synthetic(110_000, 10_000).to_pytorch_pickle();
        eprintln!("pickle of {} bytes", p.len());
        dump("100mb.pickle", &p);
        p
    })
}

/// Writes a benchmark's input under `$VRAMSCOPE_BENCH_DUMP` (a folder) when it is set, for
/// timing the command line on the same files.
fn dump(name: &str, bytes: &[u8]) {
    if let Some(dir) = std::env::var_os("VRAMSCOPE_BENCH_DUMP") {
        let path = std::path::Path::new(&dir).join(name);
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}
