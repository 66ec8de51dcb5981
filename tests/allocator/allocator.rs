//! Behaviour of the caching allocator: caching, rounding, pools, streams, statistics, OOM.

use std::sync::Arc;
use vramscope::{
    backend::EventMode, backend::FaultPlan, backend::FaultyBackend, backend::HostBackend, backend::RawStream,
    backend::SimBackend, config::AllocatorConfig, error::InvalidRequest, error::UsageError, CachingAllocator, Error,
};

const MIB: u64 = 1 << 20;

/// An allocator configured by `conf` (`VRAMSCOPE_ALLOC_CONF` form) on a 1 GiB sim.
fn on_sim(conf: &str) -> CachingAllocator {
    CachingAllocator::with_config(SimBackend::new(1 << 30), AllocatorConfig::parse(conf).unwrap()).unwrap()
}

/// An allocator on `backend` without views of the range's pages (`alias_pages`): for the tests
/// of how the range unmaps and grows, whose requests a view of a hole's pages would serve.
fn without_views(backend: impl vramscope::backend::IntoBackend) -> CachingAllocator {
    CachingAllocator::with_config(backend, AllocatorConfig::parse("alias_pages:false").unwrap()).unwrap()
}

/// An allocator that caches exactly like PyTorch's (no fragmentation limit).
fn pytorch_like(capacity: u64) -> CachingAllocator {
    let config =
        AllocatorConfig::parse("fragmentation_limit:off,expandable_segments:False,share_idle_streams:False").unwrap();
    CachingAllocator::with_config(SimBackend::new(capacity), config).unwrap()
}

#[test]
fn freed_blocks_are_cached_and_reused() {
    let alloc = pytorch_like(1 << 30);
    let s = alloc.default_stream();
    let a = alloc.alloc::<u8>(&s, 3 * MIB as usize).unwrap();
    let addr = a.device_ptr();
    drop(a);
    assert_eq!(alloc.memory_allocated(), 0);
    assert_eq!(alloc.memory_reserved(), 20 * MIB, "a 3 MiB request gets a 20 MiB segment");
    let b = alloc.alloc::<u8>(&s, 3 * MIB as usize).unwrap();
    assert_eq!(b.device_ptr(), addr, "the cached block is reused");
    assert_eq!(alloc.stats().num_device_alloc, 1);
}

#[test]
fn requests_round_to_512_and_pools_split_at_1_mib() {
    let alloc = pytorch_like(1 << 30);
    let s = alloc.default_stream();
    let a = alloc.alloc::<u8>(&s, 1).unwrap();
    let b = alloc.alloc::<u8>(&s, 513).unwrap();
    let c = alloc.alloc::<u8>(&s, MIB as usize).unwrap();
    let d = alloc.alloc::<u8>(&s, MIB as usize + 1).unwrap();
    let st = alloc.stats();
    assert_eq!(st.allocated_bytes.small_pool.current, 512 + 1024 + MIB);
    assert_eq!(st.allocated_bytes.large_pool.current, MIB + 512);
    assert_eq!(st.requested_bytes.all.current, 1 + 513 + MIB + MIB + 1);
    assert_eq!(st.segment.small_pool.current, 1, "small blocks share one 2 MiB segment");
    assert_eq!(b.device_ptr(), a.device_ptr() + 512, "blocks are split from the front");
    drop((a, b, c, d));
}

#[test]
fn the_fragmentation_limit_gives_cache_back_before_growing() {
    // Segments that cannot grow in place (as `cuMemAlloc`'s): see the next test for those that can.
    let alloc = on_sim("release_pages:false");
    let s = alloc.default_stream();
    // A new peak is reserved exactly: no 20 MiB segment for a 3 MiB request.
    let a = alloc.alloc::<u8>(&s, 3 * MIB as usize).unwrap();
    assert_eq!(alloc.memory_reserved(), 4 * MIB);
    drop(a);
    // A cached block that does not fit is released before a new segment is reserved.
    let b = alloc.alloc::<u8>(&s, 6 * MIB as usize).unwrap();
    assert_eq!(alloc.memory_reserved(), 6 * MIB);
    assert_eq!(alloc.stats().num_device_free, 1);
    drop(b);
    // Below the peak, segments are sized for reuse as PyTorch sizes them.
    let small = alloc.alloc::<u8>(&s, 3 * MIB as usize).unwrap();
    assert_eq!(alloc.memory_reserved(), 6 * MIB, "served from the cached 6 MiB block");
    drop(small);
    alloc.check_invariants().unwrap();
}

#[test]
fn a_single_stream_grows_its_segment_in_place_where_the_backend_maps_pages() {
    let sim = Arc::new(SimBackend::new(1 << 30));
    let alloc = CachingAllocator::new(sim.clone());
    let s = alloc.default_stream();
    let a = alloc.alloc::<u8>(&s, 3 * MIB as usize).unwrap();
    let base = a.device_ptr();
    assert_eq!(alloc.memory_reserved(), 4 * MIB);
    drop(a);
    // 6 MiB does not fit the free 4 MiB segment: it grows by the 2 MiB its free end lacks,
    // and the request gets the whole segment, from its start.
    let b = alloc.alloc::<u8>(&s, 6 * MIB as usize).unwrap();
    assert_eq!(b.device_ptr(), base);
    let st = alloc.stats();
    assert_eq!((alloc.memory_reserved(), sim.used_memory()), (6 * MIB, 6 * MIB));
    assert_eq!((st.num_device_alloc, st.num_device_free, st.num_device_map), (1, 0, 1), "{st:#?}");
    // With its end in use, the next request grows it again, after that end.
    let c = alloc.alloc::<u8>(&s, 5 * MIB as usize).unwrap();
    assert_eq!(c.device_ptr(), base + 6 * MIB);
    assert_eq!(alloc.memory_reserved(), 12 * MIB);
    alloc.check_invariants().unwrap();
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 1, "{:#?}", snap.segments);
    assert_eq!(snap.segments[0].total_size, 12 * MIB);
    // The history says what was mapped, where, for which request.
    let maps: Vec<_> = snap.history.iter().filter(|e| e.action == vramscope::record::Action::SegmentMap).collect();
    assert_eq!(
        maps.iter().map(|e| (e.addr, e.size)).collect::<Vec<_>>(),
        [(base + 4 * MIB, 2 * MIB), (base + 6 * MIB, 6 * MIB)]
    );
    // Its grown granules are given back whole, and the whole segment at once.
    drop(b);
    alloc.empty_cache();
    assert_eq!(sim.used_memory(), 6 * MIB, "the 6 MiB still in use stay: {:#?}", alloc.stats());
    drop(c);
    alloc.empty_cache();
    assert_eq!((alloc.memory_reserved(), sim.used_memory()), (0, 0));
    alloc.check_invariants().unwrap();
}

/// Random requests on one stream (so segments grow in place), with and without PyTorch's
/// `max_split_size` (which does not apply in a range that grows: its blocks are split, mapped
/// where they are not), freeing and emptying the cache at random: every invariant holds after
/// every step.
#[test]
fn one_stream_growing_in_place_keeps_every_invariant() {
    for seed in 1..3000u64 {
        let mut r = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
        let mut next = move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r
        };
        let conf = match seed % 3 {
            0 => "",
            1 => "max_split_size_mb:40,roundup_power2_divisions:4",
            _ => "roundup_power2_divisions:4",
        };
        let alloc =
            CachingAllocator::with_config(SimBackend::new(1 << 40), AllocatorConfig::parse(conf).unwrap()).unwrap();
        let s = alloc.default_stream();
        let mut live: Vec<vramscope::Buffer<u8>> = Vec::new();
        let mut log = Vec::new();
        for _ in 0..60 {
            let k = next() % 10;
            if k < 5 {
                let bytes = [512usize, 1 << 20, 4 << 20, 3 << 20, 7 << 20, 20 << 20, 45 << 20][(next() % 7) as usize]
                    + (next() % 3) as usize * 4096;
                log.push(format!("alloc {bytes}"));
                live.push(alloc.alloc::<u8>(&s, bytes).unwrap());
            } else if k < 9 && !live.is_empty() {
                let i = (next() as usize) % live.len();
                log.push(format!("free {}", live[i].len()));
                drop(live.swap_remove(i));
            } else {
                log.push("empty".into());
                alloc.empty_cache();
            }
            if let Err(e) = alloc.check_invariants() {
                panic!("seed {seed} conf {conf}: {e}\n{}", log.join("\n"));
            }
        }
    }
}

