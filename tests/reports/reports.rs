//! Golden tests of every report on the PyTorch fixtures, and the reports' properties.

use vramscope::report::{self, FoldedKind};
use vramscope::{backend::SimBackend, record::RecordConfig, record::StackMode, CachingAllocator, Snapshot};

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
    assert_eq!(d.iter().map(|x| x.change).collect::<Vec<_>>(), [report::Change::New, report::Change::New]);
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

#[cfg(feature = "flamegraph")]
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
    let e = report::flamegraph("", "empty").unwrap_err();
    // A caller writing one flamegraph per snapshot can skip the empty ones.
    assert!(
        matches!(&e, vramscope::Error::Report(vramscope::error::ReportError::EmptyProfile { title }) if title == "empty")
    );
    assert!(e.to_string().contains("nothing to draw"), "{e}");
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
        assert_eq!(again.history, snap.history, "{name}: every event, its time included");
        assert_eq!(again.time_origin_us, snap.time_origin_us, "{name}");
        assert_eq!(report::leaks(&again), report::leaks(&snap), "{name}");
        // And through our JSON: the times survive (they used to become 0, 1970 in the viewer).
        let json = Snapshot::from_bytes(snap.to_json().as_bytes(), "json").unwrap();
        assert_eq!((json.time_origin_us, &json.history), (snap.time_origin_us, &snap.history), "{name}");
        // The fixtures were recorded in 2026 (fixtures/torch/README.md): the origin is a date
        // then, in microseconds since the epoch.
        let year = 1970 + snap.time_origin_us / 1_000_000 / 86_400 / 365;
        assert!((2025..=2027).contains(&year), "{name}: time origin {} is in {year}", snap.time_origin_us);
    }
}

/// A segment is a contiguous mapped range, in PyTorch's snapshot of expandable segments
/// (`expandable_unmap`: 60 MiB mapped, 40 of them unmapped by `empty_cache`, listed as the
/// 20 still mapped) and in vramscope's after the same steps on virtual segments: the
/// segments' sizes sum to the bytes reserved, not to the address ranges reserved.
#[test]
fn segments_are_the_mapped_ranges_as_in_pytorch() {
    let torch = fixture("expandable_unmap");
    let sizes = |s: &Snapshot| s.segments.iter().map(|g| (g.total_size >> 20, g.expandable)).collect::<Vec<_>>();
    assert_eq!(sizes(&torch), [(2, true), (20, true)]);
    let back = Snapshot::from_pytorch_pickle(&torch.to_pytorch_pickle(), "written").unwrap();
    assert_eq!(back.segments, torch.segments);

    let alloc = CachingAllocator::new(vramscope::backend::SimBackend::new(1 << 30));
    let s = alloc.default_stream();
    let small = alloc.alloc::<u8>(&s, 1000).unwrap();
    drop(alloc.alloc::<u8>(&s, 60 << 20).unwrap());
    let kept = alloc.alloc::<u8>(&s, 8 << 20).unwrap();
    alloc.empty_cache();
    let own = alloc.snapshot();
    let listed: u64 = own.segments.iter().map(|g| g.total_size).sum();
    assert_eq!(listed, alloc.memory_reserved());
    assert!(listed < 60 << 20, "the unmapped pages are not listed: {:?}", sizes(&own));
    assert!(own.segments.iter().all(|g| g.mapped_size == g.total_size && g.expandable));
    let back = Snapshot::from_pytorch_pickle(&own.to_pytorch_pickle(), "written").unwrap();
    assert_eq!(sizes(&back), sizes(&own));
    drop((small, kept));
}

/// vramscope's own pickles carry real times (microseconds since the epoch, as PyTorch's) and
/// every free as PyTorch records it: `free_requested`, then `free_completed`.
#[test]
fn own_pickles_have_real_times_and_requested_frees() {
    use vramscope::{record::Action, record::RecordConfig};
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64;
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    alloc.record_memory_history(RecordConfig::default());
    let x = alloc.alloc::<u8>(alloc.default_stream(), 100).unwrap();
    let addr = x.device_ptr();
    drop(x);
    let snap = alloc.snapshot();
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64;
    assert!((before..=after).contains(&snap.time_origin_us), "{} not in {before}..={after}", snap.time_origin_us);
    let blocks = |s: &Snapshot| -> Vec<Action> {
        s.history
            .iter()
            .filter(|e| e.addr == addr && !matches!(e.action, Action::SegmentAlloc))
            .map(|e| e.action)
            .collect()
    };
    assert_eq!(
        blocks(&snap),
        [Action::Alloc, Action::FreeCompleted],
        "recorded: a free nothing held up completes at once"
    );
    let back = Snapshot::from_pytorch_pickle(&snap.to_pytorch_pickle(), "own").unwrap();
    assert_eq!(blocks(&back), [Action::Alloc, Action::FreeRequested, Action::FreeCompleted]);
    assert_eq!(back.time_origin_us, snap.time_origin_us + snap.history[0].time_ns / 1000);
}

