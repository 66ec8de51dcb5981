//! The leak finder on any step numbering: the same program numbered 0, 1, 2, ..., with a
//! stride, resumed from a checkpoint, or sparsely, gives the same leaking lines with the same
//! per-step figures; only the step numbers it names follow the program's. The reports that use
//! it on programs of steps too: the timeline and ranks side by side. (In a binary of its own,
//! the tests taking turns: `vramscope::step` is process-wide.)

use std::collections::HashMap;
use vramscope::{backend::SimBackend, record::Action, report, Buffer, CachingAllocator, Snapshot, Stream};

#[inline(never)]
fn keep(alloc: &CachingAllocator, s: &Stream, kept: &mut Vec<Buffer<u8>>) {
    kept.push(alloc.alloc::<u8>(s, 1 << 20).unwrap());
}

#[inline(never)]
fn temporary(alloc: &CachingAllocator, s: &Stream) {
    drop(alloc.alloc::<u8>(s, 4 << 20).unwrap());
}

#[inline(never)]
fn replaced(alloc: &CachingAllocator, s: &Stream, slot: &mut Option<Buffer<u8>>) {
    *slot = Some(alloc.alloc::<u8>(s, 2 << 20).unwrap());
}

/// The buffers a program still holds: the kept list and the replaced slot.
type Held = (Vec<Buffer<u8>>, Option<Buffer<u8>>);

/// A program of `keep`, `temporary` and `replaced` lines, one round per step number of `steps`
/// (marked with `vramscope::step`); the kept list is cleared before the round of step `clear`.
/// Returns the allocator and the buffers the program still holds.
fn program(steps: impl Iterator<Item = u64>, clear: Option<u64>) -> (CachingAllocator, Held) {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let (mut kept, mut slot) = (Vec::new(), None);
    for i in steps {
        vramscope::step(i);
        if clear == Some(i) {
            kept.clear();
        }
        keep(&alloc, &s, &mut kept);
        temporary(&alloc, &s);
        replaced(&alloc, &s, &mut slot);
    }
    (alloc, (kept, slot))
}

/// The same snapshot with every step number `s` replaced by `f(s)`.
fn renumbered(json: &serde_json::Value, f: &dyn Fn(u64) -> u64) -> Snapshot {
    fn walk(v: &mut serde_json::Value, f: &dyn Fn(u64) -> u64) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(ctx) = m.get_mut("context").and_then(|c| c.as_object_mut()) {
                    if let Some(step) = ctx.get("step").and_then(serde_json::Value::as_u64) {
                        ctx.insert("step".into(), f(step).into());
                    }
                }
                m.values_mut().for_each(|x| walk(x, f));
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| walk(x, f)),
            _ => {}
        }
    }
    let mut v = json.clone();
    walk(&mut v, f);
    Snapshot::from_bytes(v.to_string().as_bytes(), "renumbered").expect("still a snapshot")
}

/// `vramscope::step` is process-wide: the tests of this binary take turns.
static STEPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn strided_resumed_and_sparse_steps_give_the_same_verdicts() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let (alloc, held) = program(0..30, None);
    let json: serde_json::Value = serde_json::from_str(&alloc.snapshot().to_json()).unwrap();
    let base = report::leaks(&renumbered(&json, &|s| s));
    assert_eq!(base.len(), 1, "{base:#?}");
    assert!(base[0].site.contains("keep"), "{base:#?}");
    assert_eq!(base[0].bytes_per_step, 1 << 20);
    let cases: [(&str, &dyn Fn(u64) -> u64); 5] = [
        ("stride 2", &|s| s * 2),
        ("stride 3", &|s| s * 3),
        ("stride 5", &|s| s * 5),
        ("resumed: loaded at 0, then 10001 on", &|s| if s == 0 { 0 } else { 10_000 + s }),
        ("sparse: squares", &|s| s * s),
    ];
    for (name, f) in cases {
        let found = report::leaks(&renumbered(&json, f));
        assert_eq!(found.len(), base.len(), "{name}: {found:#?}");
        for (a, b) in found.iter().zip(&base) {
            assert_eq!(a.site, b.site, "{name}");
            assert_eq!(a.bytes_per_step, b.bytes_per_step, "{name}");
            assert_eq!(a.blocks_per_step, b.blocks_per_step, "{name}");
            assert_eq!((a.growing_steps, a.steps), (b.growing_steps, b.steps), "{name}");
            assert_eq!((a.grew_from, a.grew_until), (f(b.grew_from), f(b.grew_until)), "{name}: the program's numbers");
            assert_eq!((a.blocks, a.bytes), (b.blocks, b.bytes), "{name}");
        }
    }
    drop(held);
}

