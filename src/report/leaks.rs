use super::{bytes, site_frame};
use crate::record::{Action, Frame};
use crate::snapshot::{ContextInfo, Snapshot};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// An allocation site whose live blocks keep growing.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct LeakCandidate {
    /// `file:line (function)` of the allocating code.
    pub site: String,
    /// The site's frame.
    pub frame: Frame,
    /// Blocks allocated there and still live at the end of the history.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes added per step (or per time window), on average.
    pub bytes_per_step: u64,
    /// Steps (or windows) in which surviving blocks were allocated, of `steps`.
    pub growing_steps: u32,
    /// Steps (or windows) the history spans.
    pub steps: u32,
    /// `step` where the program marked steps, else `window` (a tenth of the history's time).
    pub unit: &'static str,
}

/// Time windows used where the history has no step markers.
const WINDOWS: u32 = 10;

/// Sites whose live memory keeps growing: blocks allocated there and still live at the end of
/// the history, allocated across at least half of the steps (or time windows, where no step
/// markers exist) and at least three of them. A site that allocated once (model weights) or
/// whose blocks are freed (temporaries) is not a candidate; blocks without a program frame are
/// left out. Largest growth first.
pub fn leaks(snapshot: &Snapshot) -> Vec<LeakCandidate> {
    // Replay the history to find the allocations that survive it.
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut allocs = Vec::new();
    for (i, e) in snapshot.history.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, i);
                allocs.push(i);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    if allocs.is_empty() {
        return Vec::new();
    }
    let hist = &snapshot.history;
    let step_of = |i: usize| hist[i].context.map_or(0, |c: ContextInfo| c.step);
    let (min_step, max_step) =
        allocs.iter().fold((u64::MAX, 0), |(lo, hi), &i| (lo.min(step_of(i)), hi.max(step_of(i))));
    let by_step = max_step > min_step && max_step - min_step >= 2;
    let (t0, t1) = (hist[allocs[0]].time_ns, hist[*allocs.last().expect("not empty")].time_ns);
    let steps: u32 = if by_step { (max_step - min_step + 1).min(u64::from(u32::MAX)) as u32 } else { WINDOWS };
    let bucket = |i: usize| -> u32 {
        if by_step {
            (step_of(i) - min_step) as u32
        } else {
            let span = (t1 - t0).max(1) as u128;
            (((hist[i].time_ns - t0) as u128 * u128::from(WINDOWS)) / (span + 1)) as u32
        }
    };
    // Per site: surviving bytes per bucket.
    let mut per_site: BTreeMap<Frame, (u64, u64, BTreeMap<u32, u64>)> = BTreeMap::new();
    for &i in live.values() {
        let e = &hist[i];
        let Some(frame) = site_frame(snapshot, e.context.as_ref()) else { continue };
        let s = per_site.entry(frame.clone()).or_default();
        s.0 += 1;
        s.1 += e.size;
        *s.2.entry(bucket(i)).or_default() += e.size;
    }
    let mut out: Vec<LeakCandidate> = per_site
        .into_iter()
        .filter(|(_, (_, _, b))| b.len() as u32 >= 3.max(steps.div_ceil(2)))
        .map(|(frame, (blocks, total, b))| LeakCandidate {
            site: frame.to_string(),
            frame,
            blocks,
            bytes: total,
            bytes_per_step: total / u64::from(steps.max(1)),
            growing_steps: b.len() as u32,
            steps,
            unit: if by_step { "step" } else { "window" },
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    out
}

impl LeakCandidate {
    /// The report as text.
    pub fn render(candidates: &[LeakCandidate]) -> String {
        if candidates.is_empty() {
            return "no leak candidates: no allocation site keeps growing\n".to_string();
        }
        let mut s = format!("{} leak candidates (live blocks that keep growing)\n", candidates.len());
        for c in candidates {
            s.push_str(&format!(
                "{:>12}/{} {:>12} in {:>5} blocks, grew in {:>2} of {} {}s  {}\n",
                bytes(c.bytes_per_step),
                c.unit,
                bytes(c.bytes),
                c.blocks,
                c.growing_steps,
                c.steps,
                c.unit,
                c.site
            ));
        }
        s
    }
}
