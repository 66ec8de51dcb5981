//! Snapshots of one job's ranks side by side: what each holds, where they differ, and which
//! ranks leak.

use crate::snapshot::Snapshot;
use serde::Serialize;
use std::collections::BTreeMap;

/// Sites listed by [`Ranks::render`] where the ranks differ most.
pub const RANKS_SITES: usize = 10;

/// One rank's figures, as [`ranks`] reads them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Rank {
    /// The rank's name (its file).
    pub name: String,
    /// Bytes allocated now: the live blocks of the snapshot's segments.
    pub allocated: u64,
    /// Bytes reserved now: the snapshot's segments.
    pub reserved: u64,
    /// The most bytes allocated at once over the history: the blocks live at its start (what
    /// is allocated now, less what the history allocated and freed since), then its events,
    /// each request counted as its 512-byte-rounded block.
    pub peak_allocated: u64,
    /// The most bytes reserved at once over the history: the segments at its start, then its
    /// segment events (`segment_alloc`, `segment_map`, and their frees).
    pub peak_reserved: u64,
    /// The sites the leak finder names in this rank ([`super::leaks`]).
    pub leaks: Vec<String>,
}

/// One site's live bytes on each rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SiteAcrossRanks {
    /// `file:line (function)`, or `<no stack>`.
    pub site: String,
    /// Bytes of its live blocks on each rank, in the ranks' order.
    pub bytes: Vec<u64>,
    /// The most minus the least of `bytes`.
    pub spread: u64,
}

/// The ranks of one job side by side: each rank's figures, and the sites whose live bytes
/// differ most between ranks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Ranks {
    /// Each rank, in the order given.
    pub ranks: Vec<Rank>,
    /// The sites whose live bytes differ most between ranks, most first (at most
    /// [`RANKS_SITES`]; sites equal on every rank are left out).
    pub sites: Vec<SiteAcrossRanks>,
}

/// One rank's figures.
fn rank(name: &str, snap: &Snapshot) -> Rank {
    let now = crate::snapshot::stats_of(&snap.segments);
    // The peaks come from the history's changes, replayed from the start that today's figures
    // less those changes give: the leak finder's pass over the history sees them all.
    let found = super::leaks::find(snap);
    Rank {
        name: name.to_string(),
        allocated: now.allocated_bytes.all.current,
        reserved: now.reserved_bytes.all.current,
        peak_allocated: found.allocated.peak(now.allocated_bytes.all.current),
        peak_reserved: found.reserved.peak(now.reserved_bytes.all.current),
        leaks: found.candidates.into_iter().map(|c| c.site).collect(),
    }
}

/// The ranks of one job side by side (each snapshot a rank, named by `name`): per rank, what
/// is allocated and reserved now and at the history's peak, and the lines the leak finder
/// names; across ranks, the sites whose live bytes differ most. A rank that holds more than
/// the others (an embedding table on rank 0, a pipeline stage's activations) shows there.
pub fn ranks(snapshots: &[(String, Snapshot)]) -> Ranks {
    // Each rank's figures and live sites on the cores there are, a share of the ranks each.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = snapshots.len().div_ceil(cores).max(1);
    let parts: Vec<RankPart> = std::thread::scope(|scope| {
        let workers: Vec<_> = (snapshots.chunks(share))
            .map(|part| scope.spawn(move || part.iter().map(|(name, snap)| rank_part(name, snap)).collect::<Vec<_>>()))
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a rank's report does not panic")).collect()
    });
    ranks_from(parts)
}

/// What [`ranks`] reads of one rank's snapshot: its figures and its live bytes by site. Made
/// from each snapshot alone, as soon as it is read, the snapshot can be freed before the next
/// is read: `vramscope ranks` holds one snapshot per core at most, and reads each rank's
/// history while it is still in the cache.
#[derive(Debug, Clone)]
pub struct RankPart {
    rank: Rank,
    live: Vec<super::LiveGroup>,
}

