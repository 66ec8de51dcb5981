//! Selecting a test's blocks from snapshots of several allocators, and putting them in one
//! snapshot for the reports.

use crate::intern::Interner;
use crate::snapshot::{BlockState, ContextInfo, Snapshot};

/// The snapshot with only the live blocks (and history) of contexts inside scope `path` (or,
/// with `inside == false`, outside it); free and pending blocks stay, so segments keep their
/// shape.
pub(super) fn within(snap: &Snapshot, path: &[String], inside: bool) -> Snapshot {
    let is_inside = |c: Option<&ContextInfo>| {
        c.and_then(|c| snap.scopes.get(c.scope as usize)).is_some_and(|p| p.starts_with(path))
    };
    let mut s = snap.clone();
    for seg in &mut s.segments {
        seg.blocks.retain(|b| b.state != BlockState::ActiveAllocated || is_inside(b.context.as_ref()) == inside);
    }
    s.history.retain(|e| is_inside(e.context.as_ref()) == inside);
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

/// One snapshot holding the segments, blocks and history of several (of different allocators):
/// frames, stacks, scopes and threads are re-indexed into shared tables. Statistics are summed
/// (peaks too, so they are upper bounds); device and backend are the first snapshot's, with the
/// other backends named after it (`host+sim`).
pub(super) fn merge(snaps: Vec<Snapshot>) -> Option<Snapshot> {
    let mut it = snaps.into_iter();
    let mut out = it.next()?;
    let mut frames_t = Interner::from_items(std::mem::take(&mut out.frames));
    let mut stacks_t = Interner::from_items(std::mem::take(&mut out.stacks));
    let mut scopes_t = Interner::from_items(std::mem::take(&mut out.scopes));
    let mut threads_t = Interner::from_items(std::mem::take(&mut out.threads));
    for s in it {
        let frames: Vec<u32> = s.frames.into_iter().map(|f| frames_t.intern(f)).collect();
        let remap = |table: &[u32], k: u32| table.get(k as usize).copied().unwrap_or(k);
        let stacks: Vec<u32> =
            s.stacks.into_iter().map(|st| stacks_t.intern(st.iter().map(|&f| remap(&frames, f)).collect())).collect();
        let scopes: Vec<u32> = s.scopes.into_iter().map(|p| scopes_t.intern(p)).collect();
        let threads: Vec<u32> = s.threads.into_iter().map(|t| threads_t.intern(t)).collect();
        let map = |c: &mut ContextInfo| {
            c.stack = c.stack.map(|k| remap(&stacks, k));
            c.scope = remap(&scopes, c.scope);
            c.thread = remap(&threads, c.thread);
        };
        for mut seg in s.segments {
            for b in &mut seg.blocks {
                if let Some(c) = &mut b.context {
                    map(c);
                }
            }
            out.segments.push(seg);
        }
        for mut e in s.history {
            if let Some(c) = &mut e.context {
                map(c);
            }
            out.history.push(e);
        }
        out.history_dropped += s.history_dropped;
        for (k, v) in s.stats {
            let total = out.stats.entry(k).or_default();
            *total = total.saturating_add(v);
        }
        if !out.backend.split('+').any(|b| b == s.backend) {
            out.backend = format!("{}+{}", out.backend, s.backend);
        }
    }
    out.frames = frames_t.into_items();
    out.stacks = stacks_t.into_items();
    out.scopes = scopes_t.into_items();
    out.threads = threads_t.into_items();
    Some(out)
}
