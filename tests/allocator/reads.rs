//! Reading the allocator changes nothing it does. A free keeps the block it frees aside, unmerged,
//! for a next request of its size; reads (statistics, snapshots, the largest free block, scope
//! usage) used to merge it first, which handed that request the best fit instead: a program
//! that read its statistics between a free and an allocation got other blocks, and other peaks,
//! than one that did not. These tests replay random operations with and without a read after
//! every one (and with the peaks reset after every one), and check that reads show the heap as
//! merging would leave it.

use proptest::prelude::*;
use std::sync::Arc;
use vramscope::{backend::EventMode, backend::SimBackend, Buffer, CachingAllocator, Stream};

use crate::common_configs::configs;

#[derive(Debug, Clone)]
enum Op {
    Alloc { stream: usize, bytes: usize },
    Free(usize),
    RecordStream { buffer: usize, stream: usize },
    CompleteEvents,
}

/// Sizes from 1 byte to 48 MiB, log-uniform, with a bias towards a few repeated sizes (the
/// block kept aside serves only a request of its very size).
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => (0u32..26).prop_flat_map(|e| (1usize << e)..=(3usize << e)),
        1 => Just(512usize),
        1 => Just(3000usize),
        1 => Just(1 << 20),
        1 => Just(6 << 20),
        1 => Just(25 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2usize, size()).prop_map(|(stream, bytes)| Op::Alloc { stream, bytes }),
        5 => any::<usize>().prop_map(Op::Free),
        1 => (any::<usize>(), 0..2usize).prop_map(|(buffer, stream)| Op::RecordStream { buffer, stream }),
        1 => Just(Op::CompleteEvents),
    ]
}

struct Run {
    sim: Arc<SimBackend>,
    alloc: CachingAllocator,
    streams: Vec<Stream>,
    live: Vec<Buffer<u8>>,
    /// Where each allocation went, in order.
    placed: Vec<u64>,
}

impl Run {
    fn new(config: &vramscope::config::AllocatorConfig) -> Run {
        let sim = Arc::new(SimBackend::with_events(1 << 40, EventMode::Manual).with_costly_segments(true));
        let alloc = CachingAllocator::with_config(sim.clone(), config.clone()).unwrap();
        let streams = vec![alloc.default_stream(), alloc.new_stream().unwrap()];
        Run { sim, alloc, streams, live: Vec::new(), placed: Vec::new() }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Alloc { stream, bytes } => {
                let b = self.alloc.alloc::<u8>(&self.streams[stream], bytes).expect("the sim is large enough");
                self.placed.push(b.device_ptr());
                self.live.push(b);
            }
            Op::Free(i) if !self.live.is_empty() => drop(self.live.swap_remove(i % self.live.len())),
            Op::RecordStream { buffer, stream } if !self.live.is_empty() => {
                let b = &self.live[buffer % self.live.len()];
                self.alloc.record_stream(b, self.streams[stream]).unwrap();
            }
            Op::CompleteEvents => self.sim.complete_events(),
            _ => {}
        }
    }
}

/// Every read the allocator offers.
fn read_everything(alloc: &CachingAllocator) {
    let stats = alloc.stats();
    assert_eq!(alloc.memory_stats(), stats.to_pytorch_map());
    assert!(!alloc.memory_summary().is_empty());
    let snap = alloc.snapshot();
    assert_eq!(snap.stats, stats);
    assert_eq!(alloc.memory_allocated(), stats.allocated_bytes.all.current);
    assert_eq!(alloc.memory_reserved(), stats.reserved_bytes.all.current);
    assert_eq!(alloc.max_memory_allocated(), stats.allocated_bytes.all.peak);
    assert_eq!(alloc.max_memory_reserved(), stats.reserved_bytes.all.peak);
    let _ = (alloc.largest_free_block(), alloc.fragmentation_limit(), alloc.record_config(), alloc.last_error());
    let _ = alloc.scope_usage(vramscope::current_scope());
}

