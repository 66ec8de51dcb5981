//! Golden tests of every report on the PyTorch fixtures, and the reports' properties.

use vramscope::report::{self, FoldedKind};
use vramscope::{CachingAllocator, RecordConfig, SimBackend, Snapshot, StackMode};

fn fixture(name: &str) -> Snapshot {
    Snapshot::load(format!("{}/fixtures/torch/{name}.snapshot.pickle", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn leaky_train_leaks_name_lines_76_72_and_71_but_not_67() {
    let snap = fixture("leaky_train");
    let leaks = report::leaks(&snap);
    let lines: Vec<u32> = leaks.iter().filter_map(|l| l.frame.line).collect();
    assert_eq!(lines, [76, 71, 72], "largest growth first");
    assert!(leaks.iter().all(|l| l.frame.file.as_deref() == Some("scripts/train_loops.py")));
    assert!(leaks.iter().all(|l| l.frame.function == "leaky_train"));
    insta::assert_snapshot!("leaky_train_leaks", report::LeakCandidate::render(&leaks));
}

#[test]
fn a_steady_program_has_no_leak_candidates() {
    assert!(report::leaks(&fixture("resnet_train")).is_empty());
}

#[test]
fn golden_reports_of_leaky_train() {
    let snap = fixture("leaky_train");
    insta::assert_snapshot!("leaky_train_live", report::LiveGroup::render(&report::live(&snap)));
    insta::assert_snapshot!("leaky_train_summary", report::summary(&snap));
    insta::assert_snapshot!("leaky_train_segments", report::segments(&snap));
    insta::assert_snapshot!("leaky_train_folded", report::folded(&snap, FoldedKind::Live));
}

#[test]
fn golden_reports_of_resnet_train() {
    let snap = fixture("resnet_train");
    insta::assert_snapshot!("resnet_train_live", report::LiveGroup::render(&report::live(&snap)));
    insta::assert_snapshot!("resnet_train_summary", report::summary(&snap));
}

#[test]
fn diff_of_two_points_of_a_leaky_run() {
    // Before: the leaky run with its leaking sites' blocks dropped.
    let after = fixture("leaky_train");
    let mut before = after.clone();
    for seg in &mut before.segments {
        seg.blocks.retain(|b| {
            let line = b.context.and_then(|c| c.stack).and_then(|s| {
                after.stack_frames(s).find(|f| f.file.as_deref() == Some("scripts/train_loops.py")).and_then(|f| f.line)
            });
            !matches!(line, Some(71 | 76))
        });
    }
    let d = report::diff(&before, &after);
    insta::assert_snapshot!("leaky_train_diff", report::SiteDelta::render(&d));
    assert_eq!(d.iter().map(|x| x.change).collect::<Vec<_>>(), ["new", "new"]);
    assert!(report::diff(&after, &after).is_empty());
}

#[test]
fn pytorch_snapshots_round_trip_through_json() {
    for name in ["leaky_train", "resnet_train"] {
        let snap = fixture(name);
        let back = Snapshot::from_bytes(snap.to_json().as_bytes(), "json").unwrap();
        assert_eq!(back, snap, "{name}");
        assert!(!snap.history.is_empty());
    }
}

#[test]
fn flamegraphs_are_deterministic_and_name_the_sites() {
    let snap = fixture("leaky_train");
    let folded = report::folded(&snap, FoldedKind::Live);
    let a = report::flamegraph(&folded, "live").unwrap();
    let b = report::flamegraph(&folded, "live").unwrap();
    assert_eq!(a, b);
    assert!(a.starts_with("<?xml") && a.contains("train_loops.py:76"));
    let churn = report::folded(&snap, FoldedKind::Allocated);
    assert!(report::flamegraph(&churn, "allocated").unwrap().contains("svg"));
    let diff = report::differential_flamegraph(&churn, &folded, "diff").unwrap();
    assert!(diff.contains("svg"));
    let e = report::flamegraph("", "empty").unwrap_err().to_string();
    assert!(e.contains("nothing to draw"), "{e}");
}

#[test]
fn own_snapshots_report_scopes_and_tensors_deterministically() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let mut rec = RecordConfig::default();
    rec.stacks = StackMode::Off;
    alloc.record_memory_history(rec);
    let s = alloc.default_stream();
    let _model = vramscope::scope("model");
    let weights: Vec<_> =
        (0..3).map(|_| alloc.alloc::<f32>(&s, 1024 * 1024).unwrap().with_shape(&[1024, 1024]).unwrap()).collect();
    let act = {
        let _fwd = vramscope::scope("forward");
        alloc.alloc::<u16>(&s, 4096).unwrap().with_tensor_meta("bfloat16", &[64, 64]).unwrap()
    };
    let text = report::LiveGroup::render(&report::live(&alloc.snapshot()));
    insta::assert_snapshot!("own_snapshot_live", text);
    drop((weights, act));
}

#[test]
fn pickles_written_for_pytorch_read_back_the_same() {
    for name in ["leaky_train", "resnet_train"] {
        let snap = fixture(name);
        let again = Snapshot::from_pytorch_pickle(&snap.to_pytorch_pickle(), "written").unwrap();
        assert_eq!(again.segments, snap.segments, "{name}");
        assert_eq!(again.frames, snap.frames, "{name}");
        assert_eq!(again.stacks, snap.stacks, "{name}");
        assert_eq!(again.history.len(), snap.history.len(), "{name}");
        assert_eq!(report::leaks(&again), report::leaks(&snap), "{name}");
    }
}

#[test]
fn own_pickles_carry_scopes_as_frames() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let _outer = vramscope::scope("outer");
    let x = alloc.alloc::<u8>(&alloc.default_stream(), 100).unwrap();
    let bytes = alloc.snapshot().to_pytorch_pickle();
    let back = Snapshot::from_pytorch_pickle(&bytes, "own").unwrap();
    let block = back.live_blocks().next().unwrap();
    let frames: Vec<_> = back.stack_frames(block.context.unwrap().stack.unwrap()).collect();
    let last = frames.last().unwrap();
    assert_eq!((last.function.as_str(), last.file.as_deref()), ("outer", Some("<scope>")));
    drop(x);
}
