//! The heap's unit tests: its algorithms on a simulated device, checked block by block.

use super::*;
use crate::backend::{EventMode, SimBackend};

/// A heap of `config` on a sim of 1 TiB, recording nothing.
pub(super) fn heap(config: &str) -> (Heap, SimBackend) {
    heap_with(config, SimBackend::new(1 << 40))
}

fn heap_with(config: &str, sim: SimBackend) -> (Heap, SimBackend) {
    (Heap::new(0, AllocatorConfig::parse(config).unwrap(), RecordConfig::off(), &sim), sim)
}

/// Queues "work" on `stream` (an event the manual sim keeps pending), so that the stream is
/// busy until `sim.synchronize` of it.
fn make_busy(h: &Heap, sim: &SimBackend, stream: StreamId) {
    sim.record_event(h.streams[stream.index()].raw).unwrap();
    assert!(!sim.stream_idle(h.streams[stream.index()].raw).unwrap());
}

#[test]
fn recorded_context_costs_at_most_64_bytes_per_block() {
    // Each block carries its context inline; stacks are interned and shared.
    let per_block = std::mem::size_of::<Option<Context>>();
    assert!(per_block <= 64, "{per_block} bytes");
    assert_eq!(per_block, 24);
}

#[test]
fn rounding_matches_pytorch() {
    let (h, _) = heap("");
    assert_eq!(h.round_size(0), Some(512));
    assert_eq!(h.round_size(512), Some(512));
    assert_eq!(h.round_size(513), Some(1024));
    assert_eq!(h.round_size(u64::MAX), None);
    let (h, _) = heap("roundup_power2_divisions:4");
    assert_eq!(h.round_size(1000), Some(1024), "small sizes round to 512 only");
    assert_eq!(h.round_size(5 << 20), Some(5 << 20), "already on a division");
    assert_eq!(h.round_size((4 << 20) + 1), Some(5 << 20));
    assert_eq!(h.round_size(8 << 20), Some(8 << 20));
}

#[test]
fn an_extra_given_back_comes_again_as_new_and_few_are_kept() {
    let (mut h, _) = heap("");
    let used = || {
        Box::new(Extra {
            uses: vec![StreamId(1), StreamId(2), StreamId(3)],
            lent_to: Some(StreamId(1)),
            from_range: true,
            used_by_owner: true,
            meta: Some(TensorMeta { dtype: "float32".into(), shape: vec![2, 3] }),
        })
    };
    h.recycle_extra(used());
    let e = h.spare_extras.pop().expect("kept");
    assert!(e.uses.is_empty() && e.uses.capacity() >= 3, "emptied, its capacity kept");
    assert_eq!((e.lent_to, e.from_range, e.used_by_owner, e.meta.is_none()), (None, false, false, true));
    for _ in 0..SPARE_EXTRAS + 5 {
        h.recycle_extra(used());
    }
    assert_eq!(h.spare_extras.len(), SPARE_EXTRAS);
}

#[test]
fn segment_sizes_match_pytorch() {
    let (h, _) = heap("");
    assert_eq!(h.segment_size(512), Some(2 << 20));
    assert_eq!(h.segment_size(1 << 20), Some(2 << 20));
    assert_eq!(h.segment_size((1 << 20) + 512), Some(20 << 20));
    assert_eq!(h.segment_size((10 << 20) - 512), Some(20 << 20));
    assert_eq!(h.segment_size((10 << 20) + 512), Some(12 << 20));
    assert_eq!(h.segment_size(u64::MAX - 511), None);
}

#[test]
fn split_and_merge_keep_one_free_block_per_hole() {
    let (mut h, sim) = heap("fragmentation_limit:off");
    let a = h.alloc(&sim, StreamId(0), 1000, None).unwrap();
    let b = h.alloc(&sim, StreamId(0), 1000, None).unwrap();
    let c = h.alloc(&sim, StreamId(0), 1000, None).unwrap();
    assert_eq!(b.addr, a.addr + 1024);
    assert_eq!(h.free.len(), 1, "the rest of the segment");
    h.free(&sim, b.block, None);
    h.settle();
    assert_eq!(h.free.len(), 2, "a hole between a and c");
    h.free(&sim, a.block, None);
    h.settle();
    assert_eq!(h.free.len(), 2, "a merged into the hole");
    h.free(&sim, c.block, None);
    h.settle();
    assert_eq!(h.free.len(), 1, "everything merged back into the segment");
    assert_eq!(h.largest_free(), 2 << 20);
    assert_eq!(h.accounting.stats().inactive_split_bytes.current(), 0);
    h.release_cache(&sim, true);
    assert_eq!(sim.used_memory(), 0);
}

