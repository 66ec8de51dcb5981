//! The structural and statistical invariants of a heap, recounted from its blocks.

use super::{BlockState, Heap};
use crate::alloc::stats::Pool;

/// Describes the first invariant `heap` breaks, if any.
pub(crate) fn check_heap(heap: &Heap) -> std::result::Result<(), String> {
    let mut allocated = [0u64; 2];
    let mut active = [0u64; 2];
    let mut requested = [0u64; 2];
    let mut reserved = [0u64; 2];
    let mut nalloc = [0u64; 2];
    let mut nseg = [0u64; 2];
    let mut split_free = [0u64; 2];
    let (mut oversize_segments, mut oversize_allocations) = (0u64, 0u64);
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    // Loans given back unasked (`Heap::check_returns`): a stream's bit is set exactly where
    // loans of it are listed, each listed loan inside a live segment, owned by another stream.
    let (unchecked, unchecked_loans) = heap.streams.unchecked();
    let listed = unchecked_loans.iter().fold(0u64, |m, l| m | crate::alloc::ids::stream_bit(l.borrower));
    if listed != unchecked {
        return Err(format!("unchecked loans: streams {:#b} marked, {listed:#b} listed", unchecked));
    }
    for (i, slot) in heap.streams.iter().enumerate() {
        let owed = (unchecked_loans.iter())
            .filter(|l| l.owner.index() == i)
            .fold(0u64, |m, l| m | crate::alloc::ids::stream_bit(l.borrower));
        if owed != slot.owed_by {
            return Err(format!(
                "loans given back unasked to stream {i}: {:#b} marked, {owed:#b} listed",
                slot.owed_by
            ));
        }
    }
    for l in unchecked_loans {
        let s = &heap.segments[l.segment];
        if !s.live || l.addr < s.addr || l.addr + l.size > s.addr + s.size || l.owner == l.borrower {
            return Err(format!(
                "unchecked loan {:#x}+{} of stream {} (owner {}) lies in no live segment of another \
                 stream ({:?} live {} at {:#x}+{})",
                l.addr, l.size, l.borrower, l.owner, l.segment, s.live, s.addr, s.size
            ));
        }
    }
    for (_, seg) in heap.segments.iter().filter(|(_, s)| s.live) {
        let p = seg.pool as usize;
        nseg[p] += 1;
        oversize_segments += u64::from(heap.is_oversize(seg.size));
        reserved[p] += seg.mapped;
        let mut unmapped = 0;
        if seg.granule % heap.setup.page != 0 || !seg.granule.is_power_of_two() {
            return Err(format!(
                "segment {:#x}: granule {} is not a power-of-two multiple of the page",
                seg.addr, seg.granule
            ));
        }
        let grown_ok = seg.grown.first().is_none_or(|&g| g == seg.uniform_end)
            && seg.grown.windows(2).all(|w| w[0] < w[1])
            && seg.grown.last().is_none_or(|&g| g < seg.size)
            && seg.grown.iter().all(|g| g % heap.setup.page == 0)
            && (seg.grown.is_empty() == (seg.uniform_end == seg.size))
            && seg.grown_at_page.len() as u64 == (seg.size - seg.uniform_end) >> seg.page_shift
            && seg.grown_at_page.iter().enumerate().all(|(p, &g)| {
                let off = seg.uniform_end + ((p as u64) << seg.page_shift);
                let g = g as usize;
                seg.grown[g] <= off && seg.grown.get(g + 1).is_none_or(|&next| off < next)
            })
            && seg.uniform_end <= seg.size
            && (seg.room == 0 || seg.pool == Pool::Large)
            && seg.unmapped_pages.len() as u64 == seg.granules().div_ceil(64);
        if !grown_ok {
            return Err(format!(
                "segment {:#x} of {} bytes: growths {:?} after {} do not tile it (room {})",
                seg.addr, seg.size, seg.grown, seg.uniform_end, seg.room
            ));
        }
        for pg in 0..seg.granules() {
            if Heap::is_page_unmapped(seg, pg) {
                unmapped += seg.granule_span(pg, pg + 1).1;
            }
        }
        if seg.mapped + unmapped != seg.size {
            return Err(format!(
                "segment {:#x}: mapped {} + unmapped {unmapped} != size {}",
                seg.addr, seg.mapped, seg.size
            ));
        }
        ranges.push((seg.addr, seg.addr + seg.size));
    }
    // The counts that say whether one stream holds the segments (growing in place).
    let mut held = vec![[0u32; 2]; heap.streams.len()];
    for (_, seg) in heap.segments.iter().filter(|(_, s)| s.live) {
        held[seg.stream.index()][seg.pool as usize] += 1;
    }
    let kept: Vec<[u32; 2]> = heap.streams.iter().map(|s| s.segments).collect();
    let total = held.iter().fold([0u64; 2], |t, h| [t[0] + u64::from(h[0]), t[1] + u64::from(h[1])]);
    let counted = [Pool::Small, Pool::Large].map(|p| heap.accounting.stats().segment.pool_current(p));
    if held != kept || total != counted {
        return Err(format!(
            "segments per stream and pool {kept:?} (in the statistics {counted:?}), recounted {held:?}"
        ));
    }
    // And those that say which stream's range may grow beside other streams' segments.
    let mut growable = vec![0u32; heap.streams.len()];
    for (_, seg) in heap.segments.iter().filter(|(_, s)| s.live && s.growable) {
        growable[seg.stream.index()] += 1;
    }
    let kept: Vec<u32> = heap.streams.iter().map(|s| s.growable).collect();
    if growable != kept || growable.iter().sum::<u32>() != heap.streams.growable() {
        return Err(format!(
            "segments reserved to grow per stream {kept:?} (in all {}), recounted {growable:?}",
            heap.streams.growable()
        ));
    }
    // The home stream (`Heap::track_home`): one that holds the range, or with segments that do
    // not grow one that holds a large segment; none only where no stream does.
    let holds = |i: usize| if heap.setup.can_unmap { growable[i] > 0 } else { held[i][Pool::Large as usize] > 0 };
    let any = (0..heap.streams.len()).any(holds);
    if heap.streams.home().is_some_and(|h| !holds(h.index())) || heap.streams.home().is_none() == any {
        return Err(format!(
            "home stream {:?}, but segments per stream {held:?}, growable {growable:?}",
            heap.streams.home()
        ));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[0].1 > w[1].0 {
            return Err(format!("segments {:#x} and {:#x} overlap", w[0].0, w[1].0));
        }
    }
    // A block in use, as the counters count it: allocated, or waiting for other streams.
    let mut count_in_use = |b: &super::Block, p: usize| {
        active[p] += b.size;
        if b.state == BlockState::Allocated {
            allocated[p] += b.size;
            requested[p] += b.requested;
            nalloc[p] += 1;
            oversize_allocations += u64::from(heap.is_oversize(b.size));
        }
    };
    let mut err = None;
    let mut last: Option<(u64, u64, BlockState)> = None;
    let mut cur_seg = u64::MAX;
    let mut nfree = 0;
    let mut nwhole = 0;
    let mut nheld = 0;
    heap.for_each_block(|i, seg, b| {
        if err.is_some() {
            return;
        }
        let p = seg.pool as usize;
        if seg.addr != cur_seg {
            cur_seg = seg.addr;
            if b.addr != seg.addr {
                err = Some(format!("segment {:#x} starts with block {:#x}", seg.addr, b.addr));
            }
            last = None;
        }
        if let Some((a, s, st)) = last {
            if a + s != b.addr {
                err = Some(format!("blocks {a:#x}+{s} and {:#x} do not tile segment {:#x}", b.addr, seg.addr));
            }
            if st == BlockState::Free && b.state == BlockState::Free {
                err = Some(format!("free blocks {a:#x} and {:#x} were not merged", b.addr));
            }
        }
        if b.stream != seg.stream {
            err = Some(format!("block {:#x} is on stream {} but its segment on {}", b.addr, b.stream, seg.stream));
        }
        if b.addr + b.size > seg.addr + seg.size {
            err = Some(format!("block {:#x}+{} runs past its segment", b.addr, b.size));
        }
        if b.next.is_none() && seg.tail != Some(i) {
            err = Some(format!("segment {:#x}: its tail {:?} is not its last block {i:?}", seg.addr, seg.tail));
        }
        if b.size % super::MIN_BLOCK != 0 {
            err = Some(format!("block {:#x} size {} is not a multiple of 512", b.addr, b.size));
        }
        if matches!(b.state, BlockState::Allocated | BlockState::PendingFree | BlockState::Stranded) {
            count_in_use(b, p);
        }
        match b.state {
            BlockState::Allocated => {
                // An allocated block's granules are all mapped.
                if seg.granules_touching(b.addr, b.size).any(|pg| Heap::is_page_unmapped(seg, pg)) {
                    err = Some(format!("allocated block {:#x} lies on an unmapped page", b.addr));
                }
            }
            BlockState::PendingFree | BlockState::Stranded => {}
            BlockState::Aliased => {
                nheld += 1;
                let touching = seg.granules_touching(b.addr, b.size);
                let mapped = !touching.clone().any(|pg| Heap::is_page_unmapped(seg, pg));
                if !b.size.is_multiple_of(heap.setup.page) || !b.addr.is_multiple_of(heap.setup.page) || !mapped {
                    err = Some(format!("aliased block {:#x}+{} is not whole mapped pages", b.addr, b.size));
                } else if seg.granule_span(touching.start, touching.start + 1).0 != b.addr {
                    err = Some(format!("aliased block {:#x} starts inside a mapping", b.addr));
                } else if !heap.held_by_a_view(i) {
                    err = Some(format!("aliased block {:#x} is held by no view in use", b.addr));
                }
            }
            BlockState::Free => {
                nfree += 1;
                if b.requested != 0 {
                    err = Some(format!("free block {:#x} still says {} bytes were asked for", b.addr, b.requested));
                }
                let (indexed, listed_whole, _, _) = heap.free_index_state(Some(i));
                if !indexed {
                    err = Some(format!("free block {:#x} is not in the free index", b.addr));
                }
                let split = b.prev.is_some() || b.next.is_some();
                if split {
                    split_free[p] += b.size;
                } else {
                    nwhole += 1;
                }
                let mapped =
                    heap.can_unmap() && seg.granules_inside(b.addr, b.size).any(|pg| !Heap::is_page_unmapped(seg, pg));
                if heap.listed_with_mapped_pages(i) != mapped {
                    err = Some(format!("free block {:#x}: mapped whole pages {mapped} but listed otherwise", b.addr));
                }
                if listed_whole == split {
                    err = Some(format!("free block {:#x}: split {split} but listed as whole {listed_whole}", b.addr));
                }
            }
        }
        last = Some((b.addr, b.size, b.state));
    });
    if let Some(e) = err {
        return Err(e);
    }
    // Views' blocks in use lie in no segment: counted here, with the memory they hold.
    let mut held = 0;
    for (v, runs, len) in heap.views_in_use() {
        let b = heap.block(v);
        let p = Pool::Large as usize;
        held += runs.len();
        let span: u64 = runs.iter().map(|&h| heap.block(h).size).sum();
        if !b.view || span != len || b.size > span || b.size + heap.setup.page <= span {
            return Err(format!("view block {:#x} of {} bytes over {len} bytes holding {span}", b.addr, b.size));
        }
        if runs.iter().any(|&h| heap.block(h).state != BlockState::Aliased) {
            return Err(format!("view block {:#x} holds memory not aliased", b.addr));
        }
        match b.state {
            BlockState::Allocated | BlockState::PendingFree | BlockState::Stranded => count_in_use(b, p),
            s => return Err(format!("view block {:#x} in use is {s:?}", b.addr)),
        }
    }
    if held != nheld {
        return Err(format!("views in use hold {held} runs but {nheld} blocks are aliased"));
    }
    let (_, _, indexed, whole) = heap.free_index_state(None);
    if indexed != nfree {
        return Err(format!("the free index holds {indexed} blocks but {nfree} blocks are free"));
    }
    if whole != nwhole {
        return Err(format!("the free index lists {whole} whole segments but {nwhole} free blocks are whole"));
    }
    let st = &heap.accounting.stats();
    for (name, stat, recount) in [
        ("allocated_bytes", &st.allocated_bytes, allocated),
        ("active_bytes", &st.active_bytes, active),
        ("requested_bytes", &st.requested_bytes, requested),
        ("reserved_bytes", &st.reserved_bytes, reserved),
        ("allocation", &st.allocation, nalloc),
        ("segment", &st.segment, nseg),
        ("inactive_split_bytes", &st.inactive_split_bytes, split_free),
    ] {
        for pool in [Pool::Small, Pool::Large] {
            let (counted, recounted) = (stat.pool_current(pool), recount[pool as usize]);
            if counted != recounted {
                return Err(format!("{name} ({pool:?} pool): counter says {counted} but a recount gives {recounted}"));
            }
        }
        if stat.current() != recount[0] + recount[1] {
            return Err(format!("{name}: the all-pools counter disagrees with the pools"));
        }
    }
    for (name, counted, recounted) in [
        ("oversize_segments", st.oversize_segments.current, oversize_segments),
        ("oversize_allocations", st.oversize_allocations.current, oversize_allocations),
    ] {
        if counted != recounted {
            return Err(format!("{name}: counter says {counted} but a recount gives {recounted}"));
        }
    }
    Ok(())
}
