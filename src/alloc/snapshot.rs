//! Building a [`Snapshot`] from an allocator: raw data copied under the lock, symbols resolved
//! after it is released.

use super::heap::{self, Heap};
use super::CachingAllocator;
use crate::frames::Symbolizer;
use crate::intern::Interner;
use crate::model::{
    BlockInfo, BlockState, ContextInfo, FrameId, HistoryEntry, ScopeId, SegmentInfo, Snapshot, StackId, ThreadId,
    SNAPSHOT_VERSION,
};
use crate::record::{snapshot_path, thread_name, Context, Event, Frame};

struct Raw {
    device: usize,
    /// Each segment with the recorded context of each of its blocks, side by side: a block's
    /// context travels with it through the sort, never paired with it later by position.
    segments: Vec<(SegmentInfo, Vec<Option<Context>>)>,
    history: Vec<Event>,
    dropped: u64,
    stacks: Vec<Box<[usize]>>,
    sites: Vec<crate::record::Site>,
    stats: crate::alloc::MemoryStats,
    clock: crate::record::Clock,
    stacks_mode: crate::record::StackMode,
}

fn copy(heap: &Heap) -> Raw {
    let mut segments: Vec<(SegmentInfo, Vec<Option<Context>>)> = Vec::new();
    // The block kept aside by the last free and its free neighbours show as the one free block
    // that merging makes: a snapshot shows the heap as settled without settling it (see
    // `Heap::hot_merge`).
    let merge = heap.hot_merge();
    // The heap segment the blocks come from, and its unmapped ranges: a snapshot lists one
    // segment per contiguous mapped range, as PyTorch's does for its expandable segments, so
    // that what a segment's blocks cover is memory held (see `SNAPSHOT_VERSION`, 7).
    let mut current: Option<Unmapped> = None;
    heap.for_each_block(|i, seg, b| {
        let first = current.as_ref().is_none_or(|u| u.segment != seg.addr);
        if first {
            current = Some(Unmapped { segment: seg.addr, ranges: Heap::unmapped_ranges(seg), passed: 0 });
        }
        let Unmapped { ranges: unmapped, passed, .. } = current.as_mut().expect("set above");
        let mut b = b;
        let mut merged = None;
        if let Some(m) = merge.filter(|m| [Some(m.hot), m.prev, m.next].contains(&Some(i))) {
            if i != m.prev.unwrap_or(m.hot) {
                return;
            }
            // The block that survives the merge (`merge_free` keeps the lower free neighbour,
            // else the upper one) carries the merged block's description.
            b = heap.block(m.prev.or(m.next).unwrap_or(m.hot));
            merged = Some(m);
        }
        // A run of pages a view in use maps: shown in the view's segment (below), not here.
        let Some(state) = state_of(b.state) else { return };
        let (address, size, state) = match merged {
            Some(m) => (m.addr, m.size, BlockState::Inactive),
            None => (b.addr, b.size, state),
        };
        for (address, size) in mapped_pieces(address, size, unmapped, passed) {
            // Only free blocks lie over unmapped pages.
            debug_assert!(state == BlockState::Inactive || (address, size) == (b.addr, b.size));
            let joins = !first && segments.last().is_some_and(|(s, _)| s.address + s.total_size == address);
            if !joins {
                let info = SegmentInfo {
                    address,
                    total_size: 0,
                    mapped_size: 0,
                    expandable: seg.room > 0 || !unmapped.is_empty(),
                    stream: u64::from(seg.stream.0),
                    device: None,
                    pool: seg.pool,
                    pool_id: None,
                    allocated_size: 0,
                    active_size: 0,
                    requested_size: 0,
                    blocks: Vec::new(),
                    context: None,
                    source: None,
                };
                segments.push((info, Vec::new()));
            }
            let (s, contexts) = segments.last_mut().expect("pushed above");
            s.total_size += size;
            s.mapped_size += size;
            s.blocks.push(block_info(b, address, size, state));
            contexts.push(b.ctx);
        }
    });
    // Each view in use (`alias.rs`) as a segment of its own: its addresses are a contiguous
    // mapped range as any segment's, the tensor lies at them, and the range's memory it holds
    // is left out above, so that the segments still sum to the memory held.
    for (v, _, total) in heap.views_in_use() {
        let b = heap.block(v);
        let state = state_of(b.state).expect("a view's block in use is allocated or waiting");
        let mut blocks = vec![block_info(b, b.addr, b.size, state)];
        let mut contexts = vec![b.ctx];
        if total > b.size {
            // The rest of the view's last page: held by the view, free for no one else (the rest
            // of its last mapping, if any, stays free in the range).
            blocks.push(BlockInfo {
                address: b.addr + b.size,
                size: total - b.size,
                requested_size: 0,
                state: BlockState::Inactive,
                dtype: None,
                shape: None,
                context: None,
            });
            contexts.push(None);
        }
        let info = SegmentInfo {
            address: b.addr,
            total_size: total,
            mapped_size: total,
            expandable: false,
            stream: u64::from(b.stream.0),
            device: None,
            pool: crate::alloc::Pool::Large,
            pool_id: None,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            blocks,
            context: None,
            source: None,
        };
        segments.push((info, contexts));
    }
    segments.sort_by_key(|(s, _)| s.address);
    for (s, _) in &mut segments {
        let sum = s.summary();
        (s.allocated_size, s.active_size, s.requested_size) = (sum.allocated, sum.active, sum.active_requested);
    }
    let rec = heap.recorder();
    Raw {
        device: heap.device(),
        segments,
        history: rec.history.iter().copied().collect(),
        dropped: rec.history.total - rec.history.len() as u64,
        stacks: rec.stacks.stacks.clone(),
        sites: rec.sites.sites.clone(),
        stats: heap.settled_stats().public(),
        clock: rec.clock,
        stacks_mode: rec.config.stacks,
    }
}