/// Memory that grew step after step and then fell is not a leak: a list kept for 24 of 30
/// steps, then cleared and filled again, is a cache emptied in time, whatever it held meanwhile.
#[test]
fn memory_that_falls_is_not_a_leak() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let (alloc, _held) = program(0..30, Some(24));
    let leaks = report::leaks(&alloc.snapshot());
    assert!(leaks.is_empty(), "a cleared list named as a leak: {leaks:#?}");
    // Kept to the end, the same list is a leak: the rule above is what tells them apart.
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let mut kept = Vec::new();
    for i in 0..30 {
        vramscope::step(i);
        if i < 24 {
            keep(&alloc, &s, &mut kept);
        }
        temporary(&alloc, &s);
    }
    let leaks = report::leaks(&alloc.snapshot());
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    assert!(leaks[0].site.contains("keep"), "{leaks:#?}");
}

/// Steps counted down (`step(10)` down to `step(1)`) are steps in the order they happened: the
/// line that keeps a block each step is named as when counting up.
#[test]
fn steps_counted_down_find_the_same_leak() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let (alloc, _held) = program((1..=10).rev(), None);
    let leaks = report::leaks(&alloc.snapshot());
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    assert!(leaks[0].site.contains("keep"), "{leaks:#?}");
    assert_eq!(leaks[0].bytes_per_step, 1 << 20);
}

/// The timeline's bands add up to the live bytes at every point, computed apart from the
/// history's prefix; the leaking line is a band of its own, marked; the picture is bounded.
#[test]
fn timeline_bands_add_up_to_the_live_bytes_at_every_point() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let (alloc, held) = program(0..30, None);
    let snap = alloc.snapshot();
    let t = report::timeline(&snap);
    assert_eq!(t.events, snap.history.len());
    assert!(t.points.len() <= report::TIMELINE_POINTS && !t.bands.is_empty());
    for (k, &after) in t.points.iter().enumerate() {
        let mut live: HashMap<u64, u64> = HashMap::new();
        for e in &snap.history[..=after] {
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, e.size);
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
        let drawn: u64 = t.bands.iter().map(|b| b.bytes[k]).sum();
        assert_eq!(drawn, live.values().sum::<u64>(), "point {k}, after event {after}");
    }
    let leak = t.bands.iter().find(|b| b.label.contains("keep")).expect("the kept line's band");
    assert!(leak.leak_candidate && leak.peak == 30 << 20, "{leak:?}");
    assert!(!t.bands.iter().any(|b| b.label.contains("temporary") && b.leak_candidate));
    let svg = t.to_svg("a test");
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    assert!(svg.contains("LEAK CANDIDATE: ") && svg.contains("(leak candidate)</title>"));
    drop(held);
}

/// A history of 200,000 events draws as many points as one of four hundred; its leaking line
/// is marked as in a short one (a long history's candidates are found on another thread).
#[test]
fn a_timeline_is_bounded_whatever_the_history() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let mut rec = vramscope::record::RecordConfig::default();
    rec.max_entries = 1 << 20;
    alloc.record_memory_history(rec);
    let s = alloc.default_stream();
    let mut kept = Vec::new();
    for i in 0..10 {
        vramscope::step(i);
        keep(&alloc, &s, &mut kept);
        for _ in 0..10_000 {
            temporary(&alloc, &s);
        }
    }
    let snap = alloc.snapshot();
    let t = report::timeline(&snap);
    assert!(t.events > 200_000, "{}", t.events);
    // The leak finder and its limits, each on a core of its own over so long a history, give
    // what they give one after the other.
    let (found, limits) = report::leaks_with_limits(&snap);
    assert_eq!((found, limits), (report::leaks(&snap), report::leak_limits(&snap)));
    assert_eq!(t.points.len(), report::TIMELINE_POINTS);
    assert!(t.to_svg("long").len() < 200_000);
    let leak = t.bands.iter().find(|b| b.label.contains("keep")).expect("the kept line's band");
    assert!(leak.leak_candidate && leak.peak == 10 << 20, "{leak:?}");
    assert!(!t.bands.iter().any(|b| b.label.contains("temporary") && b.leak_candidate));
    drop(kept);
}