/// Runs `ops` on two allocators, calling `between` on the second after every operation, and
/// checks after each that every allocation went to the same address on both.
fn side_by_side(
    ops: &[Op],
    config: &vramscope::config::AllocatorConfig,
    between: impl Fn(&CachingAllocator),
) -> (Run, Run) {
    let (mut plain, mut other) = (Run::new(config), Run::new(config));
    for (k, op) in ops.iter().enumerate() {
        plain.apply(op);
        other.apply(op);
        between(&other.alloc);
        assert_eq!(plain.placed, other.placed, "after op {k} ({op:?})");
    }
    (plain, other)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// The same operations with a read after every one put every block where they put it
    /// without, and end with the same statistics, peaks included.
    #[test]
    fn reads_never_move_a_block(ops in proptest::collection::vec(op(), 1..160), config in configs()) {
        let (plain, read) = side_by_side(&ops, &config, read_everything);
        prop_assert_eq!(plain.alloc.stats(), read.alloc.stats());
    }

    /// Resetting the peaks between operations, as a program measuring each step's peak does,
    /// puts every block where the same operations put it without, and no peak falls below its
    /// current value.
    #[test]
    fn resetting_peaks_never_moves_a_block(ops in proptest::collection::vec(op(), 1..160), config in configs()) {
        side_by_side(&ops, &config, |alloc| {
            alloc.reset_peak_stats();
            let stats = alloc.stats();
            assert!(stats.inactive_split.all.peak >= stats.inactive_split.all.current);
            assert!(stats.inactive_split_bytes.all.peak >= stats.inactive_split_bytes.all.current);
        });
    }

    /// After any operations, what reads show is what they show once the block kept aside is
    /// merged (`check_invariants` merges it, as every operation that changes the heap does):
    /// statistics (peaks and totals included), segments and their blocks, the largest free
    /// block, scope usage.
    #[test]
    fn reads_show_the_heap_as_merged(ops in proptest::collection::vec(op(), 1..60), config in configs()) {
        for k in 1..=ops.len() {
            let mut run = Run::new(&config);
            for op in &ops[..k] {
                run.apply(op);
            }
            let seen = (
                run.alloc.stats(),
                run.alloc.snapshot().segments,
                run.alloc.largest_free_block(),
                run.alloc.scope_usage(vramscope::current_scope()),
            );
            // Merges the block kept aside, then checks the counters against a recount.
            if let Err(e) = run.alloc.check_invariants() {
                panic!("after op {k}: {e}");
            }
            let merged = (
                run.alloc.stats(),
                run.alloc.snapshot().segments,
                run.alloc.largest_free_block(),
                run.alloc.scope_usage(vramscope::current_scope()),
            );
            prop_assert_eq!(seen, merged, "after op {} ({:?})", k, &ops[k - 1]);

            // Peaks reset with the block kept aside are the peaks reset after merging it, both
            // before and after it is merged.
            let (mut before, mut after) = (Run::new(&config), Run::new(&config));
            for op in &ops[..k] {
                before.apply(op);
                after.apply(op);
            }
            before.alloc.reset_peak_stats();
            after.alloc.check_invariants().unwrap();
            after.alloc.reset_peak_stats();
            prop_assert_eq!(before.alloc.stats(), after.alloc.stats(), "reset after op {}", k);
            before.alloc.check_invariants().unwrap();
            prop_assert_eq!(before.alloc.stats(), after.alloc.stats(), "reset after op {}, merged", k);
        }
    }
}

/// The case that showed it, kept small: a free, a read, then a request of the freed block's
/// size. Among equal large holes, best fit after merging takes the lower (small ones: the one
/// freed last); the block kept aside is the upper one, and a read must not change which the
/// request gets.
#[test]
fn a_read_between_a_free_and_an_allocation_changes_nothing() {
    for read in [false, true] {
        let run = Run::new(
            &vramscope::config::AllocatorConfig::parse("release_pages:false,fragmentation_limit:off").unwrap(),
        );
        let s = &run.streams[0];
        // Four in one 20 MiB segment, as PyTorch's allocator places them (no limit).
        let a = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
        let _b = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
        let c = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
        let _d = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
        let (a_at, c_at) = (a.device_ptr(), c.device_ptr());
        drop(a);
        drop(c);
        if read {
            let stats = run.alloc.stats();
            assert_eq!(stats.inactive_split.all.current, 3, "two holes (one kept aside) and the rest");
        }
        let e = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
        assert_eq!(e.device_ptr(), c_at, "read: {read}: the block freed last, not the lower hole at {a_at:#x}");
    }
}

