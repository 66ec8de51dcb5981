//! Property tests of the allocator's invariants under random alloc/free/record_stream
//! sequences over several streams, on one thread and on several.

use proptest::prelude::*;
use std::sync::Arc;
use vramscope::{backend::EventMode, backend::HostBackend, backend::SimBackend, Buffer, CachingAllocator, Stream};

#[derive(Debug, Clone)]
enum Op {
    Alloc { stream: usize, bytes: usize },
    Free(usize),
    RecordStream { buffer: usize, stream: usize },
    Synchronize(usize),
    CompleteEvents,
    EmptyCache,
}

/// Sizes from 1 byte to 96 MiB, log-uniform, with a bias towards a few repeated sizes.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        (0u32..27).prop_flat_map(|e| (1usize << e)..=(3usize << e)),
        Just(512usize),
        Just(1 << 20),
        Just(4 << 20),
    ]
}

fn op(streams: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..streams, size()).prop_map(|(stream, bytes)| Op::Alloc { stream, bytes }),
        4 => any::<usize>().prop_map(Op::Free),
        2 => (any::<usize>(), 0..streams).prop_map(|(buffer, stream)| Op::RecordStream { buffer, stream }),
        1 => (0..streams).prop_map(Op::Synchronize),
        1 => Just(Op::CompleteEvents),
        1 => Just(Op::EmptyCache),
    ]
}

use crate::common_configs::configs;

/// No two live buffers overlap.
fn check_disjoint(live: &[(Buffer<u8>, usize)]) {
    let mut ranges: Vec<(u64, u64)> =
        live.iter().map(|(b, _)| (b.device_ptr(), b.device_ptr() + b.num_bytes())).collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "live buffers overlap: {:x?} and {:x?}", w[0], w[1]);
    }
}

/// Allocations made and the bytes they asked for, counted by the test (the ground truth for
/// the allocator's accumulated totals, which threads' parked round trips reach only at a pull).
#[derive(Default)]
struct Made {
    allocations: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
}

