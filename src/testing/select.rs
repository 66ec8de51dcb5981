//! Selecting a test's blocks from snapshots of several allocators, and putting them in one
//! snapshot for the reports.

use crate::intern::Interner;
use crate::snapshot::{BlockState, ContextInfo, FrameId, ScopeId, SegmentInfo, Snapshot, StackId, ThreadId};

/// The snapshot with only the live blocks (and history) of contexts inside scope `path` (or,
/// with `inside == false`, outside it); free and pending blocks stay, so segments keep their
/// shape.
pub(super) fn within(snap: &Snapshot, path: &[String], inside: bool) -> Snapshot {
    let is_inside = |c: Option<&ContextInfo>| c.and_then(|c| snap.scope(c.scope)).is_some_and(|p| p.starts_with(path));
    let mut s = snap.clone();
    for seg in &mut s.segments {
        seg.blocks.retain(|b| b.state != BlockState::ActiveAllocated || is_inside(b.context.as_ref()) == inside);
    }
    // Frees carry no context by default: a free goes with the allocation it frees, so that the
    // history's live memory (the timeline's) rises and falls as the selected blocks did.
    let mut selected = std::collections::HashSet::new();
    s.history.retain(|e| match e.action {
        crate::record::Action::Alloc => {
            let keep = is_inside(e.context.as_ref()) == inside;
            if keep {
                selected.insert(e.addr);
            } else {
                selected.remove(&e.addr);
            }
            keep
        }
        crate::record::Action::FreeRequested | crate::record::Action::FreeCompleted if e.context.is_none() => {
            if e.action == crate::record::Action::FreeCompleted {
                selected.remove(&e.addr)
            } else {
                selected.contains(&e.addr)
            }
        }
        _ => is_inside(e.context.as_ref()) == inside,
    });
    s
}

/// Removes the leading `path` from every scope path that starts with it: the test's own scope
/// is implied in its reports.
pub(super) fn strip_scope(snap: &mut Snapshot, path: &[String]) {
    for p in &mut snap.scopes {
        if p.starts_with(path) {
            p.drain(..path.len());
        }
    }
}

/// The merged table's id for `id`, at `index` of a snapshot's table (an id outside it, which
/// validation refuses, is kept as it is).
fn remap<T: Copy>(table: &[T], id: T, index: usize) -> T {
    table.get(index).copied().unwrap_or(id)
}

/// One snapshot holding the segments, blocks and history of several (of different allocators):
/// frames, stacks, scopes and threads are re-indexed into shared tables. Statistics are summed
/// (peaks too, so they are upper bounds); device and backend are the first snapshot's, with the
/// other backends named after it (`host+sim`).
pub(super) fn merge(snaps: Vec<Snapshot>) -> Option<Snapshot> {
    let mut it = snaps.into_iter();
    let mut out = it.next()?;
    // Which snapshot each segment came from, in the order they were taken.
    let mut taken: Vec<usize> = vec![0; out.segments.len()];
    let mut frames_t = Interner::from_items(std::mem::take(&mut out.frames));
    let mut stacks_t = Interner::from_items(std::mem::take(&mut out.stacks));
    let mut scopes_t = Interner::from_items(std::mem::take(&mut out.scopes));
    let mut threads_t = Interner::from_items(std::mem::take(&mut out.threads));
    for (i, s) in it.enumerate() {
        // Each table's ids in `s`, by their ids in the merged tables.
        let frames: Vec<FrameId> = s.frames.into_iter().map(|f| FrameId(frames_t.intern(f))).collect();
        let stacks: Vec<StackId> = s
            .stacks
            .into_iter()
            .map(|st| StackId(stacks_t.intern(st.iter().map(|&f| remap(&frames, f, f.index())).collect())))
            .collect();
        let scopes: Vec<ScopeId> = s.scopes.into_iter().map(|p| ScopeId(scopes_t.intern(p))).collect();
        let threads: Vec<ThreadId> = s.threads.into_iter().map(|t| ThreadId(threads_t.intern(t))).collect();
        let map = |c: &mut ContextInfo| {
            c.stack = c.stack.map(|k| remap(&stacks, k, k.index()));
            c.scope = remap(&scopes, c.scope, c.scope.index());
            c.thread = remap(&threads, c.thread, c.thread.index());
        };
        let first_backend = out.backend.split('+').next().unwrap_or_default().to_string();
        for mut seg in s.segments {
            if s.backend != first_backend && seg.source.is_none() {
                seg.source = Some(s.backend.clone());
            }
            for b in &mut seg.blocks {
                if let Some(c) = &mut b.context {
                    map(c);
                }
            }
            out.segments.push(seg);
            taken.push(i + 1);
        }
        for mut e in s.history {
            if let Some(c) = &mut e.context {
                map(c);
            }
            out.history.push(e);
        }
        out.history_dropped += s.history_dropped;
        out.stats.add(&s.stats);
        if !out.backend.split('+').any(|b| b == s.backend) {
            out.backend = format!("{}+{}", out.backend, s.backend);
        }
    }
    out.segments = settle(std::mem::take(&mut out.segments), taken);
    out.frames = frames_t.into_items();
    out.stacks = stacks_t.into_items();
    out.scopes = scopes_t.into_items();
    out.threads = threads_t.into_items();
    Some(out)
}