#[test]
fn a_growth_the_backend_refuses_becomes_a_new_segment() {
    // Requests: 0 reserves the first segment, 1 is the growth (refused), 2 the new segment.
    let sim = SimBackend::new(1 << 30);
    let alloc = without_views(FaultyBackend::new(sim, FaultPlan::nth(1)));
    let s = alloc.default_stream();
    let a = alloc.alloc::<u8>(&s, 3 * MIB as usize).unwrap();
    let b = alloc.alloc::<u8>(&s, 6 * MIB as usize).unwrap();
    let st = alloc.stats();
    assert_eq!((st.num_device_alloc, st.num_device_map), (2, 0), "{st:#?}");
    assert_eq!(alloc.memory_reserved(), 10 * MIB);
    alloc.check_invariants().unwrap();
    drop((a, b));
    // The next growth is granted.
    let c = alloc.alloc::<u8>(&s, 12 * MIB as usize).unwrap();
    assert_eq!(alloc.stats().num_device_map, 1);
    alloc.check_invariants().unwrap();
    drop(c);
}

/// One range grows at a time: another stream's large segment, reserved without room, does not
/// stop the first stream's range from growing in place, and that stream's own requests get
/// segments of their own while the range's stream has work queued. Once it is idle, the other
/// stream's large requests are served from the range.
#[test]
fn one_range_grows_while_other_streams_hold_segments() {
    let sim = Arc::new(SimBackend::with_events(1 << 30, EventMode::Manual));
    let alloc = CachingAllocator::new(sim.clone());
    let (s, t) = (alloc.default_stream(), alloc.new_stream().unwrap());
    let a = alloc.alloc::<u8>(&s, 3 * MIB as usize).unwrap();
    // Work queued on `s` (an event the manual sim keeps pending): `t` goes its own way.
    vramscope::backend::Backend::record_event(&*sim, s.raw()).unwrap();
    let other = alloc.alloc::<u8>(&t, 3 * MIB as usize).unwrap();
    assert_eq!(alloc.stats().num_device_alloc, 2);
    // The range of `s` grows by what its free end lacks: a map, no new segment.
    let b = alloc.alloc::<u8>(&s, 6 * MIB as usize).unwrap();
    let st = alloc.stats();
    assert_eq!((st.num_device_alloc, st.num_device_map), (2, 1), "{st:#?}");
    assert_eq!(b.device_ptr(), a.device_ptr() + 3 * MIB, "in the range, after `a`");
    // `t` does not grow its segment: a new one.
    let more = alloc.alloc::<u8>(&t, 30 * MIB as usize).unwrap();
    let st = alloc.stats();
    assert_eq!((st.num_device_alloc, st.num_device_map), (3, 1), "{st:#?}");
    alloc.check_invariants().unwrap();
    // `s` idle: the range serves `t`, grown by what it lacks.
    vramscope::backend::Backend::synchronize(&*sim, s.raw()).unwrap();
    let shared = alloc.alloc::<u8>(&t, 40 * MIB as usize).unwrap();
    let st = alloc.stats();
    assert_eq!((st.num_device_alloc, st.num_device_map), (3, 2), "{st:#?}");
    assert_eq!(shared.device_ptr(), b.device_ptr() + 6 * MIB, "in the range, after `b`");
    alloc.check_invariants().unwrap();
    drop((a, b, other, more, shared));
    alloc.check_invariants().unwrap();
}

#[test]
fn holes_are_unmapped_instead_of_growing_where_the_backend_can() {
    let sim = Arc::new(SimBackend::new(1 << 30));
    let alloc = without_views(sim.clone());
    let s = alloc.default_stream();
    // One 40 MiB segment, then keep its two ends and free the middle.
    let whole = alloc.alloc::<u8>(&s, 40 * MIB as usize).unwrap();
    drop(whole);
    let head = alloc.alloc::<u8>(&s, 12 * MIB as usize).unwrap();
    let middle = alloc.alloc::<u8>(&s, 16 * MIB as usize).unwrap();
    let tail = alloc.alloc::<u8>(&s, 12 * MIB as usize).unwrap();
    assert_eq!(alloc.memory_reserved(), 40 * MIB);
    drop(middle);
    // 18 MiB does not fit in the 16 MiB hole: the range grows to 58 MiB, and of the hole's pages
    // as many whole granules as that exceeds the limit by (1.05 x 42 MiB) are unmapped, from its
    // end: 14 MiB, rather than exceeding the limit (or unmapping all 16).
    let other = alloc.alloc::<u8>(&s, 18 * MIB as usize).unwrap();
    let st = alloc.stats();
    assert!(st.num_device_unmap >= 1, "{st:#?}");
    assert_eq!(alloc.memory_reserved(), 44 * MIB);
    assert_eq!(sim.used_memory(), 44 * MIB);
    alloc.check_invariants().unwrap();
    // The hole's pages are mapped again when it is reused.
    let again = alloc.alloc::<u8>(&s, 16 * MIB as usize).unwrap();
    assert!(alloc.stats().num_device_map >= 1);
    assert_eq!(alloc.memory_reserved(), 58 * MIB);
    alloc.check_invariants().unwrap();
    drop((head, tail, other, again));
    alloc.empty_cache();
    assert_eq!(sim.used_memory(), 0);
}

#[test]
fn mapping_a_blocks_front_may_give_back_the_pages_of_its_rest() {
    let sim = Arc::new(SimBackend::new(1 << 30));
    let alloc = without_views(sim.clone());
    let s = alloc.default_stream();
    drop(alloc.alloc::<u8>(&s, 40 * MIB as usize).unwrap());
    let [a, b, c, d] = [(); 4].map(|()| alloc.alloc::<u8>(&s, 10 * MIB as usize).unwrap());
    drop(b);
    // 12 MiB fits no hole: the range grows to 52 MiB, and the last 8 MiB of b's hole are
    // unmapped to stay under the limit (1.05 x 42 MiB).
    let e = alloc.alloc::<u8>(&s, 12 * MIB as usize).unwrap();
    assert_eq!(alloc.memory_reserved(), 44 * MIB);
    // One free block of 20 MiB: b's 2 mapped and 8 unmapped MiB, then c's mapped 10 MiB.
    drop(c);
    // Its front 12 MiB lack 8 MiB of pages; the limit (1.05 x 44 MiB) lets reserved reach
    // 46.2 MiB, so 6 of the rest's 8 MiB of whole pages are given back: 44 + 8 - 6.
    let f = alloc.alloc::<u8>(&s, 12 * MIB as usize).unwrap();
    assert_eq!(alloc.memory_reserved(), 46 * MIB, "{:#?}", alloc.stats());
    assert_eq!(sim.used_memory(), 46 * MIB);
    alloc.check_invariants().unwrap();
    drop((a, d, e, f));
}

