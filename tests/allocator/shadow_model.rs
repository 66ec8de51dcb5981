//! A shadow-model stress test: the allocator runs on a backend that is itself an independent
//! model of a GPU's streams (queued work, events, `synchronize`, `order_after`), and every
//! allocation is checked against that model, not against the allocator's own bookkeeping:
//!
//! - no two live buffers overlap;
//! - a block handed out on stream X overlaps no memory that other work may still touch: every
//!   earlier use of those bytes on another stream has finished (its stream synchronized, or an
//!   event recorded after it reported complete) or stream X was ordered after it
//!   (`order_after(X, that stream)` called after the use);
//! - every segment reserved is released by the end, and the allocator's figures add up.
//!
//! The backend fails `record_event`, `event_completed`, `synchronize` and `order_after` at
//! random (a failed call has no effect in the model), and reports events complete (and streams
//! idle) only when the test lets a stream's work finish, and the work it was ordered after (as
//! on CUDA: `tests/cuda.rs` `a_stream_ordered_after_a_busy_stream_is_not_idle`). Runs briefly in every `cargo test` (48 cases of up to 300
//! operations); `VRAMSCOPE_SHADOW_CASES=C VRAMSCOPE_SHADOW_OPS=N` runs C cases of up to N
//! operations for a longer attack.

use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use vramscope::backend::{Backend, RawEvent, RawStream};
use vramscope::error::BackendError;
use vramscope::{Buffer, CachingAllocator, Stream};

/// One stream in the model: work queued so far and finished so far (positions in its queue),
/// and the streams it was ordered after, with the position of theirs it waits for.
#[derive(Default, Debug)]
struct StreamModel {
    queued: u64,
    done: u64,
    after: HashMap<RawStream, u64>,
}

/// A use of device memory by work queued on a stream.
#[derive(Debug, Clone, Copy)]
struct Use {
    start: u64,
    end: u64,
    stream: RawStream,
    position: u64,
}

/// An event: its stream, that stream's position, and what the stream waited for then (an event
/// recorded after a wait completes after it, as on CUDA).
type EventModel = (RawStream, u64, Vec<(RawStream, u64)>);

#[derive(Default, Debug)]
struct Model {
    streams: HashMap<RawStream, StreamModel>,
    events: HashMap<RawEvent, EventModel>,
    next_event: RawEvent,
    next_stream: RawStream,
    next_addr: u64,
    segments: HashMap<u64, u64>,
    /// Uses of memory whose work may not have finished, by buffers alive or dead.
    uses: Vec<Use>,
    /// Random state for the injected failures, and the failure rate (per 1,000 calls).
    rng: u64,
    fail_per_mille: u64,
    injected: u64,
}

impl Model {
    fn stream(&mut self, s: RawStream) -> &mut StreamModel {
        self.streams.entry(s).or_default()
    }

    /// Whether this call fails (an injected fault).
    fn fails(&mut self) -> bool {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let fail = self.rng % 1000 < self.fail_per_mille;
        self.injected += u64::from(fail);
        fail
    }

    /// Whether the work before position `position` of `stream`, and the work of other streams
    /// it waited for (`after`), has finished.
    fn passed(&self, stream: RawStream, position: u64, after: &[(RawStream, u64)]) -> bool {
        let done = |s: &RawStream| self.streams.get(s).map_or(0, |m| m.done);
        done(&stream) >= position && after.iter().all(|(k, p)| done(k) >= *p)
    }

    /// Forgets uses whose work has finished.
    fn prune(&mut self) {
        let streams = &self.streams;
        self.uses.retain(|u| streams.get(&u.stream).is_none_or(|s| s.done < u.position));
    }

    /// Queues work on `stream` touching `[start, end)`.
    fn use_memory(&mut self, stream: RawStream, start: u64, end: u64) {
        let s = self.stream(stream);
        s.queued += 1;
        let position = s.queued;
        self.uses.push(Use { start, end, stream, position });
    }

    /// Lets every piece of work queued on `stream` finish, and so the work of the streams it
    /// waits for (its waits are part of its queue).
    fn finish(&mut self, stream: RawStream) {
        let mut work = vec![(stream, u64::MAX)];
        while let Some((s, upto)) = work.pop() {
            let st = self.stream(s);
            let target = upto.min(st.queued);
            if st.done >= target && upto != u64::MAX {
                continue;
            }
            st.done = st.done.max(target);
            work.extend(st.after.iter().map(|(&k, &p)| (k, p)));
        }
        self.prune();
    }

