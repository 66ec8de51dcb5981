//! Every live block in a snapshot carries the context of the allocation that made it.
//!
//! The oracle is the test's own record: at each allocation the test notes, for the address it
//! got back, the scope it entered (a unique name per allocation), the thread, the step, the
//! helper function that allocated and the shape it described; the snapshot must say exactly
//! that for every live block, after random alloc/free/`empty_cache`/`record_stream` sequences
//! over several streams and threads, in every configuration the invariant tests use.

use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use vramscope::{
    backend::EventMode, backend::SimBackend, config::AllocatorConfig, Buffer, CachingAllocator, Snapshot, Stream,
};

#[derive(Debug, Clone)]
enum Op {
    Alloc { stream: usize, bytes: usize, helper: bool },
    Free(usize),
    RecordStream { buffer: usize, stream: usize },
    Synchronize(usize),
    CompleteEvents,
    EmptyCache,
    Check,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        (0u32..25).prop_flat_map(|e| (1usize << e)..=(3usize << e)),
        Just(512usize),
        Just(3 << 20),
        Just(12 << 20),
    ]
}

fn op(streams: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..streams, size(), any::<bool>()).prop_map(|(stream, bytes, helper)| Op::Alloc { stream, bytes, helper }),
        4 => any::<usize>().prop_map(Op::Free),
        2 => (any::<usize>(), 0..streams).prop_map(|(buffer, stream)| Op::RecordStream { buffer, stream }),
        1 => (0..streams).prop_map(Op::Synchronize),
        1 => Just(Op::CompleteEvents),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::Check),
    ]
}

#[path = "../common/configs.rs"]
mod common_configs;
use common_configs::configs;

/// What the test itself noted about one allocation.
#[derive(Debug, Clone, PartialEq)]
struct Noted {
    scope: Vec<String>,
    thread: String,
    step: Option<u64>,
    function: &'static str,
    bytes: u64,
}

#[inline(never)]
fn allocate_in_first_helper(alloc: &CachingAllocator, s: &Stream, n: usize) -> Buffer<u8> {
    std::hint::black_box(alloc.alloc::<u8>(s, n).unwrap().with_shape(&[n]).unwrap())
}

#[inline(never)]
fn allocate_in_second_helper(alloc: &CachingAllocator, s: &Stream, n: usize) -> Buffer<u8> {
    std::hint::black_box(alloc.alloc::<u8>(s, n).unwrap().with_shape(&[1, n]).unwrap())
}

fn allocate(alloc: &CachingAllocator, s: &Stream, n: usize, helper: bool, name: String) -> (Buffer<u8>, Noted) {
    let _g = vramscope::scope(&name);
    let b = if helper { allocate_in_first_helper(alloc, s, n) } else { allocate_in_second_helper(alloc, s, n) };
    let noted = Noted {
        scope: vec![name],
        thread: std::thread::current().name().unwrap_or("").to_string(),
        step: None,
        function: if helper { "allocate_in_first_helper" } else { "allocate_in_second_helper" },
        bytes: n as u64,
    };
    (b, noted)
}

/// Compares every live block of `snap` with what was noted at its address.
fn check(snap: &Snapshot, noted: &HashMap<u64, Noted>, live: usize) {
    let mut seen = 0;
    for b in snap.live_blocks() {
        seen += 1;
        let n = noted.get(&b.address).unwrap_or_else(|| panic!("live block {:#x} was never allocated", b.address));
        let c = b.context.unwrap_or_else(|| panic!("block {:#x} has no context", b.address));
        assert_eq!(snap.scopes[c.scope.index()], n.scope, "scope of {:#x}", b.address);
        let thread = &snap.threads[c.thread.index()];
        assert!(n.thread.is_empty() || *thread == n.thread, "thread of {:#x}: {thread} vs {}", b.address, n.thread);
        if let Some(step) = n.step {
            assert_eq!(c.step, step, "step of {:#x}", b.address);
        }
        let first = snap.stack_frames(c.stack.expect("stacks are on")).next().expect("a user frame");
        assert!(first.function.ends_with(n.function), "site of {:#x}: {} vs {}", b.address, first.function, n.function);
        assert_eq!(b.requested_size, n.bytes, "requested bytes of {:#x}", b.address);
        let shape =
            if n.function == "allocate_in_first_helper" { vec![n.bytes as usize] } else { vec![1, n.bytes as usize] };
        assert_eq!(b.shape.as_deref(), Some(&shape[..]), "shape of {:#x}", b.address);
    }
    assert_eq!(seen, live, "live blocks in the snapshot vs live buffers");
}