#[test]
fn a_refused_map_of_a_blocks_front_leaves_the_block_free_and_whole() {
    let faulty = Arc::new(FaultyBackend::new(SimBackend::new(1 << 30), FaultPlan::Never));
    let alloc = without_views(faulty.clone());
    let s = alloc.default_stream();
    drop(alloc.alloc::<u8>(&s, 40 * MIB as usize).unwrap());
    let [a, b, c, d] = [(); 4].map(|()| alloc.alloc::<u8>(&s, 10 * MIB as usize).unwrap());
    let b_addr = b.device_ptr();
    drop(b);
    let e = alloc.alloc::<u8>(&s, 12 * MIB as usize).unwrap();
    drop(c);
    // The front of the 20 MiB free block lacks pages, and every map is refused (the retry
    // after releasing the cache too): an out-of-memory error, and nothing lost.
    faulty.set_plan(FaultPlan::From(0));
    let err = alloc.alloc::<u8>(&s, 12 * MIB as usize).unwrap_err();
    assert!(err.to_string().contains("out of memory"), "{err}");
    alloc.check_invariants().unwrap();
    assert_eq!(alloc.memory_allocated(), 32 * MIB);
    // The block is whole again: with maps allowed, the same request gets its front.
    faulty.set_plan(FaultPlan::Never);
    let f = alloc.alloc::<u8>(&s, 20 * MIB as usize).unwrap();
    assert_eq!(f.device_ptr(), b_addr);
    alloc.check_invariants().unwrap();
    drop((a, d, e, f));
}

#[test]
fn holes_in_large_segments_are_unmapped_in_whole_granules() {
    // A 1 GiB segment maps in 32 MiB granules (`backend::map_granule`): a hole gives back the
    // granules wholly inside it, and the sim backend refuses any other unmap.
    let sim = Arc::new(SimBackend::new(8 << 30));
    let alloc = without_views(sim.clone());
    let s = alloc.default_stream();
    let whole = alloc.alloc::<u8>(&s, 1024 * MIB as usize).unwrap();
    drop(whole);
    // Keep 100 MiB at each end and free the middle 824 MiB (starting and ending mid-granule).
    let head = alloc.alloc::<u8>(&s, 100 * MIB as usize).unwrap();
    let middle = alloc.alloc::<u8>(&s, 824 * MIB as usize).unwrap();
    let tail = alloc.alloc::<u8>(&s, 100 * MIB as usize).unwrap();
    assert_eq!(alloc.memory_reserved(), 1024 * MIB);
    drop(middle);
    // Granules wholly inside [100, 924) MiB: [128, 896) MiB, 24 of them.
    let other = alloc.alloc::<u8>(&s, 900 * MIB as usize).unwrap();
    let st = alloc.stats();
    assert!(st.num_device_unmap >= 1, "{st:#?}");
    assert_eq!(alloc.memory_reserved(), (1024 - 768 + 900) * MIB, "{st:#?}");
    assert_eq!(sim.used_memory(), alloc.memory_reserved());
    alloc.check_invariants().unwrap();
    // Reusing the hole maps again the whole granules the new block touches (the sim backend
    // refuses a map of part of one).
    let again = alloc.alloc::<u8>(&s, 800 * MIB as usize).unwrap();
    assert!(alloc.stats().num_device_map >= 1);
    assert_eq!(sim.used_memory(), alloc.memory_reserved());
    alloc.check_invariants().unwrap();
    drop((head, tail, other, again));
    alloc.empty_cache();
    assert_eq!(sim.used_memory(), 0);
}

#[test]
fn large_requests_get_their_own_segment_size() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let s = alloc.default_stream();
    let a = alloc.alloc::<u8>(&s, 50 * MIB as usize + 1).unwrap();
    assert_eq!(alloc.memory_reserved(), 52 * MIB, "rounded up to the 2 MiB page");
    drop(a);
}

#[test]
fn roundup_power2_divisions_rounds_like_pytorch() {
    let alloc = on_sim("roundup_power2_divisions:4,fragmentation_limit:off");
    let s = alloc.default_stream();
    // 1200 KiB lies between 1 MiB and 2 MiB: divisions of 256 KiB, so 1280 KiB.
    let a = alloc.alloc::<u8>(&s, 1200 << 10).unwrap();
    assert_eq!(alloc.memory_allocated(), 1280 << 10);
    drop(a);
}

#[test]
fn merging_restores_whole_segments() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let s = alloc.default_stream();
    let bufs: Vec<_> = (0..8).map(|_| alloc.alloc::<u8>(&s, 4096).unwrap()).collect();
    assert_eq!(alloc.stats().inactive_split_bytes.all.current, 2 * MIB - 8 * 4096);
    // Free every other block, then the rest: merges from both sides.
    let (even, odd): (Vec<_>, Vec<_>) = bufs.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    drop(even);
    alloc.check_invariants().unwrap();
    drop(odd);
    alloc.check_invariants().unwrap();
    alloc.empty_cache();
    assert_eq!(alloc.memory_reserved(), 0, "fully merged segments are released");
    assert_eq!(alloc.largest_free_block(), 0);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    // Segments that do not grow, no soft limit: PyTorch's rules hold throughout.
    let alloc = on_sim("max_split_size_mb:32,fragmentation_limit:off,release_pages:false");
    let s = alloc.default_stream();
    drop(alloc.alloc::<u8>(&s, 64 * MIB as usize).unwrap());
    // A small request must not take the cached 64 MiB block.
    let small = alloc.alloc::<u8>(&s, 2 * MIB as usize).unwrap();
    assert_eq!(alloc.stats().num_device_alloc, 2);
    assert_eq!(alloc.stats().oversize_segments.current, 1);
    drop(small);
    let big = alloc.alloc::<u8>(&s, 60 * MIB as usize).unwrap();
    assert_eq!(alloc.stats().oversize_allocations.current, 1);
    drop(big);
    alloc.check_invariants().unwrap();
}

#[test]
fn max_non_split_rounding_lets_oversize_requests_take_larger_blocks_whole() {
    // PyTorch's rules throughout (no soft limit, segments that do not grow), with the default
    // 20 MiB of rounding and with 64 MiB.
    for (rounding, segments) in [("", 2), (",max_non_split_rounding_mb:64", 1)] {
        let conf = format!("max_split_size_mb:32,fragmentation_limit:off,release_pages:false{rounding}");
        let alloc = on_sim(&conf);
        let s = alloc.default_stream();
        drop(alloc.alloc::<u8>(&s, 128 * MIB as usize).unwrap());
        // 80 MiB is 48 MiB smaller than the cached block: beyond 20 MiB, within 64.
        let b = alloc.alloc::<u8>(&s, 80 * MIB as usize).unwrap();
        let st = alloc.stats();
        assert_eq!(st.num_device_alloc, segments, "{conf}");
        if segments == 1 {
            assert_eq!(st.allocated_bytes.all.current, 128 * MIB, "taken whole, not split");
        }
        drop(b);
        alloc.check_invariants().unwrap();
    }
}

#[test]
fn max_split_size_gives_way_over_the_soft_limit() {
    // Segments that do not grow; the default limit (1.05 times the peak of allocated bytes),
    // then one with room for a new segment.
    for (limit, segments) in [("1.05", 1), ("2", 3)] {
        let conf = format!("max_split_size_mb:32,release_pages:false,fragmentation_limit:{limit}");
        let alloc = on_sim(&conf);
        let s = alloc.default_stream();
        drop(alloc.alloc::<u8>(&s, 64 * MIB as usize).unwrap());
        // PyTorch's rules keep the cached 64 MiB block from a 2 MiB request and from a 40 MiB
        // one (20 MiB or more smaller than it). Under the limit they hold: each reserves a
        // segment of its own. Where that would pass the limit, the block is split instead.
        let small = alloc.alloc::<u8>(&s, 2 * MIB as usize).unwrap();
        let big = alloc.alloc::<u8>(&s, 40 * MIB as usize).unwrap();
        let st = alloc.stats();
        assert_eq!(st.num_device_alloc, segments, "limit {limit}: {st:#?}");
        if segments == 1 {
            assert_eq!(alloc.memory_reserved(), 64 * MIB);
            assert_eq!(big.device_ptr(), small.device_ptr() + 2 * MIB);
        }
        drop((small, big));
        alloc.check_invariants().unwrap();
    }
}