/// The segments of several snapshots in address order, as a snapshot lists them. The snapshots
/// were taken one after another while other threads went on: where a segment of one overlaps
/// a segment of a snapshot taken later, its allocator gave the range back in between (and
/// another took it), so the earlier one is stale and left out. Without this a merged snapshot
/// could list one address twice and no reader would load it.
fn settle(segments: Vec<SegmentInfo>, taken: Vec<usize>) -> Vec<SegmentInfo> {
    let mut tagged: Vec<(SegmentInfo, usize)> = segments.into_iter().zip(taken).collect();
    tagged.sort_by_key(|(s, _)| s.address);
    let mut out: Vec<(SegmentInfo, usize)> = Vec::with_capacity(tagged.len());
    for (seg, when) in tagged {
        let end = |s: &SegmentInfo| s.address.saturating_add(s.total_size);
        match out.last() {
            Some((last, last_when)) if seg.address < end(last) => {
                if when > *last_when {
                    out.pop();
                    // The newer segment may overlap more than one stale one.
                    while out.last().is_some_and(|(l, w)| seg.address < end(l) && *w < when) {
                        out.pop();
                    }
                    out.push((seg, when));
                }
            }
            _ => out.push((seg, when)),
        }
    }
    out.into_iter().map(|(s, _)| s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(address: u64, total_size: u64) -> SegmentInfo {
        SegmentInfo {
            address,
            total_size,
            mapped_size: total_size,
            expandable: false,
            stream: 0,
            device: None,
            pool: crate::alloc::Pool::Large,
            pool_id: None,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            blocks: Vec::new(),
            context: None,
            source: None,
        }
    }

    #[test]
    fn merged_segments_are_in_order_and_a_stale_range_gives_way_to_a_newer_one() {
        // Taken first: 100..200 and 500..600; second: 0..50 and 150..250 (taken after the
        // first allocator gave 100..200 back); third: 550..560.
        let segs = vec![seg(100, 100), seg(500, 100), seg(0, 50), seg(150, 100), seg(550, 10)];
        let out = settle(segs, vec![0, 0, 1, 1, 2]);
        let got: Vec<(u64, u64)> = out.iter().map(|s| (s.address, s.total_size)).collect();
        assert_eq!(got, [(0, 50), (150, 100), (550, 10)]);
        // Nothing overlaps: everything stays, in address order.
        let out = settle(vec![seg(300, 10), seg(100, 10)], vec![0, 1]);
        assert_eq!(out.iter().map(|s| s.address).collect::<Vec<_>>(), [100, 300]);
    }
}