/// Two ranks of one program, one of which keeps a block every step: its figures are higher by
/// what it kept, the line differs between the ranks by that much, and only its rank names the
/// leak.
#[test]
fn ranks_tell_the_leaking_rank_and_line() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    // The same program, its kept list cleared at every step: one block kept at the end.
    let steady = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = steady.default_stream();
    let (mut kept, mut slot) = (Vec::new(), None);
    for i in 0..10 {
        vramscope::step(i);
        kept.clear();
        keep(&steady, &s, &mut kept);
        temporary(&steady, &s);
        replaced(&steady, &s, &mut slot);
    }
    let steady_held = (kept, slot);
    let (leaky, leaky_held) = program(0..10, None);
    let snaps = vec![("rank0.json".to_string(), steady.snapshot()), ("rank1.json".to_string(), leaky.snapshot())];
    let r = report::ranks(&snaps);
    // Made rank by rank (as the command line does, each snapshot freed once read), the same.
    let parts = snaps.iter().map(|(name, snap)| report::rank_part(name, snap)).collect();
    assert_eq!(report::ranks_from(parts), r);
    let (a, b) = (&r.ranks[0], &r.ranks[1]);
    assert_eq!(b.allocated - a.allocated, 9 << 20, "{a:?} {b:?}");
    // Each rank's peaks, replayed from its history, are the allocator's own: the history
    // holds every event, and every request here fills its block.
    for (rank, (_, snap)) in r.ranks.iter().zip(&snaps) {
        let stats = &snap.stats;
        assert_eq!(rank.peak_allocated, stats.allocated_bytes.all.peak, "{rank:?}");
        assert_eq!(rank.peak_reserved, stats.reserved_bytes.all.peak, "{rank:?}");
        assert!(rank.peak_allocated > rank.allocated, "the temporary block raised the peak: {rank:?}");
    }
    assert!(a.leaks.is_empty(), "{:?}", a.leaks);
    assert!(b.leaks.iter().any(|l| l.contains("keep")), "{:?}", b.leaks);
    let top = &r.sites[0];
    assert!(top.site.contains("keep"), "{top:?}");
    assert_eq!(top.spread, 9 << 20, "{top:?}");
    let text = r.render();
    assert!(text.lines().all(|l| l.chars().count() <= 100), "{text}");
    assert!(text.contains("leak candidates, by rank:\n  1: "), "{text}");
    drop((steady_held, leaky_held));
}

