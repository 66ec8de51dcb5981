#[cfg(feature = "flamegraph")]
use crate::error::{Error, ReportError, Result};
use crate::intern::Map;
use crate::record::Action;
use crate::snapshot::{ContextInfo, ScopeId, Snapshot, StackId, ThreadId};
use std::collections::BTreeMap;

/// What a folded profile counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FoldedKind {
    /// Bytes of the blocks live in the snapshot.
    Live,
    /// Bytes of every allocation in the history (churn).
    Allocated,
}

/// The folded-stack line prefix of a context: scopes as `[name]` frames, then the stack,
/// outermost first.
fn stack_line(snap: &Snapshot, ctx: Option<&ContextInfo>) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(c) = ctx {
        if let Some(path) = snap.scope(c.scope) {
            parts.extend(path.iter().map(|s| format!("[{s}]")));
        }
        if let Some(stack) = c.stack {
            // In a stack with Python frames, what PyTorch's own viewer leaves out (the
            // unwinder, the interpreter's loop, the C runtime) is left out too.
            let python = crate::frames::has_python(snap.stack_frames(stack));
            let frames: Vec<String> = snap
                .stack_frames(stack)
                .filter(|f| !python || !crate::frames::is_unwinding_or_interpreter(f))
                .map(|f| match (&f.file, f.line) {
                    (Some(file), Some(line)) => format!("{} ({file}:{line})", f.function),
                    _ => f.function.clone(),
                })
                .collect();
            parts.extend(frames.into_iter().rev());
        }
    }
    if parts.is_empty() {
        parts.push("<no stack>".into());
    }
    parts.iter().map(|p| escape_frame(p)).collect::<Vec<_>>().join(";")
}

/// A frame as one folded-stack field: `;` (the field separator) becomes `:`, and line breaks
/// and other control characters are written as escapes (`\n`), so that no frame or scope name
/// read from a file can start a line of its own or forge a count.
fn escape_frame(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for c in p.chars() {
        match c {
            ';' => out.push(':'),
            '\t' => out.push(' '),
            c => super::push_printable(&mut out, c),
        }
    }
    out
}

/// Folded stacks (`frame;frame;frame bytes`, one line per distinct stack, sorted), the input
/// format of flamegraph tools.
pub fn folded(snapshot: &Snapshot, kind: FoldedKind) -> String {
    // Sum by (scope, stack) first: a program has far fewer of those than blocks, and each line
    // is formatted once.
    let mut by_ctx: Map<Option<(ScopeId, Option<StackId>)>, u64> = Map::default();
    let mut add = |ctx: Option<&ContextInfo>, size: u64| {
        let n = by_ctx.entry(ctx.map(|c| (c.scope, c.stack))).or_default();
        *n = n.saturating_add(size);
    };
    match kind {
        FoldedKind::Live => snapshot.live_blocks().for_each(|b| add(b.context.as_ref(), b.size)),
        FoldedKind::Allocated => {
            snapshot.history.iter().filter(|e| e.action == Action::Alloc).for_each(|e| add(e.context.as_ref(), e.size))
        }
    }
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for (key, size) in by_ctx {
        let ctx = key.map(|(scope, stack)| ContextInfo { stack, scope, thread: ThreadId(0), step: 0 });
        let n = lines.entry(stack_line(snapshot, ctx.as_ref())).or_default();
        *n = n.saturating_add(size);
    }
    lines.into_iter().filter(|(_, n)| *n > 0).map(|(l, n)| format!("{l} {n}\n")).collect()
}

#[cfg(feature = "flamegraph")]
fn options(title: &str, subtitle: Option<&str>) -> inferno::flamegraph::Options<'static> {
    let mut o = inferno::flamegraph::Options::default();
    o.title = title.to_string();
    o.subtitle = subtitle.map(str::to_string);
    o.count_name = "bytes".into();
    o.colors = inferno::flamegraph::color::Palette::Basic(inferno::flamegraph::color::BasicPalette::Mem);
    o.deterministic = true;
    o
}