#[test]
fn the_block_freed_last_serves_the_next_request_of_its_size() {
    let (mut h, sim) = heap("");
    let a = h.alloc(&sim, StreamId(0), 1000, None).unwrap();
    let b = h.alloc(&sim, StreamId(0), 1000, None).unwrap();
    h.free(&sim, b.block, None);
    assert_eq!(h.hot, Some(b.block), "kept aside, not merged");
    assert_eq!(h.accounting.stats().active_bytes.current(), 1024, "but no longer counted as active");
    let again = h.alloc(&sim, StreamId(0), 900, None).unwrap();
    assert_eq!((again.block, again.addr), (b.block, b.addr));
    assert_eq!(h.hot, None);
    // Another size merges it first, as an immediate free would have.
    h.free(&sim, again.block, None);
    let big = h.alloc(&sim, StreamId(0), 4096, None).unwrap();
    assert_eq!(big.addr, b.addr, "the merged hole is reused from its start");
    assert_eq!(h.free.len(), 1);
    // A request on another stream does not take it.
    h.free(&sim, big.block, None);
    h.add_stream(1).unwrap();
    let other = h.alloc(&sim, StreamId(1), 4096, None).unwrap();
    assert_ne!(other.addr, big.addr);
    for g in [a, other] {
        h.free(&sim, g.block, None);
    }
    h.settle();
    h.release_cache(&sim, true);
    assert_eq!(sim.used_memory(), 0);
}

/// The heap's whole state in words, for comparing two heaps.
fn state(h: &Heap) -> String {
    let mut s = format!("{h:?}\n{}", h.free.dump());
    if !h.setup.defer_hot {
        s = s.replace("defer_hot: false", "defer_hot: true");
    }
    s
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        stream: usize,
        bytes: u64,
    },
    /// Allocated and freed at once (the pattern the deferral serves).
    Temporary {
        stream: usize,
        bytes: u64,
    },
    Free(usize),
    RecordStream {
        block: usize,
        stream: usize,
    },
    CompleteEvents,
    EmptyCache,
}

fn ops() -> impl proptest::strategy::Strategy<Value = Vec<Op>> {
    use proptest::prelude::*;
    // Few sizes, so that a temporary freed on one stream is often asked for on another.
    let bytes = prop_oneof![Just(512u64), Just(1000), Just(1 << 20), Just(3 << 20), Just(12 << 20), 1u64..(30 << 20)];
    let op = prop_oneof![
        5 => (0..6usize, bytes.clone()).prop_map(|(stream, bytes)| Op::Alloc { stream, bytes }),
        4 => (0..6usize, bytes).prop_map(|(stream, bytes)| Op::Temporary { stream, bytes }),
        5 => any::<usize>().prop_map(Op::Free),
        1 => (any::<usize>(), 0..6usize).prop_map(|(block, stream)| Op::RecordStream { block, stream }),
        1 => Just(Op::CompleteEvents),
        1 => Just(Op::EmptyCache),
    ];
    proptest::collection::vec(op, 1..120)
}

/// Five more streams, for the six that `ops` names.
fn add_streams(h: &mut Heap, backend: &dyn Backend) {
    for _ in 1..6 {
        let raw = backend.create_stream().unwrap();
        h.add_stream(raw).unwrap();
    }
}

/// Applies an `op` other than an allocation to one heap (`live`: its live blocks;
/// `complete`: completes the backend's events).
fn apply_other(h: &mut Heap, backend: &dyn Backend, op: &Op, live: &mut Vec<BlockId>, complete: impl Fn()) {
    match *op {
        Op::Free(i) if !live.is_empty() => {
            let b = live.swap_remove(i % live.len());
            h.free(backend, b, None);
        }
        Op::RecordStream { block, stream } if !live.is_empty() => {
            h.settle();
            h.record_stream(live[block % live.len()], StreamId(stream as u32));
        }
        Op::CompleteEvents => complete(),
        Op::EmptyCache => {
            h.settle();
            h.release_cache(backend, true);
        }
        _ => {}
    }
}

/// A heap on a sim backend (manual events, wrapped so that its stream waits may fail) with
/// six streams, for the property tests that run one sequence on two heaps.
type Twin = (Heap, crate::backend::FaultyBackend<SimBackend>);