/// The figures of a leak that keeps 1 MiB a step, pinned for short and long programs: few
/// steps (one window each), more steps than windows (grouped: figures are still per step, and
/// the steps named are the program's), growth that begins late, and a history of nothing but
/// allocations. Each figure follows from the program: 1 MiB and one block a step, kept from the
/// first step, seen up to the step before the last window (whose allocations show in no floor).
#[test]
fn a_steady_leak_is_measured_exactly_at_any_length() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let figures = |found: &[report::LeakCandidate]| -> Vec<(u64, f64, u32, u32, u64, u64)> {
        found
            .iter()
            .map(|c| (c.bytes_per_step, c.blocks_per_step, c.growing_steps, c.steps, c.grew_from, c.grew_until))
            .collect()
    };
    let per_window = |found: &[report::LeakCandidate]| found.iter().map(|c| c.steps_per_window).collect::<Vec<_>>();
    assert!(report::leaks(&program(0..3, None).0.snapshot()).is_empty(), "three steps are too few to tell");
    for (n, until) in [(4u64, 2u64), (5, 3), (12, 10), (100, 98), (301, 297)] {
        let (alloc, _held) = program(0..n, None);
        let windows = n.min(100) as u32;
        let found = report::leaks(&alloc.snapshot());
        assert_eq!(figures(&found), [(1 << 20, 1.0, windows - 1, windows, 0, until)], "{n} steps");
        assert_eq!(per_window(&found), [n as f64 / f64::from(windows)], "{n} steps");
    }
    // Kept from step 120 of 250 (grouped in windows of 2.5 steps): the growth and its rate are
    // the leak's, not spread over the steps that kept nothing.
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let mut kept = Vec::new();
    for i in 0..250 {
        vramscope::step(i);
        if i >= 120 {
            keep(&alloc, &s, &mut kept);
        }
        temporary(&alloc, &s);
    }
    let found = report::leaks(&alloc.snapshot());
    assert_eq!(figures(&found).len(), 1, "{found:?}");
    let c = &found[0];
    assert_eq!((c.bytes_per_step, c.blocks_per_step, c.grew_from, c.grew_until), (1 << 20, 1.0, 120, 247), "{c:?}");
    // Nothing but allocations: no free anywhere in the history.
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let mut kept = Vec::new();
    for i in 0..6 {
        vramscope::step(i);
        keep(&alloc, &alloc.default_stream(), &mut kept);
    }
    assert_eq!(figures(&report::leaks(&alloc.snapshot())), [(1 << 20, 1.0, 5, 6, 0, 4)]);
    // The same history without the snapshot's own mark: allocations and nothing else.
    let mut v: serde_json::Value = serde_json::from_str(&alloc.snapshot().to_json()).unwrap();
    v["history"].as_array_mut().unwrap().retain(|e| e["action"] == "alloc");
    let only = Snapshot::from_bytes(v.to_string().as_bytes(), "allocations only").unwrap();
    assert!(only.history.iter().all(|e| e.action == Action::Alloc));
    assert_eq!(figures(&report::leaks(&only)), [(1 << 20, 1.0, 5, 6, 0, 4)]);
}

/// Memory kept now and then is not a leak: a site whose floor rose in 3 of the 8 steps since it
/// first rose (under half of them) is left out, whatever step its growth began at.
#[test]
fn growth_in_under_half_the_steps_since_it_began_is_not_a_leak() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let (mut kept, mut every) = (Vec::new(), Vec::new());
    for i in 0..10 {
        vramscope::step(i);
        if [1, 4, 7].contains(&i) {
            keep(&alloc, &s, &mut kept);
        }
        replaced(&alloc, &s, &mut None);
        if i >= 2 {
            every.push(alloc.alloc::<u8>(&s, 512).unwrap()); // a leak beside it, for contrast
        }
    }
    let found = report::leaks(&alloc.snapshot());
    let sites: Vec<&str> = found.iter().map(|c| c.site.as_str()).collect();
    assert_eq!(found.len(), 1, "only the steady leak: {sites:?}");
    assert_eq!(found[0].bytes_per_step, 512, "{sites:?}");
}

/// At the boundary: memory kept in exactly half the steps since it began (steps 3, 5 and 7 of
/// 10) is a leak, at half its size a step.
#[test]
fn growth_in_half_the_steps_since_it_began_is_a_leak() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let mut kept = Vec::new();
    for i in 0..10 {
        vramscope::step(i);
        if [3, 5, 7].contains(&i) {
            keep(&alloc, &s, &mut kept);
        }
        temporary(&alloc, &s);
    }
    let found = report::leaks(&alloc.snapshot());
    assert_eq!(found.len(), 1, "{found:?}");
    let c = &found[0];
    assert_eq!((c.bytes_per_step, c.growing_steps, c.grew_from, c.grew_until), (1 << 19, 3, 3, 7), "{c:?}");
}