#[test]
fn max_split_size_does_not_apply_where_segments_grow() {
    // One stream on a backend that maps pages: its large segment grows in place.
    let alloc = on_sim("max_split_size_mb:32");
    let s = alloc.default_stream();
    drop(alloc.alloc::<u8>(&s, 64 * MIB as usize).unwrap());
    // The range's free 64 MiB serves a small request and then a large one, split as PyTorch's
    // expandable segments split: no new segment, no page mapped.
    let small = alloc.alloc::<u8>(&s, 2 * MIB as usize).unwrap();
    let big = alloc.alloc::<u8>(&s, 40 * MIB as usize).unwrap();
    let st = alloc.stats();
    assert_eq!((st.num_device_alloc, st.num_device_map, alloc.memory_reserved()), (1, 0, 64 * MIB), "{st:#?}");
    drop((small, big));
    alloc.check_invariants().unwrap();
}

#[test]
fn per_process_memory_fraction_caps_what_the_allocator_reserves() {
    for pages in [false, true] {
        let conf = format!("per_process_memory_fraction:0.25,release_pages:{pages}");
        let sim = Arc::new(SimBackend::new(1 << 30));
        let alloc = CachingAllocator::with_config(sim.clone(), AllocatorConfig::parse(&conf).unwrap()).unwrap();
        let s = alloc.default_stream();
        let a = alloc.alloc::<u8>(&s, 200 * MIB as usize).unwrap();
        // 300 MiB would fit the device's 1 GiB, not the 256 MiB allowed.
        let err = alloc.alloc::<u8>(&s, 100 * MIB as usize).unwrap_err();
        let Error::OutOfMemory(report) = &err else { panic!("{conf}: {err}") };
        assert_eq!((report.allowed, report.capacity), (Some(256 * MIB), 1 << 30), "{conf}");
        assert!(err.to_string().contains("may reserve 256.00 MiB of it;"), "{err}");
        assert_eq!(alloc.memory_allocated(), 200 * MIB, "{conf}: nothing recorded is lost");
        // Cached memory that does not fit a request is given back for it.
        drop(a);
        let b = alloc.alloc::<u8>(&s, 240 * MIB as usize).unwrap();
        assert!(alloc.memory_reserved() <= 256 * MIB && sim.used_memory() <= 256 * MIB, "{conf}");
        // Small requests beside it fill the rest, not more.
        let mut small = Vec::new();
        while let Ok(x) = alloc.alloc::<u8>(&s, MIB as usize) {
            small.push(x);
        }
        assert!(alloc.memory_reserved() <= 256 * MIB, "{conf}: {}", alloc.memory_reserved());
        assert!(small.len() >= 12, "{conf}: {} MiB beside 240", small.len());
        drop((b, small));
        alloc.check_invariants().unwrap();
    }
}

/// With `share_idle_streams:false`, as in PyTorch's allocator, a block cached for one stream
/// is never handed to another (but for loans over the fragmentation limit, off here).
#[test]
fn blocks_are_reused_only_on_their_stream_where_streams_share_nothing() {
    let alloc = pytorch_like(1 << 30);
    let s1 = alloc.default_stream();
    let s2 = alloc.new_stream().unwrap();
    let a = alloc.alloc::<u8>(&s1, 4 * MIB as usize).unwrap();
    let addr = a.device_ptr();
    drop(a);
    let b = alloc.alloc::<u8>(&s2, 18 * MIB as usize).unwrap();
    assert_ne!(b.device_ptr(), addr, "a block cached for stream 1 is not handed to stream 2");
    let c = alloc.alloc::<u8>(&s1, 4 * MIB as usize).unwrap();
    assert_eq!(c.device_ptr(), addr);
}

/// A block cached for one stream serves another stream only while the first has no work
/// queued (`Heap::serve_from_range`: with `cuMemAlloc`-like segments, the stream holding the
/// most large segments is the one whose cache serves the others).
#[test]
fn blocks_are_reused_on_another_stream_only_while_their_stream_is_idle() {
    let sim = Arc::new(SimBackend::with_events(1 << 30, EventMode::Manual));
    let config = AllocatorConfig::parse("fragmentation_limit:off,expandable_segments:False").unwrap();
    let alloc = CachingAllocator::with_config(sim.clone(), config).unwrap();
    let s1 = alloc.default_stream();
    let s2 = alloc.new_stream().unwrap();
    let a = alloc.alloc::<u8>(&s1, 4 * MIB as usize).unwrap();
    let addr = a.device_ptr();
    drop(a);
    // Work queued on stream 1 (an event the manual sim keeps pending).
    vramscope::backend::Backend::record_event(&*sim, s1.raw()).unwrap();
    let b = alloc.alloc::<u8>(&s2, 4 * MIB as usize).unwrap();
    assert_ne!(b.device_ptr(), addr, "a block cached for stream 1 is not handed to stream 2");
    let c = alloc.alloc::<u8>(&s1, 4 * MIB as usize).unwrap();
    assert_eq!(c.device_ptr(), addr);
    drop(c);
    // Stream 1 idle: a request that stream 2's own cache (16 MiB free) cannot serve gets stream
    // 1's cached segment, lent.
    vramscope::backend::Backend::synchronize(&*sim, s1.raw()).unwrap();
    let d = alloc.alloc::<u8>(&s2, 18 * MIB as usize).unwrap();
    assert_eq!(d.device_ptr(), addr, "stream 1's cache serves stream 2");
    assert_eq!(alloc.stats().num_device_alloc, 2, "nothing reserved for it");
    drop((b, d));
    alloc.check_invariants().unwrap();
}

#[test]
fn record_stream_delays_reuse_until_the_other_stream_passes_the_free() {
    let sim = Arc::new(SimBackend::with_events(1 << 30, EventMode::Manual));
    let alloc = CachingAllocator::new(sim.clone());
    let s1 = alloc.default_stream();
    let s2 = alloc.new_stream().unwrap();
    let a = alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap();
    let addr = a.device_ptr();
    alloc.record_stream(&a, s2).unwrap();
    drop(a);
    let st = alloc.stats();
    assert_eq!(st.allocated_bytes.all.current, 0, "live bytes drop at once");
    assert_eq!(st.active_bytes.all.current, 8 * MIB, "but the block stays active");
    let b = alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap();
    assert_ne!(b.device_ptr(), addr, "the block is not reused while stream 2 may still use it");
    drop(b);
    alloc.synchronize(s2).unwrap();
    assert_eq!(alloc.stats().active_bytes.all.current, 0);
    let c = alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap();
    assert!(c.device_ptr() == addr || alloc.stats().num_device_alloc == 2);
    alloc.check_invariants().unwrap();
}

/// `synchronize(s)` completes the frees that waited on `s` from the wait itself, even where
/// the event query still says "not ready" (as `cuEventQuery` did after `cuStreamSynchronize` on
/// an H200: BENCHMARKS.md, "An event query that lags"): the frees that wait on other streams
/// stay pending until those are waited for, and `synchronize_all` completes every one.
#[test]
fn synchronizing_a_stream_completes_its_frees_whatever_the_event_query_says() {
    let backend = SyncLog::new(SimBackend::with_events(1 << 30, EventMode::Manual));
    let alloc = CachingAllocator::new(backend.clone());
    let (s1, s2, s3) = (alloc.default_stream(), alloc.new_stream().unwrap(), alloc.new_stream().unwrap());
    let (a, b) = (alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap(), alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap());
    let (a_addr, b_addr) = (a.device_ptr(), b.device_ptr());
    alloc.record_stream(&a, s2).unwrap();
    alloc.record_stream(&b, s3).unwrap();
    drop((a, b));
    backend.stale_queries.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(alloc.stats().active_bytes.all.current, 16 * MIB, "both wait");
    alloc.synchronize(s1).unwrap();
    assert_eq!(alloc.stats().active_bytes.all.current, 16 * MIB, "no free waited on stream 1");
    alloc.synchronize(s2).unwrap();
    assert_eq!(alloc.stats().active_bytes.all.current, 8 * MIB, "the free that waited on stream 2 is done");
    let c = alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap();
    assert_eq!(c.device_ptr(), a_addr, "and its block is reused");
    let d = alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap();
    assert_ne!(d.device_ptr(), b_addr, "the block that waits on stream 3 is not");
    alloc.synchronize_all().unwrap();
    assert_eq!(alloc.stats().active_bytes.all.current, 16 * MIB, "c and d only");
    assert_eq!(alloc.stats().num_backend_errors, 0);
    drop((c, d));
    alloc.check_invariants().unwrap();
}

