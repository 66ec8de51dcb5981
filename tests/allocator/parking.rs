//! Parking: a thread's dropped blocks wait in its own slot for its next request of their size,
//! without the allocator's lock. What users can see of it must be what they would see without
//! it: exact statistics and peaks, no memory kept after the allocator goes, no stale tensor
//! description, and while recording, every allocation and free in the history with its
//! context.

use std::sync::{Arc, Barrier};
use vramscope::backend::SimBackend;
use vramscope::record::RecordConfig;
use vramscope::CachingAllocator;

fn quiet(sim: &Arc<SimBackend>) -> CachingAllocator {
    quiet_with(sim, "")
}

/// [`quiet`] with an allocator configuration.
fn quiet_with(sim: &Arc<SimBackend>, config: &str) -> CachingAllocator {
    let config = vramscope::config::AllocatorConfig::parse(config).unwrap();
    let alloc = CachingAllocator::with_config(sim.clone(), config).unwrap();
    alloc.record_memory_history(RecordConfig::off());
    // Park on every free, not only where the lock is busy (on one thread it never is).
    alloc.park_always();
    alloc
}

#[test]
fn the_peak_is_the_true_one_though_a_block_sat_parked() {
    let sim = Arc::new(SimBackend::new(1 << 30));
    // Segments that do not grow: PyTorch's two pools, each counted apart (where segments grow
    // and one stream holds them, every request is served from the large pool).
    let alloc = quiet_with(&sim, "release_pages:false");
    let s = alloc.default_stream();
    for _ in 0..3 {
        drop(alloc.alloc::<u8>(&s, 1 << 20).unwrap());
    }
    // The 1 MiB block is parked (the heap still counts it) when 2 MiB are asked for: the pull
    // frees it first, so the peak is 2 MiB, never 3.
    let two = alloc.alloc::<u8>(&s, 2 << 20).unwrap();
    assert_eq!(alloc.max_memory_allocated(), 2 << 20);
    assert_eq!(alloc.memory_allocated(), 2 << 20);
    drop(two);
    let stats = alloc.stats();
    // Every allocation and free counted, whether the heap or the slot served it.
    assert_eq!((stats.allocation.all.allocated, stats.allocation.all.freed, stats.allocation.all.current), (4, 4, 0));
    assert_eq!(stats.requested_bytes.all.allocated, (3 << 20) + (2 << 20));
    assert_eq!(stats.allocated_bytes.small_pool.allocated, 3 << 20);
    assert_eq!(stats.allocated_bytes.large_pool.allocated, 2 << 20);
    alloc.check_invariants().unwrap();
}

#[test]
fn threads_round_trips_are_counted_exactly() {
    let sim = Arc::new(SimBackend::new(1 << 34));
    let alloc = quiet(&sim);
    // Small-pool sizes: their blocks are exactly the rounded request (a large-pool block may
    // keep a remainder too small to split, which depends on what else is free).
    let sizes = [512usize, 1000, 4096, 1 << 20];
    let (threads, rounds) = (4, 2_000);
    std::thread::scope(|s| {
        for t in 0..threads {
            let alloc = &alloc;
            s.spawn(move || {
                let stream = if t % 2 == 0 { alloc.default_stream() } else { alloc.new_stream().unwrap() };
                for i in 0..rounds {
                    let a = alloc.alloc::<u8>(&stream, sizes[i % sizes.len()]).unwrap();
                    let b = alloc.alloc::<u8>(&stream, sizes[(i + t) % sizes.len()]).unwrap();
                    drop(a);
                    drop(b);
                }
            });
        }
    });
    // Block sizes as PyTorch rounds small requests: to 512-byte multiples.
    let block = |n: usize| (n as u64).next_multiple_of(512);
    let mut requested = 0;
    let mut bytes = 0;
    for t in 0..threads {
        for i in 0..rounds {
            for n in [sizes[i % sizes.len()], sizes[(i + t) % sizes.len()]] {
                requested += n as u64;
                bytes += block(n);
            }
        }
    }
    let stats = alloc.stats();
    let pairs = (threads * rounds * 2) as u64;
    assert_eq!((stats.allocation.all.allocated, stats.allocation.all.freed), (pairs, pairs));
    assert_eq!((stats.active.all.allocated, stats.active.all.freed), (pairs, pairs));
    assert_eq!(stats.requested_bytes.all.allocated, requested);
    assert_eq!(stats.allocated_bytes.all.allocated, bytes);
    assert_eq!(stats.allocated_bytes.all.current, 0);
    alloc.check_invariants().unwrap();
}

#[test]
fn a_parked_block_forgets_its_tensor_description() {
    let alloc = quiet(&Arc::new(SimBackend::new(1 << 30)));
    let s = alloc.default_stream();
    drop(alloc.alloc_shaped::<f32>(&s, &[4, 64]).unwrap());
    let again = alloc.alloc::<f32>(&s, 256).unwrap();
    assert_eq!(again.tensor_meta(), None);
    let shaped = again.with_shape(&[16, 16]).unwrap();
    assert_eq!(shaped.tensor_meta().unwrap().shape, [16, 16]);
}