fn run_one_thread(config: AllocatorConfig, ops: &[Op]) {
    let sim = Arc::new(SimBackend::with_events(1 << 40, EventMode::Manual));
    let alloc = CachingAllocator::with_config(sim.clone(), config).unwrap();
    let streams = [alloc.default_stream(), alloc.new_stream().unwrap(), alloc.new_stream().unwrap()];
    let mut live: Vec<Buffer<u8>> = Vec::new();
    let mut noted = HashMap::new();
    for (k, op) in ops.iter().enumerate() {
        match op {
            Op::Alloc { stream, bytes, helper } => {
                vramscope::step(k as u64);
                let (b, mut n) = allocate(&alloc, &streams[*stream], *bytes, *helper, format!("op{k}"));
                n.step = Some(k as u64);
                noted.insert(b.device_ptr(), n);
                live.push(b);
            }
            Op::Free(i) if !live.is_empty() => drop(live.swap_remove(i % live.len())),
            Op::RecordStream { buffer, stream } if !live.is_empty() => {
                alloc.record_stream(&live[buffer % live.len()], streams[*stream]).unwrap();
            }
            Op::Synchronize(s) => alloc.synchronize(streams[*s]).unwrap(),
            Op::CompleteEvents => sim.complete_events(),
            Op::EmptyCache => alloc.empty_cache(),
            Op::Check => check(&alloc.snapshot(), &noted, live.len()),
            _ => {}
        }
    }
    check(&alloc.snapshot(), &noted, live.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn contexts_follow_their_blocks_on_one_thread(config in configs(), ops in prop::collection::vec(op(3), 1..200)) {
        run_one_thread(config, &ops);
    }

    #[test]
    fn contexts_follow_their_blocks_across_threads(
        config in configs(),
        per_thread in prop::collection::vec(prop::collection::vec(op(2), 1..100), 2..5),
    ) {
        let sim = Arc::new(SimBackend::with_events(1 << 40, EventMode::Manual));
        let alloc = CachingAllocator::with_config(sim.clone(), config).unwrap();
        let streams = [alloc.default_stream(), alloc.new_stream().unwrap()];
        let noted = shared::Noted::default();
        let survivors: Vec<Vec<Buffer<u8>>> = std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for (t, ops) in per_thread.iter().enumerate() {
                let (alloc, sim, noted) = (&alloc, &sim, &noted);
                let h = std::thread::Builder::new().name(format!("worker-{t}")).spawn_scoped(scope, move || {
                    let mut live: Vec<Buffer<u8>> = Vec::new();
                    for (k, op) in ops.iter().enumerate() {
                        match op {
                            Op::Alloc { stream, bytes, helper } => {
                                let name = format!("t{t}-op{k}");
                                let (b, n) = allocate(alloc, &streams[*stream], *bytes, *helper, name);
                                noted.insert(b.device_ptr(), n);
                                live.push(b);
                            }
                            Op::Free(i) if !live.is_empty() => {
                                // Forget the note before the block can be handed to another thread.
                                let b = live.swap_remove(i % live.len());
                                noted.remove(b.device_ptr());
                                drop(b);
                            }
                            Op::RecordStream { buffer, stream } if !live.is_empty() => {
                                alloc.record_stream(&live[buffer % live.len()], streams[*stream]).unwrap();
                            }
                            Op::Synchronize(s) => alloc.synchronize(streams[*s]).unwrap(),
                            Op::CompleteEvents => sim.complete_events(),
                            Op::EmptyCache => alloc.empty_cache(),
                            // Other threads allocate meanwhile: check only the blocks noted
                            // before the snapshot and still noted after it.
                            Op::Check => noted.check_stable(alloc),
                            _ => {}
                        }
                    }
                    // Keep the survivors until every thread is done, then check them all.
                    live
                }).unwrap();
                handles.push(h);
            }
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        noted.check_stable(&alloc);
        drop(survivors);
    }
}

/// The oracle shared by threads.
mod shared {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    pub(super) struct Noted(Mutex<HashMap<u64, super::Noted>>);

    impl Noted {
        pub(super) fn insert(&self, addr: u64, n: super::Noted) {
            self.0.lock().unwrap().insert(addr, n);
        }
        pub(super) fn remove(&self, addr: u64) {
            self.0.lock().unwrap().remove(&addr);
        }
        /// Checks the live blocks whose note was the same before and after the snapshot (no
        /// other thread freed and reallocated them meanwhile).
        pub(super) fn check_stable(&self, alloc: &CachingAllocator) {
            let before = self.0.lock().unwrap().clone();
            let snap = alloc.snapshot();
            let after = self.0.lock().unwrap().clone();
            let stable: HashMap<u64, super::Noted> =
                before.into_iter().filter(|(a, n)| after.get(a) == Some(n)).collect();
            let mut checked = 0;
            for b in snap.live_blocks() {
                let Some(n) = stable.get(&b.address) else { continue };
                checked += 1;
                let c = b.context.expect("blocks carry a context");
                assert_eq!(snap.scopes[c.scope.index()], n.scope, "scope of {:#x}", b.address);
                assert_eq!(snap.threads[c.thread.index()], n.thread, "thread of {:#x}", b.address);
                let first = snap.stack_frames(c.stack.expect("stacks are on")).next().expect("a user frame");
                assert!(first.function.ends_with(n.function), "site of {:#x}: {}", b.address, first.function);
                assert_eq!(b.requested_size, n.bytes, "requested bytes of {:#x}", b.address);
            }
            // Every stable note is a live block of the snapshot.
            assert_eq!(checked, stable.len(), "noted blocks missing from the snapshot");
        }
    }
}

/// The smallest case that paired blocks with the wrong context: a 3 MiB buffer (a 20 MiB
/// segment) made before a 64-byte one (a 2 MiB segment) at a lower address.
#[test]
fn a_large_then_a_small_allocation_keep_their_own_lines() {
    let alloc = CachingAllocator::new(vramscope::backend::HostBackend::new(1 << 30));
    let s = alloc.default_stream();
    let (big, big_line) = (alloc.alloc::<u8>(&s, 3 << 20).unwrap(), line!());
    let (small, small_line) = (alloc.alloc::<f32>(&s, 16).unwrap().with_shape(&[4, 4]).unwrap(), line!());
    let snap = alloc.snapshot();
    for (ptr, line, size) in [(big.device_ptr(), big_line, 4 << 20), (small.device_ptr(), small_line, 512)] {
        let b = snap.live_blocks().find(|b| b.address == ptr).unwrap();
        assert_eq!(b.size, size);
        let c = b.context.expect("a context");
        let f = snap.stack_frames(c.stack.unwrap()).next().unwrap();
        assert_eq!(f.line, Some(line), "{f}");
    }
    // After the cache is emptied, a new segment reuses the freed slot at another address.
    drop(big);
    alloc.empty_cache();
    let (again, again_line) = (alloc.alloc::<u8>(&s, 5 << 20).unwrap(), line!());
    let snap = alloc.snapshot();
    for (ptr, line) in [(small.device_ptr(), small_line), (again.device_ptr(), again_line)] {
        let b = snap.live_blocks().find(|b| b.address == ptr).unwrap();
        let f = snap.stack_frames(b.context.unwrap().stack.unwrap()).next().unwrap();
        assert_eq!(f.line, Some(line), "{f}");
    }
}