/// A free whose event query keeps saying "not ready" completes once its stream is idle, without
/// a `synchronize`: the event is asked a few times, then its stream (on CUDA `cuStreamQuery`).
#[test]
fn a_free_whose_event_query_lags_completes_once_its_stream_is_idle() {
    let backend = SyncLog::new(SimBackend::with_events(1 << 30, EventMode::Manual));
    let alloc = CachingAllocator::new(backend.clone());
    let (s1, s2) = (alloc.default_stream(), alloc.new_stream().unwrap());
    let a = alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap();
    let addr = a.device_ptr();
    alloc.record_stream(&a, s2).unwrap();
    drop(a);
    backend.stale_queries.store(true, std::sync::atomic::Ordering::Relaxed);
    // While stream 2's work runs (its event pending in the sim), the block stays out of use.
    let mut kept = Vec::new();
    for _ in 0..20 {
        kept.push(alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap());
    }
    assert!(kept.iter().all(|k| k.device_ptr() != addr), "reused while stream 2 may still use it");
    // Stream 2's work ends; the event query still says "not ready".
    vramscope::backend::Backend::synchronize(&backend.sim, s2.raw()).unwrap();
    let mut asked = 0;
    let reused = loop {
        let x = alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap();
        asked += 1;
        if x.device_ptr() == addr {
            break x;
        }
        kept.push(x);
        assert!(asked < 40, "the block never came back after stream 2 went idle");
    };
    assert_eq!(alloc.stats().num_backend_errors, 0);
    drop((reused, kept));
    alloc.check_invariants().unwrap();
}

#[test]
fn zero_length_buffers_allocate_nothing() {
    let alloc = CachingAllocator::new(HostBackend::new(1 << 20));
    let s = alloc.default_stream();
    let mut z = alloc.alloc::<f64>(&s, 0).unwrap();
    assert!(z.is_empty());
    assert_eq!(z.device_ptr(), 0);
    z.copy_from_host(&[]).unwrap();
    assert_eq!(z.to_vec().unwrap(), Vec::<f64>::new());
    assert_eq!(alloc.memory_reserved(), 0);
}

#[test]
fn impossible_requests_are_errors_not_panics() {
    let alloc = CachingAllocator::new(HostBackend::new(64 * MIB));
    let s = alloc.default_stream();
    let e = alloc.alloc::<u64>(&s, usize::MAX).unwrap_err();
    assert!(matches!(e, Error::InvalidRequest(InvalidRequest::BytesOverflow { len: usize::MAX, element: 8 })), "{e}");
    assert_eq!(e.to_string(), format!("invalid request: {} elements of 8 bytes overflow 64 bits", usize::MAX));
    let e = alloc.alloc::<u8>(&s, 1 << 40).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)), "{e}");
    let e = alloc.alloc::<u8>(&s, usize::MAX - 10).unwrap_err();
    assert!(matches!(e, Error::InvalidRequest(_) | Error::OutOfMemory(_)), "{e}");
    // The allocator still works.
    drop(alloc.alloc::<u8>(&s, 1024).unwrap());
    alloc.check_invariants().unwrap();
}

#[test]
fn streams_and_buffers_of_another_allocator_are_refused() {
    let a = CachingAllocator::new(SimBackend::new(1 << 30));
    let b = CachingAllocator::new(SimBackend::new(1 << 30));
    let sb = b.new_stream().unwrap();
    assert!(matches!(a.alloc::<u8>(&sb, 10), Err(Error::Usage(UsageError::ForeignStream { stream: 1 }))));
    let buf = b.alloc::<u8>(&b.default_stream(), 10).unwrap();
    let e = a.record_stream(&buf, a.default_stream()).unwrap_err();
    assert!(matches!(e, Error::Usage(UsageError::ForeignBuffer)), "{e}");
    assert_eq!(e.to_string(), "usage error: the buffer belongs to another allocator");
}

#[test]
fn copy_length_mismatch_is_an_error_and_sim_memory_is_not_addressable() {
    let host = CachingAllocator::new(HostBackend::new(1 << 24));
    let mut b = host.alloc::<u16>(&host.default_stream(), 4).unwrap();
    assert!(b.copy_from_host(&[1, 2, 3]).is_err());
    let sim = CachingAllocator::new(SimBackend::new(1 << 24));
    let b = sim.alloc::<u16>(&sim.default_stream(), 4).unwrap();
    let e = b.to_vec().unwrap_err().to_string();
    assert!(e.contains("not addressable"), "{e}");
}

#[test]
fn buffers_outlive_their_allocator_handle() {
    let alloc = CachingAllocator::new(HostBackend::new(1 << 24));
    let mut b = alloc.alloc::<u32>(&alloc.default_stream(), 3).unwrap();
    let probe = alloc.clone();
    drop(alloc);
    b.copy_from_host(&[7, 8, 9]).unwrap();
    assert_eq!(probe.memory_allocated(), 512);
    drop(probe);
    // The last reference is the buffer itself; dropping it frees everything.
    assert_eq!(b.to_vec().unwrap(), vec![7, 8, 9]);
    drop(b);
}

#[test]
fn peaks_reset() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let s = alloc.default_stream();
    drop(alloc.alloc::<u8>(&s, 30 * MIB as usize).unwrap());
    assert_eq!(alloc.max_memory_allocated(), 30 * MIB);
    alloc.reset_peak_stats();
    assert_eq!(alloc.max_memory_allocated(), 0);
    assert_eq!(alloc.max_memory_reserved(), alloc.memory_reserved());
    alloc.reset_accumulated_stats();
    let st = alloc.stats();
    assert_eq!(st.allocation.all.allocated, 0);
    assert_eq!(st.allocation.all.freed, 0);
}

#[test]
fn out_of_memory_releases_the_cache_retries_then_reports() {
    let alloc = CachingAllocator::with_config(
        HostBackend::new(100 * MIB),
        AllocatorConfig::parse("fragmentation_limit:off").unwrap(),
    )
    .unwrap();
    let s = alloc.default_stream();
    // Fill the cache with a free 60 MiB segment, then ask for 70 MiB: only a retry after
    // releasing the cache can succeed.
    drop(alloc.alloc::<u8>(&s, 60 * MIB as usize).unwrap());
    let keep = alloc.alloc::<u8>(&s, 70 * MIB as usize).unwrap();
    assert_eq!(alloc.stats().num_alloc_retries, 1);
    let e = alloc.alloc::<u8>(&s, 40 * MIB as usize).unwrap_err();
    let Error::OutOfMemory(report) = &e else { panic!("expected OOM, got {e}") };
    assert_eq!(report.requested, 40 * MIB);
    assert_eq!(report.capacity, 100 * MIB);
    assert_eq!(report.allocated, 70 * MIB);
    assert_eq!(report.reserved, 70 * MIB);
    let msg = e.to_string();
    for part in ["40.00 MiB", "100.00 MiB", "30.00 MiB is free", "70.00 MiB is allocated", "largest free cached block"]
    {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    assert_eq!(alloc.stats().num_ooms, 1);
    drop(keep);
    drop(alloc.alloc::<u8>(&s, 90 * MIB as usize).expect("memory is usable again after buffers drop"));
    alloc.check_invariants().unwrap();
}

#[test]
fn injected_faults_are_retried_or_reported() {
    for k in 0..12 {
        let faulty = Arc::new(FaultyBackend::new(SimBackend::new(1 << 34), FaultPlan::nth(k)));
        let alloc = CachingAllocator::new(faulty.clone());
        let s = alloc.default_stream();
        let mut live = Vec::new();
        for i in 0..24usize {
            match alloc.alloc::<u8>(&s, (i % 7 + 1) << 21) {
                Ok(b) => live.push(b),
                Err(Error::OutOfMemory(_)) => {}
                Err(e) => panic!("request {i} with fault {k}: unexpected error {e}"),
            }
            if i % 3 == 2 {
                live.remove(0);
            }
            alloc.check_invariants().unwrap();
        }
        assert!(faulty.injected() <= 1);
        drop(live);
        faulty.set_plan(FaultPlan::Never);
        drop(alloc.alloc::<u8>(&s, 1 << 30).unwrap());
    }
}

#[test]
fn every_request_failing_is_an_oom_and_nothing_leaks() {
    let faulty = Arc::new(FaultyBackend::new(SimBackend::new(1 << 34), FaultPlan::From(0)));
    let alloc = CachingAllocator::new(faulty.clone());
    let s = alloc.default_stream();
    let e = alloc.alloc::<u8>(&s, 100).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)));
    assert_eq!(faulty.injected(), 2, "one request and one retry");
    assert_eq!(alloc.stats().num_ooms, 1);
    assert_eq!(alloc.memory_reserved(), 0);
    assert_eq!(faulty.inner().used_memory(), 0);
}