    /// Orders work queued on `waiting` from now on after the work queued so far on `on`: as on
    /// a GPU (an event recorded on `on`, waited for on `waiting`), that includes what `on`
    /// itself was ordered after.
    fn order(&mut self, waiting: RawStream, on: RawStream) {
        let mut inherited: Vec<(RawStream, u64)> = self.stream(on).after.iter().map(|(&k, &p)| (k, p)).collect();
        inherited.push((on, self.stream(on).queued));
        let w = self.stream(waiting);
        for (k, p) in inherited {
            if k != waiting {
                let e = w.after.entry(k).or_insert(0);
                *e = (*e).max(p);
            }
        }
    }

    /// Why `[start, end)` may not be handed to work on `stream` now, if it may not.
    fn hazard(&self, stream: RawStream, start: u64, end: u64) -> Option<String> {
        let x = self.streams.get(&stream);
        self.uses.iter().filter(|u| u.start < end && start < u.end && u.stream != stream).find_map(|u| {
            let finished = self.streams.get(&u.stream).is_some_and(|s| s.done >= u.position);
            let ordered = x.and_then(|x| x.after.get(&u.stream)).is_some_and(|&p| p >= u.position);
            (!finished && !ordered).then(|| {
                format!(
                    "[{start:#x}, {end:#x}) handed to stream {stream} while work {} of stream {} on \
                     [{:#x}, {:#x}) may still run",
                    u.position, u.stream, u.start, u.end
                )
            })
        })
    }
}

/// The backend: address space only, with the model's streams and events.
#[derive(Debug, Clone)]
struct ShadowBackend(Arc<Mutex<Model>>);

const PAGE: u64 = 2 << 20;

impl ShadowBackend {
    /// The model (still usable after a failed check panicked while holding it, so that the
    /// allocator's drop during the unwinding does not abort the test).
    fn lock(&self) -> std::sync::MutexGuard<'_, Model> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

// SAFETY: address space only (no host pointer, nothing is ever touched); segments are disjoint
// ranges a page apart, never reused; an event reports complete, and `synchronize` returns
// `Ok`, only when the model's stream has finished the work queued before it; `order_after`
// returns `Ok` only after recording the ordering the model then relies on.
unsafe impl Backend for ShadowBackend {
    fn name(&self) -> &str {
        "shadow"
    }

    fn total_memory(&self) -> u64 {
        1 << 40
    }

    fn free_memory(&self) -> u64 {
        let m = self.lock();
        (1u64 << 40).saturating_sub(m.segments.values().sum())
    }

    fn page_size(&self) -> u64 {
        PAGE
    }

    fn reserve(&self, size: u64) -> Result<u64, BackendError> {
        let mut m = self.lock();
        if m.segments.values().sum::<u64>() + size > 1 << 40 {
            return Err(BackendError::OutOfMemory { requested: size, message: "shadow device full".into() });
        }
        let addr = (1 << 44) + m.next_addr;
        m.next_addr += size + PAGE;
        m.segments.insert(addr, size);
        Ok(addr)
    }

    unsafe fn release(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let mut m = self.lock();
        match m.segments.remove(&addr) {
            Some(s) if s == size => Ok(()),
            other => panic!("release of {addr:#x} ({size} bytes): the model has {other:?}"),
        }
    }

    fn create_stream(&self) -> Result<RawStream, BackendError> {
        let mut m = self.lock();
        m.next_stream += 1;
        let s = m.next_stream;
        m.stream(s);
        Ok(s)
    }

    fn record_event(&self, stream: RawStream) -> Result<RawEvent, BackendError> {
        let mut m = self.lock();
        if m.fails() {
            return Err(BackendError::Other("injected: record_event".into()));
        }
        m.next_event += 1;
        let s = m.stream(stream);
        let (position, after) = (s.queued, s.after.iter().map(|(&k, &p)| (k, p)).collect());
        let id = m.next_event;
        m.events.insert(id, (stream, position, after));
        Ok(id)
    }

    fn event_completed(&self, event: RawEvent) -> Result<bool, BackendError> {
        let mut m = self.lock();
        if m.fails() {
            return Err(BackendError::Other("injected: event_completed".into()));
        }
        let (stream, position, after) = m.events.get(&event).expect("an event the allocator recorded and kept");
        Ok(m.passed(*stream, *position, after))
    }

    fn destroy_event(&self, event: RawEvent) {
        self.lock().events.remove(&event).expect("an event destroyed once");
    }

    fn synchronize(&self, stream: RawStream) -> Result<(), BackendError> {
        let mut m = self.lock();
        if m.fails() {
            return Err(BackendError::Other("injected: synchronize".into()));
        }
        m.finish(stream);
        Ok(())
    }

