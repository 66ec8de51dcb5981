//! Bad input of every kind gets an error, never a panic, a hang or unbounded memory: random and
//! mutated bytes for the pickle and JSON readers (a bounded fuzzing run in the test suite, seeded
//! with the fixtures), hostile values, and the config parser.

use proptest::prelude::*;
use vramscope::replay::{replay, ReplayOptions, Trace};
use vramscope::report::{self, FoldedKind};
use vramscope::{backend::SimBackend, config::AllocatorConfig, CachingAllocator, Snapshot};

fn fixture_bytes(name: &str) -> &'static [u8] {
    use std::sync::OnceLock;
    static LEAKY: OnceLock<Vec<u8>> = OnceLock::new();
    static JSON: OnceLock<Vec<u8>> = OnceLock::new();
    let root = env!("CARGO_MANIFEST_DIR");
    match name {
        "pickle" => {
            LEAKY.get_or_init(|| std::fs::read(format!("{root}/fixtures/torch/leaky_train.snapshot.pickle")).unwrap())
        }
        _ => JSON.get_or_init(|| {
            Snapshot::load(format!("{root}/fixtures/torch/leaky_train.snapshot.pickle")).unwrap().to_json().into_bytes()
        }),
    }
}

/// Everything a user could run on a snapshot that loaded.
fn exercise(snap: &Snapshot) {
    let _ = report::live(snap);
    let _ = report::leaks(snap);
    let _ = report::segments(snap);
    let _ = report::summary(snap);
    let _ = report::diff(snap, snap);
    let folded = report::folded(snap, FoldedKind::Live);
    #[cfg(feature = "flamegraph")]
    let _ = report::flamegraph(&folded, "t");
    #[cfg(not(feature = "flamegraph"))]
    drop(folded);
    let _ = report::folded(snap, FoldedKind::Allocated);
    let _ = snap.to_json();
    let _ = snap.to_pytorch_pickle();
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
}

fn mutate(data: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut d = data.to_vec();
    for m in muts {
        let n = d.len().max(1);
        match m {
            Mutation::Flip(i, x) => {
                let i = i % n;
                if let Some(b) = d.get_mut(i) {
                    *b ^= x | 1;
                }
            }
            Mutation::Truncate(i) => d.truncate(i % n),
            Mutation::Insert(i, bytes) => {
                let i = i % n;
                d.splice(i.min(d.len())..i.min(d.len()), bytes.iter().copied());
            }
            Mutation::Delete(i, len) => {
                let i = (i % n).min(d.len());
                let end = (i + len % 64).min(d.len());
                d.drain(i..end);
            }
        }
    }
    d
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, x)| Mutation::Flip(i, x)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(i, l)| Mutation::Delete(i, l)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_are_errors(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(s) = Snapshot::from_bytes(&bytes, "random") { exercise(&s) }
        let _ = Trace::from_bytes(&bytes, "random");
        let mut with_header = vec![0x80, 4];
        with_header.extend(&bytes);
        if let Ok(s) = Snapshot::from_bytes(&with_header, "random") { exercise(&s) }
        let _ = Trace::from_bytes(&with_header, "random");
    }

    #[test]
    fn mutated_pytorch_pickles_are_errors_or_snapshots(muts in prop::collection::vec(mutation(), 1..6)) {
        let data = mutate(fixture_bytes("pickle"), &muts);
        if let Ok(s) = Snapshot::from_bytes(&data, "mutated") { exercise(&s) }
        let _ = Trace::from_bytes(&data, "mutated");
    }

    #[test]
    fn mutated_json_snapshots_are_errors_or_snapshots(muts in prop::collection::vec(mutation(), 1..6)) {
        let data = mutate(fixture_bytes("json"), &muts);
        if let Ok(s) = Snapshot::from_bytes(&data, "mutated") { exercise(&s) }
    }

    #[test]
    fn config_strings_never_panic(s in "\\PC{0,60}", key in prop::sample::select(vec![
        "max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold", "fragmentation_limit", "release_pages",
        "max_non_split_rounding_mb", "per_process_memory_fraction",
    ]), value in "\\PC{0,12}") {
        let _ = AllocatorConfig::parse(&s);
        let _ = AllocatorConfig::parse(&format!("{key}:{value}"));
        let _ = AllocatorConfig::parse(&format!("max_split_size_mb:64,{key}:{value}"));
    }
}

