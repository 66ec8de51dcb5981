//! The leak finder's per-step figures where a program marks no steps (PyTorch's snapshots): the
//! steps are estimated from the history, and the rate is taken over the steps the memory grew.
//! (Its own binary: `vramscope::step` is process-wide, and these programs must mark none.)

use vramscope::{backend::SimBackend, record::Action, report, Buffer, CachingAllocator, Snapshot, Stream};

/// One line, two allocations: a temporary and a block kept (as `torch.ones(n).tril()` kept in a
/// cache allocates twice on one line).
#[inline(never)]
fn two_kept_one(alloc: &CachingAllocator, s: &Stream, kept: &mut Vec<Buffer<u8>>) {
    #[rustfmt::skip]
    let (t, k) = (alloc.alloc::<u8>(s, 8 << 10).unwrap(), alloc.alloc::<u8>(s, 1 << 20).unwrap());
    kept.push(k);
    drop(t);
}

/// Another line of the loop, also two allocations a step, neither kept.
#[inline(never)]
fn two_temporaries(alloc: &CachingAllocator, s: &Stream) {
    #[rustfmt::skip]
    let (a, b) = (alloc.alloc::<u8>(s, 4 << 20).unwrap(), alloc.alloc::<u8>(s, 4 << 20).unwrap());
    drop((a, b));
}

/// A step's output: replaced by the next step's, or kept.
#[inline(never)]
fn output(alloc: &CachingAllocator, s: &Stream) -> Buffer<u8> {
    alloc.alloc::<u8>(s, 1 << 20).unwrap()
}

fn within(value: f64, truth: f64, share: f64) -> bool {
    (value / truth - 1.0).abs() <= share
}

/// Every line of the loop allocates twice a step: counted by allocations the loop would have
/// run 60 steps and kept half a block a step (as the finder said of a cache keyed by the step,
/// 0.51 blocks a step against the truth's 1.0); counted by runs of a line's allocations, 30.
#[test]
fn a_line_that_allocates_twice_a_step_counts_one_step() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let mut kept = Vec::new();
    for _ in 0..30 {
        two_kept_one(&alloc, &s, &mut kept);
        two_temporaries(&alloc, &s);
    }
    let leaks = report::leaks(&alloc.snapshot());
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let l = &leaks[0];
    assert!(l.site.contains("two_kept_one"), "{l:#?}");
    assert!(within(l.steps_per_window, 3.0, 0.01), "30 steps in 10 windows: {l:#?}");
    assert!(within(l.blocks_per_step, 1.0, 0.15), "{l:#?}");
    assert!(within(l.bytes_per_step as f64, (1 << 20) as f64, 0.15), "{l:#?}");
    drop(kept);
}

/// A line whose output lives until the next step's replaces it, then, from the middle of the
/// run, is kept (a list filled from step 20 on): its floor rises once in the first steps and
/// then steadily. Spread over the steps since that first rise, the rate was under half the
/// truth (0.46 blocks a step on the corpus's `leak_starts_late`); measured since the growth
/// began, a block a step.
#[test]
fn a_leak_that_starts_late_is_measured_from_where_it_starts() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let (mut kept, mut last) = (Vec::new(), None);
    for i in 0..40 {
        let y = output(&alloc, &s);
        if i >= 20 {
            kept.push(y);
        } else {
            last = Some(y);
        }
        two_temporaries(&alloc, &s);
    }
    let leaks = report::leaks(&alloc.snapshot());
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let l = &leaks[0];
    assert!(l.site.contains("output"), "{l:#?}");
    assert_eq!(l.blocks, 21, "20 kept and the last replaced one: {l:#?}");
    assert!(within(l.blocks_per_step, 1.0, 0.15), "{l:#?}");
    assert!(within(l.bytes_per_step as f64, (1 << 20) as f64, 0.15), "{l:#?}");
    drop((kept, last));
}

/// One line allocates everything a step does, three tensors of three sizes, and keeps one (as
/// `preds.append(model(x))` with a model of library modules): no other line breaks its runs,
/// so the steps are the repeats of its sizes, not its allocations (which made it 0.34 blocks
/// a step for four kept a step on the corpus's `validation_outputs_across_epochs`, whose step
/// is now a forward pass).
#[test]
fn a_loop_whose_one_line_allocates_counts_the_repeats_of_its_sizes() {
    #[inline(never)]
    fn forward(alloc: &CachingAllocator, s: &Stream) -> Buffer<u8> {
        #[rustfmt::skip]
        let (a, b, c) = (alloc.alloc::<u8>(s, 3 << 20).unwrap(), alloc.alloc::<u8>(s, 2 << 20).unwrap(), alloc.alloc::<u8>(s, 1 << 20).unwrap());
        drop((a, b));
        c
    }
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let kept: Vec<_> = (0..30).map(|_| forward(&alloc, &s)).collect();
    let leaks = report::leaks(&alloc.snapshot());
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let l = &leaks[0];
    assert!(within(l.steps_per_window, 3.0, 0.01), "30 steps in 10 windows: {l:#?}");
    assert!(within(l.blocks_per_step, 1.0, 0.15), "{l:#?}");
    assert!(within(l.bytes_per_step as f64, (1 << 20) as f64, 0.15), "{l:#?}");
    drop(kept);
}

/// A scalar kept each step (`losses.append(loss)`) asks for 4 bytes and holds a 512-byte
/// block: the report gives both, so that "+4 B per step" is not read as all the memory grows
/// by (what `memory_allocated()` counts is the blocks).
#[test]
fn a_scalar_kept_each_step_shows_the_block_it_holds() {
    #[inline(never)]
    fn scalar(alloc: &CachingAllocator, s: &Stream) -> Buffer<f32> {
        alloc.alloc::<f32>(s, 1).unwrap()
    }
    let alloc = CachingAllocator::new(SimBackend::new(1 << 40));
    let s = alloc.default_stream();
    let mut kept = Vec::new();
    for _ in 0..30 {
        kept.push(scalar(&alloc, &s));
        two_temporaries(&alloc, &s);
    }
    let snap = alloc.snapshot();
    let leaks = report::leaks(&snap);
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let l = &leaks[0];
    assert_eq!((l.bytes, l.block_bytes, l.blocks), (120, 30 * 512, 30), "{l:#?}");
    assert!(within(l.bytes_per_step as f64, 4.0, 0.15), "{l:#?}");
    assert!(within(l.block_bytes_per_step as f64, 512.0, 0.15), "{l:#?}");
    // The same figures from the snapshot written as PyTorch's pickle and read back, and from
    // the file a vramscope before format 6 wrote, whose history gave each block's size.
    let pickled = Snapshot::from_pytorch_pickle(&snap.to_pytorch_pickle(), "pickled").unwrap();
    let mut older = snap.clone();
    older.version = 5;
    for e in older.history.iter_mut().filter(|e| e.action != Action::Snapshot) {
        e.size = e.size.next_multiple_of(512);
    }
    for other in [pickled, older] {
        let o = report::leaks(&other);
        assert_eq!(o.len(), 1, "{o:#?}");
        let figures = |l: &report::LeakCandidate| (l.bytes, l.block_bytes, l.bytes_per_step, l.block_bytes_per_step);
        assert_eq!(figures(&o[0]), figures(l), "version {}, {}", other.version, other.backend);
    }
    let text = report::LeakCandidate::render(&leaks);
    assert!(text.contains("held in blocks of 512 B or more: +"), "{text}");
    assert!(text.contains("15.00 KiB at the end"), "{text}");
    // Where requests fill their blocks, no such line.
    assert!(!text.contains("two_temporaries"), "{text}");
    drop(kept);
}