    fn order_after(&self, waiting: RawStream, on: RawStream) -> Result<(), BackendError> {
        let mut m = self.lock();
        if m.fails() {
            return Err(BackendError::Other("injected: order_after".into()));
        }
        m.order(waiting, on);
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        stream: usize,
        bytes: usize,
    },
    Free(usize),
    /// `record_stream` and work on that stream touching the buffer.
    UseOn {
        buffer: usize,
        stream: usize,
    },
    /// Work on the buffer's own stream.
    Use(usize),
    /// A stream's queued work finishes (the GPU catches up), as far as the model says.
    Finish(usize),
    Synchronize(usize),
    EmptyCache,
}

fn op(streams: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..streams, prop_oneof![1usize..4096, 4096usize..(4 << 20), Just(512), Just(1 << 20)])
            .prop_map(|(stream, bytes)| Op::Alloc { stream, bytes }),
        4 => any::<usize>().prop_map(Op::Free),
        3 => (any::<usize>(), 0..streams).prop_map(|(buffer, stream)| Op::UseOn { buffer, stream }),
        3 => any::<usize>().prop_map(Op::Use),
        2 => (0..streams).prop_map(Op::Finish),
        1 => (0..streams).prop_map(Op::Synchronize),
        1 => Just(Op::EmptyCache),
    ]
}

use crate::common_configs::configs;

/// With `quiet`, nothing is recorded, so dropped blocks are parked in the thread's slot where
/// they may be (and must not be where another stream used them).
fn run(config: vramscope::config::AllocatorConfig, quiet: bool, seed: u64, fail_per_mille: u64, ops: &[Op]) -> u64 {
    let model = Arc::new(Mutex::new(Model { rng: seed | 1, fail_per_mille, ..Model::default() }));
    let backend = ShadowBackend(model.clone());
    let alloc = CachingAllocator::with_config(backend, config).unwrap();
    if quiet {
        alloc.record_memory_history(vramscope::record::RecordConfig::off());
        // Park on every free, not only where the lock is busy.
        alloc.park_always();
    }
    let streams: Vec<Stream> =
        std::iter::once(alloc.default_stream()).chain((0..3).map(|_| alloc.new_stream().unwrap())).collect();
    let mut live: Vec<(Buffer<u8>, usize)> = Vec::new();
    let range = |b: &Buffer<u8>| (b.device_ptr(), b.device_ptr() + b.num_bytes().max(1));
    for (k, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { stream, bytes } => {
                let Ok(b) = alloc.alloc::<u8>(&streams[stream], bytes) else { continue };
                let (start, end) = range(&b);
                let m = model.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(why) = m.hazard(streams[stream].raw(), start, end) {
                    panic!("op {k} ({op:?}): {why}");
                }
                drop(m);
                for (other, _) in &live {
                    let (s, e) = range(other);
                    assert!(end <= s || e <= start, "op {k}: [{start:#x}, {end:#x}) overlaps live [{s:#x}, {e:#x})");
                }
                live.push((b, stream));
            }
            Op::Free(i) if !live.is_empty() => drop(live.swap_remove(i % live.len())),
            Op::UseOn { buffer, stream } if !live.is_empty() => {
                let (b, _) = &live[buffer % live.len()];
                // A stream the buffer is used on is recorded first, as the API asks.
                if alloc.record_stream(b, streams[stream]).is_ok() {
                    let (start, end) = range(b);
                    model.lock().unwrap_or_else(|p| p.into_inner()).use_memory(streams[stream].raw(), start, end);
                }
            }
            Op::Use(i) if !live.is_empty() => {
                let (b, stream) = &live[i % live.len()];
                let (start, end) = range(b);
                model.lock().unwrap_or_else(|p| p.into_inner()).use_memory(streams[*stream].raw(), start, end);
            }
            Op::Finish(s) => model.lock().unwrap_or_else(|p| p.into_inner()).finish(streams[s].raw()),
            Op::Synchronize(s) => {
                let _ = alloc.synchronize(streams[s]);
            }
            Op::EmptyCache => alloc.empty_cache(),
            _ => {}
        }
        // A check takes the lock, which pulls every parked block back: with `quiet`, only
        // every fifth op, so that blocks stay parked for later requests to take.
        if quiet && k % 5 != 4 {
            continue;
        }
        if let Err(e) = alloc.check_invariants() {
            panic!("after op {k} ({op:?}): {e}");
        }
    }
    drop(live);
    // Every stream catches up; with faults off, the cache empties completely.
    {
        let mut m = model.lock().unwrap_or_else(|p| p.into_inner());
        m.fail_per_mille = 0;
        let all: Vec<RawStream> = m.streams.keys().copied().collect();
        for s in all {
            m.finish(s);
        }
    }
    alloc.synchronize_all().unwrap();
    alloc.empty_cache();
    assert_eq!(alloc.memory_allocated(), 0);
    let injected = model.lock().unwrap_or_else(|p| p.into_inner()).injected;
    // A block whose free could be ordered neither by an event nor by synchronizing is kept out
    // of use for good (stranded); without faults nothing is.
    if injected == 0 {
        assert_eq!(alloc.memory_reserved(), 0, "{:#?}", alloc.stats());
    }
    drop(alloc);
    let m = model.lock().unwrap_or_else(|p| p.into_inner());
    assert!(m.segments.is_empty(), "segments never released: {:?}", m.segments);
    assert!(m.events.is_empty(), "events never destroyed: {}", m.events.len());
    injected
}