/// What PyTorch's viewer shows on a block or segment comes from the trace entries' frames: in
/// a pickle of a default recording every alloc, free and segment_alloc entry has a stack (a
/// free, its allocation's; a segment, the allocation that reserved it), so no hover of
/// "Allocator State History" says a block has no frames (tools/memoryviz/hovers.py).
#[test]
fn every_entry_of_an_own_pickle_has_frames() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    alloc.record_memory_history(RecordConfig::default());
    let s = alloc.default_stream();
    let big = alloc.alloc::<u8>(&s, 8 << 20).unwrap();
    let small: Vec<_> = (0..4).map(|_| alloc.alloc::<u8>(&s, 1000).unwrap()).collect();
    drop(big);
    drop(small);
    alloc.empty_cache();
    let back = Snapshot::from_pytorch_pickle(&alloc.snapshot().to_pytorch_pickle(), "own").unwrap();
    use vramscope::record::Action;
    let framed =
        |a: Action| back.history.iter().filter(|e| e.action == a).all(|e| e.context.and_then(|c| c.stack).is_some());
    for a in [Action::Alloc, Action::FreeRequested, Action::FreeCompleted, Action::SegmentAlloc] {
        assert!(back.history.iter().any(|e| e.action == a), "{a:?} recorded");
        assert!(framed(a), "every {a:?} entry has frames");
    }
}

/// A live block's scope travels on the block too (`user_metadata`, beside its frames), so it
/// survives its allocation's entry leaving the history's ring buffer, and PyTorch's viewer
/// shows it on every block (tools/memoryviz/hovers.py counts them).
#[test]
fn a_blocks_scope_outlives_its_trace_entry() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let mut rec = vramscope::record::RecordConfig::default();
    rec.max_entries = 2;
    alloc.record_memory_history(rec);
    let kept = {
        let _s = vramscope::scope("cache");
        alloc.alloc::<u8>(alloc.default_stream(), 4096).unwrap()
    };
    for _ in 0..3 {
        drop(alloc.alloc::<u8>(alloc.default_stream(), 512).unwrap());
    }
    let snap = alloc.snapshot();
    assert!(!snap.history.iter().any(|e| e.addr == kept.device_ptr()), "its entry left the ring");
    let back = Snapshot::from_pytorch_pickle(&snap.to_pytorch_pickle(), "own").unwrap();
    let block = back.live_blocks().find(|b| b.address == kept.device_ptr()).unwrap();
    assert_eq!(back.scope(block.context.unwrap().scope).unwrap(), ["cache"]);
    drop(kept);
}

/// Scopes travel where PyTorch carries user annotations: each trace entry's `user_metadata`
/// (`outer/inner`); read back, the blocks get their allocation's scope, and no fake frames.
/// A tensor's dtype and shape travel as block keys of their own; a plain buffer has none.
#[test]
fn own_pickles_carry_scopes_dtypes_and_shapes() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    alloc.record_memory_history(vramscope::record::RecordConfig::default());
    let _outer = vramscope::scope("outer");
    let _inner = vramscope::scope("inner");
    let x = alloc.alloc::<u8>(alloc.default_stream(), 100).unwrap();
    let kv = alloc.alloc_shaped::<f32>(alloc.default_stream(), &[2, 8, 128]).unwrap();
    let snap = alloc.snapshot();
    let bytes = snap.to_pytorch_pickle();
    let back = Snapshot::from_pytorch_pickle(&bytes, "own").unwrap();
    let described = |s: &Snapshot| -> Vec<(u64, Option<String>, Option<Vec<usize>>)> {
        s.live_blocks().map(|b| (b.address, b.dtype.clone(), b.shape.clone())).collect()
    };
    let tensor = (kv.device_ptr(), Some("float32".to_string()), Some(vec![2, 8, 128]));
    assert!(described(&snap).contains(&tensor), "{:?}", described(&snap));
    assert_eq!(described(&back), described(&snap));
    assert!(described(&back).contains(&(x.device_ptr(), None, None)));
    let block = back.live_blocks().find(|b| b.address == x.device_ptr()).unwrap();
    let ctx = block.context.unwrap();
    assert_eq!(back.scope(ctx.scope).unwrap(), ["outer", "inner"]);
    assert!(back.stack_frames(ctx.stack.unwrap()).all(|f| f.file.as_deref() != Some("<scope>")));
    let alloc_event =
        back.history.iter().find(|e| e.addr == x.device_ptr() && e.action == vramscope::record::Action::Alloc);
    assert_eq!(back.scope(alloc_event.unwrap().context.unwrap().scope).unwrap(), ["outer", "inner"]);
    assert!(report::live(&back).iter().all(|g| g.scope == "outer/inner"));
    drop((x, kv));
}