/// When growth began, for the rate: a pause in the growth counts only when it is long (at
/// least three steps without a rise) and unusual (over three times the median pause).
/// - Every step but a hole of two: began at the first step; 17 MiB over 19 steps.
/// - Kept at steps 0, 2, 4, 5, 9, 11 and 13 of 15 (pauses 1, 1, 0, 3, 1, 1: the pause of three
///   is exactly three times the usual one, not over it): began at the first; 7 MiB over 14.
/// - Kept at steps 0, 2, 3, 5, 10, 11 and 13 of 15 (pauses 1, 0, 1, 4, 0, 1: four is over three
///   times the usual one): began after it; 3 MiB over the last 4 steps.
/// - Kept once, nine steps of nothing, then every step: began after the pause, 1 MiB a step
///   (the first step kept still opens `grew_from`).
/// - Kept every fourth step: rises in under half the steps since it began, no leak.
#[test]
fn growth_begins_after_a_long_unusual_pause_only() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let run = |keeps: &dyn Fn(u64) -> bool, steps: u64| {
        let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
        let s = alloc.default_stream();
        let mut kept = Vec::new();
        for i in 0..steps {
            vramscope::step(i);
            if keeps(i) {
                keep(&alloc, &s, &mut kept);
            }
            temporary(&alloc, &s);
        }
        let found = report::leaks(&alloc.snapshot());
        found.iter().map(|c| (c.grew_from, c.bytes_per_step)).collect::<Vec<_>>()
    };
    assert_eq!(run(&|i| !(10..12).contains(&i), 20), [(0, (f64::from(17 << 20) / 19.0).round() as u64)]);
    assert_eq!(run(&|i| [0, 2, 4, 5, 9, 11, 13].contains(&i), 15), [(0, (7 << 20) / 14)]);
    assert_eq!(run(&|i| [0, 2, 3, 5, 10, 11, 13].contains(&i), 15), [(0, (3 << 20) / 4)]);
    assert_eq!(run(&|i| i == 0 || i >= 10, 20), [(0, 1 << 20)]);
    assert_eq!(run(&|i| i % 4 == 0, 40), []);
}

/// Three marked steps are windows by step, however many tenths of the history their events
/// fill: too few to tell. Two are no steps at all: the history's tenths are the windows, and a
/// line that keeps ten blocks in each is a leak in them.
#[test]
fn three_marked_steps_are_windows_by_step_and_two_are_tenths() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let run = |steps: u64| {
        let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
        let s = alloc.default_stream();
        let mut kept = Vec::new();
        for i in 0..steps {
            vramscope::step(i);
            for _ in 0..30 / steps {
                keep(&alloc, &s, &mut kept);
            }
        }
        let found = report::leaks(&alloc.snapshot());
        drop(kept);
        found
    };
    assert!(run(3).is_empty(), "{:#?}", run(3));
    let two = run(2);
    assert_eq!(two.len(), 1, "{two:#?}");
    assert!(two[0].site.contains("keep") && two[0].unit == report::LeakUnit::Window, "{two:#?}");
}

/// A history that kept its segments' events and none of its blocks' (a ring that dropped them):
/// the reserved peak still comes from the segments, the allocated peak is what is allocated now.
#[test]
fn a_history_of_segments_alone_gives_the_reserved_peak() {
    let _turn = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    drop(alloc.alloc::<u8>(&s, 64 << 20).unwrap());
    alloc.empty_cache();
    let kept = alloc.alloc::<u8>(&s, 1 << 20).unwrap();
    let mut snap = alloc.snapshot();
    let segment_event = |a: Action| matches!(a, Action::SegmentAlloc | Action::SegmentFree);
    assert!(snap.history.iter().any(|e| e.action == Action::SegmentFree), "the 64 MiB segment was freed");
    snap.history.retain(|e| segment_event(e.action));
    let rank = &report::ranks(&[("rank0".to_string(), snap.clone())]).ranks[0];
    assert_eq!(rank.peak_reserved, snap.stats.reserved_bytes.all.peak, "{rank:?}");
    assert!(rank.peak_reserved >= 64 << 20 && rank.peak_reserved > rank.reserved, "{rank:?}");
    assert_eq!(rank.peak_allocated, rank.allocated, "{rank:?}");
    drop(kept);
}