/// The part of [`ranks`] that reads the rank `name`'s snapshot; [`ranks_from`] puts the
/// ranks' parts side by side.
pub fn rank_part(name: &str, snapshot: &Snapshot) -> RankPart {
    RankPart { rank: rank(name, snapshot), live: super::live(snapshot) }
}

/// The ranks of one job side by side, from each rank's [`rank_part`], in the ranks' order:
/// what [`ranks`] gives for their snapshots.
pub fn ranks_from(parts: Vec<RankPart>) -> Ranks {
    let n = parts.len();
    let mut by_site: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut per_rank = Vec::with_capacity(n);
    for (r, RankPart { rank, live }) in parts.into_iter().enumerate() {
        per_rank.push(rank);
        for g in live {
            let bytes = by_site.entry(g.site).or_insert_with(|| vec![0; n]);
            bytes[r] = bytes[r].saturating_add(g.requested_bytes);
        }
    }
    let mut sites: Vec<SiteAcrossRanks> = by_site
        .into_iter()
        .map(|(site, bytes)| {
            let spread = bytes.iter().max().copied().unwrap_or(0) - bytes.iter().min().copied().unwrap_or(0);
            SiteAcrossRanks { site, bytes, spread }
        })
        .filter(|s| s.spread > 0)
        .collect();
    sites.sort_by(|a, b| b.spread.cmp(&a.spread).then_with(|| a.site.cmp(&b.site)));
    sites.truncate(RANKS_SITES);
    Ranks { ranks: per_rank, sites }
}

impl Ranks {
    /// The ranks as text within 100 columns: a row per rank, then each differing site with its
    /// bytes on each rank, then the leaks by rank.
    pub fn render(&self) -> String {
        let b = super::bytes;
        let mut s = format!(
            "{:<4} {:>12} {:>12} {:>14} {:>14}  file\n",
            "rank", "allocated", "reserved", "peak alloc.", "peak reserved"
        );
        for (i, r) in self.ranks.iter().enumerate() {
            // The file's name, its end kept where it is too long (the end tells ranks apart).
            let room = super::COLUMNS.saturating_sub(62);
            let chars: Vec<char> = r.name.chars().collect();
            let name = if chars.len() > room {
                format!("...{}", chars[chars.len() - (room - 3)..].iter().collect::<String>())
            } else {
                r.name.clone()
            };
            s.push_str(&format!(
                "{i:<4} {:>12} {:>12} {:>14} {:>14}  {name}\n",
                b(r.allocated),
                b(r.reserved),
                b(r.peak_allocated),
                b(r.peak_reserved)
            ));
        }
        if self.sites.is_empty() {
            s.push_str("\nevery site holds the same live bytes on every rank\n");
        } else {
            s.push_str("\nsites whose live bytes differ most between ranks (bytes asked for):\n");
            for site in &self.sites {
                s.push_str(&format!("  {}\n", super::fit_site(&site.site, super::COLUMNS - 2)));
                let per: Vec<String> = site.bytes.iter().enumerate().map(|(i, x)| format!("{i}: {}", b(*x))).collect();
                let mut line = String::from("     ");
                for part in per {
                    if line.len() + part.len() + 3 > super::COLUMNS {
                        s.push_str(&line);
                        s.push('\n');
                        line = String::from("     ");
                    }
                    line.push_str("  ");
                    line.push_str(&part);
                }
                s.push_str(&line);
                s.push('\n');
            }
        }
        let leaking: Vec<(usize, &Rank)> = self.ranks.iter().enumerate().filter(|(_, r)| !r.leaks.is_empty()).collect();
        if leaking.is_empty() {
            s.push_str("\nno rank has leak candidates\n");
        } else {
            s.push_str("\nleak candidates, by rank:\n");
            for (i, r) in leaking {
                for site in &r.leaks {
                    s.push_str(&format!("  {i}: {}\n", super::fit_site(site, super::COLUMNS - 6)));
                }
            }
        }
        s
    }
}