/// Applies `op` to both heaps alike (`live` pairs their live blocks); `same` compares the
/// two grants of an allocation before a temporary is freed again.
fn apply_to_both(
    op: &Op,
    (a, sa): &mut Twin,
    (b, sb): &mut Twin,
    live: &mut Vec<(BlockId, BlockId)>,
    same: impl Fn(&Heap, &Grant, &Heap, &Grant) -> bool,
) -> bool {
    match *op {
        Op::Alloc { stream, bytes } | Op::Temporary { stream, bytes } => {
            let ga = a.alloc(&*sa, StreamId(stream as u32), bytes, None).unwrap();
            let gb = b.alloc(&*sb, StreamId(stream as u32), bytes, None).unwrap();
            if !same(a, &ga, b, &gb) {
                return false;
            }
            if matches!(op, Op::Temporary { .. }) {
                a.free(&*sa, ga.block, None);
                b.free(&*sb, gb.block, None);
            } else {
                live.push((ga.block, gb.block));
            }
        }
        Op::Free(i) if !live.is_empty() => {
            let (ba, bb) = live.swap_remove(i % live.len());
            a.free(&*sa, ba, None);
            b.free(&*sb, bb, None);
        }
        Op::RecordStream { block, stream } if !live.is_empty() => {
            let (ba, bb) = live[block % live.len()];
            a.settle();
            b.settle();
            a.record_stream(ba, StreamId(stream as u32));
            b.record_stream(bb, StreamId(stream as u32));
        }
        Op::CompleteEvents => {
            sa.inner().complete_events();
            sb.inner().complete_events();
        }
        Op::EmptyCache => {
            a.settle();
            b.settle();
            a.release_cache(&*sa, true);
            b.release_cache(&*sb, true);
        }
        _ => {}
    }
    true
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 400, ..Default::default() })]

    /// Deferring the merge of the block freed last (`Heap::deferred_hot`) leaves the heap
    /// exactly as merging it first does: after every operation the two heaps, one with
    /// and one without, agree in every block, segment, counter and free list, in order.
    #[test]
    fn deferred_takeover_is_the_merge_and_split(
        ops in ops(),
        config in 0..5usize,
        mapped_pages in proptest::bool::ANY,
        failing_waits in 0..4u64,
    ) {
        use crate::backend::{FaultPlan, FaultyBackend};
        let conf = ["", "fragmentation_limit:off", "max_split_size_mb:40,roundup_power2_divisions:4",
            "fragmentation_limit:1.0,release_pages:false", ""][config];
        let costly = config == 4;
        let make = |defer| {
            let sim = SimBackend::with_events(1 << 40, EventMode::Manual).with_costly_segments(costly);
            let sim = FaultyBackend::new(sim, FaultPlan::Never);
            if failing_waits > 0 {
                // Every few stream waits fail: a take-over that cannot wait must merge and
                // go on exactly as `adopt` does.
                sim.set_wait_plan(FaultPlan::Custom(std::sync::Arc::new(move |i, _| i % (failing_waits + 1) == 0)));
            }
            let mut c = AllocatorConfig::parse(conf).unwrap();
            c.release_pages &= mapped_pages;
            let mut h = Heap::new(0, c, RecordConfig::off(), &sim);
            h.setup.defer_hot = defer;
            for _ in 1..6 {
                let raw = sim.create_stream().unwrap();
                h.add_stream(raw).unwrap();
            }
            (h, sim)
        };
        let (mut a, mut b) = (make(true), make(false));
        let mut live: Vec<(BlockId, BlockId)> = Vec::new();
        for (k, op) in ops.iter().enumerate() {
            let same = apply_to_both(op, &mut a, &mut b, &mut live, |_, ga, _, gb| ga.addr == gb.addr);
            proptest::prop_assert!(same, "grants differ at op {} ({:?})", k, op);
            proptest::prop_assert_eq!(state(&a.0), state(&b.0), "after op {} ({:?})", k, op);
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..Default::default() })]

    /// Where the backend places segments decides nothing: a heap on a sim that hands out
    /// new addresses and one on a sim that reuses the lowest free range (as `cuMemAlloc`
    /// does) make the same choices, so that after every operation each grant has the same
    /// order key (segment in reservation order, offset) and both reserve the same bytes
    /// at the same limit. Ties between free blocks of one size broken by address made
    /// the same trace's peak differ between the sim and the GPU by up to 5%.
    #[test]
    fn placement_does_not_depend_on_segment_addresses(
        ops in ops(),
        config in 0..5usize,
    ) {
        use crate::backend::{FaultPlan, FaultyBackend};
        let conf = ["", "release_pages:false", "max_split_size_mb:40", "fragmentation_limit:1.0",
            "max_split_size_mb:40,max_non_split_rounding_mb:100,release_pages:false"][config];
        let make = |reuse: bool| {
            let sim = SimBackend::with_events(1 << 40, EventMode::Manual).with_costly_segments(true);
            let sim = FaultyBackend::new(if reuse { sim.reusing_addresses() } else { sim }, FaultPlan::Never);
            let mut h = Heap::new(0, AllocatorConfig::parse(conf).unwrap(), RecordConfig::off(), &sim);
            for _ in 1..6 {
                let raw = sim.create_stream().unwrap();
                h.add_stream(raw).unwrap();
            }
            (h, sim)
        };
        let (mut a, mut b) = (make(false), make(true));
        let mut live: Vec<(BlockId, BlockId)> = Vec::new();
        for (k, op) in ops.iter().enumerate() {
            let same = apply_to_both(op, &mut a, &mut b, &mut live, |ha, ga, hb, gb| {
                placed(ha, ga.block) == placed(hb, gb.block)
            });
            proptest::prop_assert!(same, "grants differ at op {} ({:?})", k, op);
            proptest::prop_assert_eq!(a.0.reserved(), b.0.reserved(), "after op {} ({:?})", k, op);
            proptest::prop_assert_eq!(a.0.fragmentation_limit(), b.0.fragmentation_limit());
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..Default::default() })]

    /// Under a cap (`per_process_memory_fraction`: 40 MiB of the sim's 1 TiB), random
    /// requests of up to 30 MiB on six streams, with either segment kind, PyTorch's split
    /// rules or no soft limit: reserved never passes the cap, a refused request changes no
    /// live block and no count of allocated bytes, and every invariant holds after every
    /// operation. (About 180 of the 300 sequences have a request refused.)
    #[test]
    fn a_cap_holds_and_a_refusal_loses_nothing(
        ops in ops(),
        config in 0..5usize,
    ) {
        use crate::backend::{FaultPlan, FaultyBackend};
        let fraction = (40u64 << 20) as f64 / (1u64 << 40) as f64;
        let conf = ["", "release_pages:false", "max_split_size_mb:40", "fragmentation_limit:off", "alias_pages:True"]
            [config];
        let conf = format!("{conf},per_process_memory_fraction:{fraction:?}");
        let sim = SimBackend::with_events(1 << 40, EventMode::Manual).with_costly_segments(true);
        let sim = FaultyBackend::new(sim, FaultPlan::Never);
        let mut h = Heap::new(0, AllocatorConfig::parse(&conf).unwrap(), RecordConfig::off(), &sim);
        add_streams(&mut h, &sim);
        let mut live: Vec<BlockId> = Vec::new();
        for (k, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc { stream, bytes } | Op::Temporary { stream, bytes } => {
                    let before = (h.accounting.stats().allocated_bytes.current(), live.len());
                    match h.alloc(&sim, StreamId(stream as u32), bytes, None) {
                        Ok(g) if matches!(op, Op::Temporary { .. }) => h.free(&sim, g.block, None),
                        Ok(g) => live.push(g.block),
                        Err(Error::OutOfMemory(r)) => {
                            proptest::prop_assert_eq!(r.allowed, Some(40 << 20));
                            proptest::prop_assert_eq!(before, (h.accounting.stats().allocated_bytes.current(), live.len()));
                        }
                        Err(e) => proptest::prop_assert!(false, "op {}: {}", k, e),
                    }
                }
                _ => apply_other(&mut h, &sim, op, &mut live, || sim.inner().complete_events()),
            }
            proptest::prop_assert!(h.reserved() <= 40 << 20, "op {} ({:?}): {} reserved", k, op, h.reserved());
            // The invariants are those of a settled heap (as `check_invariants` checks).
            h.settle();
            if let Err(e) = check_heap(&h) {
                proptest::prop_assert!(false, "op {} ({:?}): {}", k, op, e);
            }
        }
    }
}