/// How a snapshot shows a heap block's state; `None` for the range's pages that a view in use
/// maps, which the view's own segment shows.
fn state_of(state: heap::BlockState) -> Option<BlockState> {
    match state {
        heap::BlockState::Allocated => Some(BlockState::ActiveAllocated),
        heap::BlockState::PendingFree | heap::BlockState::Stranded => Some(BlockState::ActivePendingFree),
        heap::BlockState::Free => Some(BlockState::Inactive),
        heap::BlockState::Aliased => None,
    }
}

/// Heap block `b` as a snapshot lists it, at `address` and `size` (a piece of it where pages
/// under it are unmapped, or the block a merge makes) in `state`.
fn block_info(b: &heap::Block, address: u64, size: u64, state: BlockState) -> BlockInfo {
    let meta = b.extra.as_ref().and_then(|e| e.meta.as_ref());
    BlockInfo {
        address,
        size,
        requested_size: b.requested,
        state,
        dtype: meta.map(|m| m.dtype.clone()),
        shape: meta.map(|m| m.shape.clone()),
        context: None,
    }
}

/// The unmapped ranges of the heap segment whose blocks a snapshot is copying.
struct Unmapped {
    /// The segment's address.
    segment: u64,
    /// `(address, length)`, in address order.
    ranges: Vec<(u64, u64)>,
    /// How many of them end before the block being copied (see [`mapped_pieces`]).
    passed: usize,
}

/// The parts of `[address, address + size)` outside `unmapped` (sorted, disjoint ranges of
/// `(address, length)`), in address order. `passed`: how many ranges end before `address`,
/// as far as known (a segment's blocks come in address order: linear in blocks and ranges).
fn mapped_pieces(address: u64, size: u64, unmapped: &[(u64, u64)], passed: &mut usize) -> Vec<(u64, u64)> {
    let end = address + size;
    while unmapped.get(*passed).is_some_and(|&(u, len)| u + len <= address) {
        *passed += 1;
    }
    let mut pieces = Vec::with_capacity(1);
    let mut at = address;
    for &(u, len) in &unmapped[*passed..] {
        let u_end = u + len;
        if u >= end {
            break;
        }
        if u_end <= at {
            continue;
        }
        if u > at {
            pieces.push((at, u - at));
        }
        at = at.max(u_end);
    }
    if at < end {
        pieces.push((at, end - at));
    }
    pieces
}

struct FullContext {
    stack: Option<u32>,
    scope: u32,
    thread: u32,
    step: u64,
}