#[test]
fn hostile_values_are_errors() {
    // Sizes near u64::MAX, negative numbers, missing fields.
    let huge = format!(r#"{{"events":[["a",1,{},0]]}}"#, u64::MAX - 3);
    let trace = Trace::from_bytes(huge.as_bytes(), "huge").unwrap();
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let e = replay(&alloc, &trace, &ReplayOptions::default()).unwrap_err();
    assert!(e.to_string().contains("out of memory") || e.to_string().contains("invalid request"), "{e}");
    alloc.check_invariants().unwrap();
    assert!(Trace::from_bytes(br#"{"events":[["a",-1,5,0]]}"#, "neg").is_err());
    // A pickle whose integers are negative or need more than 64 bits.
    // pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": -1, "size": 5, "stream": 0}]]}, protocol=4)
    let neg = b"\x80\x04\x95\x5d\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\x94\x5d\x94\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x7d\x94\x28\x8c\x06\x61\x63\x74\x69\x6f\x6e\x94\x8c\x05\x61\x6c\x6c\x6f\x63\x94\x8c\x04\x61\x64\x64\x72\x94\x4a\xff\xff\xff\xff\x8c\x04\x73\x69\x7a\x65\x94\x4b\x05\x8c\x06\x73\x74\x72\x65\x61\x6d\x94\x4b\x00\x75\x61\x61\x75\x2e";
    let e = Trace::from_bytes(neg, "neg.pickle").unwrap_err().to_string();
    assert!(e.contains("non-negative"), "{e}");
    let big = b"\x80\x04\x8a\x11\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01.";
    assert!(Snapshot::from_bytes(big, "big").unwrap_err().to_string().contains("128 bits"));
    // A string claiming four gigabytes in a short file is refused before any allocation.
    let claim = b"\x80\x04X\xff\xff\xff\xff";
    assert!(Snapshot::from_bytes(claim, "claim").unwrap_err().to_string().contains("runs past"));
    // Deeply nested JSON hits serde_json's recursion limit.
    let deep = format!("{{\"events\":{}", "[".repeat(100_000));
    assert!(Trace::from_bytes(deep.as_bytes(), "deep").unwrap_err().to_string().contains("not a JSON trace"));
    let deep_obj = format!("{{\"segments\":{}", "[".repeat(100_000));
    assert!(Snapshot::from_bytes(deep_obj.as_bytes(), "deep").is_err());
    // Indices that point nowhere and times that run backwards: reports still work.
    let mut snap: Snapshot = serde_json::from_slice(fixture_bytes("json")).unwrap();
    for seg in &mut snap.segments {
        seg.total_size = 0;
        for b in &mut seg.blocks {
            if let Some(c) = b.context.as_mut() {
                c.stack = Some(vramscope::snapshot::StackId(u32::MAX));
                c.scope = vramscope::snapshot::ScopeId(1_000_000);
            }
        }
    }
    for (i, e) in snap.history.iter_mut().enumerate() {
        e.time_ns = u64::MAX - i as u64;
    }
    exercise(&snap);
}

/// A snapshot from a newer format is an error naming both versions, not a silent partial read.
#[test]
fn a_newer_snapshot_version_is_an_error() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let keep = alloc.alloc::<u8>(&alloc.default_stream(), 100).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&alloc.snapshot().to_json()).unwrap();
    v["version"] = 99999.into();
    let e = vramscope::Snapshot::from_bytes(v.to_string().as_bytes(), "future.json").unwrap_err().to_string();
    let up_to = format!("up to {}", vramscope::snapshot::SNAPSHOT_VERSION);
    assert!(e.contains("future.json") && e.contains("version 99999") && e.contains(&up_to), "{e}");
    drop(keep);
}

/// Sizes past the end of the address space are refused; the largest consistent ones are summed
/// exactly in every report, without wrapping (or panicking with overflow checks).
#[test]
fn huge_sizes_are_refused_or_summed_exactly() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let s = alloc.default_stream();
    let keep = [alloc.alloc::<u8>(&s, 100).unwrap(), alloc.alloc::<u8>(&s, 100).unwrap()];
    let mut v: serde_json::Value = serde_json::from_str(&alloc.snapshot().to_json()).unwrap();
    for seg in v["segments"].as_array_mut().unwrap() {
        seg["total_size"] = (u64::MAX - 7).into();
        for b in seg["blocks"].as_array_mut().unwrap() {
            b["size"] = (u64::MAX - 10).into();
        }
    }
    // Sizes that run past the end of the address space are an inconsistency, named.
    let e = Snapshot::from_bytes(v.to_string().as_bytes(), "huge.json").unwrap_err().to_string();
    assert!(e.contains("segments[0]: address 0x") && e.contains("overflows 64 bits"), "{e}");
    // The largest consistent sizes: one segment over the whole address space but its last
    // byte, two blocks of half of it each. Every report adds them without wrapping.
    let half = u64::MAX / 2;
    for seg in v["segments"].as_array_mut().unwrap() {
        seg["address"] = 0.into();
        seg["total_size"] = u64::MAX.into();
        seg["mapped_size"] = u64::MAX.into();
        seg["blocks"].as_array_mut().unwrap().truncate(2);
        for (i, b) in seg["blocks"].as_array_mut().unwrap().iter_mut().enumerate() {
            b["address"] = (i as u64 * half).into();
            b["size"] = half.into();
            b["requested_size"] = half.into();
        }
    }
    v["segments"].as_array_mut().unwrap().truncate(1);
    let snap = Snapshot::from_bytes(v.to_string().as_bytes(), "huge.json").unwrap();
    let live = report::live(&snap);
    let total: u64 = snap.live_blocks().map(|b| b.size).sum();
    assert_eq!(total, u64::MAX - 1, "the test's own sum");
    assert_eq!(live.iter().map(|g| g.bytes).max(), Some(total), "both blocks, summed exactly");
    assert!(report::LiveGroup::render(&live).starts_with("16384.00 PiB"), "{}", report::LiveGroup::render(&live));
    let _ = report::segments(&snap);
    let _ = report::diff(&snap, &snap);
    let _ = report::leaks(&snap);
    let folded = report::folded(&snap, FoldedKind::Live);
    assert!(folded.contains(&total.to_string()) || folded.contains(&half.to_string()), "{folded}");
    drop(keep);
}