#[cfg(feature = "flamegraph")]
fn render(folded: &str, title: &str) -> Result<String> {
    render_with(folded, title, None)
}

/// A flamegraph with a subtitle line under the title.
#[cfg(feature = "flamegraph")]
pub(crate) fn render_with(folded: &str, title: &str, subtitle: Option<&str>) -> Result<String> {
    if folded.trim().is_empty() {
        return Err(ReportError::EmptyProfile { title: title.into() }.into());
    }
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options(title, subtitle), folded.lines(), &mut svg)
        .map_err(|e| rendering(title, format!("the flamegraph could not be drawn: {e}")))?;
    String::from_utf8(svg).map_err(|e| rendering(title, format!("the flamegraph is not UTF-8: {e}")))
}

#[cfg(feature = "flamegraph")]
fn rendering(title: &str, message: String) -> Error {
    ReportError::Render { title: title.into(), message }.into()
}

/// A flamegraph SVG of folded stacks (see [`folded`]); bytes are the counts, colours are
/// deterministic. An empty profile is an error saying so. (Cargo feature `flamegraph`.)
#[cfg(feature = "flamegraph")]
#[cfg_attr(docsrs, doc(cfg(feature = "flamegraph")))]
pub fn flamegraph(folded: &str, title: &str) -> Result<String> {
    render(folded, title)
}

/// A differential flamegraph: the shape of `after`, coloured by the change from `before`
/// (red grew, blue shrank). (Cargo feature `flamegraph`.)
#[cfg(feature = "flamegraph")]
#[cfg_attr(docsrs, doc(cfg(feature = "flamegraph")))]
pub fn differential_flamegraph(before: &str, after: &str, title: &str) -> Result<String> {
    let mut diff = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        before.as_bytes(),
        after.as_bytes(),
        &mut diff,
    )
    .map_err(|e| rendering(title, format!("the profiles could not be compared: {e}")))?;
    let diff = String::from_utf8(diff).map_err(|e| rendering(title, format!("the difference is not UTF-8: {e}")))?;
    render(&diff, title)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Frame;
    use crate::snapshot::{BlockInfo, BlockState, FrameId, SegmentInfo};

    /// A hostile frame name cannot forge a folded line: every stack stays one line.
    #[test]
    fn frame_names_cannot_forge_lines() {
        let mut snap = Snapshot::empty("host");
        snap.frames.push(Frame {
            function: "train_step\nevil;injected;frame 999999999\nreal".into(),
            file: None,
            line: None,
        });
        snap.stacks.push(vec![FrameId(0)]);
        snap.scopes.push(vec!["scope\r\nwith;breaks".into()]);
        let context = Some(ContextInfo { stack: Some(StackId(0)), scope: ScopeId(1), thread: ThreadId(0), step: 0 });
        let block = BlockInfo {
            address: 0,
            size: 512,
            requested_size: 512,
            state: BlockState::ActiveAllocated,
            dtype: None,
            shape: None,
            context,
        };
        snap.segments.push(SegmentInfo {
            address: 0,
            total_size: 2 << 20,
            mapped_size: 2 << 20,
            expandable: false,
            stream: 0,
            device: None,
            pool: crate::alloc::Pool::Small,
            pool_id: None,
            allocated_size: 512,
            active_size: 512,
            requested_size: 512,
            blocks: vec![block],
            context: None,
            source: None,
        });
        let folded = folded(&snap, FoldedKind::Live);
        assert_eq!(folded, "[scope\\r\\nwith:breaks];train_step\\nevil:injected:frame 999999999\\nreal 512\n");
        assert_eq!(folded.lines().count(), 1);
        #[cfg(feature = "flamegraph")]
        assert!(flamegraph(&folded, "hostile").is_ok());
    }
}