/// Where live block `b` stands, whatever the addresses: its order key, or for a view's
/// block those of the range's blocks that hold its runs.
fn placed(h: &Heap, b: BlockId) -> Vec<u64> {
    match h.views.all().iter().find(|v| v.block == b) {
        Some(v) => v.held.iter().map(|&held| h.order_key(held)).collect(),
        None => vec![h.order_key(b)],
    }
}

/// The memory behind live block `b`, as ranges of the segments' addresses: a view's block
/// is the range's memory its runs name (they hold its size in whole pages, which
/// `check_heap` checks).
fn memory_of(h: &Heap, b: BlockId) -> Vec<(u64, u64)> {
    let blk = &h.blocks[b];
    match h.views.all().iter().find(|v| v.block == b) {
        Some(v) => v.runs.iter().map(|&(p, len)| (p, p + len)).collect(),
        None => vec![(blk.addr, blk.addr + blk.size)],
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..Default::default() })]

    /// With views of the range's mappings (`alias.rs`), no two live buffers share memory, a
    /// view's memory is the range's and mapped, the books hold after every operation, and
    /// the backend holds exactly the views the heap keeps.
    #[test]
    fn views_never_hand_out_memory_twice(ops in ops(), streams in 1..4usize, limit in 0..2usize, scale in 0..2u32) {
        // One stream most often: views are made for the stream whose range grows.
        let sim = SimBackend::with_events(1 << 40, EventMode::Manual).with_costly_segments(true);
        let (mut h, sim) = heap_with(["alias_pages:True", "alias_pages:True,fragmentation_limit:off"][limit], sim);
        add_streams(&mut h, &sim);
        let mut live: Vec<BlockId> = Vec::new();
        for (k, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc { stream, bytes } | Op::Temporary { stream, bytes } => {
                    let stream = if stream < 3 { 0 } else { stream % streams };
                    // Sixteen times larger, growths over 128 MiB map mappings of several
                    // pages, which views then map whole.
                    let bytes = bytes << (4 * scale);
                    let g = h.alloc(&sim, StreamId(stream as u32), bytes, None).unwrap();
                    proptest::prop_assert!(!h.blocks[g.block].view || g.lent, "a view's block is never parked");
                    if matches!(op, Op::Temporary { .. }) {
                        h.free(&sim, g.block, None);
                    } else {
                        live.push(g.block);
                    }
                }
                _ => apply_other(&mut h, &sim, op, &mut live, || sim.complete_events()),
            }
            h.settle();
            if let Err(e) = check_heap(&h) {
                proptest::prop_assert!(false, "op {} ({:?}): {}", k, op, e);
            }
            let mut memory: Vec<(u64, u64)> = live.iter().flat_map(|&b| memory_of(&h, b)).collect();
            memory.sort_unstable();
            for w in memory.windows(2) {
                proptest::prop_assert!(w[0].1 <= w[1].0, "op {} ({:?}): {:x?} and {:x?} overlap", k, op, w[0], w[1]);
            }
            proptest::prop_assert_eq!(sim.views(), h.views.all().len(), "op {}", k);
        }
    }
}

#[test]
fn a_temporary_on_each_new_stream_is_handed_out_without_merging() {
    // The benchmark's pattern: the block freed last on one stream is the segment's front,
    // and the next stream takes that segment over. Segments that do not grow (no pages
    // given back), so that the first stream's small block is in the small pool too.
    let (mut h, sim) = heap("release_pages:false");
    let mut last = None;
    for _ in 0..200 {
        let raw = sim.create_stream().unwrap();
        let s = h.add_stream(raw).unwrap();
        let deferred = h.deferred_hot(Pool::Small, s, 512).is_some();
        let g = h.alloc(&sim, s, 512, None).unwrap();
        if let Some((block, addr)) = last {
            assert!(deferred, "the block freed last is deferred");
            assert_eq!((g.block, g.addr), (block, addr), "and handed out again");
        }
        h.free(&sim, g.block, None);
        last = Some((g.block, g.addr));
    }
    assert_eq!(h.accounting.stats().num_segment_adoptions, 199);
    assert_eq!(h.reserved(), 2 << 20, "one segment throughout");
    h.settle();
    crate::alloc::heap::check_heap(&h).unwrap();
}