#[test]
fn memory_summary_has_pytorch_rows() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let x = alloc.alloc::<f32>(&alloc.default_stream(), 1 << 20).unwrap();
    let t = alloc.memory_summary();
    for row in ["Allocated memory", "from large pool", "GPU reserved memory", "Non-releasable memory", "Allocations"] {
        assert!(t.contains(row), "{row} missing:\n{t}");
    }
    assert!(t.contains("4096 KiB"), "4 MiB allocated, in PyTorch's units:\n{t}");
    drop(x);
}

#[test]
fn default_device_is_shared() {
    let a = vramscope::device(3);
    let b = vramscope::device(3);
    let x = a.alloc::<u8>(&a.default_stream(), 1000).unwrap();
    assert_eq!(b.memory_allocated(), 1024);
    assert_eq!(a.backend().name(), "host");
    drop(x);
}

/// A program that creates streams without end, each allocating and freeing once (of a size
/// that changes), holds a bounded cache, whichever configuration: without the fragmentation
/// limit idle streams' whole segments are taken over by new streams (after waiting for the old
/// stream) or released; with it, over the limit from the first request on, the new streams
/// borrow blocks of the cached segments.
#[test]
fn streams_created_without_end_hold_a_bounded_cache() {
    for config in ["fragmentation_limit:off", ""] {
        let alloc =
            CachingAllocator::with_config(SimBackend::new(80 << 30), AllocatorConfig::parse(config).unwrap()).unwrap();
        for i in 0..5_000 {
            let s = alloc.new_stream().unwrap();
            drop(alloc.alloc::<u8>(&s, 512 + i % 3000).unwrap());
            if i % 500 == 0 {
                alloc.check_invariants().unwrap();
            }
        }
        alloc.check_invariants().unwrap();
        let st = alloc.stats();
        // At most two sweeps' worth (2 x 64 idle streams) of 2 MiB segments, and the newest.
        assert!(alloc.memory_reserved() <= 130 * 2 * MIB, "{config}: {} reserved", alloc.memory_reserved());
        if config.is_empty() {
            assert!(st.num_device_alloc <= 2, "{config}: {} segments reserved", st.num_device_alloc);
        } else {
            assert!(st.num_segment_adoptions > 4_000, "{config}: {st:?}");
            assert!(st.num_device_alloc < 200, "{config}: {} segments reserved", st.num_device_alloc);
        }
    }
}

/// The backend of the simulated device, logging which streams the allocator orders after which.
#[derive(Debug)]
struct SyncLog {
    sim: SimBackend,
    /// `(waiting, on)` of each `order_after`.
    ordered: std::sync::Mutex<Vec<(RawStream, RawStream)>>,
    /// While set, `order_after` fails.
    fail_order: std::sync::atomic::AtomicBool,
    /// While set, every event query says the event is not done yet (a query that lags the
    /// stream), whatever the streams did.
    stale_queries: std::sync::atomic::AtomicBool,
    /// Calls of `stream_idle`.
    idle_queries: std::sync::atomic::AtomicU64,
}

impl SyncLog {
    fn new(sim: SimBackend) -> Arc<Self> {
        Arc::new(SyncLog {
            sim,
            ordered: Default::default(),
            fail_order: Default::default(),
            stale_queries: Default::default(),
            idle_queries: Default::default(),
        })
    }

    /// Runs `f`: what it returned and the `(waiting, on)` of every `order_after` it made.
    fn orderings<R>(&self, f: impl FnOnce() -> R) -> (R, Vec<(RawStream, RawStream)>) {
        self.ordered.lock().unwrap().clear();
        let r = f();
        (r, std::mem::take(&mut *self.ordered.lock().unwrap()))
    }
}

/// An allocator on `sim` (logged) that gives back no pages (so that only whole segments and
/// blocks move between streams), with its default stream and a second one.
fn two_streams_without_pages(
    sim: SimBackend,
) -> (Arc<SyncLog>, CachingAllocator, vramscope::Stream, vramscope::Stream) {
    let backend = SyncLog::new(sim);
    let mut config = AllocatorConfig::default();
    config.release_pages = false;
    let alloc = CachingAllocator::with_config(backend.clone(), config).unwrap();
    let (s1, s2) = (alloc.default_stream(), alloc.new_stream().unwrap());
    (backend, alloc, s1, s2)
}

// SAFETY: every call goes to the simulated backend, which keeps the promises.
unsafe impl vramscope::backend::Backend for SyncLog {
    fn name(&self) -> &str {
        "sync-log"
    }
    fn total_memory(&self) -> u64 {
        self.sim.total_memory()
    }
    fn free_memory(&self) -> u64 {
        self.sim.free_memory()
    }
    fn reserve(&self, size: u64) -> Result<u64, vramscope::error::BackendError> {
        self.sim.reserve(size)
    }
    unsafe fn release(&self, addr: u64, size: u64) -> Result<(), vramscope::error::BackendError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.sim.release(addr, size) }
    }
    fn create_stream(&self) -> Result<RawStream, vramscope::error::BackendError> {
        self.sim.create_stream()
    }
    fn record_event(&self, stream: RawStream) -> Result<vramscope::backend::RawEvent, vramscope::error::BackendError> {
        self.sim.record_event(stream)
    }
    fn event_completed(&self, event: vramscope::backend::RawEvent) -> Result<bool, vramscope::error::BackendError> {
        if self.stale_queries.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(false);
        }
        self.sim.event_completed(event)
    }
    fn destroy_event(&self, event: vramscope::backend::RawEvent) {
        self.sim.destroy_event(event)
    }
    fn synchronize(&self, stream: RawStream) -> Result<(), vramscope::error::BackendError> {
        self.sim.synchronize(stream)
    }
    fn stream_idle(&self, stream: RawStream) -> Result<bool, vramscope::error::BackendError> {
        self.idle_queries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.sim.stream_idle(stream)
    }
    fn order_after(&self, waiting: RawStream, on: RawStream) -> Result<(), vramscope::error::BackendError> {
        if self.fail_order.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(vramscope::error::BackendError::Other("injected: order_after".into()));
        }
        self.ordered.lock().unwrap().push((waiting, on));
        self.sim.order_after(waiting, on)
    }
}

