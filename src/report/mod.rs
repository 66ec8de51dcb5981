//! Reports over a [`Snapshot`]: what is live and where it came from, what keeps growing,
//! what changed between two snapshots, the segment maps, the summary table, and folded stacks
//! and flamegraphs. Every function reads a `Snapshot` only, so the same reports work on a
//! snapshot loaded from disk, PyTorch's included. Output meant for review is deterministic:
//! stable order, no addresses or timestamps.

mod columns;
mod diff;
mod flame;

mod labels;
mod leaks;
mod live;
mod peak;
mod ranks;
mod segments;
mod timeline;

pub use crate::frames::{FramePolicy, LIBRARY_ENV, USER_CODE_ENV};
pub use diff::{diff, Change, SiteDelta};
#[cfg(feature = "flamegraph")]
pub(crate) use flame::render_with as flamegraph_with_subtitle;
#[cfg(feature = "flamegraph")]
pub use flame::{differential_flamegraph, flamegraph};
pub use flame::{folded, FoldedKind};
pub use leaks::{leak_limits, leaks, leaks_with_limits, LeakCandidate, LeakLimits, LeakUnit};
pub use live::{live, LiveGroup};
pub use ranks::{rank_part, ranks, ranks_from, Rank, RankPart, Ranks, SiteAcrossRanks, RANKS_SITES};
pub use segments::segments;
pub use timeline::{timeline, Band, Timeline, TIMELINE_POINTS, TIMELINE_SITES};

pub(crate) use columns::{fit_site, COLUMNS};
pub(crate) use labels::Labels;

use crate::frames;
use crate::record::Frame;
use crate::snapshot::{ContextInfo, Snapshot};

/// Histories from this many events on have a report's two passes over them run on two cores
/// ([`beside`]).
const PARALLEL_FROM: usize = 100_000;

/// `there()` and `here()`, two passes over one snapshot that neither writes: on a history of
/// [`PARALLEL_FROM`] events or more (`events`), `there` runs on another thread while `here` runs
/// on this one; on a shorter one, one after the other (a thread would cost more than it saves).
fn beside<A: Send, B>(events: usize, there: impl FnOnce() -> A + Send, here: impl FnOnce() -> B) -> (A, B) {
    if events < PARALLEL_FROM {
        let b = here();
        return (there(), b);
    }
    std::thread::scope(|scope| {
        let a = scope.spawn(there);
        let b = here();
        (a.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)), b)
    })
}

/// The memory summary table in PyTorch's layout, from the snapshot's statistics: one table per
/// device of a snapshot of several ([`Snapshot::for_device`]).
pub fn summary(snapshot: &Snapshot) -> String {
    let devices = snapshot.devices();
    // PyTorch's snapshot carries no statistics: its current figures are worked out from its
    // segments, and its peaks and totals are unknown, not 0.
    let current_only = snapshot.is_from_pytorch();
    let table = |s: &Snapshot| crate::alloc::stats::summary_table(&s.stats, &s.backend, s.device, current_only);
    let mut out = if devices.len() <= 1 {
        table(snapshot)
    } else {
        snapshot.by_devices(&devices).iter().map(table).collect::<Vec<_>>().join("\n")
    };
    if current_only {
        out.push_str("Peaks and totals (-) are not in PyTorch's snapshot; current figures come from its segments.\n");
    } else {
        // The statistics are the allocator's as recorded; where the segments this snapshot
        // lists hold something else now, say so rather than print figures that contradict
        // every other report of the file.
        let listed = crate::snapshot::stats_of(&snapshot.segments);
        let (said, held) = (&snapshot.stats, &listed);
        if said.allocated_bytes.all.current != held.allocated_bytes.all.current
            || said.reserved_bytes.all.current != held.reserved_bytes.all.current
        {
            out.push_str(&format!(
                "Note: the statistics count {} allocated and {} reserved now; the segments listed hold\n\
                 {} and {} (a snapshot of part of an allocator, or statistics edited by hand).\n",
                bytes(said.allocated_bytes.all.current),
                bytes(said.reserved_bytes.all.current),
                bytes(held.allocated_bytes.all.current),
                bytes(held.reserved_bytes.all.current),
            ));
        }
    }
    if let Some(p) = snapshot.driver_pool {
        out.push_str(&format!(
            "CUDA stream-ordered pool: {} in use (peak {}), {} held (peak {})\n",
            bytes(p.used),
            bytes(p.used_high),
            bytes(p.reserved),
            bytes(p.reserved_high)
        ));
    }
    if let Some(l) = &snapshot.ledger {
        out.push('\n');
        out.push_str(&l.to_text());
    }
    out
}

/// The allocation site of a context: the innermost frame of the program itself (the rule is
/// in [`frames`]: a Python line where the stack has Python frames, never a library's frame or
/// a framework's native code).
fn site_frame<'a>(snap: &'a Snapshot, ctx: Option<&ContextInfo>) -> Option<&'a Frame> {
    let stack = ctx?.stack?;
    frames::program_frames(snap.stack_frames(stack)).next().or_else(|| frames::framework_op(snap.stack_frames(stack)))
}

/// `file:line (function)`, or `<no stack>`.
fn site_label(frame: Option<&Frame>) -> String {
    frame.map_or_else(|| "<no stack>".to_string(), |f| f.to_string())
}

/// Text from a file as a report prints it: line breaks and other control characters (an
/// escape sequence a frame name could carry to a terminal) written as escapes (`\n`,
/// `\u{1b}`), so that no name can start a line of its own or restyle the terminal.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    text.chars().for_each(|c| push_printable(&mut out, c));
    std::borrow::Cow::Owned(out)
}

/// Appends `c` as [`printable`] writes it: a control character as its escape.
pub(crate) fn push_printable(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        c => out.push(c),
    }
}

/// `1 block`, `2 blocks`.
pub(crate) fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Bytes as the reports print them.
fn bytes(n: u64) -> String {
    crate::error::fmt_bytes(n)
}

/// Bytes as every report prints them, in binary units with two decimals (`1.50 MiB`, `512 B`),
/// for tools that print next to them.
pub fn format_bytes(n: u64) -> String {
    bytes(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statistics that contradict the segments listed (`"stats": {}` beside a live block) are
    /// said to; an allocator's own snapshot has nothing to say.
    #[test]
    fn a_summary_says_where_the_statistics_contradict_the_segments() {
        let forged = include_str!("../../fixtures/hostile/consistent.json");
        let snap = Snapshot::from_bytes(forged.as_bytes(), "consistent.json").unwrap();
        let text = summary(&snap);
        assert!(text.contains("Note: the statistics count 0 B allocated and 0 B reserved now"), "{text}");
        assert!(text.contains("the segments listed hold\n1.00 KiB and 2.00 MiB"), "{text}");
        let alloc = crate::CachingAllocator::new(crate::backend::SimBackend::new(1 << 30));
        let kept = alloc.alloc::<u8>(&alloc.default_stream(), 4096).unwrap();
        assert!(!summary(&alloc.snapshot()).contains("Note:"));
        drop(kept);
    }

    #[test]
    fn printable_text_escapes_control_characters() {
        assert_eq!(printable("train.py:3 (f)"), "train.py:3 (f)");
        assert_eq!(printable("a\nb\rc\td\u{1b}[31m"), "a\\nb\\rc\\td\\u{1b}[31m");
    }
}