#[test]
fn one_stream_that_grows_serves_small_and_large_requests_from_one_range() {
    let (mut h, sim) = heap_with("", SimBackend::with_events(1 << 40, EventMode::Manual));
    let s = StreamId(0);
    // Small requests, 3 MiB of them, then all freed: their pages serve a large request.
    let small: Vec<Grant> = (0..6).map(|_| h.alloc(&sim, s, 512 << 10, None).unwrap()).collect();
    let seg = h.blocks[small[0].block].segment;
    assert!(small.iter().all(|g| h.blocks[g.block].segment == seg), "one segment");
    assert_eq!(h.segments[seg].pool, Pool::Large);
    for g in small {
        h.free(&sim, g.block, None);
    }
    h.settle();
    let reserved = h.reserved();
    assert_eq!(reserved, 4 << 20, "two pages: 2 MiB reserved, then grown by one");
    let big = h.alloc(&sim, s, 3 << 20, None).unwrap();
    assert_eq!((h.reserved(), h.blocks[big.block].segment), (reserved, seg), "no more memory");
    // A sliver under 1 MiB is split off a large block there, for small requests to use.
    let tail = h.blocks[big.block].next.expect("the rest of the range is a block of its own");
    assert_eq!((h.blocks[tail].state, h.blocks[tail].size), (BlockState::Free, 1 << 20));
    crate::alloc::heap::check_heap(&h).unwrap();
    // Once another stream holds a large segment (asked for while the range's stream was
    // busy: see `Heap::serve_from_range`), small requests go to the small pool.
    let s1 = h.add_stream(sim.create_stream().unwrap()).unwrap();
    make_busy(&h, &sim, s);
    let other = h.alloc(&sim, s1, 3 << 20, None).unwrap();
    assert_ne!(h.blocks[other.block].segment, seg);
    let g = h.alloc(&sim, s, 512, None).unwrap();
    assert_eq!(h.segments[h.blocks[g.block].segment].pool, Pool::Small);
    crate::alloc::heap::check_heap(&h).unwrap();
}

#[test]
fn another_streams_large_requests_are_served_from_the_range_while_its_stream_is_idle() {
    let (mut h, sim) = heap_with("fragmentation_limit:off", SimBackend::with_events(1 << 40, EventMode::Manual));
    let s = StreamId(0);
    let a = h.alloc(&sim, s, 12 << 20, None).unwrap();
    let seg = h.blocks[a.block].segment;
    assert!(h.segments[seg].room > 0, "stream 0 holds the range");
    h.free(&sim, a.block, None);
    h.settle();
    let reserved = h.reserved();
    // Stream 0 is idle: stream 1's large request takes the range's free block, lent.
    let s1 = h.add_stream(sim.create_stream().unwrap()).unwrap();
    let b = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert_eq!((b.addr, b.lent, h.reserved()), (a.addr, true, reserved), "the range's hole, lent");
    assert_eq!(h.streams[s1.index()].segments, [0, 0], "stream 1 reserved nothing");
    // Beyond what the range holds free, the range grows for it, as for its owner.
    let c = h.alloc(&sim, s1, 16 << 20, None).unwrap();
    assert_eq!((h.blocks[c.block].segment, c.lent), (seg, true));
    assert_eq!(h.reserved(), reserved + (12 << 20), "grown by what its free end lacked");
    // Small requests keep a small segment of the stream's own (no loan: see `park`).
    let small = h.alloc(&sim, s1, 512, None).unwrap();
    assert!(!small.lent);
    assert_eq!(h.segments[h.blocks[small.block].segment].pool, Pool::Small);
    crate::alloc::heap::check_heap(&h).unwrap();
    // Freed while stream 1 is idle, a loan is back in the range at once.
    h.free(&sim, b.block, None);
    assert_eq!(h.blocks[b.block].state, BlockState::Free);
    assert!(!h.has_pending());
    // Stream 1 was idle when last asked: its next loan goes back unasked, even while its
    // work runs (its own requests may take it: their work runs after). Stream 0's next
    // request asks, finds stream 1 busy, and orders stream 0 after it.
    let b2 = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert_eq!((b2.addr, b2.lent), (a.addr, true));
    make_busy(&h, &sim, s1);
    h.free(&sim, b2.block, None);
    assert_eq!((h.blocks[b2.block].state, h.streams.unchecked().0), (BlockState::Free, 1 << 1));
    let again = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert_eq!((again.addr, h.streams.unchecked().0), (a.addr, 1 << 1), "its own request needs no answer");
    h.free(&sim, again.block, None);
    assert!(h.streams[s.index()].free_blocks_settled());
    let x = h.alloc(&sim, s, 4 << 20, None).unwrap();
    assert_eq!(h.streams.unchecked().0, 0, "asked");
    assert!(!h.streams[s1.index()].last_idle);
    assert!(!h.streams[s.index()].free_blocks_settled(), "stream 0 ordered after stream 1");
    h.free(&sim, x.block, None);
    // Seen busy, its loans freed while its work runs wait for an event on stream 1; the
    // owner's own stream is not ordered after stream 1.
    make_busy(&h, &sim, s1);
    h.free(&sim, c.block, None);
    assert_eq!(h.blocks[c.block].state, BlockState::PendingFree);
    let d = h.alloc(&sim, s, 16 << 20, None).unwrap();
    assert_ne!(d.addr, c.addr, "still stream 1's");
    sim.synchronize(h.streams[s1.index()].raw).unwrap();
    h.free(&sim, d.block, None);
    let e = h.alloc(&sim, s, 1 << 20, None).unwrap();
    assert!(!h.has_pending(), "the wait is over");
    h.settle();
    crate::alloc::heap::check_heap(&h).unwrap();
    // While stream 0 has work queued, stream 1 goes its own way: a segment of its own.
    make_busy(&h, &sim, s);
    let f = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert!(!f.lent);
    assert_ne!(h.blocks[f.block].segment, seg);
    assert_eq!(h.streams[s1.index()].segments[Pool::Large as usize], 1);
    for g in [e, f, small] {
        h.free(&sim, g.block, None);
    }
    h.settle();
    crate::alloc::heap::check_heap(&h).unwrap();
}