#[test]
fn turning_the_recording_on_sees_no_parked_block_as_live() {
    let alloc = quiet(&Arc::new(SimBackend::new(1 << 30)));
    let s = alloc.default_stream();
    drop(alloc.alloc::<u8>(&s, 4096).unwrap());
    alloc.record_memory_history(RecordConfig::default());
    let snap = alloc.snapshot();
    assert_eq!(
        snap.live_blocks().map(|b| b.size).sum::<u64>(),
        0,
        "the parked block was freed before the recording began"
    );
    let kept = alloc.alloc::<u8>(&s, 4096).unwrap();
    assert_eq!(alloc.snapshot().live_blocks().map(|b| b.size).sum::<u64>(), 4096);
    drop(kept);
}

/// The allocator's last handle goes while other threads still hold parked blocks, or are
/// parking one at that very moment: every byte goes back to the backend (a block parked after
/// the last pull would keep the allocator, and its memory, alive for good).
#[test]
fn the_last_handle_frees_what_threads_parked_even_while_they_park() {
    for round in 0..300 {
        let sim = Arc::new(SimBackend::new(1 << 32));
        let alloc = quiet(&sim);
        let threads = 3;
        let go = Barrier::new(threads + 1);
        let done = Barrier::new(threads + 1);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (alloc, go, done) = (alloc.clone(), &go, &done);
                s.spawn(move || {
                    let stream = alloc.default_stream();
                    // Parked for good: this thread allocates no more.
                    drop(alloc.alloc::<u8>(&stream, 512 << t).unwrap());
                    let held = alloc.alloc::<u8>(&stream, 8192).unwrap();
                    drop(alloc);
                    go.wait();
                    // Dropped (and parked) while the last handle is dropped.
                    drop(held);
                    done.wait();
                });
            }
            go.wait();
            drop(alloc);
            done.wait();
            assert_eq!(sim.used_memory(), 0, "round {round}: the allocator kept its memory");
        });
    }
}

/// Threads recording (the default) park and take blocks back, logging what they do: every
/// allocation and free is in the history once, with its own thread and scope, each address
/// alternating between allocation and free, and each thread's allocations in its order.
#[test]
fn threads_recording_log_every_event_once_with_its_context() {
    let sim = Arc::new(SimBackend::new(1 << 34));
    let alloc = CachingAllocator::new(sim.clone());
    let mut rec = RecordConfig::default();
    rec.max_entries = 1 << 20;
    alloc.record_memory_history(rec);
    alloc.park_always();
    let (threads, rounds) = (4, 3_000);
    // Mostly one size from one place (taken back), now and then another.
    let size = |t: usize, i: usize| if i % 100 == 99 { 4096 << t } else { 512 * (t + 1) };
    let go = Barrier::new(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (alloc, go) = (&alloc, &go);
            s.spawn(move || {
                let stream = if t % 2 == 0 { alloc.default_stream() } else { alloc.new_stream().unwrap() };
                let _scope = vramscope::scope(&format!("thread{t}"));
                go.wait();
                for i in 0..rounds {
                    drop(alloc.alloc::<u8>(&stream, size(t, i)).unwrap());
                }
            });
        }
    });
    let snap = alloc.snapshot();
    assert_eq!(snap.history_dropped, 0);
    let stats = alloc.stats();
    let pairs = (threads * rounds) as u64;
    assert_eq!((stats.allocation.all.allocated, stats.allocation.all.freed), (pairs, pairs));
    let mut state = std::collections::HashMap::new();
    let mut sizes = vec![Vec::new(); threads];
    let (mut allocs, mut frees) = (0, 0);
    for e in &snap.history {
        match e.action {
            vramscope::record::Action::Alloc => {
                allocs += 1;
                assert_ne!(state.insert(e.addr, true), Some(true), "{:#x} allocated twice", e.addr);
                let c = e.context.as_ref().expect("an allocation's context");
                let scope = snap.scopes[c.scope.0 as usize].last().unwrap().clone();
                let t: usize = scope.strip_prefix("thread").unwrap().parse().unwrap();
                sizes[t].push(e.size);
            }
            vramscope::record::Action::FreeCompleted => {
                frees += 1;
                assert_eq!(state.insert(e.addr, false), Some(true), "{:#x} freed while not allocated", e.addr);
            }
            _ => {}
        }
    }
    assert_eq!((allocs, frees), (pairs, pairs));
    for (t, sizes) in sizes.iter().enumerate() {
        assert_eq!(sizes.len(), rounds, "thread {t}'s allocations");
        let wrong = (0..rounds).find(|&i| sizes[i] != size(t, i) as u64);
        assert_eq!(wrong, None, "thread {t}'s allocations in its order");
    }
    alloc.check_invariants().unwrap();
}