/// Every question whether a stream is idle is counted where the backend sees it: replayed on
/// its three streams, `pipeline_streams` asks in every warm pass (to lend the range's memory and
/// take loans back), and the statistics count exactly the backend's calls; `resnet_train`, on
/// one stream, asks none.
#[test]
fn stream_queries_are_counted_as_the_backend_sees_them() {
    use vramscope::replay::{replay, ReplayOptions, Trace};
    for (name, streams) in [("pipeline_streams", 3), ("resnet_train", 1)] {
        let path = format!("{}/fixtures/torch/{name}.trace.json.gz", env!("CARGO_MANIFEST_DIR"));
        let trace = Trace::from_file(path).unwrap();
        let backend = SyncLog::new(SimBackend::new(1 << 40).with_costly_segments(true));
        let alloc = CachingAllocator::new(backend.clone());
        let mut opts = ReplayOptions::default();
        opts.warm_passes = 3;
        let r = replay(&alloc, &trace, &opts).unwrap();
        assert_eq!(r.streams, streams, "{name}");
        let asked = backend.idle_queries.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(alloc.stats().num_stream_queries, asked, "{name}: the statistics against the backend");
        assert_eq!(alloc.stats().to_pytorch_map()["num_stream_queries"], asked, "{name}");
        assert!(r.warm_stream_queries.iter().sum::<u64>() <= asked, "{name}: {r:?}");
        if streams > 1 {
            assert!(r.warm_stream_queries.iter().all(|&q| q > 0), "{name}: {:?}", r.warm_stream_queries);
        } else {
            assert_eq!((asked, r.warm_stream_queries), (0, vec![0; 3]), "{name}");
        }
    }
}

/// Over the soft limit, a temporary that another stream freed just now is handed on with its
/// segment (a stream per request): the new stream's work ordered after the old one's; the
/// history shows the segment leaving one stream and joining the other.
#[test]
fn a_temporary_freed_on_another_stream_is_handed_on_with_its_segment() {
    let (backend, alloc, s1, s2) = two_streams_without_pages(SimBackend::new(1 << 30));
    alloc.record_memory_history(vramscope::record::RecordConfig::default());
    let a = alloc.alloc::<u8>(&s2, 512).unwrap();
    let addr = a.device_ptr();
    drop(a);
    let (b, ordered) = backend.orderings(|| alloc.alloc::<u8>(&s1, 512).unwrap());
    assert_eq!(b.device_ptr(), addr, "stream 2's temporary is handed on");
    assert_eq!(ordered, [(s1.raw(), s2.raw())], "stream 1 ordered after stream 2");
    let st = alloc.stats();
    assert_eq!((st.num_segment_adoptions, st.num_device_alloc), (1, 1));
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].stream, u64::from(s1.id()), "the snapshot puts the segment on stream 1");
    let segment = snap.segments[0].address;
    let moves: Vec<_> = snap.history.iter().filter(|h| h.addr == segment).map(|h| (h.action, h.stream)).collect();
    assert!(
        moves.windows(2).any(|w| w[0] == (vramscope::record::Action::SegmentFree, u64::from(s2.id()))
            && w[1] == (vramscope::record::Action::SegmentAlloc, u64::from(s1.id()))),
        "{moves:?}"
    );
    drop(b);
    alloc.check_invariants().unwrap();
}

/// Over the soft limit, another stream's whole cached segment is lent, not taken over: it
/// stays its owner's, which has it back at the borrower's free (ordered after the borrower
/// where the borrower has work queued).
/// A stream that gave its segment away would need memory again later in its loop; on dynamic
/// shapes over several streams, segments taken over wandered from stream to stream and the
/// allocator kept calling the backend pass after pass (BENCHMARKS.md, "Lending instead of
/// taking over").
#[test]
fn a_whole_segment_of_another_stream_is_lent_and_stays_its_owners() {
    let (backend, alloc, s1, s2) =
        two_streams_without_pages(SimBackend::with_events(1 << 30, vramscope::backend::EventMode::Manual));
    let a = alloc.alloc::<u8>(&s2, 8 * MIB as usize).unwrap();
    let addr = a.device_ptr();
    drop(a);
    // Stream 2 has work queued: its cache does not serve stream 1 as its own (see
    // `blocks_are_reused_on_another_stream_only_while_their_stream_is_idle`); over the limit
    // it lends.
    vramscope::backend::Backend::record_event(&*backend, s2.raw()).unwrap();
    let (b, ordered) = backend.orderings(|| alloc.alloc::<u8>(&s1, 8 * MIB as usize).unwrap());
    assert_eq!(b.device_ptr(), addr, "stream 2's cached segment is lent");
    assert_eq!(ordered, [(s1.raw(), s2.raw())], "stream 1 ordered after stream 2");
    let st = alloc.stats();
    assert_eq!((st.num_segment_adoptions, st.num_device_alloc), (0, 1));
    assert_eq!(alloc.snapshot().segments[0].stream, u64::from(s2.id()), "still stream 2's segment");
    // Stream 1 has no work queued (the sim's streams are idle): nothing to order at the free.
    // (With work queued, stream 2 is ordered after it: see the next tests.)
    let ((), ordered) = backend.orderings(|| drop(b));
    assert_eq!(ordered, [], "stream 1 idle at the free");
    let again = alloc.alloc::<u8>(&s2, 8 * MIB as usize).unwrap();
    assert_eq!(again.device_ptr(), addr, "back with its owner");
    assert_eq!(alloc.stats().num_device_alloc, 1);
    drop(again);
    alloc.check_invariants().unwrap();
}

/// Over the soft limit, with no other stream's cached segment of about the request's size, the
/// best-fitting free block of another stream (here the smaller of two whole segments) is lent,
/// split, instead of a segment being released to reserve one of the request's size: with
/// dynamic shapes on several streams, that release and reserve came back on every step (the
/// synthetic traces of `BENCHMARKS.md`).
#[test]
fn the_best_fitting_block_of_another_stream_is_lent_rather_than_released() {
    let (backend, alloc, s1, s2) =
        two_streams_without_pages(SimBackend::with_events(1 << 30, vramscope::backend::EventMode::Manual));
    let bigger = alloc.alloc::<u8>(&s2, 140 * MIB as usize).unwrap();
    let big = alloc.alloc::<u8>(&s2, 100 * MIB as usize).unwrap();
    let kept = alloc.alloc::<u8>(&s1, 40 * MIB as usize).unwrap();
    let addr = big.device_ptr();
    drop((big, bigger));
    // Stream 2 has work queued: no serving as its own; over the limit it lends.
    vramscope::backend::Backend::record_event(&*backend, s2.raw()).unwrap();
    // Peak allocated 280 MiB, reserved 280 MiB: 60 MiB more is over the 1.05 limit, and no
    // cached segment is of about 60 MiB.
    let (b, ordered) = backend.orderings(|| alloc.alloc::<u8>(&s1, 60 * MIB as usize).unwrap());
    assert_eq!(b.device_ptr(), addr, "the smaller of stream 2's two cached segments is lent");
    assert_eq!(ordered, [(s1.raw(), s2.raw())], "stream 1 ordered after stream 2");
    let st = alloc.stats();
    assert_eq!((st.num_segment_adoptions, st.num_device_alloc, st.num_device_free), (0, 3, 0), "{st:?}");
    assert_eq!(st.reserved_bytes.all.current, 280 * MIB);
    drop((b, kept));
    alloc.check_invariants().unwrap();
}