/// A heap whose stream 0 holds a range with a free 12 MiB hole at its start (returned), and
/// a second stream, with events completed by hand.
fn range_with_a_hole_and_another_stream() -> (Heap, SimBackend, Grant, StreamId) {
    let (mut h, sim) = heap_with("fragmentation_limit:off", SimBackend::with_events(1 << 40, EventMode::Manual));
    let a = h.alloc(&sim, StreamId(0), 12 << 20, None).unwrap();
    h.free(&sim, a.block, None);
    h.settle();
    let s1 = h.add_stream(sim.create_stream().unwrap()).unwrap();
    (h, sim, a, s1)
}

#[test]
fn the_range_lends_free_blocks_settled_since_its_stream_was_seen_idle_without_asking_again() {
    let (mut h, sim, a, s1) = range_with_a_hole_and_another_stream();
    let s = StreamId(0);
    // The first loan asks whether stream 0 is idle (it is: seen idle from here).
    let b = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert_eq!((b.addr, b.lent), (a.addr, true));
    // Back from an idle borrower, the block leaves stream 0's free blocks settled.
    h.free(&sim, b.block, None);
    assert!(h.streams[s.index()].free_blocks_settled());
    // Stream 0 has work queued now, but none of it can touch a block that was free when
    // it was seen idle: the loan stands without asking.
    make_busy(&h, &sim, s);
    let c = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert_eq!((c.addr, c.lent), (a.addr, true), "a settled free block, lent while stream 0 is busy");
    h.free(&sim, c.block, None);
    // Growing the range for stream 1 would order it after stream 0's work: not while busy.
    let big = h.alloc(&sim, s1, 64 << 20, None).unwrap();
    assert!(!big.lent && h.blocks[big.block].segment != h.blocks[a.block].segment);
    // A block freed on stream 0 while its work runs unsettles its free blocks: the next
    // loan asks, and stream 0 being busy, stream 1 goes its own way.
    let d = h.alloc(&sim, s, 2 << 20, None).unwrap();
    h.free(&sim, d.block, None);
    assert!(!h.streams[s.index()].free_blocks_settled());
    let e = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert!(!e.lent, "stream 0 busy, its free blocks unsettled");
    // Seen idle again, it lends again (14 MiB: more than stream 1's own segments hold
    // free, 12 MiB beside `e`).
    sim.synchronize(h.streams[s.index()].raw).unwrap();
    let f = h.alloc(&sim, s1, 14 << 20, None).unwrap();
    assert!(f.lent);
    assert!(h.streams[s.index()].free_blocks_settled());
    for g in [big, e, f] {
        h.free(&sim, g.block, None);
    }
    h.settle();
    crate::alloc::heap::check_heap(&h).unwrap();
}

#[test]
fn a_request_asks_about_a_loan_given_back_unasked_only_where_it_takes_it() {
    let (mut h, sim) = heap_with("fragmentation_limit:off", SimBackend::with_events(1 << 40, EventMode::Manual));
    let s = StreamId(0);
    // Stream 0's range: an 8 MiB hole, a live block, a 20 MiB hole, a live block.
    let [a, b, c, d] = [8u64, 2, 20, 2].map(|mib| h.alloc(&sim, s, mib << 20, None).unwrap());
    h.free(&sim, a.block, None);
    h.free(&sim, c.block, None);
    h.settle();
    let s1 = h.add_stream(sim.create_stream().unwrap()).unwrap();
    // Stream 1 borrows the 8 MiB hole; idle when asked at its first free, its next loan goes
    // back unasked while its work runs.
    let first = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert_eq!((first.addr, first.lent), (a.addr, true));
    h.free(&sim, first.block, None);
    let loan = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert_eq!(loan.addr, a.addr);
    make_busy(&h, &sim, s1);
    h.free(&sim, loan.block, None);
    assert_eq!(h.streams.unchecked().0, 1 << 1);
    // Stream 0's request that the 20 MiB hole serves takes none of the loan: no question.
    let asked = h.accounting.stats().num_stream_queries;
    let far = h.alloc(&sim, s, 16 << 20, None).unwrap();
    assert_eq!(far.addr, c.addr);
    assert_eq!((h.accounting.stats().num_stream_queries, h.streams.unchecked().0), (asked, 1 << 1), "not asked");
    // The request that takes the loan's memory asks, finds stream 1 busy, and orders stream
    // 0 after it.
    let near = h.alloc(&sim, s, 8 << 20, None).unwrap();
    assert_eq!(near.addr, a.addr);
    assert_eq!((h.accounting.stats().num_stream_queries, h.streams.unchecked().0), (asked + 1, 0), "asked once");
    assert!(!h.streams[s1.index()].last_idle);
    assert!(!h.streams[s.index()].free_blocks_settled(), "stream 0 ordered after stream 1");
    for g in [b, d, far, near] {
        h.free(&sim, g.block, None);
    }
    h.settle();
    crate::alloc::heap::check_heap(&h).unwrap();
}

