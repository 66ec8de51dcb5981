use super::labels::Labels;
use super::{bytes, plural};
use crate::snapshot::Snapshot;
use serde::Serialize;
use std::collections::BTreeMap;

/// Live blocks that share an allocation site, scope and tensor description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LiveGroup {
    /// `file:line (function)` of the allocating code, or `<no stack>`.
    pub site: String,
    /// Scope path, `a/b`, or empty.
    pub scope: String,
    /// Element type, where known.
    pub dtype: Option<String>,
    /// Shape, where known and the same for every block of the group.
    pub shape: Option<Vec<usize>>,
    /// Live blocks.
    pub count: u64,
    /// Bytes of those blocks.
    pub bytes: u64,
    /// Bytes their callers asked for.
    pub requested_bytes: u64,
}

/// Live tensors grouped by allocation site and scope, largest first.
pub fn live(snapshot: &Snapshot) -> Vec<LiveGroup> {
    let mut labels = Labels::new(snapshot);
    let mut groups: BTreeMap<(u32, u32, Option<&str>), LiveGroup> = BTreeMap::new();
    for b in snapshot.live_blocks() {
        let ctx = b.context.as_ref();
        let (site, scope) = (labels.site(ctx), labels.scope(ctx));
        let g = groups.entry((site, scope, b.dtype.as_deref())).or_insert_with(|| LiveGroup {
            site: labels.site_label(site).to_string(),
            scope: labels.scope_label(scope).to_string(),
            dtype: b.dtype.clone(),
            shape: b.shape.clone(),
            count: 0,
            bytes: 0,
            requested_bytes: 0,
        });
        if g.shape != b.shape {
            g.shape = None;
        }
        g.count += 1;
        g.bytes = g.bytes.saturating_add(b.size);
        g.requested_bytes = g.requested_bytes.saturating_add(b.requested_size);
    }
    let mut out: Vec<LiveGroup> = groups.into_values().collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)).then_with(|| a.scope.cmp(&b.scope)));
    out
}

impl LiveGroup {
    /// The report as text, one group per line, every site whole: what `assert_mem_snapshot!`
    /// pins, where two sites must never read alike.
    pub fn render(groups: &[LiveGroup]) -> String {
        Self::render_with(groups, false)
    }

    /// The report as [`LiveGroup::render`] writes it, each site made to fit a line of 100
    /// columns where it is too wide: a Rust function's module path, then the middle of its name,
    /// a C++ function's parameters (`at::_ops::mm::call(..)`) left out, the file and line whole.
    /// For reading in a terminal (`vramscope live`).
    pub fn render_in_columns(groups: &[LiveGroup]) -> String {
        Self::render_with(groups, true)
    }

    fn render_with(groups: &[LiveGroup], fit: bool) -> String {
        let mut s = String::new();
        let total: u64 = groups.iter().map(|g| g.bytes).fold(0, u64::saturating_add);
        let count: u64 = groups.iter().map(|g| g.count).sum();
        let (blocks, sites) = (plural(count, "block", "blocks"), plural(groups.len() as u64, "site", "sites"));
        s.push_str(&format!("{} live in {blocks} from {sites}\n", bytes(total)));
        for g in groups {
            let tensor = match (&g.dtype, &g.shape) {
                (Some(d), Some(sh)) => format!(" {d}{sh:?}"),
                (Some(d), None) => format!(" {d}"),
                _ => String::new(),
            };
            let scope = if g.scope.is_empty() { String::new() } else { format!(" [{}]", g.scope) };
            let figures = format!("{:>12} {:>6}x  ", bytes(g.bytes), g.count);
            // The site gets what the figures, the scope and the tensor leave.
            let site = if fit {
                let taken = figures.chars().count() + scope.chars().count() + tensor.chars().count();
                super::fit_site(&g.site, super::COLUMNS.saturating_sub(taken).max(40))
            } else {
                std::borrow::Cow::Borrowed(g.site.as_str())
            };
            s.push_str(&format!("{figures}{site}{scope}{tensor}\n"));
        }
        s
    }
}