/// Interns frames, scopes and threads into the snapshot's tables.
#[derive(Default)]
struct Tables {
    frames: Interner<Frame>,
    /// By the recorder's stack id.
    stacks: Interner<u32, Vec<FrameId>>,
    /// By the recorder's scope id.
    scopes: Interner<u32, Vec<String>>,
    /// By the recorder's thread id.
    threads: Interner<u32, String>,
}

impl Tables {
    fn context(&mut self, c: Context, raw: &Raw, sym: &mut Symbolizer) -> ContextInfo {
        let site = raw.sites[c.site as usize];
        let c = FullContext { stack: site.stack, scope: site.scope, thread: site.thread, step: c.step };
        let raw = &raw.stacks[..];
        let stack = c.stack.map(|s| StackId(self.stack(s, raw, sym)));
        let scope = ScopeId(self.scopes.id(c.scope, |&s| snapshot_path(s)));
        let thread = ThreadId(self.threads.id(c.thread, |&t| thread_name(t)));
        ContextInfo { stack, scope, thread, step: c.step }
    }

    /// The index of `f` in the frame table, added if new.
    fn frame(&mut self, f: &Frame) -> FrameId {
        FrameId(self.frames.intern_ref(f))
    }

    fn stack(&mut self, id: u32, raw: &[Box<[usize]>], sym: &mut Symbolizer) -> u32 {
        if let Some(s) = self.stacks.get(&id) {
            return s;
        }
        let mut frames = Vec::new();
        let ips = raw.get(id as usize).map(|b| &b[..]).unwrap_or(&[]);
        each_frame(ips, sym, |f| frames.push(self.frame(f)));
        self.stacks.id(id, |_| frames)
    }
}

/// Calls `f` with each frame of the stack of return addresses `ips`, innermost first, as a
/// snapshot lists them.
fn each_frame(ips: &[usize], sym: &mut Symbolizer, mut f: impl FnMut(&Frame)) {
    let mut any = false;
    let mut harness_seen = false;
    for &ip in ips {
        let (resolved, harness) = sym.resolve(ip);
        for r in resolved {
            f(r);
            any = true;
        }
        // The harness called the test body from here: the body's frames are complete. Where
        // none of them could be seen (a body inlined into the harness, in a build without
        // line tables), the user's test function outside the harness names it instead.
        harness_seen |= harness;
        if harness_seen && any {
            break;
        }
    }
    // Frames were captured but none is the program's own: its code was inlined into the
    // harness or the standard library (a build with symbols only), so say so rather than
    // show no stack.
    if !ips.is_empty() && !any {
        let function = if harness_seen { crate::frames::INLINED_TEST_BODY } else { crate::frames::INLINED_ELSEWHERE };
        f(&Frame { function: function.to_string(), file: None, line: None });
    }
}

/// An allocator's live allocated blocks, copied under its lock: address, bytes and the
/// recorder's stack id of each, and the return addresses of each stack they name.
pub(crate) struct LiveRaw {
    /// Address, bytes, stack id, and how recorded memory was made.
    pub(crate) blocks: Vec<(u64, u64, Option<u32>, crate::alloc::heap::Made)>,
    pub(crate) stacks: std::collections::HashMap<u32, Box<[usize]>>,
}

impl CachingAllocator {
    /// The live allocated blocks with their stacks, without symbols (see [`LiveRaw`]).
    pub(crate) fn live_raw(&self) -> LiveRaw {
        let locked = self.shared.lock_as_is();
        let heap = &locked.heap;
        let rec = heap.recorder();
        let mut out = LiveRaw { blocks: Vec::new(), stacks: std::collections::HashMap::new() };
        heap.for_each_block(|_, _, b| {
            if b.state != heap::BlockState::Allocated {
                return;
            }
            let stack = b.ctx.and_then(|c| rec.sites.sites.get(c.site as usize)).and_then(|s| s.stack);
            if let Some(id) = stack {
                if let std::collections::hash_map::Entry::Vacant(e) = out.stacks.entry(id) {
                    if let Some(ips) = rec.stacks.stacks.get(id as usize) {
                        e.insert(ips.clone());
                    }
                }
            }
            out.blocks.push((b.addr, b.size, stack, heap.recorded_made(b.addr).unwrap_or_default()));
        });
        out
    }