#[test]
fn a_loan_used_on_its_owners_stream_is_not_lent_again_while_that_work_runs() {
    // Found by `tests/shadow_model.rs` (1,000 cases of up to 3,000 operations) in the
    // first version of the rule above, which took every loan back from an idle borrower
    // as untouched: the owner's stream may use a loan too (`record_stream` with the owner's
    // stream needs no event), and its work may still run when the loan comes back.
    let (mut h, sim, a, s1) = range_with_a_hole_and_another_stream();
    let s = StreamId(0);
    let s2 = h.add_stream(sim.create_stream().unwrap()).unwrap();
    let b = h.alloc(&sim, s1, 8 << 20, None).unwrap();
    assert_eq!((b.addr, b.lent), (a.addr, true));
    h.record_stream(b.block, s);
    make_busy(&h, &sim, s);
    h.free(&sim, b.block, None);
    assert!(!h.streams[s.index()].free_blocks_settled(), "stream 0's work on the loan may still run");
    let c = h.alloc(&sim, s2, 8 << 20, None).unwrap();
    assert!(!c.lent && c.addr != b.addr, "stream 2 goes its own way");
    h.free(&sim, c.block, None);
    h.settle();
    crate::alloc::heap::check_heap(&h).unwrap();
}

/// Stream 1 borrows 8 MiB of stream 0's 12 MiB free block twice: seen idle at its first
/// loan's free, it gives its second back unasked while its work runs (with `elsewhere`,
/// the loan was recorded on stream 2 too, and so waits for its event). Then every wait
/// fails. Returns the heap, its backend, the loans' address, the block that holds it now
/// (the second loan's, or the free block it merged into) and the streams.
fn unasked_loan_then_waits_fail(
    elsewhere: bool,
) -> (Heap, crate::backend::FaultyBackend<SimBackend>, u64, BlockId, [StreamId; 3]) {
    use crate::backend::{FaultPlan, FaultyBackend};
    let events = SimBackend::with_events(1 << 40, EventMode::Manual);
    let sim = FaultyBackend::new(events, FaultPlan::Never);
    let config = AllocatorConfig::parse("fragmentation_limit:off").unwrap();
    let mut h = Heap::new(0, config, RecordConfig::off(), &sim);
    let s = StreamId(0);
    let a = h.alloc(&sim, s, 12 << 20, None).unwrap();
    h.free(&sim, a.block, None);
    h.settle();
    let s1 = h.add_stream(sim.create_stream().unwrap()).unwrap();
    let s2 = h.add_stream(sim.create_stream().unwrap()).unwrap();
    let mut loan = a.block;
    for busy in [false, true] {
        let b = h.alloc(&sim, s1, 8 << 20, None).unwrap();
        assert_eq!((b.addr, b.lent), (a.addr, true));
        if busy && elsewhere {
            h.record_stream(b.block, s2);
        }
        if busy {
            make_busy(&h, sim.inner(), s1);
        }
        h.free(&sim, b.block, None);
        // Given back unasked, the loan merges into the free block it came from, unless it
        // still waits for stream 2's event.
        loan = if elsewhere { b.block } else { a.block };
    }
    assert_eq!(h.blocks[loan].addr, a.addr);
    assert_eq!(h.streams.unchecked().0, 1 << 1);
    sim.set_wait_plan(FaultPlan::From(0));
    (h, sim, a.addr, loan, [s, s1, s2])
}

#[test]
fn loans_given_back_unasked_stay_out_of_use_where_their_stream_cannot_be_waited_for() {
    // Found by `tests/shadow_model.rs` (1,000 cases of up to 3,000 operations, waits
    // failing at random) in the first version of `Heap::check_returns`, which only noted
    // the error: another stream was then handed memory the borrower's work still used.
    let (mut h, sim, addr, loan, [_, _, s2]) = unasked_loan_then_waits_fail(false);
    // Stream 2's request asks: stream 1 is busy, and neither ordering stream 0 after it
    // nor synchronizing it works. The memory stream 1 gave back stays out of use.
    let c = h.alloc(&sim, s2, 8 << 20, None).unwrap();
    assert_ne!(c.addr, addr, "not the memory stream 1's work may still use");
    assert_eq!(h.blocks[loan].state, BlockState::Stranded);
    assert!(h.accounting.stats().num_backend_errors >= 2, "the failed order and synchronize are noted");
    assert_eq!((h.streams.unchecked().0, h.streams.unchecked().1.len()), (0, 0));
    h.free(&sim, c.block, None);
    h.settle();
    crate::alloc::heap::check_heap(&h).unwrap();
}

