//! Allocators that record memory the program allocated itself (`CachingAllocator::external`):
//! statistics, snapshots and memory tests over them, as over the caching allocator's blocks.

use std::sync::atomic::{AtomicU64, Ordering};
use vramscope::testing::MemTest;
use vramscope::CachingAllocator;

/// Addresses no other test uses.
fn next_addr() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x7000_0000_0000);
    NEXT.fetch_add(1 << 20, Ordering::Relaxed)
}

#[test]
fn recorded_allocations_are_counted_snapshotted_and_forgotten() {
    let seen = CachingAllocator::external(0, "framework", 80 << 30);
    let (a, b) = (next_addr(), next_addr());
    {
        let _s = vramscope::scope("load");
        seen.record_external(0, a, 1000).unwrap();
        seen.record_external(7, b, 3 << 20).unwrap();
    }
    assert_eq!(seen.memory_allocated(), 1024 + (3 << 20));
    assert_eq!(seen.stats().requested_bytes.all.current, 1000 + (3 << 20));
    let snap = seen.snapshot();
    assert_eq!(snap.backend, "framework");
    assert_eq!(snap.segments.len(), 2);
    assert!(snap.segments.iter().all(|s| s.source.as_deref() == Some("framework")), "marked as the program's");
    // PyTorch's format carries the mark too, and reads it back.
    let back = vramscope::Snapshot::from_pytorch_pickle(&snap.to_pytorch_pickle(), "seen.pickle").unwrap();
    assert!(back.segments.iter().all(|s| s.source.as_deref() == Some("framework")), "{:?}", back.segments);
    let live = vramscope::report::LiveGroup::render(&vramscope::report::live(&snap));
    assert!(live.contains("load"), "{live}");
    assert!(live.contains("tests/allocator/external.rs"), "the recording line is the site:\n{live}");
    seen.check_invariants().unwrap();
    // A size that cannot be rounded to the driver's 512 bytes is refused, and what was
    // recorded at that address stays.
    let e = seen.record_external(0, a, u64::MAX - 10).unwrap_err();
    assert!(
        matches!(e, vramscope::Error::InvalidRequest(vramscope::error::InvalidRequest::RoundingOverflow { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("cannot be rounded"), "{e}");
    assert_eq!(seen.stats().requested_bytes.all.current, 1000 + (3 << 20));
    // The same address again: its free was not seen; the old one is forgotten.
    seen.record_external(0, a, 2000).unwrap();
    assert_eq!(seen.stats().requested_bytes.all.current, 2000 + (3 << 20));
    assert!(seen.forget_external(a));
    assert!(seen.forget_external(b));
    assert!(!seen.forget_external(b), "forgotten once");
    // An unmapped range forgets every mapping that starts inside it, and nothing else.
    let base = next_addr();
    for i in 0..4 {
        seen.record_external(0, base + i * (2 << 20), 2 << 20).unwrap();
    }
    assert_eq!(seen.forget_external_range(base + (2 << 20), 4 << 20), 2);
    assert_eq!(seen.stats().requested_bytes.all.current, 4 << 20);
    assert_eq!(seen.forget_external_range(base + (2 << 20), 4 << 20), 0, "forgotten once");
    assert_eq!(seen.forget_external_range(base, 8 << 20), 2);
    seen.check_invariants().unwrap();
    assert_eq!((seen.memory_allocated(), seen.memory_reserved()), (0, 0));
    seen.check_invariants().unwrap();
    let e = seen.alloc::<u8>(seen.default_stream(), 10).unwrap_err();
    assert!(e.to_string().contains("records memory allocated elsewhere"), "{e}");
    // An allocator that serves memory refuses addresses it did not hand out.
    let own = CachingAllocator::new(vramscope::backend::SimBackend::new(1 << 30));
    let e = own.record_external(0, a, 512).unwrap_err();
    assert!(matches!(e, vramscope::Error::Usage(vramscope::error::UsageError::NotExternal { .. })), "{e}");
    assert!(!own.forget_external(a));
    assert_eq!(own.forget_external_range(a, 1 << 20), 0);
}

#[test]
fn a_memory_test_sees_recorded_allocations_that_leak() {
    let seen = CachingAllocator::external(0, "framework", 80 << 30);
    let line = line!() + 3;
    let v = MemTest::new("external::leaky").iters(3).check(|| {
        let addr = next_addr();
        seen.record_external(0, addr, 4096).unwrap(); // never forgotten
    });
    assert!(!v.passed, "{}", v.report);
    assert!(v.report.contains(&format!("tests/allocator/external.rs:{line}")), "names the line:\n{}", v.report);
    let v = MemTest::new("external::clean").iters(3).check(|| {
        let addr = next_addr();
        seen.record_external(0, addr, 4096).unwrap();
        assert!(seen.forget_external(addr));
    });
    assert!(v.passed, "{}", v.report);
}

#[test]
fn merged_evidence_marks_each_segment_with_its_allocator() {
    let seen = CachingAllocator::external(0, "framework", 80 << 30);
    let mine = CachingAllocator::new(vramscope::backend::HostBackend::new(1 << 30));
    let mut kept = Vec::new();
    let dir = std::env::temp_dir().join(format!("vramscope-external-{}", std::process::id()));
    let v = MemTest::new("external::both").iters(2).evidence_dir(&dir).check(|| {
        kept.push(mine.alloc::<u8>(mine.default_stream(), 1000).unwrap());
        seen.record_external(0, next_addr(), 2000).unwrap();
    });
    assert!(!v.passed);
    let snap = vramscope::Snapshot::load(dir.join("external__both").join("snapshot.json")).unwrap();
    let first = snap.backend.split('+').next().unwrap().to_string();
    // The segments holding the test's blocks (other tests of this binary have allocators too,
    // whose segments the evidence keeps, empty of the test's blocks).
    let sources: std::collections::BTreeSet<String> = snap
        .segments
        .iter()
        .filter(|s| s.blocks.iter().any(|b| b.state == vramscope::snapshot::BlockState::ActiveAllocated))
        .map(|s| s.source.clone().unwrap_or_else(|| first.clone()))
        .collect();
    assert_eq!(sources, ["framework".to_string(), "host".to_string()].into(), "{}", snap.backend);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ledger counts an allocator of recorded allocations by owner and by the program's line
/// (as it counts the observer's), and not again among vramscope's allocators.
#[test]
fn the_ledger_names_the_lines_of_recorded_allocations() {
    let device = 7_101;
    let seen = CachingAllocator::external(device, vramscope::backend::OBSERVED_BACKEND, 80 << 30);
    let first = line!() + 3;
    let record = |bytes: u64, twice: bool| {
        let a = next_addr();
        seen.record_external(0, a, bytes).unwrap();
        if twice {
            let b = next_addr();
            seen.record_external(0, b, bytes).unwrap(); // the second line
        }
    };
    record(1 << 20, true);
    let ledger = vramscope::ledger::take_from(device, Err("no GPU here".into()), Some(&seen));
    assert!(ledger.allocators.is_empty(), "counted once, by owner: {:?}", ledger.allocators);
    let owners = ledger.observed.as_ref().expect("observed");
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].owner, vramscope::ledger::PROGRAM);
    assert_eq!((owners[0].bytes, owners[0].allocations), (2 << 20, 2));
    let sites: Vec<&str> = owners[0].sites.iter().map(|s| s.site.as_str()).collect();
    assert_eq!(sites.len(), 2, "{sites:?}");
    let file = "tests/allocator/external.rs";
    for line in [first, first + 3] {
        assert!(sites.iter().any(|s| s.contains(&format!("{file}:{line}"))), "line {line} in {sites:?}");
    }
    assert_eq!(ledger.bytes(), 2 << 20, "no driver total: the parts");
    assert_eq!(ledger.not_explained(), None);
    assert!(ledger.unseen.iter().any(|u| u == "no GPU here"), "{:?}", ledger.unseen);
    let text = ledger.to_text();
    assert!(text.contains("observed: the program's lines") && text.contains("not seen: no GPU here"), "{text}");
}