impl Made {
    fn count(&self, bytes: usize) {
        if bytes > 0 {
            self.allocations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.bytes.fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn check(&self, alloc: &CachingAllocator) {
        let stats = alloc.stats();
        let made = (
            self.allocations.load(std::sync::atomic::Ordering::Relaxed),
            self.bytes.load(std::sync::atomic::Ordering::Relaxed),
        );
        assert_eq!((stats.allocation.all.allocated, stats.requested_bytes.all.allocated), made);
    }
}

/// With `quiet`, nothing is recorded: threads park and take their blocks without the lock.
fn allocator(sim: &Arc<SimBackend>, config: vramscope::config::AllocatorConfig, quiet: bool) -> CachingAllocator {
    let alloc = CachingAllocator::with_config(sim.clone(), config).unwrap();
    if quiet {
        alloc.record_memory_history(vramscope::record::RecordConfig::off());
        // Park on every free, not only where the lock is busy: these tests check parking.
        alloc.park_always();
    }
    alloc
}

/// Whether to check after op `k`: after every op, or with `quiet` after every fifth (a check
/// takes the lock, which pulls every parked block back: checking every op, nothing would stay
/// parked for a later request to take).
fn check_after(k: usize, quiet: bool) -> bool {
    !quiet || k % 5 == 4
}

fn run_ops(alloc: &CachingAllocator, sim: &SimBackend, streams: &[Stream], ops: &[Op], quiet: bool) {
    let mut live: Vec<(Buffer<u8>, usize)> = Vec::new();
    let made = Made::default();
    for (k, op) in ops.iter().enumerate() {
        match op {
            Op::Alloc { stream, bytes } => {
                let b = alloc.alloc::<u8>(&streams[*stream], *bytes).expect("the sim device is large enough");
                assert_eq!(b.num_bytes(), *bytes as u64);
                made.count(*bytes);
                live.push((b, *stream));
            }
            Op::Free(i) if !live.is_empty() => drop(live.swap_remove(i % live.len())),
            Op::RecordStream { buffer, stream } if !live.is_empty() => {
                let (b, _) = &live[buffer % live.len()];
                alloc.record_stream(b, streams[*stream]).unwrap();
            }
            Op::Synchronize(s) => alloc.synchronize(streams[*s]).unwrap(),
            Op::CompleteEvents => sim.complete_events(),
            Op::EmptyCache => alloc.empty_cache(),
            _ => {}
        }
        check_disjoint(&live);
        if !check_after(k, quiet) {
            continue;
        }
        if let Err(e) = alloc.check_invariants() {
            panic!("after op {k} ({op:?}): {e}");
        }
        check_snapshot_segments(alloc);
        let live_bytes: u64 = live.iter().map(|(b, _)| b.num_bytes()).sum();
        assert_eq!(alloc.stats().requested_bytes.all.current, live_bytes);
        assert!(alloc.memory_allocated() >= live_bytes);
        assert!(alloc.memory_reserved() >= alloc.memory_allocated());
        made.check(alloc);
    }
    drop(live);
    made.check(alloc);
}

/// A snapshot lists the memory held and only it: one segment per contiguous mapped range (as
/// PyTorch's snapshot does for its expandable segments), the segments' sizes summing to the
/// bytes reserved, each tiled by its blocks; read back from PyTorch's pickle, the same.
fn check_snapshot_segments(alloc: &CachingAllocator) {
    let snap = alloc.snapshot();
    let listed: u64 = snap.segments.iter().map(|s| s.total_size).sum();
    assert_eq!(listed, alloc.memory_reserved(), "the segments' sizes are the bytes reserved");
    for s in &snap.segments {
        assert_eq!(s.mapped_size, s.total_size, "segment at {:#x}: wholly mapped", s.address);
        assert_eq!(s.blocks.iter().map(|b| b.size).sum::<u64>(), s.total_size, "segment at {:#x}", s.address);
    }
    let back = vramscope::Snapshot::from_pytorch_pickle(&snap.to_pytorch_pickle(), "invariants").unwrap();
    let ranges = |s: &vramscope::Snapshot| s.segments.iter().map(|g| (g.address, g.total_size)).collect::<Vec<_>>();
    assert_eq!(ranges(&back), ranges(&snap));
}

fn finish(alloc: &CachingAllocator, sim: &SimBackend) {
    assert_eq!(alloc.memory_allocated(), 0);
    sim.complete_events();
    alloc.empty_cache();
    alloc.check_invariants().unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.reserved_bytes.all.current, 0, "{stats:#?}");
    assert_eq!(stats.active_bytes.all.current, 0);
    assert_eq!(stats.segment.all.current, 0);
    assert_eq!(sim.used_memory(), 0, "the backend still holds memory");
    assert_eq!(stats.allocation.all.allocated, stats.allocation.all.freed);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_on_one_thread(
        config in configs(),
        quiet in any::<bool>(),
        ops in prop::collection::vec(op(3), 1..250),
    ) {
        let sim = Arc::new(SimBackend::with_events(1 << 40, EventMode::Manual));
        let alloc = allocator(&sim, config, quiet);
        let streams = [alloc.default_stream(), alloc.new_stream().unwrap(), alloc.new_stream().unwrap()];
        run_ops(&alloc, &sim, &streams, &ops, quiet);
        finish(&alloc, &sim);
    }

    #[test]
    fn invariants_hold_across_threads(
        config in configs(),
        quiet in any::<bool>(),
        per_thread in prop::collection::vec(prop::collection::vec(op(2), 1..120), 2..5),
    ) {
        let sim = Arc::new(SimBackend::with_events(1 << 40, EventMode::Manual));
        let alloc = allocator(&sim, config, quiet);
        let streams = [alloc.default_stream(), alloc.new_stream().unwrap()];
        let made = Made::default();
        std::thread::scope(|scope| {
            for ops in &per_thread {
                let (alloc, sim, made) = (&alloc, &sim, &made);
                scope.spawn(move || {
                    let mut live: Vec<Buffer<u8>> = Vec::new();
                    for (k, op) in ops.iter().enumerate() {
                        match op {
                            Op::Alloc { stream, bytes } => {
                                live.push(alloc.alloc::<u8>(&streams[*stream], *bytes).unwrap());
                                made.count(*bytes);
                            }
                            Op::Free(i) if !live.is_empty() => drop(live.swap_remove(i % live.len())),
                            Op::RecordStream { buffer, stream } if !live.is_empty() => {
                                alloc.record_stream(&live[buffer % live.len()], streams[*stream]).unwrap();
                            }
                            Op::Synchronize(s) => alloc.synchronize(streams[*s]).unwrap(),
                            Op::CompleteEvents => sim.complete_events(),
                            Op::EmptyCache => alloc.empty_cache(),
                            _ => {}
                        }
                        if check_after(k, quiet) {
                            alloc.check_invariants().unwrap();
                        }
                    }
                    // Hand the survivors to another thread to drop.
                    std::thread::spawn(move || drop(live)).join().unwrap();
                });
            }
        });
        made.check(&alloc);
        finish(&alloc, &sim);
    }
}

/// On the host backend the buffers hold data: every live buffer keeps the pattern written into
/// it, which fails if two live buffers ever shared memory.
#[test]
fn host_buffers_never_share_memory() {
    let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    let streams = [alloc.default_stream(), alloc.new_stream().unwrap()];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut live: Vec<(Buffer<u32>, u32)> = Vec::new();
    for tag in 0..3000u32 {
        if live.len() > 40 || (!live.is_empty() && next() % 3 == 0) {
            let i = (next() as usize) % live.len();
            let (b, t) = live.swap_remove(i);
            assert!(b.as_host_slice().unwrap().iter().all(|&x| x == t), "buffer {t} was overwritten");
        } else {
            let len = 1 + (next() % (1 << (next() % 20))) as usize;
            let mut b = alloc.alloc::<u32>(&streams[(next() % 2) as usize], len).unwrap();
            b.as_host_slice_mut().unwrap().fill(tag);
            live.push((b, tag));
        }
    }
    for (b, t) in &live {
        assert!(b.to_vec().unwrap().iter().all(|x| x == t));
    }
    drop(live);
    alloc.empty_cache();
    assert_eq!(alloc.memory_reserved(), 0);
}

/// Applies `op` to one of two allocators run side by side (`sim` its backend, `streams` its
/// three streams, `live` its buffers); `make` makes an allocation's buffer. Returns the address
/// allocated (0 for other ops), which the caller compares with the other side's.
fn apply_side(
    op: &Op,
    alloc: &CachingAllocator,
    sim: &SimBackend,
    streams: &[Stream; 3],
    live: &mut Vec<Buffer<u8>>,
    make: impl FnOnce(&Stream, usize) -> Buffer<u8>,
) -> u64 {
    match op {
        Op::Alloc { stream, bytes } => {
            let b = make(&streams[*stream], *bytes);
            let addr = b.device_ptr();
            live.push(b);
            return addr;
        }
        Op::Free(i) if !live.is_empty() => drop(live.swap_remove(i % live.len())),
        Op::RecordStream { buffer, stream } if !live.is_empty() => {
            let b = &live[buffer % live.len()];
            alloc.record_stream(b, streams[*stream]).unwrap();
        }
        Op::Synchronize(s) => alloc.synchronize(streams[*s]).unwrap(),
        Op::CompleteEvents => sim.complete_events(),
        Op::EmptyCache => alloc.empty_cache(),
        _ => {}
    }
    0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Parking is invisible on one thread: the same ops on two allocators, one recording (no
    /// parking) and one recording nothing (dropped blocks parked, the block freed last taken
    /// back without the lock), hand out the same addresses and end with the same statistics.
    /// Shapes and other streams' uses make some frees go through the lock in between, and
    /// events complete only when the ops say so. (90,000 cases passed; 128 run here.)
    #[test]
    fn parking_hands_out_the_blocks_the_heap_would(
        config in configs(),
        ops in prop::collection::vec(op(3), 1..300),
        shaped in prop::collection::vec(any::<bool>(), 300),
    ) {
        let sim = || Arc::new(SimBackend::with_events(1 << 40, EventMode::Manual));
        let sims = [sim(), sim()];
        let allocs = [allocator(&sims[0], config.clone(), false), allocator(&sims[1], config, true)];
        let streams: Vec<[Stream; 3]> =
            allocs.iter().map(|a| [a.default_stream(), a.new_stream().unwrap(), a.new_stream().unwrap()]).collect();
        let mut live: [Vec<Buffer<u8>>; 2] = [Vec::new(), Vec::new()];
        for (k, op) in ops.iter().enumerate() {
            let mut addrs = [0u64; 2];
            for side in 0..2 {
                let alloc = &allocs[side];
                addrs[side] = apply_side(op, alloc, &sims[side], &streams[side], &mut live[side], |stream, bytes| {
                    let b = alloc.alloc::<u8>(stream, bytes).unwrap();
                    if shaped[k] { b.with_shape(&[bytes]).unwrap() } else { b }
                });
            }
            prop_assert_eq!(addrs[0], addrs[1], "op {} ({:?})", k, op);
        }
        drop(live);
        prop_assert_eq!(allocs[0].memory_stats(), allocs[1].memory_stats());
    }
}

/// What a snapshot's context says, resolved: the frames' functions and lines, the scope path
/// and the step (thread names are equal on one thread).
fn resolved(
    snap: &vramscope::Snapshot,
    ctx: &Option<vramscope::snapshot::ContextInfo>,
) -> Option<(Vec<String>, Vec<String>, u64)> {
    let c = ctx.as_ref()?;
    let frames = c.stack.map_or_else(Vec::new, |s| {
        snap.stacks[s.0 as usize]
            .iter()
            .map(|f| {
                let f = &snap.frames[f.0 as usize];
                format!("{}:{:?}", f.function, f.line)
            })
            .collect()
    });
    Some((frames, snap.scopes[c.scope.0 as usize].clone(), c.step))
}

/// The events and live blocks a snapshot holds, resolved, without times.
type Recorded = (
    Vec<(String, u64, u64, u64, Option<(Vec<String>, Vec<String>, u64)>)>,
    Vec<(u64, Option<(Vec<String>, Vec<String>, u64)>)>,
);

fn recorded(alloc: &CachingAllocator) -> Recorded {
    let snap = alloc.snapshot();
    let history = snap
        .history
        .iter()
        .map(|e| (format!("{:?}", e.action), e.addr, e.size, e.stream, resolved(&snap, &e.context)))
        .collect();
    let live = snap.live_blocks().map(|b| (b.address, resolved(&snap, &b.context))).collect();
    (history, live)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Parking while recording is invisible on one thread: the same ops, some inside scopes and
    /// steps, on two recording allocators, one parking on every free (a request from the site
    /// it last allocated from through the lock takes its block back and logs the allocation),
    /// give the same addresses, the same statistics, the same history (actions, addresses,
    /// sizes, streams, stacks, scopes, steps, in the same order, times never going back) and
    /// the same live blocks with the same contexts; events complete only when the ops say so.
    #[test]
    fn recorded_parking_records_what_the_lock_would(
        config in configs(),
        ops in prop::collection::vec(op(3), 1..200),
        scoped in prop::collection::vec(0..3usize, 200),
    ) {
        let sim = || Arc::new(SimBackend::with_events(1 << 40, EventMode::Manual));
        let sims = [sim(), sim()];
        let allocs = [
            CachingAllocator::with_config(sims[0].clone(), config.clone()).unwrap(),
            CachingAllocator::with_config(sims[1].clone(), config).unwrap(),
        ];
        allocs[1].park_always();
        let streams: Vec<[Stream; 3]> =
            allocs.iter().map(|a| [a.default_stream(), a.new_stream().unwrap(), a.new_stream().unwrap()]).collect();
        let mut live: [Vec<Buffer<u8>>; 2] = [Vec::new(), Vec::new()];
        for (k, op) in ops.iter().enumerate() {
            let mut addrs = [0u64; 2];
            // A new step now and then: a block taken back must carry its new one.
            if k % 3 == 2 {
                vramscope::step(k as u64);
            }
            for side in 0..2 {
                let alloc = &allocs[side];
                addrs[side] = apply_side(op, alloc, &sims[side], &streams[side], &mut live[side], |stream, bytes| {
                    // Three places: two scopes and none, so that sites change under a thread.
                    match scoped[k] {
                        0 => alloc.alloc::<u8>(stream, bytes).unwrap(),
                        1 => {
                            let _g = vramscope::scope("one");
                            alloc.alloc::<u8>(stream, bytes).unwrap()
                        }
                        _ => {
                            let _g = vramscope::scope("two");
                            alloc.alloc::<u8>(stream, bytes).unwrap()
                        }
                    }
                });
            }
            prop_assert_eq!(addrs[0], addrs[1], "op {} ({:?})", k, op);
            if k % 7 == 6 {
                prop_assert_eq!(recorded(&allocs[0]), recorded(&allocs[1]), "after op {}", k);
            }
        }
        prop_assert_eq!(recorded(&allocs[0]), recorded(&allocs[1]));
        drop(live);
        prop_assert_eq!(allocs[0].memory_stats(), allocs[1].memory_stats());
        prop_assert_eq!(recorded(&allocs[0]), recorded(&allocs[1]));
        let times: Vec<u64> = allocs[1].snapshot().history.iter().map(|e| e.time_ns).collect();
        prop_assert!(times.windows(2).all(|w| w[0] <= w[1]), "times go back: {:?}", times);
    }
}