#[test]
fn a_loan_given_back_unasked_and_waiting_for_another_stream_stays_out_of_use_too() {
    // Found by `tests/shadow_model.rs` in CI (20,000 cases, waits failing at random): a
    // loan also used on another stream went back unasked still waiting for that stream's
    // event; the borrower could then be neither waited for nor synchronized, and only
    // free blocks were kept out of use, so the wait ended among the owner's free blocks.
    let (mut h, sim, addr, loan, [s, _, s2]) = unasked_loan_then_waits_fail(true);
    assert_eq!(h.blocks[loan].state, BlockState::PendingFree);
    let c = h.alloc(&sim, s2, 8 << 20, None).unwrap();
    assert_eq!(h.blocks[loan].state, BlockState::Stranded);
    // Stream 2's event completes: the block stays out of use, even for its owner.
    sim.set_wait_plan(crate::backend::FaultPlan::Never);
    sim.inner().complete_events();
    let d = h.alloc(&sim, s, 8 << 20, None).unwrap();
    assert_ne!(d.addr, addr, "not the memory stream 1's work may still use");
    assert_eq!(h.blocks[loan].state, BlockState::Stranded);
    for x in [c, d] {
        h.free(&sim, x.block, None);
    }
    h.settle();
    crate::alloc::heap::check_heap(&h).unwrap();
}

#[test]
fn the_free_end_of_a_growing_range_is_taken_last() {
    // Without views, which would serve the 13 MiB request below from the hole's pages.
    let sim = SimBackend::with_events(1 << 40, EventMode::Manual);
    let (mut h, sim) = heap_with("fragmentation_limit:off,alias_pages:false", sim);
    let s = StreamId(0);
    // A 12 MiB hole at the start of the range, then 1.5 MiB in use, then a free end of
    // 0.5 MiB (the range grew by a whole page for the 1.5 MiB).
    let a = h.alloc(&sim, s, 12 << 20, None).unwrap();
    let b = h.alloc(&sim, s, 3 << 19, None).unwrap();
    h.free(&sim, a.block, None);
    h.settle();
    let end = h.blocks[b.block].next.expect("a free end");
    assert_eq!((h.blocks[end].state, h.blocks[end].size), (BlockState::Free, 1 << 19));
    assert!(h.is_wilderness(end, s));
    // 256 KiB fit the free end best, but the hole serves it: the end stays whole.
    let c = h.alloc(&sim, s, 1 << 18, None).unwrap();
    assert_eq!(c.addr, a.addr, "the hole, not the free end");
    assert_eq!(h.blocks[end].size, 1 << 19);
    // With nothing else that fits, the free end serves.
    let d = h.alloc(&sim, s, 13 << 20, None).unwrap();
    assert_eq!(d.addr, b.addr + (3 << 19), "the free end, grown by what it lacked");
    crate::alloc::heap::check_heap(&h).unwrap();
    // Another stream's large segment is reserved without room, and the range still grows:
    // its free end is still taken last (for a large request; small ones go to the small
    // pool once another stream holds a segment). The range's stream is busy when the
    // other asks, or the range would serve it (`Heap::serve_from_range`).
    let s1 = h.add_stream(sim.create_stream().unwrap()).unwrap();
    make_busy(&h, &sim, s);
    let other = h.alloc(&sim, s1, 3 << 20, None).unwrap();
    assert_eq!(h.segments[h.blocks[other.block].segment].room, 0);
    let end = h.blocks[d.block].next.expect("a free end");
    assert!(h.is_wilderness(end, s) && h.may_grow_in_place(Pool::Large, s));
    assert!(!h.may_grow_in_place(Pool::Large, s1), "one range grows at a time");
    let other_end = h.blocks[other.block].next.expect("the rest of its segment");
    assert!(!h.is_wilderness(other_end, s1), "a segment without room has no wilderness");
    let hole = h.blocks[c.block].next.expect("the hole's rest");
    assert!(h.blocks[hole].size > h.blocks[end].size, "the hole is larger");
    let e = h.alloc(&sim, s, 5 << 18, None).unwrap();
    assert_eq!(e.addr, c.addr + (1 << 18), "the hole, not the free end");
    crate::alloc::heap::check_heap(&h).unwrap();
}

#[test]
fn soft_limit_follows_the_peak_of_allocated_bytes() {
    let (mut h, sim) = heap("fragmentation_limit:1.5");
    let a = h.alloc(&sim, StreamId(0), 10 << 20, None).unwrap();
    assert_eq!(h.soft_limit(&sim, 0), 15 << 20);
    h.free(&sim, a.block, None);
    assert_eq!(h.soft_limit(&sim, 0), 15 << 20, "the limit keeps the peak");
    assert_eq!(h.soft_limit(&sim, 20 << 20), 30 << 20, "and counts the request");
    let (h, sim) = heap("fragmentation_limit:off,garbage_collection_threshold:0.5");
    assert_eq!(h.soft_limit(&sim, 0), 1 << 39);
}
