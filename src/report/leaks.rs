use super::labels::Labels;
use super::{bytes, is_library};
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
    /// The program's frames that called the site, innermost first (at most three), from the
    /// site's largest surviving allocation.
    pub callers: Vec<String>,
    /// Scope path of that allocation, `a/b`, or empty.
    pub scope: String,
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
            // Saturating: a hand-edited or hostile history need not run forward in time.
            let span = t1.saturating_sub(t0).max(1) as u128;
            ((hist[i].time_ns.saturating_sub(t0) as u128 * u128::from(WINDOWS)) / (span + 1))
                .min(u128::from(WINDOWS - 1)) as u32
        }
    };
    // Per site: surviving bytes per bucket.
    struct Site {
        blocks: u64,
        bytes: u64,
        buckets: BTreeMap<u32, u64>,
        /// The largest surviving allocation (size, then earliest), for callers and scope.
        example: (u64, std::cmp::Reverse<usize>),
    }
    let mut labels = Labels::new(snapshot);
    let mut per_site: BTreeMap<u32, Site> = BTreeMap::new();
    for &i in live.values() {
        let e = &hist[i];
        let site = labels.site(e.context.as_ref());
        if labels.site_frame(site).is_none() {
            continue;
        }
        let s = per_site.entry(site).or_insert(Site {
            blocks: 0,
            bytes: 0,
            buckets: BTreeMap::new(),
            example: (0, std::cmp::Reverse(usize::MAX)),
        });
        s.blocks += 1;
        s.bytes = s.bytes.saturating_add(e.size);
        let b = s.buckets.entry(bucket(i)).or_default();
        *b = b.saturating_add(e.size);
        s.example = s.example.max((e.size, std::cmp::Reverse(i)));
    }
    let mut out: Vec<LeakCandidate> = per_site
        .into_iter()
        .filter(|(_, s)| s.buckets.len() as u32 >= 3.max(steps.div_ceil(2)))
        .map(|(site, s)| {
            let frame = labels.site_frame(site).expect("sites without a frame were left out").clone();
            let ctx = hist[s.example.1 .0].context;
            let callers = ctx
                .and_then(|c| c.stack)
                .map(|st| {
                    snapshot
                        .stack_frames(st)
                        .filter(|f| !is_library(f))
                        .skip(1)
                        .take(3)
                        .map(|f| f.to_string())
                        .collect()
                })
                .unwrap_or_default();
            LeakCandidate {
                site: frame.to_string(),
                frame,
                callers,
                scope: {
                    let scope = labels.scope(ctx.as_ref());
                    labels.scope_label(scope).to_string()
                },
                blocks: s.blocks,
                bytes: s.bytes,
                bytes_per_step: s.bytes / u64::from(steps.max(1)),
                growing_steps: s.buckets.len() as u32,
                steps,
                unit: if by_step { "step" } else { "window" },
            }
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
        let n = candidates.len();
        let mut s = format!(
            "{n} leak candidate{}: allocation sites whose live blocks keep growing\n",
            if n == 1 { "" } else { "s" }
        );
        if candidates.iter().any(|c| c.unit == "window") {
            s.push_str("(no step markers: the history is cut into 10 windows of equal time)\n");
        }
        for c in candidates {
            s.push_str(&format!(
                "\n{}\n  +{} per {}: {} in {} block{} still live; grew in {} of {} {}s\n",
                c.site,
                bytes(c.bytes_per_step),
                c.unit,
                bytes(c.bytes),
                c.blocks,
                if c.blocks == 1 { "" } else { "s" },
                c.growing_steps,
                c.steps,
                c.unit,
            ));
            for caller in &c.callers {
                s.push_str(&format!("  called from {caller}\n"));
            }
            if !c.scope.is_empty() {
                s.push_str(&format!("  in scope {}\n", c.scope));
            }
        }
        s
    }
}