/// How the leak finder did on one corpus: per part, (lines named rightly, named wrongly,
/// missed), and per named leaking line (program, blocks per step: the finder's, the truth's).
type CorpusScores = (std::collections::BTreeMap<&'static str, (usize, usize, usize)>, Vec<(String, f64, f64)>);

/// Runs the leak finder over a corpus recorded by `fixtures/torch/corpus/record.py`: each
/// program of its `ground_truth.json`, whose files `locate(name)` gives (recorded with Python
/// stacks, recorded with PyTorch's defaults, and the part it counts in), its lines in
/// `programs` (the file name in frames). Asserts that both recordings give the same report (but for record.py's own line
/// numbers) and that no site outside the programs is named, pins the report
/// (`{prefix}{name}`), and scores the lines against the truth.
fn check_corpus(
    dir: &str,
    programs: &str,
    prefix: &str,
    locate: impl Fn(&str) -> (String, String, &'static str),
) -> CorpusScores {
    let truth: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{dir}/ground_truth.json")).unwrap()).unwrap();
    let mut scores = std::collections::BTreeMap::new();
    let mut figures = Vec::new();
    for p in truth["programs"].as_array().unwrap() {
        let name = p["program"].as_str().unwrap();
        let (python, default, part) = locate(name);
        let snap = Snapshot::load(&python).unwrap();
        let leaks = report::leaks(&snap);
        // The default recording: the same report but for record.py's line numbers.
        let default = Snapshot::load(&default).unwrap();
        let record_lines = |text: String| {
            text.lines()
                .map(|l| match l.find("record.py:") {
                    Some(i) => format!(
                        "{}record.py:N{}",
                        &l[..i],
                        &l[i..].trim_start_matches(|c: char| !c.is_ascii_whitespace())
                    ),
                    None => l.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(
            record_lines(report::LeakCandidate::render(&report::leaks(&default))),
            record_lines(report::LeakCandidate::render(&leaks)),
            "{name}: the default recording's leaks differ from the Python-stack recording's"
        );
        let named = |c: &&report::LeakCandidate| c.frame.file.as_deref() == Some(programs);
        let mut found: Vec<u64> = leaks.iter().filter(named).map(|c| u64::from(c.frame.line.unwrap())).collect();
        found.sort();
        let truth_lines = p["leaking_lines"].as_array().unwrap();
        let mut expected: Vec<u64> = truth_lines.iter().map(|l| l["line"].as_u64().unwrap()).collect();
        expected.sort();
        assert_eq!(leaks.len(), found.len(), "{name}: a site outside the program was named: {leaks:?}");
        let (tp, fp, fn_) = scores.entry(part).or_insert((0, 0, 0));
        *tp += found.iter().filter(|l| expected.contains(l)).count();
        *fp += found.iter().filter(|l| !expected.contains(l)).count();
        *fn_ += expected.iter().filter(|l| !found.contains(l)).count();
        for c in leaks.iter().filter(named) {
            let line = u64::from(c.frame.line.unwrap());
            if let Some(t) = truth_lines.iter().find(|l| l["line"].as_u64() == Some(line)) {
                figures.push((format!("{name}:{line}"), c.blocks_per_step, t["blocks_per_step"].as_f64().unwrap()));
            }
        }
        insta::assert_snapshot!(format!("{prefix}{name}"), report::LeakCandidate::render(&leaks));
    }
    (scores, figures)
}

/// The leak finder on the corpus of real PyTorch programs (fixtures/torch/corpus): it names
/// exactly the lines the ground truth names (computed by running each program beside its fixed
/// twin), on the tuning part and on the held-out part, and its output is pinned. The same
/// programs recorded as PyTorch's documentation shows (`_record_memory_history()`'s defaults:
/// C++ frames around the Python ones, `default_stacks/`) give the same leaking lines with the
/// same figures: the report differs only where the recording script's own lines moved.
///
/// Then the second corpus (`corpus/second`, `programs2.py`: ten programs written after the
/// first corpus's rules were set, recorded both ways in one run): the same checks. And the
/// figures of both: no step markers there, so blocks per step rest on the finder's estimate of
/// the steps; on lines whose leak is a block or more per step, within 15% of the truth's on
/// all but one (`validation_outputs_across_epochs`: its loop's one allocating line runs four
/// identical forward passes an epoch, and the finder's step is a pass, the truth's an epoch).
/// Before the steps were counted by runs of a line's allocations (or the repeats of its sizes)
/// and the rate from where the growth began, four lines were off by 2 to 12 times.
#[test]
fn leak_finder_matches_the_corpus_ground_truth() {
    let dir = format!("{}/fixtures/torch/corpus", env!("CARGO_MANIFEST_DIR"));
    let (scores, mut figures) = check_corpus(&dir, "corpus/programs.py", "corpus_", |name| {
        let held_out = std::path::Path::new(&format!("{dir}/held_out/{name}.snapshot.pickle")).exists();
        let file = if held_out { format!("{dir}/held_out/{name}") } else { format!("{dir}/{name}") };
        let default = format!("{dir}/default_stacks/{name}.default.snapshot.pickle");
        (format!("{file}.snapshot.pickle"), default, if held_out { "held out" } else { "tuning" })
    });
    let second = format!("{dir}/second");
    let (second_scores, second_figures) = check_corpus(&second, "corpus/programs2.py", "corpus2_", |name| {
        let file = format!("{second}/{name}");
        (format!("{file}.snapshot.pickle"), format!("{file}.default.snapshot.pickle"), "second corpus")
    });
    for (part, (tp, fp, fn_)) in scores.iter().chain(&second_scores) {
        eprintln!("{part}: {tp} leaking lines named, {fp} named wrongly, {fn_} missed");
        assert_eq!((*fp, *fn_), (0, 0), "{part}: precision and recall must both be 1");
    }
    figures.extend(second_figures);
    let whole: Vec<_> = figures.iter().filter(|f| f.2 >= 0.9).collect();
    let off: Vec<_> = whole.iter().filter(|f| (f.1 / f.2 - 1.0).abs() > 0.15).collect();
    eprintln!("blocks per step, finder against truth: {whole:?}");
    assert_eq!(whole.len(), 14, "{figures:?}");
    assert!(off.len() <= 1, "blocks per step more than 15% off the truth: {off:?}");
}

/// An out-of-memory event carries the device's free bytes, as PyTorch's `oom` trace entries do
/// (`device_free`, no address; its viewer prints it), and reads back from that form.
#[test]
fn oom_events_carry_the_free_bytes_as_pytorch_does() {
    let alloc = CachingAllocator::new(SimBackend::new(64 << 20));
    alloc.record_memory_history(vramscope::record::RecordConfig::default());
    let x = alloc.alloc::<u8>(alloc.default_stream(), 20 << 20).unwrap();
    let free = vramscope::backend::Backend::free_memory(&**alloc.backend());
    assert!(alloc.alloc::<u8>(alloc.default_stream(), 100 << 20).is_err());
    let snap = alloc.snapshot();
    let oom =
        |s: &Snapshot| s.history.iter().find(|e| e.action == vramscope::record::Action::Oom).map(|e| (e.addr, e.size));
    assert_eq!(oom(&snap), Some((free, 100 << 20)));
    let bytes = snap.to_pytorch_pickle();
    let back = Snapshot::from_pytorch_pickle(&bytes, "own").unwrap();
    assert_eq!(oom(&back), Some((free, 100 << 20)), "read back from `device_free`");
    drop(x);
}

/// The driver's stream-ordered pool, where a CUDA backend could read it, is kept through JSON
/// and printed under the summary; snapshots without it (earlier versions, PyTorch's) have none.
#[test]
fn the_driver_pool_reaches_the_summary() {
    let mut snap = fixture("leaky_train");
    assert_eq!(snap.driver_pool, None);
    assert!(!report::summary(&snap).contains("stream-ordered pool"));
    snap.driver_pool = Some(vramscope::snapshot::DriverPool::new(4096, 8192, 2 << 20, 4 << 20));
    let back = Snapshot::from_bytes(snap.to_json().as_bytes(), "<memory>").unwrap();
    assert_eq!(back.driver_pool, snap.driver_pool);
    let summary = report::summary(&back);
    let line = summary.lines().last().unwrap();
    assert_eq!(line, "CUDA stream-ordered pool: 4.00 KiB in use (peak 8.00 KiB), 2.00 MiB held (peak 4.00 MiB)");
    assert!(line.len() <= 100);
}
