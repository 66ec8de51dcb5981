use super::{bytes, live};
use crate::snapshot::Snapshot;
use serde::Serialize;
use std::collections::BTreeMap;

/// Which way a site's live memory went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Change {
    /// Nothing live before.
    New,
    /// More bytes live after.
    Grew,
    /// Fewer bytes live after.
    Shrank,
    /// Nothing live after.
    Gone,
    /// The same bytes in another number of blocks.
    Changed,
}

impl Change {
    /// `new`, `grew`, `shrank`, `gone` or `changed`.
    pub fn name(self) -> &'static str {
        match self {
            Change::New => "new",
            Change::Grew => "grew",
            Change::Shrank => "shrank",
            Change::Gone => "gone",
            Change::Changed => "changed",
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// How one allocation site's live memory changed between two snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SiteDelta {
    /// Which way it went.
    pub change: Change,
    /// `file:line (function)`, or `<no stack>`.
    pub site: String,
    /// Scope path.
    pub scope: String,
    /// Live bytes before and after.
    pub before: u64,
    /// Live bytes after.
    pub after: u64,
    /// Live blocks before.
    pub count_before: u64,
    /// Live blocks after.
    pub count_after: u64,
}

/// Sites that are new, grew, shrank or are gone between `before` and `after`, largest change first.
pub fn diff(before: &Snapshot, after: &Snapshot) -> Vec<SiteDelta> {
    let mut sites: BTreeMap<(String, String), [(u64, u64); 2]> = BTreeMap::new();
    for (k, snap) in [before, after].into_iter().enumerate() {
        for g in live(snap) {
            let e = sites.entry((g.site, g.scope)).or_default();
            e[k].0 = e[k].0.saturating_add(g.bytes);
            e[k].1 = e[k].1.saturating_add(g.count);
        }
    }
    let mut out: Vec<SiteDelta> = sites
        .into_iter()
        .filter(|(_, v)| v[0] != v[1])
        .map(|((site, scope), [(b, cb), (a, ca)])| SiteDelta {
            change: match (b, a) {
                (0, _) => Change::New,
                (_, 0) => Change::Gone,
                _ if a > b => Change::Grew,
                _ if a < b => Change::Shrank,
                _ => Change::Changed,
            },
            site,
            scope,
            before: b,
            after: a,
            count_before: cb,
            count_after: ca,
        })
        .collect();
    out.sort_by(|x, y| {
        let dx = x.after.abs_diff(x.before);
        let dy = y.after.abs_diff(y.before);
        dy.cmp(&dx).then_with(|| x.site.cmp(&y.site)).then_with(|| x.scope.cmp(&y.scope))
    });
    out
}

impl SiteDelta {
    /// The diff as text, a line per site: the change, the bytes and blocks before and after,
    /// the site. Where that is wider than 100 columns, the site goes on the next line, made to
    /// fit it as [`LiveGroup::render_in_columns`](super::LiveGroup::render_in_columns) does.
    pub fn render(deltas: &[SiteDelta]) -> String {
        if deltas.is_empty() {
            return "no change in live memory by site\n".to_string();
        }
        let mut s = String::new();
        for d in deltas {
            let sign = if d.after >= d.before { '+' } else { '-' };
            let scope = if d.scope.is_empty() { String::new() } else { format!(" [{}]", d.scope) };
            let figures = format!(
                "{:<6} {sign}{:>11}  {:>11} -> {:<11} ({} -> {} blocks)  ",
                d.change,
                bytes(d.after.abs_diff(d.before)),
                bytes(d.before),
                bytes(d.after),
                d.count_before,
                d.count_after,
            );
            let line = format!("{figures}{}{scope}", d.site);
            if line.chars().count() <= super::COLUMNS {
                s.push_str(&line);
            } else {
                // Too wide beside the figures: the site on a line of its own under them, made
                // to fit there, rather than cut to the few columns the figures leave.
                const UNDER: &str = "       ";
                let room = super::COLUMNS.saturating_sub(UNDER.len() + scope.chars().count());
                s.push_str(&format!("{}\n{UNDER}{}{scope}", figures.trim_end(), super::fit_site(&d.site, room)));
            }
            s.push('\n');
        }
        s
    }
}