#[path = "../common/hostile.rs"]
mod hostile;

/// Pickle bombs: shared references that expand a small file to hundreds of millions of blocks
/// are refused quickly, naming where; a shared frame list is read once, however often it is
/// referenced, so that 20,000 events sharing a stack of 20,000 frames load at once; a reference
/// cycle is refused.
#[test]
fn pickle_bombs_and_cycles_are_refused() {
    let data = hostile::block_bomb(20_000);
    assert!(data.len() < 300_000, "{} bytes", data.len());
    let started = std::time::Instant::now();
    let e = Snapshot::from_bytes(&data, "blocks").unwrap_err().to_string();
    assert!(e.contains("expands to more than"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    let data = hostile::frame_bomb(20_000);
    assert!(data.len() < 300_000, "{} bytes", data.len());
    let started = std::time::Instant::now();
    let snap = Snapshot::from_bytes(&data, "frames").unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!((snap.history.len(), snap.stacks.len(), snap.frames.len()), (20_000, 1, 1));
    assert_eq!(snap.stacks[0].len(), 20_000);
    // The same shapes at a size real snapshots have load.
    // (A blocks list naming one block many times is within the budget at this size, but its
    // blocks overlap: an inconsistency, named.)
    let e = Snapshot::from_bytes(&hostile::block_bomb(100), "small").unwrap_err().to_string();
    assert!(e.contains("segments[0].blocks[1]: block at 0x0 overlaps the block before it"), "{e}");
    let snap = Snapshot::from_bytes(&hostile::frame_bomb(100), "small").unwrap();
    assert_eq!(snap.history.len(), 100);
    let e = Snapshot::from_bytes(&hostile::cycle(), "cycle").unwrap_err().to_string();
    assert!(e.contains("reference cycle"), "{e}");
    // A cycle nothing the pickle ends with reaches is refused too (and freed: load_leaks.rs).
    let e = Snapshot::from_bytes(&hostile::unreachable_cycle(), "cycle").unwrap_err().to_string();
    assert!(e.contains("reference cycle"), "{e}");
}

/// A file can name one long stack and one long scope path from every block; the reports work
/// each out once, so that they stay linear in the file's size (100,000 blocks sharing a stack
/// of 10,000 library frames took a billion steps when each block walked its stack).
#[test]
fn reports_stay_linear_when_blocks_share_a_long_stack() {
    let (blocks, depth) = (100_000u64, 10_000u64);
    let frames: Vec<_> = (0..depth)
        .map(|i| serde_json::json!({"function": format!("f{i}"), "file": "/x/site-packages/lib.py", "line": i}))
        .collect();
    let ctx = serde_json::json!({"stack": 0, "scope": 1, "thread": 0, "step": 0});
    let block_list: Vec<_> = (0..blocks)
        .map(|i| {
            serde_json::json!({"address": i * 512, "size": 512, "requested_size": 512,
                               "state": "active_allocated", "context": ctx})
        })
        .collect();
    let snap = serde_json::json!({
        "version": 1, "device": 0, "backend": "sim",
        "segments": [{"address": 0, "total_size": blocks * 512, "mapped_size": blocks * 512, "stream": 0,
                      "pool": "large", "allocated_size": blocks * 512, "active_size": blocks * 512,
                      "requested_size": blocks * 512, "blocks": block_list}],
        "history": [], "history_dropped": 0,
        "frames": frames, "stacks": [(0..depth).collect::<Vec<_>>()],
        "scopes": [[], (0..depth).map(|i| format!("scope{i}")).collect::<Vec<_>>()],
        "threads": ["main"], "stats": {}
    });
    let snap = Snapshot::from_bytes(snap.to_string().as_bytes(), "long-stack.json").unwrap();
    let started = std::time::Instant::now();
    let live = report::live(&snap);
    assert_eq!((live.len(), live[0].count, live[0].site.as_str()), (1, blocks, "<no stack>"));
    let _ = report::leaks(&snap);
    let _ = report::diff(&snap, &snap);
    let _ = report::segments(&snap);
    assert_eq!(report::folded(&snap, FoldedKind::Live).lines().count(), 1);
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
}

/// Every way of reading a snapshot validates it, serde's `Deserialize` included: a consistent
/// file reads, an inconsistent one is refused with the place and the rule, never handed out.
#[test]
fn deserializing_a_snapshot_validates_it() {
    let dir = format!("{}/fixtures/hostile", env!("CARGO_MANIFEST_DIR"));
    let good = std::fs::read_to_string(format!("{dir}/consistent.json")).unwrap();
    let snap: Snapshot = serde_json::from_str(&good).expect("a consistent snapshot reads");
    assert_eq!(serde_json::from_str::<Snapshot>(&snap.to_json()).unwrap(), snap);
    let bad = std::fs::read_to_string(format!("{dir}/overlapping_blocks.json")).unwrap();
    let e = serde_json::from_str::<Snapshot>(&bad).unwrap_err().to_string();
    assert!(e.contains("segments[0].blocks[1]") && e.contains("overlaps"), "{e}");
    let e = Snapshot::from_bytes(bad.as_bytes(), "overlapping_blocks.json").unwrap_err().to_string();
    assert!(e.starts_with("overlapping_blocks.json: inconsistent snapshot: segments[0].blocks[1]"), "{e}");
}
