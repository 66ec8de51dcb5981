//! Parking (nothing recorded): a thread's dropped blocks wait in its own slot for its next
//! request of their size, without the allocator's lock. What users can see of it must be what
//! they would see without it: exact statistics and peaks, no memory kept after the allocator
//! goes, no stale tensor description.

use std::sync::{Arc, Barrier};
use vramscope::backend::SimBackend;
use vramscope::record::RecordConfig;
use vramscope::CachingAllocator;

fn quiet(sim: &Arc<SimBackend>) -> CachingAllocator {
    let alloc = CachingAllocator::new(sim.clone());
    alloc.record_memory_history(RecordConfig::off());
    // Park on every free, not only where the lock is busy (on one thread it never is).
    alloc.park_always();
    alloc
}

#[test]
fn the_peak_is_the_true_one_though_a_block_sat_parked() {
    let sim = Arc::new(SimBackend::new(1 << 30));
    let alloc = quiet(&sim);
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