/// Over the soft limit, a free block of another stream's segment is lent: the borrower's work is ordered after the owner's and nothing is reserved.
/// At its free the block goes back to its owner at once, the owner's work ordered after the
/// borrower's; where that ordering fails, the block waits for an event on the borrower (as
/// after `record_stream`).
#[test]
fn a_free_block_of_another_streams_segment_is_lent_and_given_back_in_stream_order() {
    for order_back_fails in [false, true] {
        let (backend, alloc, s1, s2) =
            two_streams_without_pages(SimBackend::with_events(1 << 30, vramscope::backend::EventMode::Manual));
        let kept = alloc.alloc::<u8>(&s1, 100 * MIB as usize).unwrap();
        // Stream 1 has work queued (an event the manual sim keeps pending until stream 1 is
        // synchronized): stream 2 reserves a segment of its own instead of being served from
        // stream 1's memory, and stream 1's free below orders stream 2 after it.
        vramscope::backend::Backend::record_event(&*backend, s1.raw()).unwrap();
        let whole = alloc.alloc::<u8>(&s2, 100 * MIB as usize).unwrap();
        let base = whole.device_ptr();
        drop(whole);
        // Stream 2's segment: 40 MiB live at its start, 60 MiB free behind.
        let front = alloc.alloc::<u8>(&s2, 40 * MIB as usize).unwrap();
        assert_eq!(front.device_ptr(), base);
        // Peak allocated 200 MiB, all reserved: 50 MiB more is over the 1.05 limit.
        let (lent, ordered) = backend.orderings(|| alloc.alloc::<u8>(&s1, 50 * MIB as usize).unwrap());
        assert_eq!(lent.device_ptr(), base + 40 * MIB, "stream 2's free block is lent");
        assert_eq!(ordered, [(s1.raw(), s2.raw())], "stream 1 ordered after stream 2");
        let st = alloc.stats();
        assert_eq!((st.num_device_alloc, st.num_device_free, st.num_segment_adoptions), (2, 0, 0), "{st:?}");
        backend.fail_order.store(order_back_fails, std::sync::atomic::Ordering::Relaxed);
        let ((), ordered) = backend.orderings(|| drop(lent));
        backend.fail_order.store(false, std::sync::atomic::Ordering::Relaxed);
        let back = if order_back_fails {
            // Stream 1's work may still use it: stream 2 cannot have it back yet.
            let again = alloc.alloc::<u8>(&s2, 50 * MIB as usize).unwrap();
            assert_ne!(again.device_ptr(), base + 40 * MIB, "reused before the borrower's work was done");
            drop(again);
            alloc.synchronize(s1).unwrap();
            // Merged again with the 10 MiB left behind it: stream 2's 60 MiB free block.
            alloc.alloc::<u8>(&s2, 60 * MIB as usize).unwrap()
        } else {
            assert_eq!(ordered, [(s2.raw(), s1.raw())], "stream 2 ordered after stream 1");
            alloc.alloc::<u8>(&s2, 60 * MIB as usize).unwrap()
        };
        assert_eq!(back.device_ptr(), base + 40 * MIB, "back with its owner");
        assert_eq!(alloc.stats().num_backend_errors, u64::from(order_back_fails));
        drop((back, front, kept));
        alloc.check_invariants().unwrap();
    }
}

/// Over the soft limit, a stream that holds no small segment borrows a small block once; when it
/// must borrow again it reserves a segment of its own: lent every block it ever asks for, each
/// allocation and free would order two streams under the lock. Many threads each allocating on
/// their own stream made 1.1 M pairs a second at 16 threads against 40 M on one stream (H200
/// host, BENCHMARKS.md "Threads on their own streams again"). A stream made for one
/// request still borrows (`streams_created_without_end_hold_a_bounded_cache`), and a stream
/// that holds a small segment borrows where its own have no free block that fits.
#[test]
fn a_stream_that_keeps_borrowing_small_blocks_reserves_its_own_segment() {
    let (backend, alloc, s1, s2) = two_streams_without_pages(SimBackend::new(1 << 30));
    // Stream 1's small segment, mostly free: 512 B live of 2 MiB. Reserved is far over 1.05
    // times the 512 B allocated.
    let kept = alloc.alloc::<u8>(&s1, 512).unwrap();
    let (first, ordered) = backend.orderings(|| alloc.alloc::<u8>(&s2, 512).unwrap());
    assert_eq!(ordered, [(s2.raw(), s1.raw())], "stream 2's first request borrows");
    drop(first);
    for _ in 0..3 {
        let (b, ordered) = backend.orderings(|| alloc.alloc::<u8>(&s2, 512).unwrap());
        assert!(ordered.is_empty(), "stream 2 borrowed again: {ordered:?}");
        assert_eq!(alloc.stats().num_device_alloc, 2, "stream 2's own small segment, once");
        drop(b);
    }
    // Stream 2 now holds a small segment: a request that its free blocks cannot serve borrows.
    let full = [(); 2].map(|()| alloc.alloc::<u8>(&s2, MIB as usize).unwrap());
    let (lent, ordered) = backend.orderings(|| alloc.alloc::<u8>(&s2, 512).unwrap());
    assert_eq!(ordered, [(s2.raw(), s1.raw())], "stream 2 borrowed from stream 1's segment");
    assert_eq!(alloc.stats().num_device_alloc, 2);
    drop((lent, full, kept));
    alloc.check_invariants().unwrap();
}

/// The papercuts of a small inference engine: a shaped allocation in one call, streams by
/// value or reference, a buffer that gives back its allocator (to grow a KV cache), and
/// half-precision element types (feature `half`).
#[test]
fn shaped_allocations_streams_by_value_and_a_buffers_allocator() {
    let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    let s = alloc.new_stream().unwrap();
    let kv = alloc.alloc_shaped::<f32>(s, &[2, 4, 64]).unwrap();
    let meta = kv.tensor_meta().unwrap();
    assert_eq!((kv.len(), meta.dtype.as_str(), meta.shape), (512, "float32", vec![2, 4, 64]));
    assert!(alloc.alloc_shaped::<f32>(s, &[usize::MAX, 2]).is_err(), "an overflowing shape is an error");
    // Growing the cache from the buffer alone, on the buffer's stream.
    let owner = kv.allocator();
    assert!(owner.same_allocator(&alloc));
    let grown = owner.alloc_shaped::<f32>(kv.stream(), &[2, 8, 64]).unwrap();
    assert_eq!(grown.stream(), s);
    drop(kv);
    drop(alloc);
    drop(owner);
    // The buffer alone keeps the allocator alive; its allocator() is a working handle.
    let again = grown.allocator();
    assert_eq!(again.memory_allocated(), 4096);
    drop(grown);
    assert_eq!(again.memory_allocated(), 0);
    #[cfg(feature = "half")]
    {
        let h = again.alloc_shaped::<half::bf16>(again.default_stream(), &[3]).unwrap();
        assert_eq!((h.num_bytes(), h.tensor_meta().unwrap().dtype.as_str()), (6, "bfloat16"));
    }
}

/// A tensor served through a view of the range's free pages (`alias_pages`) shows in a snapshot
/// at its own address, in a segment of the view's pages, while the range leaves those pages
/// out: the segments sum to the memory held, and the snapshot survives PyTorch's format.
#[test]
fn a_view_shows_as_a_segment_of_its_own_and_memory_is_counted_once() {
    const MIB: usize = 1 << 20;
    let config = vramscope::config::AllocatorConfig::parse("alias_pages:True").unwrap();
    let alloc = CachingAllocator::with_config(SimBackend::new(1 << 40), config).unwrap();
    let s = alloc.default_stream();
    let mut blocks: Vec<_> = (0..4).map(|_| Some(alloc.alloc::<u8>(&s, 4 * MIB).unwrap())).collect();
    blocks[0] = None;
    blocks[2] = None;
    let reserved = alloc.stats().reserved_bytes.all.current;
    let view = alloc.alloc::<u8>(&s, 7 * MIB).unwrap().with_shape(&[7, MIB]).unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all.current, reserved, "served by a view");
    let snap = alloc.snapshot();
    snap.validate().unwrap();
    let total: u64 = snap.segments.iter().map(|g| g.total_size).sum();
    assert_eq!(total, reserved, "every byte held once");
    let live: Vec<_> = snap.live_blocks().collect();
    assert_eq!(live.len(), 3);
    let shown = live.iter().find(|b| b.address == view.device_ptr()).expect("the tensor at its own address");
    assert_eq!((shown.requested_size, shown.shape.as_deref()), (7 * MIB as u64, Some(&[7, MIB][..])));
    let seg = snap.segments.iter().find(|g| g.address == view.device_ptr()).expect("the view's segment");
    assert_eq!((seg.total_size, seg.blocks.len()), (8 * MIB as u64, 2), "four pages, the last one's rest free");
    let back = vramscope::Snapshot::from_pytorch_pickle(&snap.to_pytorch_pickle(), "view").unwrap();
    assert_eq!(back.segments.iter().map(|g| g.total_size).sum::<u64>(), reserved);
    drop(view);
    let snap = alloc.snapshot();
    snap.validate().unwrap();
    assert_eq!(snap.segments.iter().map(|g| g.total_size).sum::<u64>(), reserved, "the pages back in the range");
    assert_eq!(snap.live_blocks().count(), 2);
}