fn shadow_cases() -> u32 {
    std::env::var("VRAMSCOPE_SHADOW_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(48)
}

fn ops_per_case() -> usize {
    std::env::var("VRAMSCOPE_SHADOW_OPS").ok().and_then(|n| n.parse().ok()).unwrap_or(300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: shadow_cases(), ..ProptestConfig::default() })]

    /// Without faults, and with 5% and 30% of stream calls failing.
    #[test]
    fn no_block_moves_before_the_streams_that_used_it_are_done(
        config in configs(),
        quiet in any::<bool>(),
        seed in any::<u64>(),
        fail in prop_oneof![Just(0u64), Just(50), Just(300)],
        ops in prop::collection::vec(op(4), 1..=ops_per_case()),
    ) {
        run(config, quiet, seed, fail, &ops);
    }
}

/// The model sees a hazard when there is one: a block reused on another stream without any
/// wait is caught (the check cannot pass vacuously).
#[test]
fn the_model_catches_a_block_moved_too_early() {
    let mut m = Model::default();
    m.use_memory(1, 0x1000, 0x2000);
    assert!(m.hazard(2, 0x1800, 0x1900).is_some(), "another stream, work not finished");
    assert!(m.hazard(1, 0x1800, 0x1900).is_none(), "the same stream: stream order");
    m.order(2, 1);
    assert!(m.hazard(2, 0x1800, 0x1900).is_none(), "ordered after it");
    assert!(m.hazard(3, 0x1800, 0x1900).is_some());
    m.order(3, 2);
    assert!(m.hazard(3, 0x1800, 0x1900).is_none(), "ordered after a stream ordered after it");
    assert!(m.hazard(4, 0x1800, 0x1900).is_some());
    m.use_memory(1, 0x1000, 0x2000);
    assert!(m.hazard(2, 0x1800, 0x1900).is_some(), "work queued after the ordering");
    m.finish(2);
    assert!(m.hazard(4, 0x1800, 0x1900).is_some(), "stream 1's second use was not waited for");
    m.finish(1);
    assert!(m.hazard(4, 0x1800, 0x1900).is_none(), "finished");
}

/// Faults are injected at the rates asked for (the stress test above is not run fault-free).
#[test]
fn faults_are_injected() {
    let ops: Vec<Op> = (0..400)
        .map(|i| match i % 5 {
            0 | 1 => Op::Alloc { stream: i % 4, bytes: 1000 + i },
            2 => Op::UseOn { buffer: i, stream: (i + 1) % 4 },
            3 => Op::Free(i),
            _ => Op::Synchronize(i % 4),
        })
        .collect();
    let config = vramscope::config::AllocatorConfig::default();
    for quiet in [false, true] {
        assert_eq!(run(config.clone(), quiet, 7, 0, &ops), 0);
        assert!(run(config.clone(), quiet, 7, 300, &ops) > 10);
    }
}

/// With nothing recorded a dropped block is parked for its thread's next request of its size,
/// but not one that another stream used: that one waits for the stream (the model would see
/// the hazard of the same size asked for again at once).
#[test]
fn a_block_used_on_another_stream_is_not_parked() {
    let ops = [
        Op::Alloc { stream: 0, bytes: 1000 },
        Op::UseOn { buffer: 0, stream: 1 },
        Op::Free(0),
        Op::Alloc { stream: 0, bytes: 1000 },
    ];
    assert_eq!(run(vramscope::config::AllocatorConfig::default(), true, 7, 0, &ops), 0);
}