    /// The frames of the stack of return addresses `ips`, innermost first, as this
    /// allocator's snapshots list them (symbols cached per address).
    pub(crate) fn frames_of(&self, ips: &[usize]) -> Vec<Frame> {
        let mut sym = self.shared.symbols.lock();
        let mut out = Vec::new();
        each_frame(ips, &mut sym, |f| out.push(f.clone()));
        out
    }
}

impl CachingAllocator {
    /// A snapshot of segments, blocks with their state and context, and the history,
    /// symbolized. The lock is held only while the raw data is copied; symbols are resolved
    /// afterwards, each address once per allocator.
    ///
    /// ```
    /// use vramscope::{CachingAllocator, backend::HostBackend};
    /// let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    /// let x = alloc.alloc::<f32>(&alloc.default_stream(), 256).unwrap();
    /// let snap = alloc.snapshot();
    /// assert_eq!(snap.live_blocks().count(), 1);
    /// let json = snap.to_json();
    /// # drop(x);
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let mut raw = {
            let mut locked = self.shared.lock_as_is();
            locked.heap.note_snapshot();
            copy(&locked.heap)
        };
        let mut sym = self.shared.symbols.lock();
        let mut t = Tables::default();
        t.scopes.id(crate::record::ROOT_SCOPE, |_| Vec::new());
        let raw_segments = std::mem::take(&mut raw.segments);
        let mut segments = Vec::with_capacity(raw_segments.len());
        for (mut s, contexts) in raw_segments {
            for (b, c) in s.blocks.iter_mut().zip(contexts) {
                b.context = c.map(|c| t.context(c, &raw, &mut sym));
            }
            segments.push(s);
        }
        if self.backend().is_external() {
            // Memory the program allocated itself: marked, so that a report or a pickle of
            // this snapshot alone still says whose it is.
            let name = self.backend().name();
            segments.iter_mut().for_each(|s| s.source = Some(name.to_string()));
        }
        let to_ns = raw.clock.ticks_to_ns();
        let history = raw
            .history
            .iter()
            .map(|e| HistoryEntry {
                action: e.action(),
                addr: e.addr,
                size: e.size(),
                stream: u64::from(e.stream),
                device: None,
                time_ns: to_ns(e.ticks),
                context: e.context().map(|c| t.context(c, &raw, &mut sym)),
                compile_context: None,
                user_metadata: None,
            })
            .collect();
        Snapshot {
            version: SNAPSHOT_VERSION,
            device: raw.device,
            backend: self.backend().name().to_string(),
            segments,
            history,
            history_dropped: raw.dropped,
            frames: t.frames.into_items(),
            stacks: t.stacks.into_items(),
            scopes: t.scopes.into_items(),
            threads: t.threads.into_items(),
            stats: raw.stats,
            time_origin_us: raw.clock.origin_us(),
            allocator_settings: None,
            external_annotations: Vec::new(),
            stack_capture: Some(crate::model::StackCapture::now(raw.stacks_mode)),
            driver_pool: self.backend().driver_pool(),
            ledger: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mapped_pieces;

    #[test]
    fn a_block_is_cut_where_its_pages_are_unmapped() {
        let unmapped = [(100, 50), (200, 100), (400, 10)];
        let mut passed = 0;
        // One segment's blocks in address order: before, across, inside, after the ranges.
        assert_eq!(mapped_pieces(0, 100, &unmapped, &mut passed), [(0, 100)]);
        assert_eq!(mapped_pieces(100, 120, &unmapped, &mut passed), [(150, 50)]);
        assert_eq!(mapped_pieces(220, 50, &unmapped, &mut passed), []);
        assert_eq!(mapped_pieces(270, 200, &unmapped, &mut passed), [(300, 100), (410, 60)]);
        assert_eq!(passed, 1, "the ranges that end before the last block began are passed");
        assert_eq!(mapped_pieces(500, 8, &unmapped, &mut passed), [(500, 8)]);
        assert_eq!(passed, 3);
        assert_eq!(mapped_pieces(0, 8, &[], &mut 0), [(0, 8)]);
    }
}