/// Peak reserved bytes of five passes of a recorded trace (each pass's leftovers freed at its
/// end, as `vramscope replay` does), with the statistics read after every operation or not.
fn replay_peak(name: &str, config: &str, read: bool) -> u64 {
    use vramscope::replay::{Trace, TraceOp};
    let path = format!("{}/fixtures/torch/{name}.trace.json.gz", env!("CARGO_MANIFEST_DIR"));
    let trace = Trace::from_file(path).unwrap();
    let sim = Arc::new(SimBackend::new(80 << 30).with_costly_segments(true));
    let alloc = CachingAllocator::with_config(sim, vramscope::config::AllocatorConfig::parse(config).unwrap()).unwrap();
    alloc.record_memory_history(vramscope::record::RecordConfig::off());
    let s = alloc.default_stream();
    for _ in 0..5 {
        let mut live = std::collections::BTreeMap::new();
        for e in &trace.events {
            match e.op {
                TraceOp::Alloc if !live.contains_key(&e.addr) => {
                    live.insert(e.addr, alloc.alloc::<u8>(&s, e.size as usize).unwrap());
                }
                TraceOp::Free => drop(live.remove(&e.addr)),
                TraceOp::Alloc => {}
            }
            if read {
                std::hint::black_box(alloc.stats());
            }
        }
    }
    alloc.max_memory_reserved()
}

/// Recorded programs replayed with their statistics read after every operation reach the peak
/// they reach unread. Before reads left the block freed last alone, the two differed on these
/// rows: `fno_varres` with `cuMemAlloc` segments and `pointnet_varpoints` with virtual ones.
#[test]
fn recorded_programs_peak_the_same_read_or_not() {
    let rows = [("fno_varres", "release_pages:false"), ("pointnet_varpoints", "release_pages:true")];
    let peaks: Vec<(u64, u64)> = rows
        .iter()
        .map(|&(name, config)| (replay_peak(name, config, false), replay_peak(name, config, true)))
        .collect();
    for ((name, config), (unread, read)) in rows.iter().zip(&peaks) {
        println!(
            "{name} ({config}): peak reserved {} MiB unread, {} MiB read after every operation",
            unread >> 20,
            read >> 20
        );
    }
    for ((name, config), (unread, read)) in rows.iter().zip(&peaks) {
        assert_eq!(unread, read, "{name} ({config})");
    }
}

/// Peaks reset while the block freed last lies between two free holes: merging would leave one
/// free block where there are three, so the reset sets the inactive-split peak to that one less
/// (the peak a reset after the merge leaves); handed out unmerged instead, the block leaves the
/// three, and the peak rises back to them.
#[test]
fn peaks_reset_beside_the_block_kept_aside_stay_true() {
    let run =
        Run::new(&vramscope::config::AllocatorConfig::parse("release_pages:false,fragmentation_limit:off").unwrap());
    let s = &run.streams[0];
    let a = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
    let b = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
    let c = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
    let _d = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
    let b_at = b.device_ptr();
    drop(a);
    drop(c);
    drop(b);
    // a, c and the segment's free end are free; b lies between a and c, kept aside.
    run.alloc.reset_peak_stats();
    let split = run.alloc.stats().inactive_split.all;
    assert_eq!((split.current, split.peak), (2, 2), "as merged: a+b+c and the free end");
    let e = run.alloc.alloc::<u8>(s, 3 << 20).unwrap();
    assert_eq!(e.device_ptr(), b_at, "the block kept aside");
    let split = run.alloc.stats().inactive_split.all;
    assert_eq!((split.current, split.peak), (3, 3), "a, c and the free end, the peak with them");
}
